//go:build linux

package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/rewrite"
)

// loopStates returns, for every session the server holds, whether an event loop serves it.
func loopStates(s *Server) []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	var states []bool
	for c := range s.conns {
		states = append(states, c.loop.Load() != nil)
	}
	return states
}

// runningLoops counts the server's event loops.
func runningLoops(s *Server) int { return s.loops.running() }

// loopLeg is a way a test's sessions reach the database through the proxy.
type loopLeg struct {
	name      string
	configure func(*Server)
	url       func(p *testProxy, db string) string
	tls       bool // TLS from the client to the proxy and from the proxy to the database
}

// loopLegs are plain sockets on both legs, and TLS on both.
func loopLegs(t *testing.T) []loopLeg {
	cfg, caFile := proxyCertificate(t)
	ca := upstreamCA(t)
	return []loopLeg{
		{"plain", func(*Server) {}, func(p *testProxy, db string) string { return p.url(db) }, false},
		{"TLS", func(s *Server) {
			s.TLSConfig, s.UpstreamSSLMode, s.UpstreamRootCAs = cfg, SSLVerifyFull, ca
		}, func(p *testProxy, db string) string { return withTLS(p.url(db), "require", caFile) }, true},
	}
}

// checkTLS fails the test unless the legs of conn's session use TLS as wanted.
func checkTLS(t *testing.T, conn *pgx.Conn, wantClient, wantUpstream bool) {
	t.Helper()
	_, client := conn.PgConn().Conn().(*tls.Conn)
	var upstream bool
	if err := conn.QueryRow(testContext(t), "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&upstream); err != nil {
		t.Fatal(err)
	}
	if client != wantClient || upstream != wantUpstream {
		t.Fatalf("TLS to the proxy %v, to the database %v; want %v, %v", client, upstream, wantClient, wantUpstream)
	}
}

// TestLoopServesSessions checks which sessions event loops take: plain and TLS sessions
// alike by default, none with GoroutineRelay; and that loops stop with their last
// session.
func TestLoopServesSessions(t *testing.T) {
	db := testenv.NewDatabase(t)
	cfg, caFile := proxyCertificate(t)
	ca := upstreamCA(t)
	tests := []struct {
		name                   string
		clientTLS, upstreamTLS bool
		relay                  bool // GoroutineRelay
		wantLoop               bool
	}{
		{"plain", false, false, false, true},
		{"client TLS", true, false, false, true},
		{"upstream TLS", false, true, false, true},
		{"TLS on both legs", true, true, false, true},
		{"goroutine relay", false, false, true, false},
		{"goroutine relay, TLS", true, true, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startProxy(t, db, func(s *Server) {
				s.TLSConfig = cfg
				s.GoroutineRelay = tt.relay
				s.EventLoops = 2
				if tt.upstreamTLS {
					s.UpstreamSSLMode, s.UpstreamRootCAs = SSLVerifyFull, ca
				}
			})
			ctx := testContext(t)
			url := p.url(db)
			if tt.clientTLS {
				url = withTLS(url, "require", caFile)
			}
			conns := make([]*pgx.Conn, 3)
			for i := range conns {
				conns[i] = connect(t, url)
				var n int
				if err := conns[i].QueryRow(ctx, "SELECT $1::int + 1", i).Scan(&n); err != nil || n != i+1 {
					t.Fatalf("query: %d, %v", n, err)
				}
			}
			checkTLS(t, conns[0], tt.clientTLS, tt.upstreamTLS)
			for _, onLoop := range loopStates(p.srv) {
				if onLoop != tt.wantLoop {
					t.Fatalf("sessions on a loop: %v, want all %v", loopStates(p.srv), tt.wantLoop)
				}
			}
			wantLoops := 0
			if tt.wantLoop {
				wantLoops = 2 // three sessions spread over both loops
			}
			if n := runningLoops(p.srv); n != wantLoops {
				t.Fatalf("%d loops running, want %d", n, wantLoops)
			}
			for _, c := range conns {
				c.Close(ctx)
			}
			waitFor(t, 10*time.Second, "loops to stop with their sessions", func() error {
				if n := runningLoops(p.srv); n != 0 {
					return fmt.Errorf("%d loops still running", n)
				}
				return nil
			})
		})
	}
}

