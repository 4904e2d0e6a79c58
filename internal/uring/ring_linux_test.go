//go:build linux && (amd64 || arm64)

package uring

import (
	"bytes"
	"errors"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// newRing sets up a ring for a test, on the test's goroutine with its thread locked.
// Under CI a kernel without io_uring fails the test instead of skipping it.
func newRing(t testing.TB, entries uint32) *Ring {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	r, err := New(entries)
	if errors.Is(err, ErrUnsupported) && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// loopbackPair returns the two ends of a loopback TCP connection as non-blocking
// descriptors of the test's.
func loopbackPair(t testing.TB) (a, b int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	dialed, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer dialed.Close()
	acc := <-accepted
	if acc == nil {
		t.Fatal("accept failed")
	}
	defer acc.Close()
	return dupFd(t, dialed), dupFd(t, acc)
}

func dupFd(t testing.TB, c net.Conn) int {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	var dupErr error
	if err := rc.Control(func(s uintptr) { fd, dupErr = unix.Dup(int(s)) }); err != nil || dupErr != nil {
		t.Fatal(err, dupErr)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// reap returns the completions in the ring and consumes them.
func reap(r *Ring) []CQE {
	first, second := r.Completions()
	out := append(append([]CQE(nil), first...), second...)
	r.Consume(len(out))
	return out
}

// A send with MSG_DONTWAIT has completed, with its count, when Enter returns without
// waiting: the event loop relies on it to know its buffer free and its completion there.
func TestSendCompletesDuringSubmit(t *testing.T) {
	r := newRing(t, 8)
	a, b := loopbackPair(t)
	msg := []byte("Q\x00\x00\x00\x0dSELECT 1\x00")
	if err := r.PrepSend(a, msg, unix.MSG_NOSIGNAL, 7); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Enter(0, -1); err != nil || n != 1 {
		t.Fatalf("Enter = %d, %v; want 1 submitted", n, err)
	}
	got := reap(r)
	if len(got) != 1 || got[0].UserData != 7 || got[0].Res != int32(len(msg)) {
		t.Fatalf("completions right after the submit: %+v; want the send's, with %d bytes", got, len(msg))
	}
	buf := make([]byte, 64)
	n, err := waitRead(b, buf)
	if err != nil || !bytes.Equal(buf[:n], msg) {
		t.Fatalf("peer read %q, %v", buf[:n], err)
	}
}

// A send the socket cannot take fails at once with EAGAIN, instead of waiting in the
// kernel for room; what it could take it reports as a short count.
func TestSendToFullSocketFailsAtOnce(t *testing.T) {
	r := newRing(t, 8)
	a, _ := loopbackPair(t)
	chunk := make([]byte, 1<<16)
	short := false
	for i := 0; ; i++ {
		if i > 10000 {
			t.Fatal("the socket never filled up")
		}
		if err := r.PrepSend(a, chunk, unix.MSG_NOSIGNAL, uint64(i)); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Enter(0, -1); err != nil {
			t.Fatal(err)
		}
		got := reap(r)
		if len(got) != 1 {
			t.Fatalf("send %d: %d completions right after the submit, want 1", i, len(got))
		}
		res := got[0].Res
		if res > 0 && res < int32(len(chunk)) {
			short = true
		}
		if res == -int32(unix.EAGAIN) {
			break
		}
		if res <= 0 {
			t.Fatalf("send %d: %d", i, res)
		}
	}
	t.Logf("a short send came before EAGAIN: %v", short)
}

// A receive on a non-blocking socket with no data waits in the kernel, and completes
// with a provided buffer holding the data once the peer writes; Enter with wait 1 sleeps
// until then.
func TestRecvWaitsForData(t *testing.T) {
	r := newRing(t, 8)
	bufs, err := r.NewBufRing(1, 4, 4096)
	if err != nil {
		t.Fatal(err)
	}
	a, b := loopbackPair(t)
	if err := r.PrepRecv(b, 1, false, 42); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Enter(0, -1); err != nil {
		t.Fatal(err)
	}
	if got := reap(r); len(got) != 0 {
		t.Fatalf("a receive with no data completed: %+v", got)
	}
	go func() {
		time.Sleep(50 * time.Millisecond) // the wait below is what is being tested
		_, _ = unix.Write(a, []byte("hello"))
	}()
	start := time.Now()
	if _, err := r.Enter(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	got := reap(r)
	if len(got) != 1 || got[0].UserData != 42 || got[0].Res != 5 || got[0].Flags&FlagBuffer == 0 {
		t.Fatalf("after %v: %+v; want the receive's completion with 5 bytes in a buffer", time.Since(start), got)
	}
	id := got[0].BufferID()
	if data := bufs.Buffer(id, int(got[0].Res)); string(data) != "hello" {
		t.Fatalf("buffer %d holds %q", id, data)
	}
	bufs.Recycle(id)
}

// Enter's wait counts the completions of its own submission: waiting for one more than
// the sends submitted returns on the next receive, not on the sends.
func TestWaitBeyondSends(t *testing.T) {
	r := newRing(t, 8)
	if _, err := r.NewBufRing(1, 4, 4096); err != nil {
		t.Fatal(err)
	}
	a, b := loopbackPair(t)
	c, d := loopbackPair(t)
	if err := r.PrepRecv(b, 1, false, 1); err != nil {
		t.Fatal(err)
	}
	if err := r.PrepSend(c, []byte("x"), unix.MSG_NOSIGNAL, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Enter(2, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got := reap(r); len(got) != 1 || got[0].UserData != 2 {
		t.Fatalf("with no data for the receive: %+v; want the send's completion alone, after the timeout", got)
	}
	if _, err := unix.Write(a, []byte("y")); err != nil {
		t.Fatal(err)
	}
	if err := r.PrepSend(c, []byte("z"), unix.MSG_NOSIGNAL, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Enter(2, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	got := reap(r)
	if len(got) != 2 {
		t.Fatalf("completions: %+v; want the send's and the receive's", got)
	}
	_ = d
}

// A cancelled receive completes with ECANCELED and takes no buffer.
func TestCancelRecv(t *testing.T) {
	r := newRing(t, 8)
	bufs, err := r.NewBufRing(1, 1, 4096)
	if err != nil {
		t.Fatal(err)
	}
	a, b := loopbackPair(t)
	if err := r.PrepRecv(b, 1, false, 5); err != nil {
		t.Fatal(err)
	}
	if err := r.PrepCancel(5, 6); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Enter(2, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	res := map[uint64]int32{}
	for _, c := range reap(r) {
		res[c.UserData] = c.Res
	}
	if res[5] != -int32(unix.ECANCELED) || res[6] != 0 {
		t.Fatalf("results by request: %v; want the receive cancelled and the cancel done", res)
	}
	// The ring's only buffer is still there for the next receive.
	if _, err := unix.Write(a, []byte("after")); err != nil {
		t.Fatal(err)
	}
	if err := r.PrepRecv(b, 1, false, 7); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Enter(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	got := reap(r)
	if len(got) != 1 || got[0].Res != 5 || string(bufs.Buffer(got[0].BufferID(), 5)) != "after" {
		t.Fatalf("receive after the cancel: %+v", got)
	}
}

// With every provided buffer taken, a receive fails with ENOBUFS: the loop then arms it
// again once it has given buffers back.
func TestRecvWithoutBuffers(t *testing.T) {
	r := newRing(t, 8)
	bufs, err := r.NewBufRing(1, 1, 64)
	if err != nil {
		t.Fatal(err)
	}
	a, b := loopbackPair(t)
	if _, err := unix.Write(a, []byte("one")); err != nil {
		t.Fatal(err)
	}
	_ = r.PrepRecv(b, 1, false, 1)
	if _, err := r.Enter(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	first := reap(r)
	if len(first) != 1 || first[0].Res != 3 {
		t.Fatalf("first receive: %+v", first)
	}
	if _, err := unix.Write(a, []byte("two")); err != nil {
		t.Fatal(err)
	}
	_ = r.PrepRecv(b, 1, false, 2)
	if _, err := r.Enter(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	second := reap(r)
	if len(second) != 1 || second[0].Res != -int32(unix.ENOBUFS) {
		t.Fatalf("receive with no buffer left: %+v; want ENOBUFS", second)
	}
	bufs.Recycle(first[0].BufferID())
	_ = r.PrepRecv(b, 1, false, 3)
	if _, err := r.Enter(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	third := reap(r)
	if len(third) != 1 || third[0].Res != 3 || string(bufs.Buffer(third[0].BufferID(), 3)) != "two" {
		t.Fatalf("receive after the buffer came back: %+v", third)
	}
}

// A peer's close completes a waiting receive with 0 bytes.
func TestRecvSeesClose(t *testing.T) {
	r := newRing(t, 8)
	if _, err := r.NewBufRing(1, 2, 64); err != nil {
		t.Fatal(err)
	}
	a, b := loopbackPair(t)
	_ = r.PrepRecv(b, 1, false, 1)
	if _, err := r.Enter(0, -1); err != nil {
		t.Fatal(err)
	}
	unix.Close(a)
	if _, err := r.Enter(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := reap(r); len(got) != 1 || got[0].Res != 0 {
		t.Fatalf("after the peer closed: %+v; want a receive of 0 bytes", got)
	}
}

// A multishot poll of an eventfd completes each time it is written, and stays armed.
func TestPollEventfd(t *testing.T) {
	r := newRing(t, 8)
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	_ = r.PrepPoll(efd, unix.POLLIN, true, 9)
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	var drain [8]byte
	for i := range 3 {
		if _, err := unix.Write(efd, one); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Enter(1, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		got := reap(r)
		if len(got) != 1 || got[0].UserData != 9 || got[0].Flags&FlagMore == 0 {
			t.Fatalf("wake-up %d: %+v; want the poll's completion, still armed", i, got)
		}
		if _, err := unix.Read(efd, drain[:]); err != nil {
			t.Fatal(err)
		}
	}
}

// waitRead reads fd, non-blocking, until data comes or 30 s pass.
func waitRead(fd int, p []byte) (int, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := unix.Read(fd, p)
		if err != unix.EAGAIN || time.Now().After(deadline) {
			return n, err
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		_, _ = unix.Poll(pfd, 1000)
	}
}

// A receive into the caller's buffer with MSG_DONTWAIT has completed when Enter returns
// without waiting, on a sender ring that no thread is locked to: with the bytes at hand
// (no more than the buffer holds, the rest left in the socket), with -EAGAIN on an empty
// socket, and with 0 once the peer has closed. The event loop receives a turn's ready
// sockets this way and relies on the buffer being written, and free, once Enter returns.
func TestRecvNowCompletesDuringSubmit(t *testing.T) {
	r, err := NewSender(8)
	if errors.Is(err, ErrUnsupported) && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	a, b := loopbackPair(t)
	recvNow := func(p []byte) CQE {
		t.Helper()
		if err := r.PrepRecvNow(a, p, 0, 3); err != nil {
			t.Fatal(err)
		}
		if n, err := r.Enter(0, -1); err != nil || n != 1 {
			t.Fatalf("Enter = %d, %v; want 1 submitted", n, err)
		}
		got := reap(r)
		if len(got) != 1 || got[0].UserData != 3 {
			t.Fatalf("completions right after the submit: %+v; want the receive's", got)
		}
		return got[0]
	}
	buf := make([]byte, 8)
	if res := recvNow(buf).Res; res != -int32(unix.EAGAIN) {
		t.Fatalf("receive on an empty socket: %d, want -EAGAIN", res)
	}
	msg := []byte("Z\x00\x00\x00\x05I")
	msg = append(msg, msg...) // 12 bytes: more than the buffer
	if _, err := unix.Write(b, msg); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for len(got) < len(msg) {
		res := recvNow(buf).Res
		switch {
		case res == -int32(unix.EAGAIN):
			waitReadable(t, a) // loopback delivers at once, but do not rely on it
		case res <= 0 || int(res) > len(buf):
			t.Fatalf("receive with data sent: %d", res)
		default:
			got = append(got, buf[:res]...)
		}
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("received %q, want %q", got, msg)
	}
	unix.Close(b)
	for {
		res := recvNow(buf).Res
		if res == 0 {
			break
		}
		if res != -int32(unix.EAGAIN) {
			t.Fatalf("receive after the peer's close: %d, want 0", res)
		}
		waitReadable(t, a)
	}
}

// waitReadable waits until fd has data or an end to report.
func waitReadable(t *testing.T, fd int) {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if _, err := unix.Poll(fds, 30_000); err != nil && err != unix.EINTR {
		t.Fatal(err)
	}
}
