package driversuite

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// pgxModule is the driver whose suite runs; its version is the one in go.mod.
const pgxModule = "github.com/jackc/pgx/v5"

// pgxPackages are the packages of pgx whose tests run.
var pgxPackages = []string{
	pgxModule,
	pgxModule + "/pgconn",
	pgxModule + "/pgtype",
	pgxModule + "/pgxpool",
	pgxModule + "/stdlib",
}

// trickyRole is the role pgx's aclitem test expects to exist (pgx's
// testsetup/postgresql_setup.sql); the test skips without it.
const trickyRole = ` tricky, ' } " \ test user `

// server is the shared PostgreSQL the suite runs against, and what the test learned of it.
type server struct {
	URL       string // superuser URL (LEAF_TEST_PG)
	Addr      string // host:port
	Port      string
	SocketDir string // where its Unix socket is, "" when it has none
	// TLS: the server's own certificate and key, which a proxy presents so that SCRAM
	// channel binding can pass it, and the CA clients verify both with. Nil when the
	// server has no TLS or its files cannot be read.
	Cert   *tls.Certificate
	CAFile string
}

// sharedServer inspects the shared test server and prepares what pgx's suite expects of
// a cluster (the setup of its databases is newSuiteDatabase's job).
func sharedServer(ctx context.Context, t *testing.T) *server {
	t.Helper()
	s := &server{URL: testenv.PostgresURL(t)}
	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatalf("parse %s: %v", testenv.EnvPostgres, err)
	}
	s.Addr = u.Host
	if _, s.Port, err = net.SplitHostPort(u.Host); err != nil {
		t.Fatalf("%s has no port: %v", testenv.EnvPostgres, err)
	}
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatalf("connect to the shared server: %v", err)
	}
	defer conn.Close(ctx)

	var socketDirs, ssl, certFile, keyFile, dataDir string
	err = conn.QueryRow(ctx, `SELECT current_setting('unix_socket_directories'), current_setting('ssl'),
		current_setting('ssl_cert_file'), current_setting('ssl_key_file'), current_setting('data_directory')`).
		Scan(&socketDirs, &ssl, &certFile, &keyFile, &dataDir)
	if err != nil {
		t.Fatalf("read the server's settings: %v", err)
	}
	// The first directory, unless it is Linux's abstract namespace (@…), which holds no file.
	if dir, _, _ := strings.Cut(socketDirs, ","); !strings.HasPrefix(strings.TrimSpace(dir), "@") {
		if dir = strings.TrimSpace(dir); dir != "" {
			if _, err := os.Stat(dir); err == nil {
				s.SocketDir = dir
			}
		}
	}
	// Relative paths of the certificate and key are relative to the data directory.
	if !filepath.IsAbs(certFile) {
		certFile = filepath.Join(dataDir, certFile)
	}
	if !filepath.IsAbs(keyFile) {
		keyFile = filepath.Join(dataDir, keyFile)
	}
	s.CAFile = os.Getenv(testenv.EnvPGCA)
	if ssl == "on" && s.CAFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err == nil {
			s.Cert = &cert
		} else {
			optional(t, "the server's TLS certificate and key", err)
		}
	} else {
		optional(t, "a TLS server", fmt.Errorf("ssl=%s, %s=%q", ssl, testenv.EnvPGCA, s.CAFile))
	}
	if s.SocketDir == "" {
		optional(t, "the server's Unix socket", fmt.Errorf("unix_socket_directories=%q", socketDirs))
	}

	// Roles belong to the cluster: create the one pgx needs once, and keep it (other runs
	// reuse it). It cannot log in.
	_, err = conn.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN CREATE ROLE %s NOLOGIN;
		EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$`, pgx.Identifier{trickyRole}.Sanitize()))
	if err != nil {
		t.Fatalf("create pgx's test role: %v", err)
	}
	return s
}

// optional reports a missing part of the test server: the suite's tests that need it
// skip in every run, which is acceptable by hand but not under CI, where the test
// environment provides everything.
func optional(t *testing.T, what string, err error) {
	t.Helper()
	if testenv.UnderCI() {
		t.Fatalf("%s is required under CI: %v", what, err)
	}
	t.Logf("no %s (%v): the tests of pgx that need it skip", what, err)
}

// newSuiteDatabase creates a fresh database with what pgx's testsetup/postgresql_setup.sql
// puts into its pgx_test database, and returns its name.
func newSuiteDatabase(ctx context.Context, t *testing.T) string {
	t.Helper()
	dbURL := testenv.NewDatabase(t)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect to the new database: %v", err)
	}
	defer conn.Close(ctx)
	for _, stmt := range []string{
		"CREATE EXTENSION hstore",
		"CREATE EXTENSION ltree",
		"CREATE DOMAIN uint64 AS numeric(20,0)",
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	return conn.Config().Database
}

// endpoint is where a run's clients connect: the server itself or a proxy.
type endpoint struct {
	Addr      string // TCP host:port
	SocketDir string // directory of the Unix socket .s.PGSQL.<SocketPort>, "" for none
	TLS       bool   // whether the endpoint accepts TLS clients
}

// suiteEnv returns the environment variables pgx's suite reads (pgx's
// scripts/lib/test_targets.rb) for database db at ep. The roles are those testenv creates
// on every server, whose authentication pg_hba.conf fixes; the variables of tests this
// environment cannot serve (plain password, client certificates, PgBouncer, OAuth,
// CockroachDB, libpq's URI regression binary) stay unset, and those tests skip in every run.
func suiteEnv(s *server, ep endpoint, db string) map[string]string {
	host, port, _ := net.SplitHostPort(ep.Addr)
	userURL := func(user, password string, query string) string {
		u := &url.URL{Scheme: "postgres", Host: ep.Addr, Path: "/" + db, RawQuery: "sslmode=disable" + query}
		if password == "" {
			u.User = url.User(user)
		} else {
			u.User = url.UserPassword(user, password)
		}
		return u.String()
	}
	superuser := "postgres"
	if u, err := url.Parse(s.URL); err == nil && u.User != nil {
		superuser = u.User.Username()
	}
	env := map[string]string{
		"PGX_TEST_DATABASE":                   userURL(superuser, "", ""),
		"PGX_TEST_TCP_CONN_STRING":            userURL(superuser, "", ""),
		"PGX_TEST_MD5_PASSWORD_CONN_STRING":   userURL(testenv.MD5User, testenv.MD5Password, ""),
		"PGX_TEST_SCRAM_PASSWORD_CONN_STRING": userURL(testenv.SCRAMUser, testenv.SCRAMPassword, "&channel_binding=disable"),
	}
	if ep.SocketDir != "" {
		env["PGX_TEST_UNIX_SOCKET_CONN_STRING"] = keywords("host", ep.SocketDir, "port", s.Port,
			"user", superuser, "dbname", db)
	}
	if ep.TLS {
		tlsConn := func(channelBinding string) string {
			return keywords("host", host, "port", port, "user", testenv.TLSUser, "password", testenv.TLSPassword,
				"dbname", db, "sslmode", "verify-full", "sslrootcert", s.CAFile, "channel_binding", channelBinding)
		}
		env["PGX_TEST_TLS_CONN_STRING"] = tlsConn("disable")
		env["PGX_TEST_SCRAM_PLUS_CONN_STRING"] = tlsConn("require")
	}
	return env
}

// keywords builds a keyword/value connection string from pairs, quoting every value.
func keywords(pairs ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(pairs); i += 2 {
		if i > 0 {
			b.WriteByte(' ')
		}
		v := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pairs[i+1])
		fmt.Fprintf(&b, "%s='%s'", pairs[i], v)
	}
	return b.String()
}

// testContext returns a context ending a minute before the test's own deadline, so that
// a hung suite is reported with its output rather than by the test binary's panic.
func testContext(t *testing.T) context.Context {
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(30 * time.Minute)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(-time.Minute))
	t.Cleanup(cancel)
	return ctx
}
