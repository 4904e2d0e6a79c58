package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// loginOutcome connects and reports "ok as <user>" or the SQLSTATE of the refusal.
func loginOutcome(rawURL string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return "refused " + pgErr.Code
		}
		return "failed: " + err.Error()
	}
	defer conn.Close(ctx)
	var user string
	if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&user); err != nil {
		return "failed after login: " + err.Error()
	}
	return "ok as " + user
}

// TestSecurity checks that the proxy refuses every login PostgreSQL refuses, and that the
// admin server binds to loopback by default and enforces its token.
func TestSecurity(t *testing.T) {
	requireServeFlags(t, "worker-source", "worker-id")
	dsn := testenv.NewDatabase(t)
	migrateUp(t, dsn)
	addTag(t, dsn, segA, 100)
	const token = "e2e-admin-token"
	withToken := hasFlag(t, "serve", "http-token")
	cfg := ProxyConfig{Upstream: hostPort(t, dsn), Store: dsn, WorkerSource: "static", WorkerID: 3}
	if withToken {
		cfg.HTTPToken = token
	}
	p := StartProxy(t, "security", cfg)

	t.Run("logins", func(t *testing.T) {
		cases := []struct {
			name, user, password string
			refused              bool
		}{
			{"SCRAM, right password", testenv.SCRAMUser, testenv.SCRAMPassword, false},
			{"SCRAM, wrong password", testenv.SCRAMUser, "not-" + testenv.SCRAMPassword, true},
			{"SCRAM, empty password", testenv.SCRAMUser, "", true},
			{"md5, right password", testenv.MD5User, testenv.MD5Password, false},
			{"md5, wrong password", testenv.MD5User, "wrong", true},
			{"refused by pg_hba", testenv.DeniedUser, testenv.DeniedPassword, true},
			{"no such role", "leaf_nobody", "x", true},
		}
		for _, tc := range cases {
			direct := loginOutcome(testenv.WithUser(dsn, tc.user, tc.password))
			proxied := loginOutcome(p.URL(dsn, tc.user, tc.password))
			t.Logf("%s: PostgreSQL says %q, the proxy says %q", tc.name, direct, proxied)
			if strings.HasPrefix(direct, "ok") == tc.refused {
				t.Errorf("%s: PostgreSQL itself said %q: the test environment is not what the test expects", tc.name, direct)
				continue
			}
			if proxied != direct {
				t.Errorf("%s: PostgreSQL says %q but the proxy says %q", tc.name, direct, proxied)
			}
		}
	})

	t.Run("TLS-only role without TLS to PostgreSQL", func(t *testing.T) {
		requireServeFlags(t, "upstream-sslmode")
		plain := cfg
		plain.Extra = []string{"--upstream-sslmode", "disable"}
		plain.HTTPToken = ""
		q := StartProxy(t, "plain-upstream", plain)
		got := loginOutcome(q.URL(dsn, testenv.TLSUser, testenv.TLSPassword))
		if strings.HasPrefix(got, "ok") {
			t.Errorf("%s logged in through a proxy whose upstream connection has no TLS; pg_hba only allows it over TLS", testenv.TLSUser)
		}
		// With the default sslmode the proxy's own upstream connection is TLS, so PostgreSQL
		// accepts the role even though the client spoke plaintext to the proxy: pg_hba
		// hostssl rules see the proxy, not the client (as with PgBouncer).
		t.Logf("%s through a proxy with sslmode disable: %s; through the default proxy: %s",
			testenv.TLSUser, got, loginOutcome(p.URL(dsn, testenv.TLSUser, testenv.TLSPassword)))
	})

	t.Run("TLS from the client", func(t *testing.T) {
		requireServeFlags(t, "tls-cert", "tls-key")
		certs, err := testenv.WriteCertificates(t.TempDir(), "proxy")
		if err != nil {
			t.Fatal(err)
		}
		withTLS := cfg
		withTLS.HTTPToken = ""
		withTLS.Extra = []string{"--tls-cert", certs.CertFile, "--tls-key", certs.KeyFile}
		q := StartProxy(t, "tls", withTLS)
		verified := func(user, password string) string {
			return strings.Replace(q.URL(dsn, user, password),
				"sslmode=disable", "sslmode=verify-full&sslrootcert="+url.QueryEscape(certs.CAFile), 1)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, verified("postgres", ""))
		if err != nil {
			t.Fatalf("verify-full TLS to the proxy: %v", err)
		}
		defer conn.Close(ctx)
		if _, ok := conn.PgConn().Conn().(*tls.Conn); !ok {
			t.Errorf("the client's connection to the proxy is %T, not TLS", conn.PgConn().Conn())
		}
		// SCRAM over TLS. PostgreSQL offers SCRAM-SHA-256-PLUS on the proxy's TLS connection,
		// but a client that binds hashes the certificate it sees, which is the proxy's: the
		// proxy hides the offer and refuses a client that would bind, so
		// channel_binding=disable is the documented way through. A proxy that presents the
		// database's own certificate passes the offer on and lets default clients bind.
		for _, u := range []struct{ user, password string }{
			{testenv.SCRAMUser, testenv.SCRAMPassword},
			{testenv.TLSUser, testenv.TLSPassword},
		} {
			if got := loginOutcome(verified(u.user, u.password) + "&channel_binding=disable"); got != "ok as "+u.user {
				t.Errorf("%s over TLS with channel_binding=disable: %s", u.user, got)
			}
			t.Logf("%s over TLS to a proxy with its own certificate, default channel binding: %s",
				u.user, loginOutcome(verified(u.user, u.password)))
		}
		pgDir := filepath.Dir(os.Getenv(testenv.EnvPGCA))
		pgCert, pgKey := filepath.Join(pgDir, "server.crt"), filepath.Join(pgDir, "server.key")
		if _, err := os.ReadFile(pgKey); err != nil || os.Getenv(testenv.EnvPGCA) == "" {
			t.Logf("the database's certificate is not readable here (%v): not checked with it", err)
		} else {
			same := withTLS
			same.Extra = []string{"--tls-cert", pgCert, "--tls-key", pgKey}
			r := StartProxy(t, "tls-db-cert", same)
			u := strings.Replace(r.URL(dsn, testenv.SCRAMUser, testenv.SCRAMPassword),
				"sslmode=disable", "sslmode=verify-full&sslrootcert="+url.QueryEscape(os.Getenv(testenv.EnvPGCA)), 1)
			if got := loginOutcome(u); got != "ok as "+testenv.SCRAMUser {
				t.Errorf("%s over TLS to a proxy presenting the database's certificate, default channel binding: %s",
					testenv.SCRAMUser, got)
			}
		}
		// A proxy without a certificate must say so, not pretend.
		required := strings.Replace(p.URL(dsn, "postgres", ""), "sslmode=disable", "sslmode=require", 1)
		if c, err := pgx.Connect(ctx, required); err == nil {
			c.Close(ctx)
			t.Errorf("sslmode=require succeeded against a proxy without a certificate")
		}
	})

	t.Run("admin token", func(t *testing.T) {
		if !withToken {
			testenv.SkipOrFail(t, "`leafproxy serve --help` lists no --http-token flag: admin token not in the binary")
		}
		for _, path := range []string{"/api/segment/get/" + segA, "/cache", "/metrics", "/readyz", "/"} {
			for _, h := range []struct {
				name   string
				header http.Header
				want   int
			}{
				{"no token", nil, http.StatusUnauthorized},
				{"wrong token", http.Header{"Authorization": {"Bearer wrong"}}, http.StatusUnauthorized},
				{"token in the wrong scheme", http.Header{"Authorization": {"Basic " + token}}, http.StatusUnauthorized},
				{"right token", http.Header{"Authorization": {"Bearer " + token}}, http.StatusOK},
			} {
				status, body, err := p.HTTPGet(path, h.header)
				if err != nil {
					t.Fatal(err)
				}
				if status != h.want {
					t.Errorf("GET %s with %s: %d %q, want %d", path, h.name, status, strings.TrimSpace(body), h.want)
				}
			}
		}
		if status, _, err := p.HTTPGet("/healthz", nil); err != nil || status != http.StatusOK {
			t.Errorf("GET /healthz without token: %d, %v; liveness must not need the token", status, err)
		}
	})

	t.Run("admin server on loopback by default", func(t *testing.T) {
		requireServeFlags(t, "http")
		help := helpText(t, "serve")
		if !strings.Contains(help, "127.0.0.1:8080") && !strings.Contains(help, "localhost:8080") {
			t.Errorf("`serve --help` shows no loopback default for --http:\n%s", help)
		}
		// Start one proxy without --http when the default port is free, and look at the
		// address its admin socket really listens on.
		l, err := net.Listen("tcp", ":8080")
		if err != nil {
			t.Logf("port 8080 is taken (%v): checked the documented default only", err)
			return
		}
		l.Close()
		def := cfg
		def.HTTPAddr = "-"
		def.HTTPToken = ""
		q := NewProxy(t, "default-http", def)
		q.Spawn()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := q.WaitReady(ctx); err != nil {
			if strings.Contains(q.Log(), "address already in use") {
				// Another test took port 8080 between our check and the start.
				t.Logf("port 8080 was taken before the proxy could bind it: checked the documented default only")
				return
			}
			t.Fatalf("proxy without --http: %v\n%s", err, q.LogTail(20))
		}
		addrs, err := listenAddrs(q.Pid())
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("sockets of a proxy started without --http: %v", addrs)
		found := false
		for _, a := range addrs {
			if strings.HasSuffix(a, ":8080") {
				found = true
				if !strings.HasPrefix(a, "127.") && !strings.HasPrefix(a, "[::1]") {
					t.Errorf("the admin server listens on %s by default, want loopback", a)
				}
			}
		}
		if !found {
			t.Errorf("no admin socket on port 8080 among %v", addrs)
		}
	})
}

// listenAddrs returns the addresses the process's listening TCP sockets are bound to.
func listenAddrs(pid int) ([]string, error) {
	socks, err := procSockets(pid)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range socks {
		if s.state == "0A" { // LISTEN
			out = append(out, procAddr(s.local))
		}
	}
	return out, nil
}
