//go:build linux

package proxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// checkTable looks at the loop's table of sockets on the loop's goroutine: every socket
// it watches must be in its epoll set, and every parked connection's entry must be the
// one its connection knows of (physIO.park). It returns how many connections are parked,
// and how many closed ones are still to leave the table (their Close posted that).
func (l *eventLoop) checkTable() (parked, leaving int, err error) {
	for slot, end := range l.ends {
		if slot == 0 || end == nil {
			continue
		}
		if end.ls == nil {
			x := end.pio
			x.regMu.Lock()
			closed := x.closed.Load()
			ok := x.home == l && x.parked == end && end.slot == int32(slot)
			x.regMu.Unlock()
			if closed {
				leaving++
				continue
			}
			if !ok {
				return 0, 0, fmt.Errorf("slot %d holds a parked connection that is not parked there", slot)
			}
			parked++
		}
		if end.watched {
			ev := end.epollEvent(end.events)
			if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_MOD, end.fd, &ev); err != nil {
				return 0, 0, fmt.Errorf("slot %d (fd %d) is not in the epoll set: %v", slot, end.fd, err)
			}
		}
	}
	return parked, leaving, nil
}

// parkedConnections checks the tables of the server's running loops and returns how many
// connections are parked in them, and how many loops have sessions.
func parkedConnections(t *testing.T, s *Server) (parked, leaving, busyLoops int, err error) {
	t.Helper()
	s.loops.mu.Lock()
	loops := append([]*eventLoop(nil), s.loops.loops...)
	for _, l := range loops {
		if l != nil && l.sessions > 0 {
			busyLoops++
		}
	}
	s.loops.mu.Unlock()
	for _, l := range loops {
		if l == nil {
			continue
		}
		type answer struct {
			parked, leaving int
			err             error
		}
		done := make(chan answer, 1)
		if !l.post(func() {
			parked, leaving, err := l.checkTable()
			done <- answer{parked, leaving, err}
		}) {
			continue
		}
		select {
		case a := <-done:
			if a.err != nil {
				return 0, 0, 0, a.err
			}
			parked += a.parked
			leaving += a.leaving
		case <-time.After(30 * time.Second):
			t.Fatal("an event loop did not answer")
		}
	}
	return parked, leaving, busyLoops, nil
}

// waitParkedConnections waits until n connections are parked in the loops, their tables consistent.
func waitParkedConnections(t *testing.T, s *Server, n int) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("%d parked connections", n), func() error {
		got, leaving, _, err := parkedConnections(t, s)
		if err != nil {
			t.Fatal(err)
		}
		if got != n || leaving > 0 {
			return fmt.Errorf("%d parked, %d closed still in a loop's table", got, leaving)
		}
		return nil
	})
}

// ownTransactions runs rounds transactions on conn, each of which sets application_name
// locally to name and checks that it sees its own value.
func ownTransactions(ctx context.Context, conn *pgx.Conn, name string, rounds int) error {
	for range rounds {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT set_config('application_name', $1, true)", name); err != nil {
			return err
		}
		var got string
		if err := tx.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&got); err != nil {
			return err
		}
		if got != name {
			return fmt.Errorf("client %s sees application_name %q", name, got)
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	return nil
}

// connectN opens n connections to url.
func connectN(t *testing.T, url string, n int) []*pgx.Conn {
	conns := make([]*pgx.Conn, n)
	for i := range conns {
		conns[i] = connect(t, url)
	}
	return conns
}

// concurrentOwnTransactions runs ownTransactions on every connection at once, client i
// naming itself client-i.
func concurrentOwnTransactions(ctx context.Context, conns []*pgx.Conn, rounds int) error {
	var wg sync.WaitGroup
	errs := make([]error, len(conns))
	for i, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = ownTransactions(ctx, conn, fmt.Sprintf("client-%d", i), rounds)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// TestTxPoolConnectionStaysInLoop: a connection given back clean stays in the epoll set
// of its loop, parked, and the loop's next borrowers take it from there, each seeing only
// its own transaction.
func TestTxPoolConnectionStaysInLoop(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 1; s.EventLoops = 1 })
	ctx := testContext(t)
	conns := connectN(t, p.url(db), 3)
	if err := concurrentOwnTransactions(ctx, conns, 30); err != nil {
		t.Fatal(err)
	}
	waitParkedConnections(t, p.srv, 1)
	if st := onlyPool(t, p.srv); st.Dials != 1 {
		t.Fatalf("%d connections dialled, want 1", st.Dials)
	}
}