// TestLoopHandsLargeMessagesToGoroutines sends a message larger than a loop holds in the
// middle of a pipeline: the session moves to goroutines with its buffered input and
// output, and every result arrives in order.
func TestLoopHandsLargeMessagesToGoroutines(t *testing.T) {
	db := testenv.NewDatabase(t)
	for _, leg := range loopLegs(t) {
		t.Run(leg.name, func(t *testing.T) { testLoopHandOff(t, db, leg) })
	}
}

func testLoopHandOff(t *testing.T, db string, leg loopLeg) {
	p := startProxy(t, db, leg.configure)
	ctx := testContext(t)
	conn := connect(t, leg.url(p, db))
	// A first round trip: the session is adopted right after its startup.
	checkTLS(t, conn, leg.tls, leg.tls)
	if states := loopStates(p.srv); len(states) != 1 || !states[0] {
		t.Fatalf("session not on a loop: %v", states)
	}
	// A message a loop holds whole, which TLS carries in some forty records.
	held := strings.Repeat("y", 600<<10)
	var length int
	if err := conn.QueryRow(ctx, "SELECT length($1::text)", held).Scan(&length); err != nil || length != len(held) {
		t.Fatalf("a %d-byte message: %d, %v", len(held), length, err)
	}
	// A pipeline longer than a session's turn on the loop, which TLS packs into records
	// that one read of the socket brings in together.
	pipeline := &pgx.Batch{}
	for i := range 200 {
		pipeline.Queue("SELECT $1::int", i)
	}
	pr := conn.SendBatch(ctx, pipeline)
	for i := range 200 {
		var got int
		if err := pr.QueryRow().Scan(&got); err != nil || got != i {
			t.Fatalf("pipelined query %d: %d, %v", i, got, err)
		}
	}
	if err := pr.Close(); err != nil {
		t.Fatal(err)
	}
	if states := loopStates(p.srv); len(states) != 1 || !states[0] {
		t.Fatalf("session left the loop for a %d-byte message or a pipeline", len(held))
	}
	big := strings.Repeat("x", loopMaxMessage+1)
	batch := &pgx.Batch{}
	batch.Queue("SELECT 1")
	batch.Queue("SELECT length($1::text)", big)
	batch.Queue("SELECT 3")
	results := conn.SendBatch(ctx, batch)
	for i, want := range []int{1, len(big), 3} {
		var got int
		if err := results.QueryRow().Scan(&got); err != nil || got != want {
			t.Fatalf("result %d: %d, %v; want %d", i, got, err, want)
		}
	}
	if err := results.Close(); err != nil {
		t.Fatal(err)
	}
	if states := loopStates(p.srv); len(states) != 1 || states[0] {
		t.Fatalf("session still on a loop after a %d-byte message", len(big))
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT 42").Scan(&n); err != nil || n != 42 {
		t.Fatalf("query after the hand-off: %d, %v", n, err)
	}
	checkTLS(t, conn, leg.tls, leg.tls)
}

