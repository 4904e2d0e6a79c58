package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/leafproxy/leafproxy/internal/testenv"
)

func TestAuthenticationRelayed(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db)
	tests := []struct {
		name, user, password string
		wantCode             string // "" means the login succeeds
	}{
		{"trust", "postgres", "", ""},
		{"scram", testenv.SCRAMUser, testenv.SCRAMPassword, ""},
		{"md5", testenv.MD5User, testenv.MD5Password, ""},
		{"scram wrong password", testenv.SCRAMUser, "wrong", "28P01"},
		{"md5 wrong password", testenv.MD5User, "wrong", "28P01"},
		{"denied by pg_hba", testenv.DeniedUser, testenv.DeniedPassword, "28000"},
		{"tls-only user over plain upstream", testenv.TLSUser, testenv.TLSPassword, "28000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			conn, err := pgx.Connect(ctx, p.url(testenv.WithUser(db, tt.user, tt.password)))
			if tt.wantCode != "" {
				if err == nil {
					conn.Close(ctx)
					t.Fatalf("%s logged in through the proxy, want SQLSTATE %s", tt.user, tt.wantCode)
				}
				wantSQLState(t, err, tt.wantCode)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var user string
			if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&user); err != nil {
				t.Fatal(err)
			}
			if user != tt.user {
				t.Fatalf("current_user = %q, want %q", user, tt.user)
			}
		})
	}
}

// upstreamCA returns the CA of the shared server's certificate.
func upstreamCA(t *testing.T) *x509.CertPool {
	t.Helper()
	file := os.Getenv(testenv.EnvPGCA)
	if file == "" {
		testenv.PostgresURL(t) // names the server's variable first when that is the one missing
		testenv.SkipOrFail(t, "%s is not set", testenv.EnvPGCA)
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", file)
	}
	return pool
}

func TestUpstreamTLS(t *testing.T) {
	db := testenv.NewDatabase(t)
	ca := upstreamCA(t)
	other, err := testenv.WriteCertificates(t.TempDir(), "other")
	if err != nil {
		t.Fatal(err)
	}
	otherPEM, err := os.ReadFile(other.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	otherCA := x509.NewCertPool()
	otherCA.AppendCertsFromPEM(otherPEM)

	tests := []struct {
		name       string
		mode       SSLMode
		roots      *x509.CertPool
		serverName string
		wantCode   string
	}{
		{"prefer", SSLPrefer, nil, "", ""},
		{"require", SSLRequire, nil, "", ""},
		{"verify-full", SSLVerifyFull, ca, "", ""},
		{"verify-full by name", SSLVerifyFull, ca, "localhost", ""},
		{"verify-full wrong name", SSLVerifyFull, ca, "db.example.com", "08001"},
		{"verify-full unknown CA", SSLVerifyFull, otherCA, "", "08001"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startProxy(t, db, func(s *Server) {
				s.UpstreamSSLMode = tt.mode
				s.UpstreamRootCAs = tt.roots
				s.UpstreamServerName = tt.serverName
			})
			ctx := testContext(t)
			conn, err := pgx.Connect(ctx, p.url(testenv.WithUser(db, testenv.TLSUser, testenv.TLSPassword)))
			if tt.wantCode != "" {
				if err == nil {
					conn.Close(ctx)
					t.Fatalf("connected, want SQLSTATE %s", tt.wantCode)
				}
				wantSQLState(t, err, tt.wantCode)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var ssl bool
			if err := conn.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil {
				t.Fatal(err)
			}
			if !ssl {
				t.Fatal("the upstream connection is not encrypted")
			}
		})
	}
}

// proxyCertificate writes a test certificate and returns the proxy's TLS configuration
// and the CA file a client verifies it with.
func proxyCertificate(t *testing.T) (*tls.Config, string) {
	t.Helper()
	certs, err := testenv.WriteCertificates(t.TempDir(), "proxy")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(certs.CertFile, certs.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, certs.CAFile
}

func TestClientTLS(t *testing.T) {
	db := testenv.NewDatabase(t)
	ca := upstreamCA(t)
	cfg, caFile := proxyCertificate(t)
	p := startProxy(t, db, func(s *Server) {
		s.TLSConfig = cfg
		s.UpstreamSSLMode = SSLVerifyFull
		s.UpstreamRootCAs = ca
	})
	ctx := testContext(t)

	// SCRAM over TLS on both legs: the proxy's certificate is not the server's, so the
	// client must not bind the channel.
	tlsUser := withTLS(p.url(testenv.WithUser(db, testenv.TLSUser, testenv.TLSPassword)), "verify-full", caFile)
	conn, err := pgx.Connect(ctx, tlsUser+"&channel_binding=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, ok := conn.PgConn().Conn().(*tls.Conn); !ok {
		t.Fatalf("client connection is %T, want *tls.Conn", conn.PgConn().Conn())
	}
	if err := conn.Ping(ctx); err != nil {
		t.Fatal(err)
	}

	// A proxy without a certificate answers SSLRequest with 'N'.
	plain := startProxy(t, db)
	_, err = pgx.Connect(ctx, withTLS(plain.url(db), "require", caFile))
	if err == nil {
		t.Fatal("sslmode=require connected to a proxy without a certificate")
	}
	conn2, err := pgx.Connect(ctx, withTLS(plain.url(db), "prefer", caFile))
	if err != nil {
		t.Fatal(err)
	}
	conn2.Close(ctx)
}

// withTLS sets a URL's sslmode and sslrootcert.
func withTLS(raw, mode, caFile string) string {
	u, _ := url.Parse(raw)
	q := u.Query()
	q.Set("sslmode", mode)
	q.Set("sslrootcert", caFile)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestChannelBindingWithServerCertificate shows the one way SCRAM channel binding passes a
// proxy: the proxy presents the database's own certificate and key.
func TestChannelBindingWithServerCertificate(t *testing.T) {
	pg := testenv.NewPostgres(t)
	cert, err := tls.LoadX509KeyPair(filepath.Join(pg.Dir, "server.crt"), filepath.Join(pg.Dir, "server.key"))
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(pg.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	db := pg.URL("postgres")
	p := startProxy(t, db, func(s *Server) {
		s.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}}
		s.UpstreamSSLMode = SSLVerifyFull
		s.UpstreamRootCAs = roots
	})
	ctx := testContext(t)
	for _, binding := range []string{"require", "prefer", "disable"} {
		t.Run(binding, func(t *testing.T) {
			u := withTLS(p.url(testenv.WithUser(db, testenv.TLSUser, testenv.TLSPassword)), "verify-full", pg.CAFile)
			conn, err := pgx.Connect(ctx, u+"&channel_binding="+binding)
			if err != nil {
				t.Fatal(err)
			}
			conn.Close(ctx)
		})
	}
}

func TestUpstreamUnreachable(t *testing.T) {
	db := testenv.NewDatabase(t)
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, db, func(s *Server) {
		s.Upstream = "127.0.0.1:" + itoa(port)
		s.DialTimeout = 2 * time.Second
	})
	ctx := testContext(t)
	start := time.Now()
	_, err = pgx.Connect(ctx, p.url(db))
	wantSQLState(t, err, "08001")
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("refusal took %v", d)
	}
	var pgErr interface{ SQLState() string }
	if !errors.As(err, &pgErr) {
		t.Fatal("not a server error")
	}
	if !waitIdle(p.srv, 5*time.Second) {
		t.Fatal("the refused connection is still tracked")
	}
	_ = context.Background
}

