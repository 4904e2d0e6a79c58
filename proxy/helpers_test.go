package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/sirupsen/logrus"
)

// testProxy is a Server serving on a loopback port for one test.
type testProxy struct {
	srv  *Server
	addr string
	done chan error
}

// startProxy starts a Server in front of the server of upstreamURL; configure may adjust
// its fields before it serves. The server is closed when the test ends.
func startProxy(t testing.TB, upstreamURL string, configure ...func(*Server)) *testProxy {
	t.Helper()
	u, err := url.Parse(upstreamURL)
	if err != nil {
		t.Fatalf("parse %s: %v", upstreamURL, err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	srv := &Server{Upstream: u.Host, UpstreamSSLMode: SSLDisable, Logger: log}
	for _, f := range configure {
		f(srv)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &testProxy{srv: srv, addr: l.Addr().String(), done: make(chan error, 1)}
	go func() { p.done <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		select {
		case err := <-p.done:
			if !errors.Is(err, ErrServerClosed) {
				t.Errorf("Serve returned %v, want ErrServerClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after Close")
		}
		// Event loops end their sessions after Close returns; wait for them, so that
		// the next test (and a memory measurement) starts from a quiet process.
		deadline := time.Now().Add(10 * time.Second)
		for srv.loops.running() > 0 {
			if time.Now().After(deadline) {
				t.Errorf("%d event loops still running after Close", srv.loops.running())
				break
			}
			time.Sleep(time.Millisecond)
		}
	})
	return p
}

// url returns dbURL with its host and port replaced by the proxy's.
func (p *testProxy) url(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return dbURL
	}
	u.Host = p.addr
	return u.String()
}

// connect opens a pgx connection through the proxy, closed when the test ends.
func connect(t testing.TB, connURL string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, connURL)
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// holdServer opens a transaction on conn, a client of a transaction-mode proxy, and runs
// a statement in it, so that it holds a server connection until it ends.
func holdServer(t testing.TB, ctx context.Context, conn *pgx.Conn) pgx.Tx {
	t.Helper()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	return tx
}

// wantSQLState fails the test unless err is a PostgreSQL error with the given code.
func wantSQLState(t testing.TB, err error, code string) *pgconn.PgError {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		t.Fatalf("got error %v, want SQLSTATE %s", err, code)
	}
	if pgErr.Code != code {
		t.Fatalf("got SQLSTATE %s (%s), want %s", pgErr.Code, pgErr.Message, code)
	}
	return pgErr
}

// waitFor polls cond until it returns nil or the timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	delay := time.Millisecond
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		time.Sleep(delay)
		delay = min(2*delay, 100*time.Millisecond)
	}
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func itoa(n int) string { return strconv.Itoa(n) }

// waitIdle waits until the server tracks no connection.
func waitIdle(s *Server, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if s.connCount() == 0 {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return s.connCount() == 0
}