// TestLoopStreamsLargeRows has the server send a DataRow and a CopyData larger than a loop
// holds, in the middle of a pipeline: the loop streams them to the client as they arrive,
// every result arrives whole and in order, and the session stays on the loop.
func TestLoopStreamsLargeRows(t *testing.T) {
	db := testenv.NewDatabase(t)
	rw, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	for _, leg := range loopLegs(t) {
		for _, rewriting := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/rewriting=%v", leg.name, rewriting), func(t *testing.T) {
				p := startProxy(t, db, leg.configure, func(s *Server) {
					if rewriting {
						s.Rewriter, s.IDs = rw, &stubIDs{}
					}
				})
				ctx := testContext(t)
				conn := connect(t, leg.url(p, db))
				other := connect(t, leg.url(p, db))
				checkTLS(t, conn, leg.tls, leg.tls)
				const size = 5 << 20
				batch := &pgx.Batch{}
				batch.Queue("SELECT 1::text")
				batch.Queue("SELECT repeat(chr(65 + i), $1) FROM generate_series(0, 2) AS i", size)
				batch.Queue("SELECT 3::text")
				results := conn.SendBatch(ctx, batch)
				var one, three string
				if err := results.QueryRow().Scan(&one); err != nil || one != "1" {
					t.Fatalf("first result: %q, %v", one, err)
				}
				rows, err := results.Query()
				if err != nil {
					t.Fatal(err)
				}
				big, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil || len(big) != 3 {
					t.Fatalf("large rows: %d, %v", len(big), err)
				}
				for i, row := range big {
					if row != strings.Repeat(string(rune(65+i)), size) {
						t.Fatalf("large row %d: %d bytes, not the text sent", i, len(row))
					}
				}
				if err := results.QueryRow().Scan(&three); err != nil || three != "3" {
					t.Fatalf("last result: %q, %v", three, err)
				}
				if err := results.Close(); err != nil {
					t.Fatal(err)
				}
				var out bytes.Buffer
				if _, err := conn.PgConn().CopyTo(ctx, &out, "COPY (SELECT repeat('y', 3 << 20)) TO STDOUT"); err != nil {
					t.Fatal(err)
				}
				if want := strings.Repeat("y", 3<<20) + "\n"; out.String() != want {
					t.Fatalf("COPY TO: %d bytes, want %d", out.Len(), len(want))
				}
				var n int
				if err := other.QueryRow(ctx, "SELECT 7").Scan(&n); err != nil || n != 7 {
					t.Fatalf("the other session: %d, %v", n, err)
				}
				for _, onLoop := range loopStates(p.srv) {
					if !onLoop {
						t.Fatalf("sessions on a loop: %v, want all", loopStates(p.srv))
					}
				}
			})
		}
	}
}

// TestLoopStreamsToASlowReader streams a 32 MiB DataRow to a client that stops reading
// after its first MiB: the loop holds the rest back and serves another session meanwhile,
// and once the client reads on, every byte arrives.
func TestLoopStreamsToASlowReader(t *testing.T) {
	db := testenv.NewDatabase(t)
	for _, leg := range loopLegs(t) {
		t.Run(leg.name, func(t *testing.T) { testLoopStreamsToASlowReader(t, db, leg) })
	}
}

func testLoopStreamsToASlowReader(t *testing.T, db string, leg loopLeg) {
	p := startProxy(t, db, leg.configure, func(s *Server) { s.EventLoops = 1 })
	ctx := testContext(t)
	hc := hijacked(t, leg.url(p, db))
	_ = hc.Conn.SetDeadline(time.Now().Add(time.Minute))
	busy := connect(t, leg.url(p, db))

	const size = 32 << 20
	query, _ := (&pgproto3.Query{String: fmt.Sprintf("SELECT repeat('x', %d)", size)}).Encode(nil)
	if _, err := hc.Conn.Write(query); err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 1<<20)
	if _, err := io.ReadFull(hc.Conn, first); err != nil {
		t.Fatal(err)
	}
	// The client reads no more until the other session is done: a loop that waited for
	// it would never get there.
	for i := range 200 {
		var n int
		if err := busy.QueryRow(ctx, "SELECT $1::int", i).Scan(&n); err != nil || n != i {
			t.Fatalf("busy query %d: %d, %v", i, n, err)
		}
	}
	fe := pgproto3.NewFrontend(io.MultiReader(bytes.NewReader(first), hc.Conn), hc.Conn)
	var got []string
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			if len(m.Values) != 1 || !bytes.Equal(m.Values[0], bytes.Repeat([]byte("x"), size)) {
				t.Fatalf("DataRow of %d values, not the text sent", len(m.Values))
			}
		case *pgproto3.ErrorResponse:
			t.Fatalf("error %s: %s", m.Code, m.Message)
		}
		got = append(got, fmt.Sprintf("%T", msg))
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	want := "[*pgproto3.RowDescription *pgproto3.DataRow *pgproto3.CommandComplete *pgproto3.ReadyForQuery]"
	if fmt.Sprint(got) != want {
		t.Fatalf("messages %v, want %s", got, want)
	}
	if states := loopStates(p.srv); len(states) != 2 || !states[0] || !states[1] {
		t.Fatalf("sessions on a loop: %v, want both", states)
	}
}

