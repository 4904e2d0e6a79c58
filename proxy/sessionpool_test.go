package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// openSession opens a client session through the proxy and returns it with its
// backend's process ID; the test ends it.
func openSession(t *testing.T, connURL string) (*pgx.Conn, uint32) {
	t.Helper()
	conn := dialCancelling(t, connURL)
	t.Cleanup(func() { conn.Close(context.Background()) })
	var pid uint32
	if err := conn.QueryRow(testContext(t), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return conn, pid
}

// waitSessionFigures waits until the proxy's session-mode figures satisfy ok.
func waitSessionFigures(t *testing.T, s *Server, what string, ok func(SessionServerFigures) bool) {
	t.Helper()
	waitFor(t, 30*time.Second, what, func() error {
		if f := s.SessionServers(); !ok(f) {
			return fmt.Errorf("%+v", f)
		}
		return nil
	})
}

// connectLater opens a session on its own goroutine; its result comes on the channel.
func connectLater(connURL string, timeout time.Duration) <-chan connResult {
	done := make(chan connResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		conn, err := pgx.Connect(ctx, connURL)
		var pid uint32
		if err == nil {
			err = conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
			conn.Close(ctx)
		}
		done <- connResult{pid, err}
	}()
	return done
}

// sessionPoolStat returns the session pool figures of user, the only ones the proxy has.
func sessionPoolStat(t *testing.T, s *Server, user string) pool.Stats {
	t.Helper()
	all := s.SessionPoolStats()
	if len(all) != 1 || all[0].User != user {
		t.Fatalf("session pool figures: %+v, want one entry, of %s", all, user)
	}
	return all[0]
}

type connResult struct {
	pid uint32
	err error
}

// backendsOf counts the backends of user in the test database, other than the
// watcher's.
func backendsOf(t *testing.T, watcher *pgx.Conn, user string) int {
	t.Helper()
	var n int
	err := watcher.QueryRow(testContext(t), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND usename = $1 AND pid <> pg_backend_pid()`, user).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSessionPoolLimits: in session mode with the proxy's authentication, a (database,
// user) has at most pool-size server connections and a database at most
// max-db-connections; a session beyond them waits for one to end or go idle, or
// closes an idle connection of another startup to open its own, and past
// query-wait-timeout is refused with 53300; a client that goes away while it waits, or a
// shutdown, ends the wait and leaves no room taken.
func TestSessionPoolLimits(t *testing.T) {
	db := testenv.NewDatabase(t)
	watcher := connect(t, db)
	t.Run("waits at pool-size", func(t *testing.T) {
		p, connURL := reuseProxy(t, db, func(s *Server) { s.Pooling.PoolSize = 2 })
		a, pidA := openSession(t, connURL)
		openSession(t, connURL)
		later := connectLater(connURL, 60*time.Second)
		waitSessionFigures(t, p.srv, "a session waiting", func(f SessionServerFigures) bool { return f.Waiting == 1 && f.Open == 2 })
		if n := backendsOf(t, watcher, testenv.SCRAMUser); n != 2 {
			t.Fatalf("%d backends with pool-size 2", n)
		}
		if st := sessionPoolStat(t, p.srv, testenv.SCRAMUser); st.Mode != "session" || st.ClientsActive != 2 || st.ServersActive != 2 ||
			st.ClientsWaiting != 1 || st.MaxWait <= 0 || st.PoolSize != 2 || st.Acquires != 2 || st.ServersIdle != 0 {
			t.Fatalf("pool figures with a session waiting: %+v", st)
		}
		a.Close(testContext(t))
		r := <-later
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.pid != pidA {
			t.Fatalf("the waiting session got backend %d, want the one the ended session left, %d", r.pid, pidA)
		}
		waitSessionFigures(t, p.srv, "two connections, one idle", func(f SessionServerFigures) bool {
			return f.Waiting == 0 && f.Open == 2 && f.Idle == 1
		})
		if st := sessionPoolStat(t, p.srv, testenv.SCRAMUser); st.ClientsActive != 1 || st.ServersIdle != 1 ||
			st.ClientsWaiting != 0 || st.MaxWait != 0 || st.Acquires != 3 || st.WaitTime <= 0 || st.WaitTimeouts != 0 {
			t.Fatalf("pool figures after the wait: %+v", st)
		}
	})
	t.Run("another startup closes an idle connection", func(t *testing.T) {
		p, connURL := reuseProxy(t, db, func(s *Server) { s.Pooling.PoolSize = 1 })
		pid := session(t, connURL, nil)
		waitIdleServers(t, p.srv, 1)
		if other := session(t, connURL+"&application_name=other", nil); other == pid {
			t.Fatalf("a session of other startup parameters got backend %d of the first", pid)
		}
		backendGone(t, watcher, pid)
		waitSessionFigures(t, p.srv, "one connection", func(f SessionServerFigures) bool { return f.Open == 1 && f.Idle == 1 })
	})
	t.Run("query-wait-timeout", func(t *testing.T) {
		p, connURL := reuseProxy(t, db, func(s *Server) {
			s.Pooling.PoolSize = 1
			s.Pooling.QueryWaitTimeout = 300 * time.Millisecond
		})
		a, pidA := openSession(t, connURL)
		r := <-connectLater(connURL, 30*time.Second)
		wantSQLState(t, r.err, "53300")
		if st := sessionPoolStat(t, p.srv, testenv.SCRAMUser); st.WaitTimeouts != 1 || st.ClientsWaiting != 0 || st.Acquires != 1 {
			t.Fatalf("pool figures after a wait timed out: %+v", st)
		}
		if _, err := a.Exec(testContext(t), "SELECT 1"); err != nil {
			t.Fatalf("the session holding the connection: %v", err)
		}
		a.Close(testContext(t))
		if got := session(t, connURL, nil); got != pidA {
			t.Fatalf("session on backend %d, want %d: the refused session left room taken", got, pidA)
		}
		waitSessionFigures(t, p.srv, "one idle connection", func(f SessionServerFigures) bool { return f.Open == 1 && f.Idle == 1 && f.Waiting == 0 })
	})
	t.Run("max-db-connections", func(t *testing.T) {
		file := writeAuthFile(t, testenv.SCRAMUser, storedSecret(t, db, testenv.SCRAMUser),
			testenv.MD5User, storedSecret(t, db, testenv.MD5User))
		p := startProxy(t, db, func(s *Server) {
			s.Auth = &ClientAuth{Type: AuthMD5, File: file} // SCRAM for the user with a SCRAM secret
			s.ReuseSessionServers = true
			s.Pooling.PoolSize = 5
			s.Pooling.MaxDBConnections = 1
		})
		scramURL := p.url(testenv.WithUser(db, testenv.SCRAMUser, testenv.SCRAMPassword))
		md5URL := p.url(testenv.WithUser(db, testenv.MD5User, testenv.MD5Password))
		pid := session(t, scramURL, nil)
		waitIdleServers(t, p.srv, 1)
		m, _ := openSession(t, md5URL) // closes the other user's idle connection
		backendGone(t, watcher, pid)
		later := connectLater(scramURL, 60*time.Second)
		waitSessionFigures(t, p.srv, "a session waiting", func(f SessionServerFigures) bool { return f.Waiting == 1 && f.Open == 1 })
		if n := backendsOf(t, watcher, testenv.SCRAMUser) + backendsOf(t, watcher, testenv.MD5User); n != 1 {
			t.Fatalf("%d backends with max-db-connections 1", n)
		}
		m.Close(testContext(t))
		if r := <-later; r.err != nil {
			t.Fatal(r.err)
		}
	})
	t.Run("client gone while waiting", func(t *testing.T) {
		p, connURL := reuseProxy(t, db, func(s *Server) { s.Pooling.PoolSize = 1 })
		a, pidA := openSession(t, connURL)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			conn, err := pgx.Connect(ctx, connURL)
			if err == nil {
				conn.Close(context.Background())
			}
			done <- err
		}()
		waitSessionFigures(t, p.srv, "a session waiting", func(f SessionServerFigures) bool { return f.Waiting == 1 })
		cancel() // pgx closes its socket
		if err := <-done; err == nil {
			t.Fatal("the cancelled connect succeeded")
		}
		waitSessionFigures(t, p.srv, "no session waiting", func(f SessionServerFigures) bool { return f.Waiting == 0 && f.Open == 1 })
		a.Close(testContext(t))
		if got := session(t, connURL, nil); got != pidA {
			t.Fatalf("session on backend %d, want %d", got, pidA)
		}
	})
	t.Run("shutdown ends the wait", func(t *testing.T) {
		p, connURL := reuseProxy(t, db, func(s *Server) { s.Pooling.PoolSize = 1 })
		openSession(t, connURL)
		later := connectLater(connURL, 60*time.Second)
		waitSessionFigures(t, p.srv, "a session waiting", func(f SessionServerFigures) bool { return f.Waiting == 1 })
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = p.srv.Shutdown(ctx)
		}()
		r := <-later
		wantSQLState(t, r.err, "57P03")
	})
	t.Run("a route's pool_size", func(t *testing.T) {
		u, err := url.Parse(db)
		if err != nil {
			t.Fatal(err)
		}
		routes := NewRoutes(map[string]Route{"alias": {Database: strings.TrimPrefix(u.Path, "/"), Pool: pool.Limits{PoolSize: 1}}}, nil)
		p, connURL := reuseProxy(t, db, func(s *Server) {
			s.SetRoutes(routes)
			s.Pooling.QueryWaitTimeout = 300 * time.Millisecond
		})
		alias, err := url.Parse(connURL)
		if err != nil {
			t.Fatal(err)
		}
		alias.Path = "/alias"
		openSession(t, alias.String())
		r := <-connectLater(alias.String(), 30*time.Second)
		wantSQLState(t, r.err, "53300")
		if f := p.srv.SessionServers(); f.Open != 1 {
			t.Fatalf("%+v, want one connection open", f)
		}
	})
	t.Run("passthrough is not counted", func(t *testing.T) {
		p := startProxy(t, db, func(s *Server) { s.Pooling.PoolSize = 1 })
		connURL := p.url(testenv.WithUser(db, testenv.SCRAMUser, testenv.SCRAMPassword))
		openSession(t, connURL)
		openSession(t, connURL)
		if f := p.srv.SessionServers(); f.Open != 0 {
			t.Fatalf("relayed logins counted: %+v", f)
		}
	})
}

// TestSessionPoolFirstComeFirstServed: the sessions waiting for room get it in the order
// they came, a session that comes while others wait for the same room queues behind
// them even when room has just come, and a session of another (database, user) with
// room of its own does not wait for them.
func TestSessionPoolFirstComeFirstServed(t *testing.T) {
	var p sessionPool
	alice := pool.Key{Database: "app", User: "alice"}
	bob := pool.Key{Database: "app", User: "bob"}
	l := sessionLimits{Limits: pool.Limits{PoolSize: 1, QueryWaitTimeout: -1}}
	stay := func() bool { return false }
	ctx := testContext(t)
	if _, err := p.acquire(ctx, alice, "", l, stay); err != nil {
		t.Fatal(err)
	}
	served := make(chan string, 3)
	waitIn := func(name string, waiting int) {
		t.Helper()
		go func() {
			if _, err := p.acquire(ctx, alice, "", l, stay); err != nil {
				served <- name + ": " + err.Error()
				return
			}
			served <- name
		}()
		waitFor(t, 30*time.Second, fmt.Sprintf("%d sessions waiting", waiting), func() error {
			if f := p.figures(); f.Waiting != waiting {
				return fmt.Errorf("%+v", f)
			}
			return nil
		})
	}
	waitIn("first", 1)
	waitIn("second", 2)
	if _, err := p.acquire(ctx, bob, "", l, stay); err != nil {
		t.Fatalf("another user with room of its own: %v", err)
	}

	p.release(alice)
	// The room is the first waiter's, not a session's that comes now.
	short := l
	short.QueryWaitTimeout = 200 * time.Millisecond
	var timeout *waitTimeoutError
	if _, err := p.acquire(ctx, alice, "", short, stay); !errors.As(err, &timeout) {
		t.Fatalf("a session that came while two waited: %v, want to wait its turn and time out", err)
	}
	if got := <-served; got != "first" {
		t.Fatalf("served %q, want the first waiter", got)
	}
	p.release(alice)
	if got := <-served; got != "second" {
		t.Fatalf("served %q, want the second waiter", got)
	}
	if f := p.figures(); f.Waiting != 0 || f.Open != 2 {
		t.Fatalf("figures at the end: %+v, want none waiting and two open", f)
	}
}
