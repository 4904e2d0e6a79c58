package proxy

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// forEachTxEngine runs test with the sessions in transaction mode served by the event
// loops (the default), then by goroutine pairs and the parking lot (event-loops -1).
func forEachTxEngine(t *testing.T, test func(*testing.T, func(*Server))) {
	t.Run("event loops", func(t *testing.T) { test(t, func(*Server) {}) })
	t.Run("goroutines", func(t *testing.T) { test(t, func(s *Server) { s.GoroutineRelay = true }) })
}

// waitParked waits until the proxy has n parked sessions.
func waitParked(t *testing.T, p *testProxy, n int) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("%d parked sessions", n), func() error {
		if got := p.srv.ParkedSessions(); got != n {
			return fmt.Errorf("%d parked", got)
		}
		return nil
	})
}

// TestTxPoolParkedSessionResumes: a parked session wakes up for its client's next
// message with its settings and prepared statements, in and out of transactions, across
// a reload of the pool settings, and parks again.
func TestTxPoolParkedSessionResumes(t *testing.T) { forEachTxEngine(t, testTxPoolParkedSessionResumes) }

func testTxPoolParkedSessionResumes(t *testing.T, engine func(*Server)) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, engine)
	ctx := testContext(t)
	conn := connect(t, p.url(db))
	if _, err := conn.Exec(ctx, "SET application_name = 'parked'"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE t (n int)"); err != nil {
		t.Fatal(err)
	}
	const q = "SELECT current_setting('application_name'), $1::int"
	check := func(n int) {
		t.Helper()
		var name string
		var got int
		if err := conn.QueryRow(ctx, q, n).Scan(&name, &got); err != nil || name != "parked" || got != n {
			t.Fatalf("after parking: %q %d, %v", name, got, err)
		}
	}
	check(1) // prepared by pgx's statement cache
	waitParked(t, p, 1)
	check(2)
	waitParked(t, p, 1)
	if err := p.srv.ReloadPooling(pool.Settings{Limits: pool.Limits{PoolSize: 2, QueryWaitTimeout: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitParked(t, p, 1)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM t", pgx.QueryExecModeSimpleProtocol).Scan(&n); err != nil || n != 1 {
		t.Fatalf("count: %d, %v", n, err)
	}
	check(3)
	conn.Close(ctx)
	waitParked(t, p, 0)
	if !waitIdle(p.srv, 20*time.Second) {
		t.Fatal("the session did not end")
	}
}

// TestTxPoolParkedClientVanishes: a client that closes its socket while its session is
// parked ends the session.
func TestTxPoolParkedClientVanishes(t *testing.T) { forEachTxEngine(t, testTxPoolParkedClientVanishes) }

func testTxPoolParkedClientVanishes(t *testing.T, engine func(*Server)) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, engine)
	c, _ := bareTxSession(t, p, db)
	waitParked(t, p, 1)
	c.Close()
	waitParked(t, p, 0)
	if !waitIdle(p.srv, 20*time.Second) {
		t.Fatal("the session did not end")
	}
}

// TestTxPoolParkedShutdown: Shutdown ends a parked session at once with 57P01, and waits
// for a session in a transaction.
func TestTxPoolParkedShutdown(t *testing.T) { forEachTxEngine(t, testTxPoolParkedShutdown) }