// TestSASLMechanismsOffered checks the AuthenticationSASL a client gets when the upstream
// connection is TLS, where PostgreSQL offers SCRAM-SHA-256-PLUS: a plaintext client must
// not see it (libpq refuses a PLUS offer over a plaintext connection), nor may a TLS client
// of a proxy with a certificate of its own (its binding could never match the server's).
func TestSASLMechanismsOffered(t *testing.T) {
	db := testenv.NewDatabase(t)
	cfg, _ := proxyCertificate(t)
	p := startProxy(t, db, func(s *Server) {
		s.UpstreamSSLMode = SSLPrefer
		s.TLSConfig = cfg
	})
	for _, tt := range []struct {
		name      string
		clientTLS bool
	}{{"plaintext client", false}, {"TLS client", true}} {
		t.Run(tt.name, func(t *testing.T) {
			got := offeredMechanisms(t, p.addr, testenv.SCRAMUser, tt.clientTLS)
			if !slices.Equal(got, []string{mechanismSCRAM}) {
				t.Fatalf("mechanisms offered: %q, want only %s", got, mechanismSCRAM)
			}
		})
	}
}

// offeredMechanisms opens a connection to addr as user and returns the SASL mechanisms of
// the AuthenticationSASL it is sent.
func offeredMechanisms(t *testing.T, addr, user string, useTLS bool) []string {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
	if useTLS {
		fe := pgproto3.NewFrontend(nc, nc)
		fe.Send(&pgproto3.SSLRequest{})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var answer [1]byte
		if _, err := nc.Read(answer[:]); err != nil || answer[0] != 'S' {
			t.Fatalf("SSLRequest answered %q, %v", answer[0], err)
		}
		tc := tls.Client(nc, &tls.Config{InsecureSkipVerify: true})
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		nc = tc
	}
	fe := pgproto3.NewFrontend(nc, nc)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": user, "database": "postgres"}})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	msg, err := fe.Receive()
	if err != nil {
		t.Fatal(err)
	}
	sasl, ok := msg.(*pgproto3.AuthenticationSASL)
	if !ok {
		t.Fatalf("got %T, want AuthenticationSASL", msg)
	}
	return sasl.AuthMechanisms
}

func TestWithoutMechanism(t *testing.T) {
	body := []byte("\x00\x00\x00\x0aSCRAM-SHA-256-PLUS\x00SCRAM-SHA-256\x00\x00")
	got := withoutMechanism(body, mechanismSCRAMPlus)
	if want := "\x00\x00\x00\x0aSCRAM-SHA-256\x00\x00"; string(got) != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if got := withoutMechanism(body[:len(body)-1], "x"); string(got) != string(body[:len(body)-1]) {
		t.Fatalf("an unterminated list changed: %q", got)
	}
}
