package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// TestAuthAtProxy runs the binary with auth-type md5 and an auth query through a
// SECURITY DEFINER function (the auth user's password from the environment), and with
// auth-type scram-sha-256 and an auth file, in front of a PostgreSQL with TLS (the
// default upstream-sslmode prefer, so the proxy's own logins bind to the database's
// certificate). psql, pgx, lib/pq and node-postgres log in over plaintext and over the
// proxy's own TLS, with libpq's default channel binding and with channel_binding=require,
// which fail through a proxy that relays authentication.
func TestAuthAtProxy(t *testing.T) {
	requireServeFlags(t, "tls-cert", "tls-key", "auth-type", "auth-file", "auth-user", "auth-query")
	dsn := testenv.NewDatabase(t)
	migrateUp(t, dsn)
	certs, err := testenv.WriteCertificates(t.TempDir(), "proxy")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	// PgBouncer's recipe: the auth user may read secrets only through this function.
	for _, s := range []string{
		`CREATE FUNCTION public.user_lookup(i_username text, OUT usename name, OUT passwd text)
		 RETURNS record LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS
		 $$ SELECT usename, passwd FROM pg_catalog.pg_shadow WHERE usename = i_username $$`,
		"REVOKE ALL ON FUNCTION public.user_lookup(text) FROM public",
		"GRANT EXECUTE ON FUNCTION public.user_lookup(text) TO " + testenv.SCRAMUser,
	} {
		if _, err := admin.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	var scramSecret, md5Secret string
	err = admin.QueryRow(ctx, "SELECT (SELECT rolpassword FROM pg_authid WHERE rolname = $1), (SELECT rolpassword FROM pg_authid WHERE rolname = $2)",
		testenv.SCRAMUser, testenv.MD5User).Scan(&scramSecret, &md5Secret)
	if err != nil {
		t.Fatal(err)
	}
	authFile := filepath.Join(t.TempDir(), "userlist.txt")
	if err := os.WriteFile(authFile, []byte(fmt.Sprintf("%q %q\n%q %q\n",
		testenv.SCRAMUser, scramSecret, testenv.MD5User, md5Secret)), 0o600); err != nil {
		t.Fatal(err)
	}
	tlsFlags := []string{"--tls-cert", certs.CertFile, "--tls-key", certs.KeyFile}
	proxies := map[string]*Proxy{
		"auth-query": StartProxy(t, "authquery", ProxyConfig{
			Upstream: hostPort(t, dsn), Store: dsn, WorkerSource: "static", WorkerID: 6,
			Extra: append([]string{"--auth-type", "md5", "--auth-user", testenv.SCRAMUser,
				"--auth-query", "SELECT usename, passwd FROM public.user_lookup($1)"}, tlsFlags...),
			Env: []string{"LEAFPROXY_AUTH_PASSWORD=" + testenv.SCRAMPassword},
		}),
		"auth-file": StartProxy(t, "authfile", ProxyConfig{
			Upstream: hostPort(t, dsn), Store: dsn, WorkerSource: "static", WorkerID: 7,
			Extra: append([]string{"--auth-type", "scram-sha-256", "--auth-file", authFile}, tlsFlags...),
		}),
	}
	// auth-type md5 checks an md5 secret with md5; scram-sha-256 refuses it, as
	// PostgreSQL does.
	md5Outcome := map[string]string{"auth-query": "ok as " + testenv.MD5User, "auth-file": "refused 28P01"}
	right, wrong := testenv.SCRAMPassword, "not-"+testenv.SCRAMPassword
	ok := "ok as " + testenv.SCRAMUser
	for name, p := range proxies {
		t.Run(name, func(t *testing.T) {
			with := func(user, password string, params ...string) string {
				u := mustURL(t, p.URL(dsn, user, password))
				q := u.Query()
				for i := 0; i+1 < len(params); i += 2 {
					q.Set(params[i], params[i+1])
				}
				if strings.HasPrefix(q.Get("sslmode"), "verify") {
					q.Set("sslrootcert", certs.CAFile)
				}
				u.RawQuery = q.Encode()
				return u.String()
			}
			scram := func(password string, params ...string) string { return with(testenv.SCRAMUser, password, params...) }
			require := []string{"sslmode", "verify-full", "channel_binding", "require"}

			t.Run("psql", func(t *testing.T) {
				psql := lookTool(t, "psql")
				for _, c := range []struct{ name, url, want string }{
					{"plaintext", scram(right), ok},
					{"plaintext, wrong password", scram(wrong), `password authentication failed for user "leaf_scram"`},
					{"libpq defaults", noParam(t, scram(right), "sslmode"), ok},
					{"libpq defaults, wrong password", noParam(t, scram(wrong), "sslmode"), `password authentication failed for user "leaf_scram"`},
					{"channel_binding=require", scram(right, require...), ok},
				} {
					t.Run(c.name, func(t *testing.T) {
						if got := psqlLogin(t, psql, c.url); !strings.Contains(got, c.want) {
							t.Fatalf("psql: %s\nwant %q", got, c.want)
						}
					})
				}
			})
			t.Run("pgx", func(t *testing.T) {
				for _, c := range []struct{ name, url, want string }{
					{"plaintext", scram(right), ok},
					{"plaintext, wrong password", scram(wrong), "refused 28P01"},
					{"defaults", noParam(t, scram(right), "sslmode"), ok},
					{"channel_binding=require", scram(right, require...), ok},
					{"channel_binding=require, wrong password", scram(wrong, require...), "refused 28P01"},
					{"md5 user", with(testenv.MD5User, testenv.MD5Password, "sslmode", "prefer"), md5Outcome[name]},
					{"md5 user, wrong password", with(testenv.MD5User, "wrong", "sslmode", "prefer"), "refused 28P01"},
					{"unknown user", with("leaf_nobody", "x", "sslmode", "prefer"), "refused 28P01"},
				} {
					t.Run(c.name, func(t *testing.T) {
						if got := loginOutcome(c.url); got != c.want {
							t.Fatalf("pgx: %s\nwant %s", got, c.want)
						}
					})
				}
			})
			t.Run("lib/pq", func(t *testing.T) {
				for _, c := range []struct{ name, url, want string }{
					{"plaintext", scram(right), ok},
					{"plaintext, wrong password", scram(wrong), "refused 28P01"},
					{"TLS", scram(right, "sslmode", "verify-full"), ok},
					{"TLS, wrong password", scram(wrong, "sslmode", "verify-full"), "refused 28P01"},
				} {
					t.Run(c.name, func(t *testing.T) {
						if got := pqLogin(c.url); got != c.want {
							t.Fatalf("lib/pq: %s\nwant %s", got, c.want)
						}
					})
				}
			})
			t.Run("node-postgres", func(t *testing.T) {
				node, npm := nodeTools(t)
				dir := nodeDir(t)
				if !fileExists(filepath.Join(dir, "node_modules", "pg")) {
					runTool(t, dir, nil, npm, "ci", "--no-audit", "--no-fund")
				}
				for _, c := range []struct {
					name, url string
					tls, bind bool
					want      string
				}{
					{"plaintext", scram(right), false, false, ok},
					{"plaintext, wrong password", scram(wrong), false, false, "refused 28P01"},
					{"TLS", noParam(t, scram(right), "sslmode"), true, false, ok},
					{"TLS, wrong password", noParam(t, scram(wrong), "sslmode"), true, false, "refused 28P01"},
					// node-postgres binds the channel only with enableChannelBinding.
					{"TLS, channel binding", noParam(t, scram(right), "sslmode"), true, true, ok},
					{"TLS, channel binding, wrong password", noParam(t, scram(wrong), "sslmode"), true, true, "refused 28P01"},
				} {
					t.Run(c.name, func(t *testing.T) {
						env := []string{"DATABASE_URL=" + c.url}
						if c.tls {
							env = append(env, "SSL_CA="+certs.CAFile)
						}
						if c.bind {
							env = append(env, "CHANNEL_BINDING=1")
						}
						if got := strings.TrimSpace(runTool(t, dir, env, node, "login.js")); got != c.want {
							t.Fatalf("node-postgres: %s\nwant %s", got, c.want)
						}
					})
				}
			})
		})
	}
}

// noParam removes a query parameter from a URL.
func noParam(t testing.TB, raw, name string) string {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Del(name)
	u.RawQuery = q.Encode()
	return u.String()
}