// TestTxPoolConnectionMovesBetweenLoops: a connection parked in one loop and borrowed by a
// session of another leaves the first loop's epoll set and table, so that no loop
// watches a connection another one serves.
func TestTxPoolConnectionMovesBetweenLoops(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 1; s.EventLoops = 2 })
	ctx := testContext(t)
	conns := connectN(t, p.url(db), 4)
	if _, _, busy, err := parkedConnections(t, p.srv); err != nil || busy != 2 {
		t.Fatalf("%d loops with sessions (%v), want 2", busy, err)
	}
	// In turns first: each borrow moves the connection to the other loop.
	for round := range 5 {
		for i, conn := range conns {
			if err := ownTransactions(ctx, conn, fmt.Sprintf("client-%d", i), 1); err != nil {
				t.Fatal(err)
			}
			if _, _, _, err := parkedConnections(t, p.srv); err != nil {
				t.Fatalf("round %d, client %d: %v", round, i, err)
			}
		}
	}
	if err := concurrentOwnTransactions(ctx, conns, 30); err != nil {
		t.Fatal(err)
	}
	waitParkedConnections(t, p.srv, 1)
}

// TestTxPoolParkedConnectionLost: a parked connection the server ends leaves the loop's
// epoll set at once (a level-triggered set would report it again and again), and new
// sessions get a working connection.
func TestTxPoolParkedConnectionLost(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 1; s.EventLoops = 1 })
	ctx := testContext(t)
	conn := connect(t, p.url(db))
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	waitParkedConnections(t, p.srv, 1)
	observer, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer observer.Close(ctx)
	if _, err := observer.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	waitParkedConnections(t, p.srv, 0)
	// The client that borrows the dead connection next learns of it; a later one gets a
	// new connection.
	_, _ = conn.Exec(ctx, "SELECT 1")
	waitFor(t, 30*time.Second, "a session with a working connection", func() error {
		c, err := pgx.Connect(ctx, p.url(db))
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		var got int
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&got); err != nil {
			return err
		}
		if got == pid {
			return fmt.Errorf("served by the terminated backend %d", pid)
		}
		return nil
	})
}

// TestTxPoolParkedConnectionClosedIdle: a parked connection the pool closes for being idle
// too long leaves the loop's table.
func TestTxPoolParkedConnectionClosedIdle(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) {
		s.EventLoops = 1
		s.Pooling.Limits = pool.Limits{PoolSize: 1, ServerIdleTimeout: 300 * time.Millisecond, QueryWaitTimeout: time.Minute}
		s.Pooling.JanitorInterval = 100 * time.Millisecond
	})
	ctx := testContext(t)
	conn := connect(t, p.url(db))
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the idle connection closed", func() error {
		if st := onlyPool(t, p.srv); st.IdleCloses == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	waitParkedConnections(t, p.srv, 0)
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	waitParkedConnections(t, p.srv, 1)
}

// onlyPool returns the figures of the server's only pool.
func onlyPool(t *testing.T, s *Server) pool.Stats {
	t.Helper()
	stats := s.PoolStats()
	if len(stats) != 1 {
		t.Fatalf("%d pools, want 1", len(stats))
	}
	return stats[0]
}

// TestPostedWorkAllocatesNothing: the work posted to a loop (a pool's answer to a session
// that waited, one per transaction when clients outnumber connections) goes in an array
// that takes turns with the one of the batch the runner ran last, so that posting
// allocates nothing once both are large enough.
func TestPostedWorkAllocatesNothing(t *testing.T) {
	l, err := newEventLoop(nil, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.destroy)
	ran := 0
	f := func() { ran++ }
	batch := func() {
		// As while the runner gives a connection back: no wake-up through the eventfd.
		l.inRelease.Store(true)
		for range 5 {
			l.post(f)
		}
		l.inRelease.Store(false)
		if !l.selfPosted.Swap(false) || !l.runPosted(l.takeSelfPosted(), l.gen.Load()) {
			t.Fatal("the posted work was not found, or the runner changed")
		}
	}
	batch()
	batch()
	if n := testing.AllocsPerRun(100, batch); n != 0 {
		t.Fatalf("a batch of posted work allocates %v times", n)
	}
	if ran != 5*(2+101) {
		t.Fatalf("%d posted functions ran, want %d", ran, 5*(2+101))
	}
}
