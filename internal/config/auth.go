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
		field: func(c *Config) any { return &c.AuthType },
		check: checkAuthType},
	{name: "auth-file", arg: "FILE", usage: `PgBouncer-style auth file of "user" "secret" lines (SCRAM, md5 or plaintext secrets), read again when it changes`,
		field: func(c *Config) any { return &c.AuthFile },
		check: checkAuthFile},
	{name: "auth-user", arg: "USER", usage: "user that runs auth-query on the upstream to look up the secrets of users not in auth-file",
		field: func(c *Config) any { return &c.AuthUser },
		check: checkAuthUser},
	{name: "auth-query", arg: "SQL", usage: "query that returns a user's name and secret given the name as $1, run as auth-user in the database the client asks for",
		field: func(c *Config) any { return &c.AuthQuery },
		check: checkAuthQuery},
	{name: "auth-password", arg: "PASSWORD", usage: "password of auth-user; environment only; without it the auth-file's secret of auth-user is used, else none",
		field: func(c *Config) any { return &c.AuthPassword },
		check: checkAuthPassword},
}

func init() { settings = append(settings, authSettings...) }

// proxyAuthenticates reports whether auth-type has the proxy authenticate clients.
func (c *Config) proxyAuthenticates() bool {
	switch c.AuthType {
	case AuthSCRAM, AuthMD5, AuthTrust:
		return true
	}
	return false
}

func checkAuthType(c *Config, bad problem) {
	switch c.AuthType {
	case AuthPassthrough, AuthTrust:
	case AuthSCRAM, AuthMD5:
		if c.AuthFile == "" && c.AuthUser == "" {
			bad("%s needs the users' secrets: set auth-file, auth-user (with auth-query), or both", c.AuthType)
		}
	default:
		bad("%q is not one of passthrough, scram-sha-256, md5, trust", c.AuthType)
	}
}

// notWithPassthrough reports a setting that is set although the proxy does not
// authenticate clients.
func notWithPassthrough(c *Config, value string, bad problem) bool {
	if c.AuthType == AuthPassthrough && value != "" {
		bad("only used when the proxy authenticates clients, but auth-type is passthrough")
		return true
	}
	return false
}

func checkAuthFile(c *Config, bad problem) {
	if c.AuthFile == "" || notWithPassthrough(c, c.AuthFile, bad) {
		return
	}
	if _, err := readAuthFile(c.AuthFile); err != nil {
		bad("%v", err)
	}
}

func readAuthFile(path string) (map[string]pgauth.Secret, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return pgauth.ParseAuthFile(string(data))
}

func checkAuthUser(c *Config, bad problem) {
	if c.AuthUser == "" || notWithPassthrough(c, c.AuthUser, bad) {
		return
	}
	if c.AuthType == AuthTrust {
		bad("not used with auth-type trust, which looks up no secret")
		return
	}
	if c.AuthFile == "" || c.AuthPassword != "" {
		return
	}
	users, err := readAuthFile(c.AuthFile)
	if s, ok := users[c.AuthUser]; err == nil && ok && s.Kind == pgauth.SCRAM {
		bad("auth-file holds a SCRAM secret for %s, which cannot log in: give its plaintext password there (or an md5 one, for an md5 upstream), or set %s", c.AuthUser, EnvName("auth-password"))
	}
}

func checkAuthQuery(c *Config, bad problem) {
	if c.AuthUser != "" && c.proxyAuthenticates() && !strings.Contains(c.AuthQuery, "$1") {
		bad("%q does not take the user name as $1", c.AuthQuery)
	}
}

func checkAuthPassword(c *Config, bad problem) {
	if c.AuthPassword == "" {
		return
	}
	if !strings.HasPrefix(c.Origins["auth-password"], "env ") {
		bad("may only be given in the environment (%s), so that it stays out of files and process listings", EnvName("auth-password"))
		return
	}
	if !notWithPassthrough(c, c.AuthPassword, bad) && c.AuthUser == "" {
		bad("only used with auth-user")
	}
}
