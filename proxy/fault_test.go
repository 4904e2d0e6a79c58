package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/leafproxy/leafproxy/internal/testenv"
)

func TestUpstreamKilledMidQuery(t *testing.T) {
	pg := testenv.NewPostgres(t)
	db := pg.URL("postgres")
	p := startProxy(t, db)
	ctx := testContext(t)
	victim := connect(t, p.url(db))
	done := make(chan error, 1)
	go func() {
		_, err := victim.Exec(ctx, "SELECT pg_sleep(30)")
		done <- err
	}()
	direct := connect(t, db)
	waitFor(t, 10*time.Second, "pg_sleep to run", func() error {
		var n int
		if err := direct.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)'").Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return errors.New("not running yet")
		}
		return nil
	})
	if err := pg.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the query succeeded although the server was killed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client got no error after the server was killed")
	}
	// The proxy itself keeps serving: once the server is back, new clients get in.
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, p.url(db))
	if err := conn.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if !waitIdleExcept(p.srv, 1, 10*time.Second) {
		t.Fatalf("%d connections tracked, want only the live one", p.srv.connCount())
	}
}

func TestServerFatalRelayed(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db)
	ctx := testContext(t)
	victim := connect(t, p.url(db))
	bystander := connect(t, p.url(db))
	var pid int
	if err := victim.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if pid != int(victim.PgConn().PID()) {
		t.Fatalf("the client was told backend pid %d, the backend is %d", victim.PgConn().PID(), pid)
	}
	if _, err := bystander.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	_, err := victim.Exec(ctx, "SELECT 1")
	if err == nil {
		t.Fatal("a terminated session still answered")
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code != "57P01" {
		t.Fatalf("got %s, want 57P01 or a closed connection", pgErr.Code)
	}
	if err := bystander.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestTooManyClients(t *testing.T) {
	db := testenv.NewDatabase(t)
	var rejected sync.Map
	p := startProxy(t, db, func(s *Server) {
		s.MaxClientConns = 2
		s.OnReject = func(code string) { rejected.Store(code, true) }
	})
	ctx := testContext(t)
	first := connect(t, p.url(db))
	connect(t, p.url(db))
	_, err := pgx.Connect(ctx, p.url(db))
	wantSQLState(t, err, "53300")
	if _, ok := rejected.Load("53300"); !ok {
		t.Error("OnReject was not told about 53300")
	}
	first.Close(ctx)
	waitFor(t, 5*time.Second, "a free slot", func() error {
		conn, err := pgx.Connect(ctx, p.url(db))
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	})
}

func TestStartupTimeout(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, func(s *Server) { s.StartupTimeout = 200 * time.Millisecond })
	sslRequest := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), sslRequestCode)
	tests := []struct {
		name string
		send []byte
	}{
		{"silent", nil},
		{"half a startup packet", []byte{0, 0, 0, 40, 0, 3}},
		{"SSLRequest then silence", sslRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", p.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write(tt.send); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
			_, err = io.Copy(io.Discard, c)
			if err != nil {
				t.Fatalf("the proxy did not close the connection: %v", err)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("closed after %v", d)
			}
		})
	}
}

