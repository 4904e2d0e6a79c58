package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection, closed when the test ends.
func tcpPair(t *testing.T) (dialed, accepted net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	accepted, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dialed.Close(); accepted.Close() })
	return dialed, accepted
}

// TestFdConn: an fdConn reads and writes its socket blocking in poll(2), with deadlines,
// sees the peer's close, peeks without reading (quiet), and goes back into the runtime's
// poller for a session served by goroutines (inRuntimePoller), where a deadline set by
// another goroutine wakes a blocked read, as the goroutine relay's hand-back of a server
// connection needs.
func TestFdConn(t *testing.T) {
	ours, peer := tcpPair(t)
	fd, err := dupSocket(ours)
	if err != nil {
		t.Fatal(err)
	}
	ours.Close()
	fc := &fdConn{fd: fd, local: peer.RemoteAddr(), remote: peer.LocalAddr()}

	if !fc.quiet() {
		t.Fatal("a socket nothing was sent to is not quiet")
	}
	if _, err := peer.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the byte to arrive", func() error {
		if fc.quiet() {
			return errors.New("still quiet")
		}
		return nil
	})
	b := make([]byte, 4)
	if _, err := io.ReadFull(fc, b); err != nil || string(b) != "ping" {
		t.Fatalf("read %q, %v", b, err)
	}
	_ = fc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := fc.Read(b); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
	_ = fc.SetDeadline(time.Time{})
	if _, err := fc.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(peer, b); err != nil || string(b) != "pong" {
		t.Fatalf("peer read %q, %v", b, err)
	}

	sc := &serverConn{nc: fc, r: msgReader{br: bufio.NewReader(fc)}, w: bufio.NewWriter(fc)}
	if err := sc.inRuntimePoller(); err != nil {
		t.Fatal(err)
	}
	if _, ok := sc.nc.(*net.TCPConn); !ok {
		t.Fatalf("server connection is a %T after inRuntimePoller, want *net.TCPConn", sc.nc)
	}
	if err := fc.Close(); err != nil {
		t.Fatalf("closing the fdConn whose descriptor was taken: %v", err)
	}
	done := make(chan error, 1)
	go func() { _, err := sc.r.br.ReadByte(); done <- err }()
	time.AfterFunc(20*time.Millisecond, func() { _ = sc.nc.SetReadDeadline(time.Now()) })
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("blocked read ended with %v, want a deadline error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a deadline set by another goroutine did not wake the blocked read")
	}

	sc.nc.Close()
	if _, err := peer.Read(b); err != io.EOF {
		t.Fatalf("peer read after close: %v, want EOF", err)
	}
}