// TestLoopSlowReader has one client read a large result slowly while another client,
// served by the same loop, keeps querying: the slow one's backed-up output must neither
// stall the loop nor lose or reorder a byte.
func TestLoopSlowReader(t *testing.T) {
	db := testenv.NewDatabase(t)
	for _, leg := range loopLegs(t) {
		t.Run(leg.name, func(t *testing.T) { testLoopSlowReader(t, db, leg) })
	}
}

func testLoopSlowReader(t *testing.T, db string, leg loopLeg) {
	p := startProxy(t, db, leg.configure, func(s *Server) { s.EventLoops = 1 })
	ctx := testContext(t)
	slow := connect(t, leg.url(p, db))
	busy := connect(t, leg.url(p, db))
	checkTLS(t, slow, leg.tls, leg.tls)
	if runningLoops(p.srv) != 1 {
		t.Fatalf("%d loops, want 1", runningLoops(p.srv))
	}

	const rows, width = 20000, 1000 // 20 MB, far beyond the socket buffers
	rr := slow.PgConn().ExecParams(ctx,
		"SELECT i, repeat(chr(65 + i % 26), $1) FROM generate_series(1, $2) AS i",
		[][]byte{[]byte(itoa(width)), []byte(itoa(rows))}, nil, nil, nil)
	queried := make(chan error, 1)
	go func() {
		// Runs while the slow reader holds the loop's output back.
		for i := range 200 {
			var n int
			if err := busy.QueryRow(ctx, "SELECT $1::int", i).Scan(&n); err != nil || n != i {
				queried <- fmt.Errorf("busy query %d: %d, %v", i, n, err)
				return
			}
		}
		queried <- nil
	}()
	seen := 0
	for rr.NextRow() {
		seen++
		vals := rr.Values()
		want := strings.Repeat(string(rune(65+seen%26)), width)
		if string(vals[0]) != itoa(seen) || string(vals[1]) != want {
			t.Fatalf("row %d: %q, %d bytes", seen, vals[0], len(vals[1]))
		}
		if seen%2000 == 0 {
			time.Sleep(20 * time.Millisecond) // a slow consumer, not a wait for a condition
		}
	}
	if _, err := rr.Close(); err != nil {
		t.Fatal(err)
	}
	if seen != rows {
		t.Fatalf("%d rows, want %d", seen, rows)
	}
	if err := <-queried; err != nil {
		t.Fatal(err)
	}
}

// blockingIDs never has an ID at hand without waiting: every Next announces itself on
// waiting and waits until release is closed.
type blockingIDs struct {
	stubIDs
	waiting chan struct{}
	release chan struct{}
}

func newBlockingIDs() *blockingIDs {
	return &blockingIDs{waiting: make(chan struct{}, 16), release: make(chan struct{})}
}

func (b *blockingIDs) TryNext(string) (int64, bool)    { return 0, false }
func (b *blockingIDs) TryNextSnowflake() (int64, bool) { return 0, false }