// TestClientsVanish opens many connections that end abruptly at every stage of a session
// and checks that the proxy is left with no goroutine, descriptor or session behind.
func TestClientsVanish(t *testing.T) {
	db := testenv.NewDatabase(t)
	var opened, closed atomic.Int64
	p := startProxy(t, db, func(s *Server) {
		// Every client here ends its connection itself; the timeout only bounds a
		// startup on a machine so loaded that 32 logins at a time take seconds.
		s.StartupTimeout = 30 * time.Second
		s.OnConnOpen = func() { opened.Add(1) }
		s.OnConnClose = func() { closed.Add(1) }
	})
	ctx := testContext(t)
	connect(t, p.url(db)).Close(ctx) // warm up whatever the runtime creates once
	baseGoroutines := runtime.NumGoroutine()
	baseFDs := openFDs(t)

	const clients = 1000
	stages := []func(context.Context) error{
		// Connect and drop at once.
		func(context.Context) error {
			c, err := net.Dial("tcp", p.addr)
			if err != nil {
				return err
			}
			return c.Close()
		},
		// Drop half-way through the startup packet.
		func(context.Context) error {
			c, err := net.Dial("tcp", p.addr)
			if err != nil {
				return err
			}
			_, _ = c.Write([]byte{0, 0, 0, 80, 0, 3, 0, 0})
			return c.Close()
		},
		// A full session whose socket is dropped without Terminate.
		func(ctx context.Context) error {
			conn, err := pgconn.Connect(ctx, p.url(db))
			if err != nil {
				return err
			}
			return conn.Conn().Close()
		},
		// Drop in the middle of a query.
		func(ctx context.Context) error {
			conn, err := pgconn.Connect(ctx, p.url(db))
			if err != nil {
				return err
			}
			_, _ = conn.Conn().Write([]byte{'Q', 0, 0, 0, 30, 'S', 'E', 'L'})
			return conn.Conn().Close()
		},
	}
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	sem := make(chan struct{}, 32)
	for i := range clients {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := stages[i%len(stages)](ctx); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if !waitIdle(p.srv, 30*time.Second) {
		t.Fatalf("%d connections still tracked", p.srv.connCount())
	}
	waitFor(t, 30*time.Second, "goroutines and descriptors to be released", func() error {
		if g := runtime.NumGoroutine(); g > baseGoroutines {
			return fmt.Errorf("%d goroutines, %d before", g, baseGoroutines)
		}
		if fds := openFDs(t); fds > baseFDs {
			return fmt.Errorf("%d open descriptors, %d before", fds, baseFDs)
		}
		return nil
	})
	if n := p.srv.sessions.Load(); n != 0 {
		t.Fatalf("%d session slots still held", n)
	}
	if o, c := opened.Load(), closed.Load(); o != clients+1 || c != o {
		t.Fatalf("hooks saw %d connections opened and %d closed, want %d", o, c, clients+1)
	}
	if n := len(p.srv.cancels.keys); n != 0 {
		t.Fatalf("%d cancel keys still registered", n)
	}
}

// openFDs counts the process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		testenv.SkipOrFail(t, "cannot count descriptors: %v", err)
	}
	return len(entries)
}

// waitIdleExcept waits until the server tracks at most n connections.
func waitIdleExcept(s *Server, n int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if s.connCount() <= n {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

func TestShutdown(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db)
	ctx := testContext(t)
	idle := connect(t, p.url(db))
	busy := connect(t, p.url(db))
	if _, err := busy.Exec(ctx, "CREATE TABLE shut (id int)"); err != nil {
		t.Fatal(err)
	}
	tx, err := busy.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO shut VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	shutdown := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		shutdown <- p.srv.Shutdown(sctx)
	}()
	// Serve returns at once; new clients are refused.
	select {
	case err := <-p.done:
		if !errors.Is(err, ErrServerClosed) {
			t.Fatalf("Serve returned %v", err)
		}
		p.done <- err // for the cleanup's check
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Shutdown")
	}
	// The idle session is ended with the administrator-shutdown error.
	waitFor(t, 5*time.Second, "the idle session to be closed", func() error {
		if !idle.IsClosed() {
			if err := idle.Ping(ctx); err == nil {
				return errors.New("still open")
			}
		}
		return nil
	})
	// The transaction in progress may finish.
	if _, err := tx.Exec(ctx, "INSERT INTO shut VALUES (2)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-shutdown:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return after the last transaction ended")
	}
	var n int
	if err := connect(t, db).QueryRow(ctx, "SELECT count(*) FROM shut").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d rows committed, want 2", n)
	}
}

func TestShutdownDeadline(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db)
	ctx := testContext(t)
	busy := connect(t, p.url(db))
	if _, err := busy.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := p.srv.Shutdown(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown returned %v, want the context's deadline", err)
	}
	if !waitIdle(p.srv, 5*time.Second) {
		t.Fatal("the session in a transaction was not closed at the deadline")
	}
	if err := busy.Ping(ctx); err == nil {
		t.Fatal("the session survived the shutdown deadline")
	}
}

func TestListenAndServe(t *testing.T) {
	srv := &Server{Addr: "127.0.0.1:0", Upstream: "127.0.0.1:1"}
	done := make(chan error, 1)
	go func() { done <- srv.ListenAndServe() }()
	waitFor(t, 5*time.Second, "the listener", func() error {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		if len(srv.listeners) == 0 {
			return errors.New("not listening yet")
		}
		return nil
	})
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("ListenAndServe returned %v", err)
	}
	if err := srv.ListenAndServe(); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("ListenAndServe after Shutdown returned %v", err)
	}
}
