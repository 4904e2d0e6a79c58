//go:build linux && (amd64 || arm64)

package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"golang.org/x/sys/unix"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/rewrite"
)

// recvLoop returns a loop with a send batch and the receive batch over its ring.
func recvLoop(t *testing.T) *eventLoop {
	t.Helper()
	l := batchLoop(t)
	l.recv = newRecvBatch(l.batch)
	l.ends = make([]*loopEnd, 1)
	return l
}

// recvEnd adds a loop session's client side to l, over a socket pair, as the loop's
// table holds it; it returns the side, the event a wait reports when it is readable,
// and the other end of the pair.
func recvEnd(t *testing.T, l *eventLoop) (end *loopEnd, ev unix.EpollEvent, peer int) {
	t.Helper()
	end, peer = batchEnd(t, l)
	l.lastToken++
	end.token, end.slot = l.lastToken, int32(len(l.ends))
	end.src = fdSource{fd: end.fd}
	end.in = endReader{stream: &end.src}
	l.ends = append(l.ends, end)
	return end, end.epollEvent(unix.EPOLLIN), peer
}

// send writes p to fd, all of it.
func send(t *testing.T, fd int, p []byte) {
	t.Helper()
	for len(p) > 0 {
		n, err := unix.Write(fd, p)
		if err != nil {
			t.Fatal(err)
		}
		p = p[n:]
	}
}

// readEnd reads what end's session reads this turn, until its reader would block or ends.
func readEnd(t *testing.T, end *loopEnd) (got []byte, eof bool) {
	t.Helper()
	buf := make([]byte, 1000) // smaller than a slot: the held bytes take several reads
	for {
		n, err := end.in.Read(buf)
		got = append(got, buf[:n]...)
		switch {
		case errors.Is(err, errWouldBlock):
			return got, false
		case err == io.EOF:
			return got, true
		case err != nil:
			t.Fatal(err)
		}
	}
}

// The sockets of a turn are read in one go: each side's bytes wait, held, for its
// session, which reads them, and its socket only when the receive may have left more
// there (a full slot) or met its end; the event no longer reports the socket readable.
func TestRecvBatchReadsTheTurnsSockets(t *testing.T) {
	l := recvLoop(t)
	short, evShort, peerShort := recvEnd(t, l)
	long, evLong, peerLong := recvEnd(t, l)
	empty, evEmpty, _ := recvEnd(t, l)
	closed, evClosed, peerClosed := recvEnd(t, l)

	send(t, peerShort, []byte("Q\x00\x00\x00\x0dSELECT 1\x00"))
	big := bytes.Repeat([]byte("0123456789abcdef"), recvSlot/16+100) // more than a slot
	send(t, peerLong, big)
	unix.Close(peerClosed)
	events := []unix.EpollEvent{evShort, evLong, evEmpty, evClosed}
	l.recv.receive(l, events)

	for i, ev := range events {
		if ev.Events&unix.EPOLLIN != 0 {
			t.Errorf("event %d still reports its socket readable", i)
		}
	}
	if string(short.in.held) != "Q\x00\x00\x00\x0dSELECT 1\x00" || short.src.readable {
		t.Errorf("short: held %q, readable %v; want the message, not readable", short.in.held, short.src.readable)
	}
	if len(long.in.held) != recvSlot || !long.src.readable {
		t.Errorf("long: %d bytes held, readable %v; want a full slot, readable", len(long.in.held), long.src.readable)
	}
	if len(empty.in.held) != 0 || empty.src.readable {
		t.Errorf("empty: %d bytes held, readable %v; want none, not readable", len(empty.in.held), empty.src.readable)
	}
	if len(closed.in.held) != 0 || !closed.src.readable {
		t.Errorf("closed: %d bytes held, readable %v; want none, readable (for the end)", len(closed.in.held), closed.src.readable)
	}
	if got, _ := readEnd(t, long); !bytes.Equal(got, big) {
		t.Errorf("long side read %d bytes, not what was sent (%d bytes) in order", len(got), len(big))
	}
	if got, eof := readEnd(t, closed); len(got) != 0 || !eof {
		t.Errorf("closed side read %q, end %v; want the end", got, eof)
	}
	if got, eof := readEnd(t, empty); len(got) != 0 || eof {
		t.Errorf("empty side read %q, end %v; want nothing, no end", got, eof)
	}
	l.recv.release()
}