func (b *blockingIDs) Next(ctx context.Context, tag string) (int64, error) {
	b.waiting <- struct{}{}
	select {
	case <-b.release:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return b.stubIDs.Next(ctx, tag)
}

// awaitSignal waits for ch or fails the test when ctx ends.
func awaitSignal(ctx context.Context, t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestLoopDetachesWhileWaitingForAnID has a session wait for an ID on a one-loop proxy:
// the loop goes on serving another session meanwhile, the waiting one gets its ID and
// returns to the loop, and a client that leaves while its session waits is cleaned up.
func TestLoopDetachesWhileWaitingForAnID(t *testing.T) {
	db := testenv.NewDatabase(t)
	rw, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	oneLoop := func(t *testing.T) (*testProxy, *blockingIDs) {
		ids := newBlockingIDs()
		return startProxy(t, db, func(s *Server) { s.Rewriter, s.IDs, s.EventLoops = rw, ids, 1 }), ids
	}

	t.Run("served meanwhile", func(t *testing.T) {
		p, ids := oneLoop(t)
		waiter := connect(t, p.url(db))
		other := connect(t, p.url(db))
		got := make(chan error, 1)
		go func() {
			var id int64
			err := waiter.QueryRow(ctx, "SELECT leaf_next('order')").Scan(&id)
			if err == nil && id != 1001 {
				err = fmt.Errorf("leaf_next gave %d, want 1001", id)
			}
			got <- err
		}()
		awaitSignal(ctx, t, ids.waiting, "the ID request")
		for i := range 50 {
			var n int
			if err := other.QueryRow(ctx, "SELECT $1::int", i).Scan(&n); err != nil || n != i {
				t.Fatalf("query %d while the other session waits: %d, %v", i, n, err)
			}
		}
		if n := runningLoops(p.srv); n != 1 {
			t.Fatalf("%d loops, want 1", n)
		}
		close(ids.release)
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		var n int
		if err := waiter.QueryRow(ctx, "SELECT 7").Scan(&n); err != nil || n != 7 {
			t.Fatalf("query after the wait: %d, %v", n, err)
		}
		for _, onLoop := range loopStates(p.srv) {
			if !onLoop {
				t.Fatal("a session did not return to its loop")
			}
		}
		waiter.Close(ctx)
		other.Close(ctx)
	})

	t.Run("client leaves while waiting", func(t *testing.T) {
		p, ids := oneLoop(t)
		waiter := connect(t, p.url(db))
		// The query's goroutine must be done with the connection before the test's cleanup
		// closes it: pgx connections are not safe for concurrent use.
		queried := make(chan error, 1)
		go func() { queried <- waiter.QueryRow(ctx, "SELECT leaf_next('order')").Scan(new(int64)) }()
		awaitSignal(ctx, t, ids.waiting, "the ID request")
		waiter.PgConn().Conn().Close()
		p.srv.closeIdleConns() // a session that waits is not idle: nothing happens
		close(ids.release)
		select {
		case err := <-queried:
			if err == nil {
				t.Fatal("leaf_next answered on a connection the client had closed")
			}
		case <-ctx.Done():
			t.Fatal("the query on the closed connection never returned")
		}
		if !waitIdle(p.srv, 10*time.Second) {
			t.Fatalf("%d connections still tracked", p.srv.connCount())
		}
		waitFor(t, 10*time.Second, "the loop to stop", func() error {
			if n := runningLoops(p.srv); n != 0 {
				return fmt.Errorf("%d loops running", n)
			}
			return nil
		})
	})
}

// panickingIDs panics on tag "boom", in TryNext or, with inNext, in Next after TryNext
// had no ID at hand.
type panickingIDs struct {
	stubIDs
	inNext bool
}

func (p *panickingIDs) TryNext(tag string) (int64, bool) {
	if tag == "boom" {
		if p.inNext {
			return 0, false
		}
		panic("TryNext failed")
	}
	return p.stubIDs.TryNext(tag)
}

func (p *panickingIDs) Next(ctx context.Context, tag string) (int64, error) {
	if tag == "boom" {
		panic("Next failed")
	}
	return p.stubIDs.Next(ctx, tag)
}

// promptIDs always has an ID at hand, so its sessions never leave a loop to wait for one.
type promptIDs struct{ stubIDs }

func (p *promptIDs) TryNext(tag string) (int64, bool) {
	id, err := p.Next(context.Background(), tag)
	return id, err == nil
}

// loopRunners reports how many goroutines have run the server's only event loop so far:
// one more each time a handler detached.
func loopRunners(t *testing.T, s *Server) uint64 {
	t.Helper()
	s.loops.mu.Lock()
	defer s.loops.mu.Unlock()
	if len(s.loops.loops) != 1 || s.loops.loops[0] == nil {
		t.Fatalf("want one running loop, have %v", s.loops.loops)
	}
	return s.loops.loops[0].gen.Load()
}

// TestLoopPlansLongTextsOffTheLoop sends a 300-row INSERT into a filled table, whose
// planning takes milliseconds: the session leaves the loop for it rather than holding up
// the loop's other sessions. A short text, and a long one the rewriter has cached, are
// planned on the loop.
func TestLoopPlansLongTextsOffTheLoop(t *testing.T) {
	db := testenv.NewDatabase(t)
	rw, err := rewrite.New(rewrite.Settings{Fill: []rewrite.FillRule{{Table: "orders", Column: "id", Tag: "order"}}})
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, db, func(s *Server) { s.Rewriter, s.IDs, s.EventLoops = rw, &promptIDs{}, 1 })
	ctx := testContext(t)
	simple := connectMode(t, p.url(db), pgx.QueryExecModeSimpleProtocol)
	extended := connect(t, p.url(db))
	if _, err := simple.Exec(ctx, "CREATE TABLE orders (id int8 PRIMARY KEY, item text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	bulk := func(prefix string) string {
		rows := make([]string, 300)
		for i := range rows {
			rows[i] = fmt.Sprintf("('%s %d')", prefix, i)
		}
		return "INSERT INTO orders (item) VALUES " + strings.Join(rows, ", ")
	}
	steps := []struct {
		name     string
		conn     *pgx.Conn
		sql      string
		detaches uint64
	}{
		{"short", simple, "INSERT INTO orders (item) VALUES ('one')", 0},
		{"short, extended", extended, "INSERT INTO orders (item) VALUES ('two')", 0},
		{"long", simple, bulk("simple"), 1},
		{"long again", simple, bulk("simple"), 0},
		{"long, extended", extended, bulk("extended"), 1},
	}
	total := int64(0)
	for _, st := range steps {
		before := loopRunners(t, p.srv)
		tag, err := st.conn.Exec(ctx, st.sql)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		total += tag.RowsAffected()
		if got := loopRunners(t, p.srv) - before; got != st.detaches {
			t.Errorf("%s: left the loop %d times, want %d", st.name, got, st.detaches)
		}
	}
	var rows, ids int64
	if err := simple.QueryRow(ctx, "SELECT count(*), count(DISTINCT id) FROM orders").Scan(&rows, &ids); err != nil {
		t.Fatal(err)
	}
	if rows != total || ids != total || total != 902 {
		t.Fatalf("%d rows with %d distinct IDs, %d inserted, want 902", rows, ids, total)
	}
}

// TestLoopPanicCostsOneSession has a handler panic on the loop's goroutine and on a
// detached one: that session ends, the other session of the loop goes on.
func TestLoopPanicCostsOneSession(t *testing.T) {
	db := testenv.NewDatabase(t)
	rw, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	for _, inNext := range []bool{false, true} {
		t.Run(fmt.Sprintf("in Next %v", inNext), func(t *testing.T) {
			ids := &panickingIDs{inNext: inNext}
			p := startProxy(t, db, func(s *Server) { s.Rewriter, s.IDs, s.EventLoops = rw, ids, 1 })
			ctx := testContext(t)
			victim := connect(t, p.url(db))
			other := connect(t, p.url(db))
			if err := victim.QueryRow(ctx, "SELECT leaf_next('boom')").Scan(new(int64)); err == nil {
				t.Fatal("leaf_next('boom') succeeded")
			}
			for i := range 20 {
				var id int64
				if err := other.QueryRow(ctx, "SELECT leaf_next('fine')").Scan(&id); err != nil {
					t.Fatalf("other session, query %d: %v", i, err)
				}
			}
			waitFor(t, 10*time.Second, "the panicked session to end", func() error {
				if n := p.srv.connCount(); n != 1 {
					return fmt.Errorf("%d connections, want 1", n)
				}
				return nil
			})
		})
	}
}

// TestLoopStopsWhenReleasedElsewhere gives a new loop's only place back from another
// goroutine, as a session that cannot be adopted does: the loop, asleep in epoll_wait
// with nothing to watch, must wake up and stop.
func TestLoopStopsWhenReleasedElsewhere(t *testing.T) {
	var g loopGroup
	l, err := g.assign(1, false)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{})
	l.post(func() { close(ran) })
	<-ran
	// Give the loop a moment to go back to sleep in epoll_wait: it must be woken from
	// there, not merely see the flag before it sleeps.
	time.Sleep(20 * time.Millisecond)
	g.release(l)
	select {
	case <-l.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the loop did not stop")
	}
	if n := g.running(); n != 0 {
		t.Fatalf("%d loops running", n)
	}
}