func testTxPoolParkedShutdown(t *testing.T, engine func(*Server)) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, engine)
	ctx := testContext(t)
	parked, _ := bareTxSession(t, p, db)
	busy := connect(t, p.url(db))
	tx, err := busy.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitParked(t, p, 1)
	done := make(chan error, 1)
	go func() { done <- p.srv.Shutdown(ctx) }()
	_ = parked.SetReadDeadline(time.Now().Add(20 * time.Second))
	fe := pgproto3.NewFrontend(bufio.NewReader(parked), parked)
	msg, err := fe.Receive()
	if e, ok := msg.(*pgproto3.ErrorResponse); !ok || e.Code != sqlstate.AdminShutdown {
		t.Fatalf("parked session got %#v, %v; want 57P01", msg, err)
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v with a transaction open", err)
	default:
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestTxPoolParkedCancelAndWait: a cancel request for a parked session does nothing to
// it; a parked session that wakes up while the pool is busy waits, gets the pool's
// SQLSTATE when the wait is too long, and goes on.
func TestTxPoolParkedCancelAndWait(t *testing.T) { forEachTxEngine(t, testTxPoolParkedCancelAndWait) }

func testTxPoolParkedCancelAndWait(t *testing.T, engine func(*Server)) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, engine, func(s *Server) {
		s.Pooling.PoolSize = 1
		s.Pooling.QueryWaitTimeout = 300 * time.Millisecond
	})
	ctx := testContext(t)
	c, key := bareTxSession(t, p, db)
	waitParked(t, p, 1)
	cancel, err := net.DialTimeout("tcp", p.addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	packet := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 16), cancelRequestCode)
	if _, err := cancel.Write(append(packet, key...)); err != nil {
		t.Fatal(err)
	}
	_ = cancel.SetReadDeadline(time.Now().Add(20 * time.Second))
	var b [1]byte
	if _, err := cancel.Read(b[:]); err == nil {
		t.Fatal("the proxy answered a cancel request")
	}
	cancel.Close()
	if err := simpleQuery(c, "SELECT 1"); err != nil {
		t.Fatalf("after a cancel request while parked: %v", err)
	}
	waitParked(t, p, 1)

	holder := connect(t, p.url(db))
	tx := holdServer(t, ctx, holder)
	err = simpleQuery(c, "SELECT 2")
	if err == nil {
		t.Fatal("a query ran while the only server connection was in another transaction")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := simpleQuery(c, "SELECT 3"); err != nil {
		t.Fatalf("after the wait: %v", err)
	}
}

// bareTxSession opens a session on a bare socket, closed when the test ends, and returns
// it with the cancel key it was given.
func bareTxSession(t *testing.T, p *testProxy, db string) (net.Conn, []byte) {
	t.Helper()
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", p.addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	defer c.SetDeadline(noDeadline)
	if _, err := c.Write(startupPacket(map[string]string{"user": u.User.Username(), "database": u.Path[1:]})); err != nil {
		t.Fatal(err)
	}
	fe := pgproto3.NewFrontend(bufio.NewReaderSize(c, 512), c)
	var key []byte
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch m := msg.(type) {
		case *pgproto3.BackendKeyData:
			key = append(binary.BigEndian.AppendUint32(nil, m.ProcessID), m.SecretKey...)
		case *pgproto3.ReadyForQuery:
			return c, key
		}
	}
}

// TestTxPoolParkedRewriting: with the rewriting proxy, a parked session wakes up for the
// fast path (answered by the proxy, no server connection) and for filled INSERTs, and
// parks again after either.
func TestTxPoolParkedRewriting(t *testing.T) { forEachTxEngine(t, testTxPoolParkedRewriting) }

func testTxPoolParkedRewriting(t *testing.T, engine func(*Server)) {
	db := testenv.NewDatabase(t)
	p, _ := rewritingProxy(t, db, inTransactionMode, engine)
	ctx := testContext(t)
	conn := connect(t, p.url(db))
	if _, err := conn.Exec(ctx, "CREATE TABLE orders (id int8 PRIMARY KEY, item text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	for i, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		waitParked(t, p, 1)
		var id int64
		if err := conn.QueryRow(ctx, "SELECT leaf_next('order')", mode).Scan(&id); err != nil || seen[id] {
			t.Fatalf("leaf_next after parking: %d, %v", id, err)
		}
		seen[id] = true
		waitParked(t, p, 1)
		if _, err := conn.Exec(ctx, "INSERT INTO orders (item) VALUES ($1)", mode, fmt.Sprint("item ", i)); err != nil {
			t.Fatalf("filled INSERT after parking: %v", err)
		}
	}
	waitParked(t, p, 1)
	var n, distinct int
	if err := conn.QueryRow(ctx, "SELECT count(*), count(DISTINCT id) FROM orders WHERE id IS NOT NULL").Scan(&n, &distinct); err != nil || n != 2 || distinct != 2 {
		t.Fatalf("orders: %d rows, %d distinct IDs, %v", n, distinct, err)
	}
}
