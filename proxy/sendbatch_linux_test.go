//go:build linux && (amd64 || arm64)

package proxy

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// batchEnd is a loop session's client side over one end of a socket pair, in a loop with
// a send batch; peer is the other end, non-blocking.
func batchEnd(t *testing.T, l *eventLoop) (end *loopEnd, peer int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	ls := &loopSession{loop: l}
	end = &ls.client
	end.ls, end.fd, end.sink = ls, fds[0], fdSink{fd: fds[0]}
	return end, fds[1]
}

// batchLoop returns a loop with a send batch; without io_uring the test is skipped,
// except under CI.
func batchLoop(t *testing.T) *eventLoop {
	t.Helper()
	b := newSendBatch()
	if b == nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no io_uring for the send batch")
		}
		t.Skip("no io_uring for the send batch")
	}
	t.Cleanup(b.close)
	return &eventLoop{batch: b}
}

// readAll reads what peer holds now.
func readAll(t *testing.T, peer int) []byte {
	t.Helper()
	var got []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(peer, buf)
		if errors.Is(err, unix.EAGAIN) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return got
		}
		got = append(got, buf[:n]...)
	}
}

func TestSendBatchSendsAtTurnEnd(t *testing.T) {
	l := batchLoop(t)
	a, peerA := batchEnd(t, l)
	b, peerB := batchEnd(t, l)
	l.batch.deferSend(a, []byte("first "))
	l.batch.deferSend(a, []byte("second"))
	l.batch.deferSend(b, []byte("other"))
	if got := readAll(t, peerA); len(got) != 0 {
		t.Fatalf("sent before the turn ended: %q", got)
	}
	l.batch.send()
	if got := readAll(t, peerA); string(got) != "first second" {
		t.Errorf("socket a got %q", got)
	}
	if got := readAll(t, peerB); string(got) != "other" {
		t.Errorf("socket b got %q", got)
	}
	// Bytes for a socket whose deferred ones are not the batch's last: those go at once,
	// the new ones at the end of the turn.
	l.batch.deferSend(a, []byte("third "))
	l.batch.deferSend(b, []byte("more"))
	l.batch.deferSend(a, []byte("fourth"))
	if got := readAll(t, peerA); string(got) != "third " {
		t.Errorf("socket a got %q before the turn ended", got)
	}
	l.batch.send()
	if got := readAll(t, peerA); string(got) != "fourth" {
		t.Errorf("socket a got %q", got)
	}
	if got := readAll(t, peerB); string(got) != "more" {
		t.Errorf("socket b got %q", got)
	}
	if len(l.again) != 0 {
		t.Errorf("%d sessions to settle again after complete sends", len(l.again))
	}
	l.batch.send() // nothing left: nothing goes twice
	if got := readAll(t, peerA); len(got) != 0 {
		t.Errorf("sent again: %q", got)
	}
}

// A write to a socket with deferred bytes sends them first.
func TestSendBatchWriteGoesAfterDeferred(t *testing.T) {
	l := batchLoop(t)
	end, peer := batchEnd(t, l)
	l.batch.deferSend(end, []byte("deferred,"))
	_, _ = end.sink.Write([]byte("written"))
	if got := readAll(t, peer); string(got) != "deferred,written" {
		t.Fatalf("peer got %q", got)
	}
	l.batch.deferSend(end, []byte(" and later"))
	l.batch.send()
	if got := readAll(t, peer); string(got) != " and later" {
		t.Fatalf("after the turn the peer got %q", got)
	}
}

// A socket leaving the loop (to be closed or handed on) takes its deferred bytes with it.
func TestSendBatchRemoveSendsDeferred(t *testing.T) {
	l := batchLoop(t)
	end, peer := batchEnd(t, l)
	l.batch.deferSend(end, []byte("last words"))
	l.remove(end)
	if got := readAll(t, peer); string(got) != "last words" {
		t.Fatalf("peer got %q", got)
	}
	l.batch.send()
	if got := readAll(t, peer); len(got) != 0 {
		t.Fatalf("sent again: %q", got)
	}
}

// A socket listed twice (its session deferring, sending and deferring again in one turn)
// sends each byte once.
func TestSendBatchListedTwiceSendsOnce(t *testing.T) {
	l := batchLoop(t)
	end, peer := batchEnd(t, l)
	l.batch.deferSend(end, []byte("once"))
	l.batch.ends = append(l.batch.ends, end)
	l.batch.send()
	if got := readAll(t, peer); string(got) != "once" {
		t.Fatalf("peer got %q", got)
	}
}

// What the socket does not take stays pending, in order, and the session settles again.
func TestSendBatchShortSendLeavesRestPending(t *testing.T) {
	l := batchLoop(t)
	end, peer := batchEnd(t, l)
	if err := unix.SetsockoptInt(end.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4096); err != nil {
		t.Fatal(err)
	}
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	l.batch.deferSend(end, payload)
	l.batch.send()
	if len(end.sink.pending) == 0 {
		t.Fatal("the socket took 1 MiB at once; nothing to test")
	}
	if len(l.again) != 1 || l.again[0] != end.ls {
		t.Fatalf("the session was not given another turn: %v", l.again)
	}
	got := readAll(t, peer)
	for len(end.sink.pending) > 0 {
		end.sink.flush()
		got = append(got, readAll(t, peer)...)
	}
	if end.sink.err != nil {
		t.Fatal(end.sink.err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("peer got %d bytes, not the 1 MiB sent in order", len(got))
	}
}

// A failed send leaves its error for the session, which settles again.
func TestSendBatchFailedSendKeepsError(t *testing.T) {
	l := batchLoop(t)
	end, peer := batchEnd(t, l)
	unix.Close(peer)
	l.batch.deferSend(end, []byte("to nobody"))
	l.batch.send()
	if !errors.Is(end.sink.err, unix.EPIPE) && !errors.Is(end.sink.err, unix.ECONNRESET) {
		t.Fatalf("sink error %v, want EPIPE or ECONNRESET", end.sink.err)
	}
	if len(l.again) != 1 {
		t.Fatalf("the session was not given another turn")
	}
}

// Without a batch, or with output pending for the socket, nothing is deferred: the
// caller writes.
func TestSendBatchDeclines(t *testing.T) {
	l := &eventLoop{}
	end, _ := batchEnd(t, l)
	if l.batch.deferSend(end, []byte("now")) {
		t.Fatal("deferred without a batch")
	}
	l = batchLoop(t)
	end, _ = batchEnd(t, l)
	end.sink.pending = []byte("earlier")
	if l.batch.deferSend(end, []byte("later")) {
		t.Fatal("deferred behind pending output")
	}
	end.sink.pending, end.sink.err = nil, unix.EPIPE
	if l.batch.deferSend(end, []byte("later")) {
		t.Fatal("deferred to a failed socket")
	}
}

// A loop started with plainSends (Server.PlainSends, io-uring: false) has no batch; one
// started without has, where io_uring is at hand.
func TestLoopGroupPlainSends(t *testing.T) {
	for _, plain := range []bool{true, false} {
		var g loopGroup
		l, err := g.assign(1, plain)
		if err != nil {
			t.Fatal(err)
		}
		hasBatch := make(chan bool)
		l.post(func() { hasBatch <- l.batch != nil })
		got := <-hasBatch
		g.release(l)
		g.close()
		<-l.done
		if plain && got {
			t.Error("a loop with plain sends has a send batch")
		}
		if !plain && !got && (os.Getenv("CI") != "" || SendBatchSupport() == nil) {
			t.Errorf("a loop without plain sends has no send batch (io_uring: %v)", SendBatchSupport())
		}
	}
}