// TestLoopLingersForTheNextSession checks that a loop whose last session ended serves
// the next session (a client that connects per request would otherwise start and end a
// loop every time), that a second idle loop stops at once, that the idle loop stops by
// itself after loopLinger, and that close stops an idle loop at once.
func TestLoopLingersForTheNextSession(t *testing.T) {
	var g loopGroup
	a, err := g.assign(2, false)
	if err != nil {
		t.Fatal(err)
	}
	b, err := g.assign(2, false)
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Fatal("a second session shared the busy loop although a slot was free")
	}
	g.release(a)
	g.release(b)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the second idle loop did not stop")
	}
	if n := g.running(); n != 1 {
		t.Fatalf("%d loops running after both sessions ended, want 1", n)
	}
	again, err := g.assign(2, false)
	if err != nil {
		t.Fatal(err)
	}
	if again != a {
		t.Fatal("the next session did not get the idle loop")
	}
	ran := make(chan struct{})
	a.post(func() { close(ran) })
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("the idle loop does not run posted work")
	}
	g.release(a)
	released := time.Now()
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the idle loop did not stop by itself")
	}
	if waited := time.Since(released); waited < loopLinger {
		t.Fatalf("the idle loop stopped after %v, before loopLinger (%v)", waited, loopLinger)
	}
	if n := g.running(); n != 0 {
		t.Fatalf("%d loops running", n)
	}

	c, err := g.assign(2, false)
	if err != nil {
		t.Fatal(err)
	}
	g.release(c)
	g.close()
	if !c.halt.Load() {
		t.Fatal("close did not stop the idle loop")
	}
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the idle loop did not end after close")
	}
}

