package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAuthSettings(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "userlist.txt")
	if err := os.WriteFile(file, []byte(`"alice" "md5e55e2f1ac22f2b7cc4a7ecdd1ec3f2a4"`+"\n"+
		`"pgbouncer" "SCRAM-SHA-256$4096:c2FsdHNhbHRzYWx0c2FsdA==$bI4ZBVi8nyGHxa8nKAMaq/ETgVa9E+QsGh4D8eKVlKo=:hGRLrbAfP2mJ7oJuAF5yWQ7gz6BB+gjMRUdqsfXsg6E="`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(dir, "broken.txt")
	if err := os.WriteFile(broken, []byte(`alice secret`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(kv ...string) map[string]string {
		m := map[string]string{"LEAFPROXY_STORE": testStore}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	c, err := load(t, "", env())
	if err != nil {
		t.Fatal(err)
	}
	if c.AuthType != AuthPassthrough || c.AuthQuery != DefaultAuthQuery {
		t.Fatalf("defaults: auth-type %q, auth-query %q", c.AuthType, c.AuthQuery)
	}
	for _, tt := range []struct {
		name string
		file string
		env  map[string]string
		args []string
		want string // "" means valid; else a piece of the error
	}{
		{"file", "", env(), []string{"--auth-type", "scram-sha-256", "--auth-file", file}, ""},
		{"query", "", env("LEAFPROXY_AUTH_PASSWORD", "pw"), []string{"--auth-type", "md5", "--auth-user", "pgbouncer"}, ""},
		{"trust", "", env(), []string{"--auth-type", "trust"}, ""},
		{"unknown type", "", env(), []string{"--auth-type", "cert"}, `auth-type (flag --auth-type): "cert" is not one of`},
		{"no secrets", "", env(), []string{"--auth-type", "scram-sha-256"}, "needs the users' secrets"},
		{"broken file", "", env(), []string{"--auth-type", "md5", "--auth-file", broken}, "auth-file (flag --auth-file): line 1"},
		{"password in file", "auth-type: md5\nauth-user: u\nauth-password: secret\n", env(), nil, "may only be given in the environment (LEAFPROXY_AUTH_PASSWORD)"},
		{"password on command line", "", env(), []string{"--auth-type", "md5", "--auth-user", "u", "--auth-password", "x"}, "auth-password (flag --auth-password): may only be given"},
		{"file with passthrough", "", env(), []string{"--auth-file", file}, "auth-file (flag --auth-file): only used when the proxy authenticates"},
		{"query without $1", "", env(), []string{"--auth-type", "md5", "--auth-user", "u", "--auth-query", "SELECT 1"}, "does not take the user name as $1"},
		{"SCRAM secret for auth-user", "", env(), []string{"--auth-type", "md5", "--auth-file", file, "--auth-user", "pgbouncer"}, "holds a SCRAM secret for pgbouncer, which cannot log in"},
		{"SCRAM secret for auth-user with a password", "", env("LEAFPROXY_AUTH_PASSWORD", "pw"), []string{"--auth-type", "md5", "--auth-file", file, "--auth-user", "pgbouncer"}, ""},
		{"auth-user with trust", "", env(), []string{"--auth-type", "trust", "--auth-user", "u"}, "not used with auth-type trust"},
		{"password without auth-user", "", env("LEAFPROXY_AUTH_PASSWORD", "pw"), []string{"--auth-type", "md5", "--auth-file", file}, "auth-password (env LEAFPROXY_AUTH_PASSWORD): only used with auth-user"},
		{"password with passthrough", "", env("LEAFPROXY_AUTH_PASSWORD", "pw"), nil, "auth-password (env LEAFPROXY_AUTH_PASSWORD): only used when the proxy authenticates"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := load(t, tt.file, tt.env, tt.args...)
			switch {
			case tt.want == "" && err != nil:
				t.Fatal(err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}
