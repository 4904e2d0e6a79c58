// Package testenv gives tests the PostgreSQL and ZooKeeper servers they run against.
//
// `make test` starts one shared PostgreSQL and one shared ZooKeeper (see cmd/testenv) and
// exports their addresses in the variables below. A test that needs a service asks for it
// through this package: when the variable is unset the test is skipped, unless CI is set,
// in which case it fails, so a CI run can never pass by skipping everything.
//
// Tests that must stop or kill a server (outages, restarts) start a private instance with
// NewPostgres or NewZooKeeper instead of touching the shared one.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Environment variables exported by cmd/testenv.
const (
	EnvPostgres    = "LEAF_TEST_PG"           // URL of the shared PostgreSQL, superuser postgres
	EnvZooKeeper   = "LEAF_TEST_ZK"           // host:port of the shared ZooKeeper
	EnvPGBin       = "LEAF_TEST_PG_BIN"       // directory with initdb, pg_ctl and postgres
	EnvZKClasspath = "LEAF_TEST_ZK_CLASSPATH" // Java class path holding ZooKeeper's server
	EnvPGCA        = "LEAF_TEST_PG_CA"        // CA certificate the shared server's certificate chains to
)

// Roles created on every server this package starts. pg_hba.conf makes each use the
// authentication its name says (leaf_saslprep: SCRAM); leaf_tls may only connect over TLS
// and leaf_denied never.
const (
	MD5User        = "leaf_md5"
	MD5Password    = "md5-secret"
	SCRAMUser      = "leaf_scram"
	SCRAMPassword  = "scram-secret"
	TLSUser        = "leaf_tls"
	TLSPassword    = "tls-secret"
	DeniedUser     = "leaf_denied"
	DeniedPassword = "denied-secret"
	// SASLprepUser's password has a non-ASCII space, which SCRAM's SASLprep maps to a
	// space before hashing: a proxy that derives SCRAM keys from the plaintext must
	// prepare it as libpq and PostgreSQL do.
	SASLprepUser     = "leaf_saslprep"
	SASLprepPassword = "pä\u00a0ss-wört"
)

// UnderCI reports whether the tests run under CI (the CI variable is set, as `.ci/run`
// does): there, everything a test needs is installed and a missing piece is a failure.
func UnderCI() bool { return os.Getenv("CI") != "" }

// SkipOrFail is the one way a test gives up for want of something outside the code under
// test (a tool, a server, a feature of the built binary): it skips the test on a
// developer's machine and fails it under CI, so that a CI run can never go green by
// skipping. The message says what is missing; under CI it is reported as required.
//
// A test that skips by design in -short mode calls t.Skip itself: `make test` never
// passes -short.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if UnderCI() {
		t.Fatalf("%s: required under CI (scripts/install-deps.sh installs every tool the tests use)", msg)
		return
	}
	t.Skipf("%s: skipping (under CI this fails)", msg)
}

// need returns the value of an environment variable a test depends on, skipping the test
// when it is unset outside CI and failing it under CI.
func need(t testing.TB, name, what string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		SkipOrFail(t, "%s is not set: the test needs %s (run the tests with `make test`)", name, what)
	}
	return v
}

// PostgresURL returns the URL of the shared PostgreSQL server.
func PostgresURL(t testing.TB) string {
	t.Helper()
	return need(t, EnvPostgres, "PostgreSQL")
}

// ZooKeeperAddr returns host:port of the shared ZooKeeper server.
func ZooKeeperAddr(t testing.TB) string {
	t.Helper()
	return need(t, EnvZooKeeper, "ZooKeeper")
}

// NewDatabase creates a fresh, empty database on the shared server, drops it when the test
// ends, and returns its URL. Tests that create tables use one so that packages running in
// parallel never see each other's rows.
func NewDatabase(t testing.TB) string {
	t.Helper()
	return newDatabase(t, PostgresURL(t))
}

func newDatabase(t testing.TB, serverURL string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		t.Fatalf("connect to %s: %v", redact(serverURL), err)
	}
	defer conn.Close(ctx)
	name := "leaftest_" + randomHex(6)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, serverURL)
		if err != nil {
			t.Logf("drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(serverURL)
	if err != nil {
		t.Fatalf("parse %s: %v", EnvPostgres, err)
	}
	u.Path = "/" + name
	return u.String()
}

// WithUser returns the URL with its user and password replaced.
func WithUser(rawURL, user, password string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL
	}
	if password == "" {
		u.User = url.User(user)
	} else {
		u.User = url.UserPassword(user, password)
	}
	return u.String()
}

// EnvPorts names the loopback ports FreePort may hand out, as "LOW-HIGH" (both included),
// for a machine where other services listen in the default range.
const EnvPorts = "LEAF_TEST_PORTS"

// FreePort returns a loopback TCP port that was free a moment ago. It is drawn at random
// from below the kernel's ephemeral range (or from EnvPorts): a port the kernel handed out
// for "port 0" could be given again to the next outgoing connection before the server that
// is to listen on it (a JVM taking seconds to start, say) binds it, which under load broke
// ZooKeeper elections.
func FreePort() (int, error) {
	lo, hi, err := portRange()
	if err != nil {
		return 0, err
	}
	for range 200 {
		port := lo + mathrand.IntN(hi-lo+1)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free loopback port in %d-%d", lo, hi)
}

// portRange returns the ports FreePort draws from, both included: EnvPorts when set, else
// 10000 up to just below the ephemeral range (32768 unless the kernel says otherwise).
func portRange() (lo, hi int, err error) {
	if v := os.Getenv(EnvPorts); v != "" {
		return parsePortRange(v)
	}
	lo, hi = 10000, 32767
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var first, last int
		if n, _ := fmt.Sscan(string(b), &first, &last); n == 2 && first > lo+1000 {
			hi = first - 1
		}
	}
	return lo, hi, nil
}

// parsePortRange reads "LOW-HIGH": two ports, 1024 < LOW <= HIGH <= 65535.
func parsePortRange(v string) (lo, hi int, err error) {
	l, h, ok := strings.Cut(v, "-")
	if ok {
		lo, err = strconv.Atoi(strings.TrimSpace(l))
		if err == nil {
			hi, err = strconv.Atoi(strings.TrimSpace(h))
		}
	}
	if !ok || err != nil || lo <= 1024 || hi < lo || hi > 65535 {
		return 0, 0, fmt.Errorf("%s=%q: want LOW-HIGH, two ports with 1024 < LOW <= HIGH <= 65535 (e.g. 20000-29999)", EnvPorts, v)
	}
	return lo, hi, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// waitFor polls cond until it returns nil or the deadline passes.
func waitFor(ctx context.Context, what string, cond func() error) error {
	var last error
	for {
		if last = cond(); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