// Bytes a session left unread at the end of the turn get memory of their own (the next
// batch reuses its memory), and the session another turn to read them, as its socket,
// already read, may not be reported again; a session that ended or left the loop is not
// queued.
func TestRecvBatchReleaseKeepsUnreadBytes(t *testing.T) {
	l := recvLoop(t)
	unread, ev1, peer1 := recvEnd(t, l)
	gone, ev2, peer2 := recvEnd(t, l)
	readUp, ev3, peer3 := recvEnd(t, l)
	send(t, peer1, []byte("first message"))
	send(t, peer2, []byte("for no one"))
	send(t, peer3, []byte("read this turn"))
	l.recv.receive(l, []unix.EpollEvent{ev1, ev2, ev3})
	if _, err := unread.in.Read(make([]byte, 6)); err != nil { // "first "
		t.Fatal(err)
	}
	gone.ls.dead = true
	readEnd(t, readUp)

	l.recv.release()
	clear(l.recv.arena) // what the next batch would do to the memory
	if string(unread.in.held) != "message" {
		t.Errorf("unread bytes after the turn: %q, want %q", unread.in.held, "message")
	}
	if len(l.again) != 1 || l.again[0] != unread.ls || !unread.ls.queued {
		t.Errorf("queued for another turn: %d sessions; want the one with bytes unread", len(l.again))
	}
	if len(l.recv.ends) != 0 {
		t.Errorf("%d sockets still in the batch after its release", len(l.recv.ends))
	}
}

// The batch reads only what its session is about to read, and only when it saves a call:
// everything else is left to the session's own read, its event untouched.
func TestRecvBatchDeclines(t *testing.T) {
	for _, tc := range []struct {
		name  string
		shake func(end *loopEnd, ev *unix.EpollEvent)
	}{
		{"more than input reported", func(_ *loopEnd, ev *unix.EpollEvent) { ev.Events |= unix.EPOLLHUP }},
		{"an old token", func(_ *loopEnd, ev *unix.EpollEvent) { ev.Pad++ }},
		{"TLS", func(end *loopEnd, _ *unix.EpollEvent) { end.tls = &tls.Conn{} }},
		{"a pooled connection", func(end *loopEnd, _ *unix.EpollEvent) { end.pio = &physIO{} }},
		{"bytes held already", func(end *loopEnd, _ *unix.EpollEvent) { end.in.held = []byte("x") }},
		{"session ended", func(end *loopEnd, _ *unix.EpollEvent) { end.ls.dead = true }},
		{"session detached", func(end *loopEnd, _ *unix.EpollEvent) { end.ls.detached = true }},
		{"session finishing", func(end *loopEnd, _ *unix.EpollEvent) { end.ls.finishing = true }},
		{"output backed up", func(end *loopEnd, _ *unix.EpollEvent) { end.ls.upstream.sink.pending = []byte("x") }},
		{"streaming to the client", func(end *loopEnd, _ *unix.EpollEvent) { end.ls.streaming = 1 }},
		{"waiting for a server connection", func(end *loopEnd, _ *unix.EpollEvent) { end.ls.tx = &pooledConn{awaiting: true} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := recvLoop(t)
			other, evOther, peerOther := recvEnd(t, l)
			end, ev, peer := recvEnd(t, l)
			send(t, peerOther, []byte("other"))
			send(t, peer, []byte("mine"))
			tc.shake(end, &ev)
			held, want := end.in.held, ev.Events
			events := []unix.EpollEvent{evOther, ev}
			l.recv.receive(l, events)
			if events[1].Events != want || !bytes.Equal(end.in.held, held) {
				t.Errorf("socket read by the batch: event %#x (was %#x), held %q", events[1].Events, want, end.in.held)
			}
			if len(other.in.held) != 0 {
				t.Errorf("a lone socket read by the batch: held %q", other.in.held)
			}
			l.recv.release()
		})
	}
	t.Run("one socket", func(t *testing.T) {
		l := recvLoop(t)
		end, ev, peer := recvEnd(t, l)
		send(t, peer, []byte("mine"))
		events := []unix.EpollEvent{ev}
		l.recv.receive(l, events)
		if events[0].Events != unix.EPOLLIN || len(end.in.held) != 0 {
			t.Errorf("a lone socket read by the batch: event %#x, held %q", events[0].Events, end.in.held)
		}
	})
}

