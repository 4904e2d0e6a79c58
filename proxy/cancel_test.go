package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/rewrite"
)

// cancelCounter is a TCP relay in front of the database that counts the connections
// opening with a CancelRequest: what the proxy sent upstream as cancels. It reads the
// first 8 bytes of each connection, so the proxy must reach it without TLS.
type cancelCounter struct {
	l       net.Listener
	target  string
	cancels atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func startCancelCounter(t *testing.T, dbURL string) *cancelCounter {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &cancelCounter{l: l, target: u.Host}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.close)
	return r
}

func (r *cancelCounter) addr() string { return r.l.Addr().String() }

func (r *cancelCounter) close() {
	r.l.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *cancelCounter) accept() {
	defer r.wg.Done()
	for {
		client, err := r.l.Accept()
		if err != nil {
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.relay(client)
		}()
	}
}

func (r *cancelCounter) relay(client net.Conn) {
	defer client.Close()
	head := make([]byte, 8)
	if _, err := io.ReadFull(client, head); err != nil {
		return
	}
	if binary.BigEndian.Uint32(head) == 16 && binary.BigEndian.Uint32(head[4:]) == cancelRequestCode {
		r.cancels.Add(1)
	}
	server, err := net.DialTimeout("tcp", r.target, 15*time.Second)
	if err != nil {
		return
	}
	defer server.Close()
	r.mu.Lock()
	r.conns = append(r.conns, client, server)
	r.mu.Unlock()
	if _, err := server.Write(head); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(client, server)
		client.Close()
		close(done)
	}()
	_, _ = io.Copy(server, client)
	server.Close()
	<-done
}

