package config

import (
	"os"
	"strings"

	"github.com/leafproxy/leafproxy/proxy/pgauth"
)

// Authentication types (auth-type).
const (
	AuthPassthrough = "passthrough"
	AuthSCRAM       = "scram-sha-256"
	AuthMD5         = "md5"
	AuthTrust       = "trust"
)

// DefaultAuthQuery is auth-query's default, PgBouncer's.
const DefaultAuthQuery = "SELECT usename, passwd FROM pg_shadow WHERE usename=$1"

// authSettings are the settings of authentication at the proxy.
var authSettings = []setting{
	{name: "auth-type", arg: "TYPE", usage: "who authenticates clients: passthrough (the database, relayed), or the proxy with scram-sha-256, md5 (md5, or SCRAM for users with a SCRAM secret) or trust",
		field: func(c *Config) any { return &c.AuthType }},
	{name: "auth-file", arg: "FILE", usage: `PgBouncer-style auth file of "user" "secret" lines (SCRAM, md5 or plaintext secrets), read again when it changes`,
		field: func(c *Config) any { return &c.AuthFile }},
	{name: "auth-user", arg: "USER", usage: "user that runs auth-query on the upstream to look up the secrets of users not in auth-file",
		field: func(c *Config) any { return &c.AuthUser }},
	{name: "auth-query", arg: "SQL", usage: "query that returns a user's name and secret given the name as $1, run as auth-user in the database the client asks for",
		field: func(c *Config) any { return &c.AuthQuery }},
	{name: "auth-password", arg: "PASSWORD", usage: "password of auth-user; environment only; without it the auth-file's secret of auth-user is used, else none",
		field: func(c *Config) any { return &c.AuthPassword }},
}

func init() { settings = append(settings, authSettings...) }

// validateAuth checks the auth-* settings.
func (c *Config) validateAuth(bad func(name, format string, args ...any)) {
	switch c.AuthType {
	case AuthPassthrough, AuthSCRAM, AuthMD5, AuthTrust:
	default:
		bad("auth-type", "%q is not one of passthrough, scram-sha-256, md5, trust", c.AuthType)
		return
	}
	if c.AuthPassword != "" && !strings.HasPrefix(c.Origins["auth-password"], "env ") {
		bad("auth-password", "may only be given in the environment (%s), so that it stays out of files and process listings", EnvName("auth-password"))
	}
	if c.AuthType == AuthPassthrough {
		for _, name := range []string{"auth-file", "auth-user", "auth-password"} {
			if c.IsSet(name) && c.authValue(name) != "" {
				bad(name, "only used when the proxy authenticates clients, but auth-type is passthrough")
			}
		}
		return
	}
	var users map[string]pgauth.Secret
	if c.AuthFile != "" {
		data, err := os.ReadFile(c.AuthFile)
		if err == nil {
			users, err = pgauth.ParseAuthFile(string(data))
		}
		if err != nil {
			bad("auth-file", "%v", err)
		}
	}
	if c.AuthType != AuthTrust && c.AuthFile == "" && c.AuthUser == "" {
		bad("auth-type", "%s needs the users' secrets: set auth-file, auth-user (with auth-query), or both", c.AuthType)
	}
	if c.AuthUser == "" {
		if c.AuthPassword != "" {
			bad("auth-password", "only used with auth-user")
		}
		return
	}
	if c.AuthType == AuthTrust {
		bad("auth-user", "not used with auth-type trust, which looks up no secret")
	}
	if !strings.Contains(c.AuthQuery, "$1") {
		bad("auth-query", "%q does not take the user name as $1", c.AuthQuery)
	}
	if s, ok := users[c.AuthUser]; ok && c.AuthPassword == "" && s.Kind == pgauth.SCRAM {
		bad("auth-user", "auth-file holds a SCRAM secret for %s, which cannot log in: give its plaintext password there (or an md5 one, for an md5 upstream), or set %s", c.AuthUser, EnvName("auth-password"))
	}
}

func (c *Config) authValue(name string) string {
	switch name {
	case "auth-file":
		return c.AuthFile
	case "auth-user":
		return c.AuthUser
	}
	return c.AuthPassword
}