// detachingIDs never has an ID at hand, so every leaf_next detaches its session from the
// loop, but it gives one at once when asked to wait.
type detachingIDs struct{ stubIDs }

func (*detachingIDs) TryNext(string) (int64, bool)    { return 0, false }
func (*detachingIDs) TryNextSnowflake() (int64, bool) { return 0, false }

// oneLoopProxy starts a rewriting proxy over ids with one event loop, which receives in
// batches, and returns it with the URL of its database.
func oneLoopProxy(t *testing.T, ids IDSource) (*testProxy, string) {
	t.Helper()
	if SendBatchSupport() != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(SendBatchSupport())
		}
		t.Skip(SendBatchSupport())
	}
	db := testenv.NewDatabase(t)
	rw, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	return startProxy(t, db, func(s *Server) { s.Rewriter, s.IDs, s.EventLoops = rw, ids, 1 }), db
}

// A handler that detaches hands the loop to a new runner in the middle of a turn: the
// sockets of the sessions after it, already read by the turn's receive batch, are not
// reported again, and the next batch reuses the memory their bytes are in. Sessions that
// query all the time on one loop beside sessions that detach on every query must each
// get every answer, and the right one.
func TestRecvBatchDetachMidTurn(t *testing.T) {
	p, db := oneLoopProxy(t, &detachingIDs{})
	ctx := testContext(t)
	const clients, queries = 4, 150
	errs := make(chan error, 2*clients)
	for i := range 2 * clients {
		conn := connect(t, p.url(db))
		detaching := i%2 == 0
		go func() {
			errs <- func() error {
				last := int64(0)
				for q := range queries {
					if detaching {
						var id int64
						if err := conn.QueryRow(ctx, "SELECT leaf_next('order')").Scan(&id); err != nil {
							return fmt.Errorf("leaf_next %d: %w", q, err)
						}
						if id <= last {
							return fmt.Errorf("leaf_next %d gave %d after %d", q, id, last)
						}
						last = id
						continue
					}
					want := strings.Repeat("x", q%64) + itoa(q)
					var got string
					if err := conn.QueryRow(ctx, "SELECT $1::text", want).Scan(&got); err != nil || got != want {
						return fmt.Errorf("query %d: %q, %v; want %q", q, got, err, want)
					}
				}
				return nil
			}()
		}()
	}
	for range 2 * clients {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if n := loopRunners(t, p.srv); n < queries {
		t.Errorf("the loop changed runners %d times, want one for each leaf_next at least", n)
	}
}

// The deterministic case of the above: the loop's turn reports a session that detaches
// (its leaf_next waits until the test lets it) and, after it, another whose query the
// turn's batch has read already. The second session must be answered while the first
// one still waits: the new runner sees no event for its socket, whose bytes the batch
// took, so the session must be handed to it as work to do.
func TestRecvBatchDetachHandsOnReadSessions(t *testing.T) {
	ids := newBlockingIDs()
	p, db := oneLoopProxy(t, ids)
	ctx := testContext(t)
	waiter, other := connect(t, p.url(db)), connect(t, p.url(db))
	defer close(ids.release)

	// Hold the loop while both queries arrive, so that one wait reports both sockets, the
	// waiter's first.
	l, gate := holdLoop(ctx, t, p)
	raw(t, waiter, "SELECT leaf_next('order')")
	raw(t, other, "SELECT 'answered meanwhile'")
	for _, end := range l.ends {
		if end != nil && end.ls != nil && end == &end.ls.client {
			awaitReadable(t, end.fd)
		}
	}
	close(gate)
	awaitSignal(ctx, t, ids.waiting, "the ID request")
	got := rawAnswer(ctx, t, other)
	if got != "answered meanwhile" {
		t.Fatalf("the other session's answer: %q", got)
	}
}

// breakableLoop is recvLoop with a function that makes its ring fail every call from
// then on, as a kernel refusing io_uring_enter would: the ring's descriptor is made to
// refer to /dev/null (its memory stays mapped).
func breakableLoop(t *testing.T) (*eventLoop, func()) {
	t.Helper()
	before := ringDescriptors(t)
	l := recvLoop(t)
	var fd int
	for d := range ringDescriptors(t) {
		if !before[d] {
			if fd != 0 {
				t.Fatal("another io_uring opened meanwhile: cannot tell the loop's")
			}
			fd = d
		}
	}
	if fd == 0 {
		t.Fatal("the loop's io_uring descriptor not found")
	}
	return l, func() {
		null, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(null)
		if err := unix.Dup3(null, fd, unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
	}
}

// ringDescriptors returns the process's io_uring descriptors.
func ringDescriptors(t *testing.T) map[int]bool {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	fds := make(map[int]bool)
	for _, e := range entries {
		if link, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && link == "anon_inode:[io_uring]" {
			fd, _ := strconv.Atoi(e.Name())
			fds[fd] = true
		}
	}
	return fds
}

// When the ring refuses a call, the receives it holds unsubmitted would go with the
// next call, into memory reused by then: the sessions read their sockets themselves,
// and neither batch uses the ring again.
func TestRecvBatchRingFailure(t *testing.T) {
	l, breakRing := breakableLoop(t)
	a, evA, peerA := recvEnd(t, l)
	b, evB, peerB := recvEnd(t, l)
	send(t, peerA, []byte("for a"))
	send(t, peerB, []byte("for b"))
	breakRing()
	l.recv.receive(l, []unix.EpollEvent{evA, evB})
	for _, end := range []*loopEnd{a, b} {
		if len(end.in.held) != 0 || !end.src.readable {
			t.Errorf("after the failed call: held %q, readable %v; want the socket for the session", end.in.held, end.src.readable)
		}
	}
	if got, _ := readEnd(t, a); string(got) != "for a" {
		t.Errorf("session a read %q", got)
	}
	if !l.recv.failed || !l.batch.failed {
		t.Errorf("batches failed: receive %v, send %v; want both", l.recv.failed, l.batch.failed)
	}
	l.recv.release()
	send(t, peerA, []byte("again"))
	events := []unix.EpollEvent{evA, evB}
	l.recv.receive(l, events)
	if events[0].Events != unix.EPOLLIN || len(a.in.held) != 0 {
		t.Errorf("the failed batch read a socket again: event %#x, held %q", events[0].Events, a.in.held)
	}
}

// When the ring refuses a call, the turn's bytes go one by one, and later turns' too: the
// sends left in the ring would go again with the next call.
func TestSendBatchRingFailure(t *testing.T) {
	l, breakRing := breakableLoop(t)
	a, peerA := batchEnd(t, l)
	b, peerB := batchEnd(t, l)
	l.batch.deferSend(a, []byte("to a"))
	l.batch.deferSend(b, []byte("to b"))
	breakRing()
	l.batch.send()
	if got := readAll(t, peerA); string(got) != "to a" {
		t.Errorf("socket a got %q", got)
	}
	if got := readAll(t, peerB); string(got) != "to b" {
		t.Errorf("socket b got %q", got)
	}
	if !l.batch.failed {
		t.Fatal("the batch goes on using a ring that failed")
	}
	if l.batch.deferSend(a, []byte("later")) {
		t.Error("deferred to a failed batch")
	}
}

// One wait reports a session's server side, with the answer to a query, and its client
// side, with the next query, whose leaf_next must wait: the batch reads both, and the
// session handles its client's bytes first (as it does whenever both are at hand), so it
// detaches with the server's answer held in the batch's memory. That answer must reach the
// client once the session is back, whole and before the next one. The loop is held while
// both arrive.
func TestRecvBatchDetachWithServerBytesHeld(t *testing.T) {
	ids := newBlockingIDs()
	p, db := oneLoopProxy(t, ids)
	ctx := testContext(t)
	client := connect(t, p.url(db))
	direct := connect(t, db)
	released := false
	defer func() {
		if !released {
			close(ids.release)
		}
	}()

	// The server answers once the test lets go of a lock the query waits for, with the
	// loop held.
	if _, err := direct.Exec(ctx, "SELECT pg_advisory_lock(4242)"); err != nil {
		t.Fatal(err)
	}
	const first = "SELECT pg_advisory_lock(4242), 'before the wait' AS detach_order"
	raw(t, client, first)
	waitFor(t, 30*time.Second, "the first query to reach the server", func() error {
		var n int
		err := direct.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'active'", first).Scan(&n)
		if err == nil && n != 1 {
			err = errors.New("no backend runs the first query")
		}
		return err
	})
	l, gate := holdLoop(ctx, t, p)
	session := loopSessionOf(t, l)
	if _, err := direct.Exec(ctx, "SELECT pg_advisory_unlock(4242)"); err != nil {
		t.Fatal(err)
	}
	awaitReadable(t, session.upstream.fd) // the answer, at the proxy
	raw(t, client, "SELECT leaf_next('order')")
	awaitReadable(t, session.client.fd)
	close(gate)
	awaitSignal(ctx, t, ids.waiting, "the ID request")
	// The new runner, held in turn, has not ended a turn yet: the batch's memory, which
	// its next batch would reuse, is cleared as that would overwrite it.
	l, gate = holdLoop(ctx, t, p)
	if len(session.upstream.in.held) == 0 {
		t.Fatal("the session detached without the server's answer held: the case is not built")
	}
	clear(l.recv.arena)
	close(gate)
	close(ids.release)
	released = true
	if got := rawAnswer(ctx, t, client); got != "before the wait" {
		t.Fatalf("the first answer: %q", got)
	}
	if got := rawAnswer(ctx, t, client); got != "1001" {
		t.Fatalf("leaf_next's answer: %q, want 1001", got)
	}
	var n int
	if err := client.QueryRow(ctx, "SELECT 7").Scan(&n); err != nil || n != 7 {
		t.Fatalf("a query after both: %d, %v", n, err)
	}
}

// holdLoop holds p's only event loop in a posted function until gate is closed.
func holdLoop(ctx context.Context, t *testing.T, p *testProxy) (l *eventLoop, gate chan struct{}) {
	t.Helper()
	p.srv.loops.mu.Lock()
	l = p.srv.loops.loops[0]
	p.srv.loops.mu.Unlock()
	held, gate := make(chan struct{}), make(chan struct{})
	l.post(func() { close(held); <-gate })
	awaitSignal(ctx, t, held, "the loop to run the posted function")
	return l, gate
}

// loopSessionOf returns the only session of a loop that holdLoop holds.
func loopSessionOf(t *testing.T, l *eventLoop) *loopSession {
	t.Helper()
	var ls *loopSession
	for _, end := range l.ends {
		if end != nil && end.ls != nil && end.ls != ls {
			if ls != nil {
				t.Fatal("more than one session on the loop")
			}
			ls = end.ls
		}
	}
	if ls == nil {
		t.Fatal("no session on the loop")
	}
	return ls
}

// raw sends sql as a simple Query on conn's socket, past pgx.
func raw(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	msg, err := (&pgproto3.Query{String: sql}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.PgConn().Conn().Write(msg); err != nil {
		t.Fatal(err)
	}
}

// rawAnswer reads the answer to a Query sent with raw, up to its ReadyForQuery, and
// returns the last column of its last row.
func rawAnswer(ctx context.Context, t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var got string
	for {
		msg, err := conn.PgConn().ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("reading an answer: %v", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.DataRow:
			got = string(msg.Values[len(msg.Values)-1])
		case *pgproto3.ErrorResponse:
			t.Fatalf("error answer: %s %s", msg.Code, msg.Message)
		case *pgproto3.ReadyForQuery:
			return got
		}
	}
}

// awaitReadable waits until fd has bytes to read, without reading them.
func awaitReadable(t *testing.T, fd int) {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		if n, err := unix.Poll(fds, 1000); n == 1 || (err != nil && err != unix.EINTR) {
			if err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("socket %d not readable after 30 s", fd)
}