// TestLoopCloseBeforeTLSTakeover closes a TLS session just before its loop takes it over:
// its TLS connections must stay on their own sockets, which the close ends (with
// close_notify), and never be pointed at the loop's duplicates, which adopt then closes:
// a close_notify written there would go to whatever socket reuses the descriptor.
func TestLoopCloseBeforeTLSTakeover(t *testing.T) {
	db := testenv.NewDatabase(t)
	legs := loopLegs(t)
	tlsLeg := legs[len(legs)-1]
	p := startProxy(t, db, tlsLeg.configure)
	seen := make(chan []*tlsTransport, 1)
	testHookBeforeTakeover = func(c *conn) {
		var transports []*tlsTransport
		for _, nc := range []net.Conn{c.client, c.server.nc} {
			transports = append(transports, nc.(*tls.Conn).NetConn().(*tlsTransport))
		}
		c.close()
		seen <- transports
	}
	t.Cleanup(func() { testHookBeforeTakeover = nil })
	ctx := testContext(t)
	conn := connect(t, tlsLeg.url(p, db)) // the startup completes before the takeover
	var transports []*tlsTransport
	select {
	case transports = <-seen:
	case <-ctx.Done():
		t.Fatal("the session never came to its takeover")
	}
	testHookBeforeTakeover = nil
	if err := conn.Ping(ctx); err == nil {
		t.Fatal("a session closed before its takeover still answers")
	}
	for _, tt := range transports {
		if tt.r != nil || tt.w != nil {
			t.Fatal("a closed session's TLS connection points at the loop's sockets")
		}
	}
	waitFor(t, 10*time.Second, "the session to be forgotten", func() error {
		if states := loopStates(p.srv); len(states) != 0 {
			return fmt.Errorf("sessions left: %v", states)
		}
		return nil
	})
}