// connectCancelling opens a pgx connection whose context cancellation sends a
// CancelRequest and waits for the server's answer, instead of closing the connection
// (pgx's default), closed when the test ends.
func connectCancelling(t *testing.T, connURL string) *pgx.Conn {
	t.Helper()
	conn := dialCancelling(t, connURL)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// dialCancelling is connectCancelling for a connection the caller closes.
func dialCancelling(t *testing.T, connURL string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(connURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnectTimeout = 20 * time.Second
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 30 * time.Second}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	return conn
}

// waitRunning waits until a backend runs the statement whose text is sql.
func waitRunning(t *testing.T, direct *pgx.Conn, sql string) {
	t.Helper()
	waitFor(t, 20*time.Second, sql+" to run", func() error {
		var n int
		err := direct.QueryRow(testContext(t), "SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'active'", sql).Scan(&n)
		if err == nil && n == 0 {
			err = errors.New("not running")
		}
		return err
	})
}

// sendCancel sends a CancelRequest with the given key to addr and waits until the other
// side closes the connection: the proxy does so only after it has dealt with the request.
func sendCancel(t *testing.T, addr string, pid uint32, secret []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	packet := binary.BigEndian.AppendUint32(nil, uint32(12+len(secret)))
	packet = binary.BigEndian.AppendUint32(packet, cancelRequestCode)
	packet = binary.BigEndian.AppendUint32(packet, pid)
	packet = append(packet, secret...)
	if _, err := c.Write(packet); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := io.Copy(io.Discard, c); err != nil || n != 0 {
		t.Fatalf("after a CancelRequest the proxy sent %d bytes, then %v; want a bare close", n, err)
	}
}

// goStatement runs a statement in a goroutine and returns its outcome and the function
// that cancels its context. When the test ends, the context is cancelled and the goroutine
// waited for before the connections it uses are closed: call it after connecting.
func goStatement(t *testing.T, run func(ctx context.Context) error) (<-chan error, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() { done <- run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return done, cancel
}

// result waits for the error a statement ended with, failing the test when it does not
// end within 30 s.
func result(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not end", what)
		return nil
	}
}

// TestCancelUnknownKeyIsDropped sends the proxy cancel requests whose key it never handed
// out: made up, a proxied session's process ID with a wrong secret, and the real key of a
// backend connected to the database directly (which PostgreSQL would honour). None goes
// upstream and nothing is cancelled; the session's own key still works.
func TestCancelUnknownKeyIsDropped(t *testing.T) {
	db := testenv.NewDatabase(t)
	counter := startCancelCounter(t, db)
	p := startProxy(t, db, func(s *Server) { s.Upstream = counter.addr() })
	ctx := testContext(t)

	victim := connect(t, p.url(db))
	direct := connect(t, db)
	watcher := connect(t, db)
	const victimSQL, directSQL = "SELECT pg_sleep(60) /* through the proxy */", "SELECT pg_sleep(60) /* direct */"
	victimDone, _ := goStatement(t, func(ctx context.Context) error { _, err := victim.Exec(ctx, victimSQL); return err })
	directDone, _ := goStatement(t, func(ctx context.Context) error { _, err := direct.Exec(ctx, directSQL); return err })
	waitRunning(t, watcher, victimSQL)
	waitRunning(t, watcher, directSQL)

	wrong := append([]byte(nil), victim.PgConn().SecretKey()...)
	wrong[len(wrong)-1] ^= 1
	for _, k := range []struct {
		name   string
		pid    uint32
		secret []byte
	}{
		{"made up", 12345, []byte{1, 2, 3, 4}},
		{"wrong secret", victim.PgConn().PID(), wrong},
		{"a backend the proxy does not serve", direct.PgConn().PID(), direct.PgConn().SecretKey()},
	} {
		sendCancel(t, p.addr, k.pid, k.secret)
		if n := counter.cancels.Load(); n != 0 {
			t.Fatalf("%s: %d cancel requests went upstream", k.name, n)
		}
	}
	select {
	case err := <-victimDone:
		t.Fatalf("the proxied statement ended: %v", err)
	case err := <-directDone:
		t.Fatalf("the direct statement ended: %v", err)
	default:
	}
	waitRunning(t, watcher, victimSQL)
	waitRunning(t, watcher, directSQL)

	// The session's own key goes through, once.
	sendCancel(t, p.addr, victim.PgConn().PID(), victim.PgConn().SecretKey())
	wantSQLState(t, result(t, victimDone, "the cancelled statement"), "57014")
	if n := counter.cancels.Load(); n != 1 {
		t.Fatalf("%d cancel requests went upstream, want 1", n)
	}
	if _, err := watcher.Exec(ctx, "SELECT pg_cancel_backend($1)", direct.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	wantSQLState(t, result(t, directDone, "the direct statement"), "57014")
}

// cancelLegs are the ways a session reaches the database in the cancel tests: on an event
// loop or a goroutine pair, over plain sockets or TLS on both legs.
func cancelLegs(t *testing.T) []loopLeg {
	var legs []loopLeg
	for _, leg := range loopLegs(t) {
		for _, goroutines := range []bool{false, true} {
			name, configure := leg.name+"/event loop", leg.configure
			if goroutines {
				name = leg.name + "/goroutines"
				configure = func(s *Server) { leg.configure(s); s.GoroutineRelay = true }
			}
			legs = append(legs, loopLeg{name: name, configure: configure, url: leg.url, tls: leg.tls})
		}
	}
	return legs
}

// wantServedBy fails the test unless every session of srv is on an event loop (loop true)
// or none is. The connection that carried a cancel request is tracked until it has
// closed, a moment after the cancelled statement has ended; it is waited for.
func wantServedBy(t *testing.T, srv *Server, loop bool) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("every session on an event loop: %v", loop), func() error {
		for _, onLoop := range loopStates(srv) {
			if onLoop != loop {
				return fmt.Errorf("a session on an event loop: %v, want %v", onLoop, loop)
			}
		}
		return nil
	})
}

// TestCancelReachesSession cancels a running statement with pgx (context cancellation
// sends a CancelRequest, encrypted when the session is) and with psql (SIGINT; psql 15
// sends its cancel in plain text even for a TLS session), for sessions on event loops and
// goroutines, plain and TLS. The statement fails with 57014 and the session goes on.
func TestCancelReachesSession(t *testing.T) {
	db := testenv.NewDatabase(t)
	watcher := connect(t, db)
	for _, leg := range cancelLegs(t) {
		t.Run(leg.name, func(t *testing.T) {
			p := startProxy(t, db, leg.configure)
			onLoop := !strings.HasSuffix(leg.name, "goroutines")

			t.Run("pgx", func(t *testing.T) {
				conn := connectCancelling(t, leg.url(p, db))
				checkTLS(t, conn, leg.tls, leg.tls)
				sql := "SELECT pg_sleep(60) /* pgx " + leg.name + " */"
				done, cancel := goStatement(t, func(ctx context.Context) error { _, err := conn.Exec(ctx, sql); return err })
				waitRunning(t, watcher, sql)
				wantServedBy(t, p.srv, onLoop)
				cancel()
				wantSQLState(t, result(t, done, "the cancelled statement"), "57014")
				var n int
				if err := conn.QueryRow(testContext(t), "SELECT 42").Scan(&n); err != nil || n != 42 {
					t.Fatalf("after the cancel: %d, %v", n, err)
				}
				wantServedBy(t, p.srv, onLoop)
			})

			t.Run("psql", func(t *testing.T) {
				sql := "SELECT pg_sleep(60) /* psql " + leg.name + " */"
				psqlInterrupted(t, leg.url(p, db), sql, func() { waitRunning(t, watcher, sql) })
			})
		})
	}
}

