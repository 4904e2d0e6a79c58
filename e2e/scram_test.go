package e2e

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// TestSCRAMThroughTLSUpstream logs in with SCRAM through a proxy with the default
// upstream-sslmode (prefer) to a PostgreSQL with TLS on, so that the server offers
// SCRAM-SHA-256-PLUS on the proxy's upstream connection. Every client, speaking plaintext
// or TLS to the proxy, must get in with the right password and get 28P01 with a wrong
// one; channel binding, which cannot reach the server through the proxy's own
// certificate, must fail with a clear error when the client insists on it.
func TestSCRAMThroughTLSUpstream(t *testing.T) {
	requireServeFlags(t, "tls-cert", "tls-key")
	dsn := testenv.NewDatabase(t)
	migrateUp(t, dsn)
	certs, err := testenv.WriteCertificates(t.TempDir(), "proxy")
	if err != nil {
		t.Fatal(err)
	}
	p := StartProxy(t, "scram", ProxyConfig{
		Upstream: hostPort(t, dsn), Store: dsn, WorkerSource: "static", WorkerID: 5,
		Extra: []string{"--tls-cert", certs.CertFile, "--tls-key", certs.KeyFile},
	})
	// with returns the proxy's URL for the SCRAM role with these connection parameters.
	with := func(password string, params ...string) string {
		u, err := url.Parse(p.URL(dsn, testenv.SCRAMUser, password))
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		for i := 0; i+1 < len(params); i += 2 {
			q.Set(params[i], params[i+1])
		}
		if q.Get("sslmode") == "verify-full" {
			q.Set("sslrootcert", certs.CAFile)
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	right, wrong := testenv.SCRAMPassword, "not-"+testenv.SCRAMPassword
	ok := "ok as " + testenv.SCRAMUser
	tlsNoBinding := []string{"sslmode", "verify-full", "channel_binding", "disable"}

	t.Run("psql", func(t *testing.T) {
		psql := lookTool(t, "psql")
		for _, c := range []struct {
			name, url string
			want      string // "ok", or a piece of psql's error
		}{
			{"plaintext", with(right), "ok"},
			{"plaintext, wrong password", with(wrong), "password authentication failed"},
			{"TLS, channel_binding=disable", with(right, tlsNoBinding...), "ok"},
			{"TLS, channel_binding=disable, wrong password", with(wrong, tlsNoBinding...), "password authentication failed"},
			// libpq answers the missing PLUS offer with "binding supported but not
			// offered"; the proxy refuses that, and with sslmode=prefer libpq retries
			// without TLS and gets in.
			{"sslmode=prefer, default channel binding", with(right, "sslmode", "prefer"), "ok"},
			{"TLS, default channel binding", with(right, "sslmode", "verify-full"), "SCRAM channel binding cannot pass through the proxy"},
			{"TLS, channel_binding=require", with(right, "sslmode", "verify-full", "channel_binding", "require"), "channel binding is required"},
		} {
			t.Run(c.name, func(t *testing.T) {
				got := psqlLogin(t, psql, c.url)
				if c.want == "ok" && got != ok || c.want != "ok" && !strings.Contains(got, c.want) {
					t.Fatalf("psql: %s\nwant %q", got, c.want)
				}
			})
		}
	})

	t.Run("pgx", func(t *testing.T) {
		for _, c := range []struct{ name, url, want string }{
			{"plaintext", with(right), ok},
			{"plaintext, wrong password", with(wrong), "refused 28P01"},
			{"TLS, channel_binding=disable", with(right, tlsNoBinding...), ok},
			{"TLS, channel_binding=disable, wrong password", with(wrong, tlsNoBinding...), "refused 28P01"},
			{"TLS, default channel binding", with(right, "sslmode", "verify-full"), "refused 28000"},
			{"TLS, channel_binding=require", with(right, "sslmode", "verify-full", "channel_binding", "require"),
				"channel binding required but server does not support SCRAM-SHA-256-PLUS"},
		} {
			t.Run(c.name, func(t *testing.T) {
				got := loginOutcome(c.url)
				if got != c.want && !(strings.HasPrefix(got, "failed: ") && strings.Contains(got, c.want)) {
					t.Fatalf("pgx: %s\nwant %s", got, c.want)
				}
			})
		}
	})

	t.Run("lib/pq", func(t *testing.T) {
		for _, c := range []struct{ name, url, want string }{
			{"plaintext", with(right), ok},
			{"plaintext, wrong password", with(wrong), "refused 28P01"},
			{"TLS", with(right, "sslmode", "verify-full"), ok},
			{"TLS, wrong password", with(wrong, "sslmode", "verify-full"), "refused 28P01"},
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
		noSSLMode := func(raw string) string {
			u := mustURL(t, raw)
			q := u.Query()
			q.Del("sslmode")
			u.RawQuery = q.Encode()
			return u.String()
		}
		for _, c := range []struct {
			name, url string
			tls       bool
			want      string
		}{
			{"plaintext", with(right), false, ok},
			{"plaintext, wrong password", with(wrong), false, "refused 28P01"},
			{"TLS", noSSLMode(with(right)), true, ok},
			{"TLS, wrong password", noSSLMode(with(wrong)), true, "refused 28P01"},
		} {
			t.Run(c.name, func(t *testing.T) {
				env := []string{"DATABASE_URL=" + c.url}
				if c.tls {
					env = append(env, "SSL_CA="+certs.CAFile)
				}
				if got := strings.TrimSpace(runTool(t, dir, env, node, "login.js")); got != c.want {
					t.Fatalf("node-postgres: %s\nwant %s", got, c.want)
				}
			})
		}
	})
}

func mustURL(t testing.TB, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// psqlLogin runs psql against rawURL and returns "ok as <user>" or psql's error output.
func psqlLogin(t testing.TB, psql, rawURL string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, psql, "-X", "-At", "-w", "-d", rawURL, "-c", "SELECT current_user")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return strings.TrimSpace(string(out))
	}
	return "ok as " + strings.TrimSpace(string(out))
}

// pqLogin connects with lib/pq and reports like loginOutcome.
func pqLogin(rawURL string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	db, err := sql.Open("postgres", rawURL)
	if err != nil {
		return "failed: " + err.Error()
	}
	defer db.Close()
	var user string
	if err := db.QueryRowContext(ctx, "SELECT current_user").Scan(&user); err != nil {
		var pqErr *pq.Error
		if errors.As(err, &pqErr) {
			return "refused " + string(pqErr.Code)
		}
		return "failed: " + err.Error()
	}
	return "ok as " + user
}