// TestLoopBurstOfWholeBuffers has a client send, in one go, Queries that fill the
// session's read buffer exactly, again and again: each buffer is a run that crosses
// unchanged and goes out last in its turn, straight from the buffer, while the loop
// reads on into the same buffer. Every Query must reach the server intact and in order,
// with a rewriting proxy and without.
func TestLoopBurstOfWholeBuffers(t *testing.T) {
	db := testenv.NewDatabase(t)
	rw, err := rewrite.New(rewrite.Settings{Fill: []rewrite.FillRule{{Table: "orders", Column: "id", Tag: "order"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name      string
		configure func(*Server)
	}{
		{"plain", func(s *Server) { s.EventLoops = 1 }},
		{"rewriting", func(s *Server) { s.Rewriter, s.IDs, s.EventLoops = rw, &promptIDs{}, 1 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := startProxy(t, db, tt.configure)
			hc := hijacked(t, p.url(db))
			_ = hc.Conn.SetDeadline(time.Now().Add(time.Minute))
			// 16 Queries of 512 bytes fill a read buffer; the budget of a turn leaves
			// room to read the next buffer in the same turn.
			const size, count = 512, 16 * 40
			var burst []byte
			pads := make([]string, count)
			for i := range count {
				sql := fmt.Sprintf("SELECT %d, '", i)
				pads[i] = strings.Repeat("z", size-6-len(sql)-1)
				sql += pads[i] + "'"
				if burst, err = (&pgproto3.Query{String: sql}).Encode(burst); err != nil {
					t.Fatal(err)
				}
			}
			if len(burst) != size*count || readBufferSize%size != 0 {
				t.Fatalf("burst of %d bytes, want %d Queries of %d", len(burst), count, size)
			}
			sent := make(chan error, 1)
			go func() {
				_, err := hc.Conn.Write(burst)
				sent <- err
			}()
			fe := pgproto3.NewFrontend(hc.Conn, hc.Conn)
			for i := 0; i < count; {
				msg, err := fe.Receive()
				if err != nil {
					t.Fatalf("after %d answers: %v", i, err)
				}
				switch m := msg.(type) {
				case *pgproto3.DataRow:
					if len(m.Values) != 2 || string(m.Values[0]) != fmt.Sprint(i) || string(m.Values[1]) != pads[i] {
						t.Fatalf("answer %d: row %q", i, m.Values)
					}
				case *pgproto3.ErrorResponse:
					t.Fatalf("answer %d: error %s: %s", i, m.Code, m.Message)
				case *pgproto3.ReadyForQuery:
					i++
				}
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
		})
	}
}