// psqlInterrupted runs sql with psql, interrupts psql (SIGINT, which makes it send a
// CancelRequest) once running says the statement runs, and checks that the statement
// failed as cancelled.
func psqlInterrupted(t *testing.T, connURL, sql string, running func()) {
	t.Helper()
	cmd := exec.Command(needTool(t, "psql"), "-X", "-d", connURL, "-c", sql)
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10", "PSQLRC=/dev/null")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-waited
	})
	running()
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		waited <- err // for the cleanup
		if err == nil || !strings.Contains(out.String(), "canceling statement due to user request") {
			t.Fatalf("psql after SIGINT: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("psql's statement was not cancelled:\n%s", out.String())
	}
}

// TestCancelWhileWaitingForAnID cancels a statement while its session waits for an ID
// that does not come: the wait ends at once with PostgreSQL's 57014, no cancel goes to
// the database (whose backend is idle and would cancel the session's next statement if
// the request arrived late), and the session stays usable. Inside a transaction block
// the block fails, as it does when PostgreSQL cancels a statement.
func TestCancelWhileWaitingForAnID(t *testing.T) {
	db := testenv.NewDatabase(t)
	rw, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []struct {
		name       string
		goroutines bool
	}{{"event loop", false}, {"goroutines", true}} {
		for _, proto := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
			t.Run(fmt.Sprintf("%s/%v", mode.name, proto), func(t *testing.T) {
				counter := startCancelCounter(t, db)
				ids := newBlockingIDs()
				p := startProxy(t, db, func(s *Server) {
					s.Upstream, s.Rewriter, s.IDs, s.GoroutineRelay = counter.addr(), rw, ids, mode.goroutines
				})
				conn := connectCancelling(t, p.url(db))
				ctx := testContext(t)

				cancelled := func(t *testing.T) {
					t.Helper()
					got, cancel := goStatement(t, func(ctx context.Context) error {
						return conn.QueryRow(ctx, "SELECT leaf_next('order')", proto).Scan(new(int64))
					})
					awaitSignal(ctx, t, ids.waiting, "the ID request")
					cancel()
					pgErr := wantSQLState(t, result(t, got, "the statement waiting for an ID"), "57014")
					if pgErr.Message != "canceling statement due to user request" {
						t.Fatalf("message %q", pgErr.Message)
					}
					if n := counter.cancels.Load(); n != 0 {
						t.Fatalf("%d cancel requests went to the database", n)
					}
				}

				cancelled(t)
				var n int
				if err := conn.QueryRow(ctx, "SELECT 42", proto).Scan(&n); err != nil || n != 42 {
					t.Fatalf("after the cancel: %d, %v", n, err)
				}

				if _, err := conn.Exec(ctx, "BEGIN", proto); err != nil {
					t.Fatal(err)
				}
				cancelled(t)
				_, err := conn.Exec(ctx, "SELECT 1", proto)
				wantSQLState(t, err, "25P02")
				if _, err := conn.Exec(ctx, "ROLLBACK", proto); err != nil {
					t.Fatal(err)
				}

				close(ids.release)
				var id int64
				if err := conn.QueryRow(ctx, "SELECT leaf_next('order')", proto).Scan(&id); err != nil || id != 1001 {
					t.Fatalf("leaf_next after the cancels: %d, %v (want the first ID: the cancelled waits took none)", id, err)
				}
				wantServedBy(t, p.srv, !mode.goroutines)
			})
		}
		t.Run(mode.name+"/psql", func(t *testing.T) {
			counter := startCancelCounter(t, db)
			ids := newBlockingIDs()
			p := startProxy(t, db, func(s *Server) {
				s.Upstream, s.Rewriter, s.IDs, s.GoroutineRelay = counter.addr(), rw, ids, mode.goroutines
			})
			psqlInterrupted(t, p.url(db), "SELECT leaf_next('order')", func() {
				awaitSignal(testContext(t), t, ids.waiting, "the ID request")
			})
			if n := counter.cancels.Load(); n != 0 {
				t.Fatalf("%d cancel requests went to the database", n)
			}
		})
	}
}

// TestCancelAfterWaitForwards checks that a session whose wait for an ID is over is
// cancelled at the database again: the wait leaves no trace in the cancel handling.
func TestCancelAfterWaitForwards(t *testing.T) {
	db := testenv.NewDatabase(t)
	rw, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	counter := startCancelCounter(t, db)
	ids := newBlockingIDs()
	p := startProxy(t, db, func(s *Server) { s.Upstream, s.Rewriter, s.IDs = counter.addr(), rw, ids })
	conn := connectCancelling(t, p.url(db))
	watcher := connect(t, db)
	ctx := testContext(t)
	close(ids.release)
	if err := conn.QueryRow(ctx, "SELECT leaf_next('order')").Scan(new(int64)); err != nil {
		t.Fatal(err)
	}
	awaitSignal(ctx, t, ids.waiting, "the ID request")
	sql := "SELECT pg_sleep(60) /* after a wait */"
	done, cancel := goStatement(t, func(ctx context.Context) error { _, err := conn.Exec(ctx, sql); return err })
	waitRunning(t, watcher, sql)
	cancel()
	wantSQLState(t, result(t, done, "the cancelled statement"), "57014")
	if n := counter.cancels.Load(); n != 1 {
		t.Fatalf("%d cancel requests went to the database, want 1", n)
	}
}

// TestCancelPipelinedReachesTheRunningStatement pipelines a long statement and, behind it,
// one whose ID does not come. The long one reaches the server at once (the wait does not
// hold it back), and one cancel request ends both: the server cancels the one it runs,
// the proxy the wait.
func TestCancelPipelinedReachesTheRunningStatement(t *testing.T) {
	db := testenv.NewDatabase(t)
	rw, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	watcher := connect(t, db)
	for _, mode := range []struct {
		name       string
		goroutines bool
	}{{"event loop", false}, {"goroutines", true}} {
		t.Run(mode.name, func(t *testing.T) {
			counter := startCancelCounter(t, db)
			ids := newBlockingIDs()
			p := startProxy(t, db, func(s *Server) {
				s.Upstream, s.Rewriter, s.IDs, s.GoroutineRelay = counter.addr(), rw, ids, mode.goroutines
			})
			hc := hijacked(t, p.url(db))
			fe := hc.Frontend
			sql := "SELECT pg_sleep(60) /* pipelined, " + mode.name + " */"
			fe.Send(&pgproto3.Query{String: sql})
			fe.Send(&pgproto3.Query{String: "SELECT leaf_next('order')"})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			waitRunning(t, watcher, sql)
			awaitSignal(testContext(t), t, ids.waiting, "the ID request")
			_ = hc.Conn.SetDeadline(time.Now().Add(30 * time.Second))
			expect := func(want string) {
				t.Helper()
				var got []string
				for len(got) == 0 || got[len(got)-1] != "ready" {
					msg, err := fe.Receive()
					if err != nil {
						t.Fatalf("after %q: %v", got, err)
					}
					switch m := msg.(type) {
					case *pgproto3.DataRow:
						got = append(got, "row:"+string(m.Values[0]))
					case *pgproto3.ErrorResponse:
						got = append(got, "error:"+m.Code)
					case *pgproto3.ReadyForQuery:
						got = append(got, "ready")
					}
				}
				if g := strings.Join(got, " "); g != want {
					t.Fatalf("got %q, want %q", g, want)
				}
			}

			sendCancel(t, p.addr, hc.PID, hc.SecretKey)
			expect("error:57014 ready") // pg_sleep, cancelled by the server
			expect("error:57014 ready") // the wait for the ID, cancelled by the proxy
			if n := counter.cancels.Load(); n != 1 {
				t.Fatalf("%d cancel requests went to the database, want 1", n)
			}
			fe.Send(&pgproto3.Query{String: "SELECT 42"})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			expect("row:42 ready")
		})
	}
}
