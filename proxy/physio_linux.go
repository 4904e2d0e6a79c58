//go:build linux

package proxy

import (
	"bufio"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// physIO is the socket of a pooled server connection (physConn) when event loops serve
// the sessions of transaction mode. The connection logs in over the runtime's socket;
// then its descriptor is duplicated and the original closed, so that the socket leaves
// the runtime's poller, whose threads would otherwise wake for every answer of the
// server. From then on the event loop of the session that borrows the connection reads
// and writes it without blocking (onLoop), and everyone else (the pool resetting or
// closing it, a session served by goroutines) with poll(2), which blocks.
type physIO struct {
	src    fdSource
	sink   fdSink
	onLoop bool // a loop session holds it: Read and Write never block
	tls    bool // TLS runs over it

	readDeadline, writeDeadline time.Time
	closed                      atomic.Bool
	local, remote               net.Addr
}

// loopNative moves p's socket out of the runtime's poller, onto a physIO; p has just
// logged in, over its original socket.
func (p *physConn) loopNative() error {
	sock, tc, ok := loopSocket(p.nc)
	if !ok {
		return errors.New("the server connection is no TCP or Unix socket")
	}
	fd, err := dupSocket(sock)
	if err != nil {
		return err
	}
	x := &physIO{src: fdSource{fd: fd}, sink: fdSink{fd: fd}, local: sock.LocalAddr(), remote: sock.RemoteAddr()}
	held := bufferedCopy(p.br)
	if tc != nil {
		x.tls = true
		t := tc.NetConn().(*tlsTransport)
		t.r, t.w = x, x
		p.br = bufio.NewReaderSize(&endReader{held: held, stream: tc}, readBufferSize)
	} else {
		p.nc = x
		p.br = bufio.NewReaderSize(&endReader{held: held, stream: x}, readBufferSize)
	}
	p.io = x
	sock.Close()
	return nil
}

func (x *physIO) Read(b []byte) (int, error) {
	if x.onLoop {
		return x.src.Read(b)
	}
	for {
		x.src.readable = true
		n, err := x.src.Read(b)
		if !isWouldBlock(err) {
			return n, err
		}
		if err := x.wait(unix.POLLIN, x.readDeadline); err != nil {
			return 0, err
		}
	}
}

func (x *physIO) Write(b []byte) (int, error) {
	if x.onLoop {
		return x.sink.Write(b)
	}
	if x.sink.err != nil {
		return 0, x.sink.err
	}
	// Output a loop left unwritten goes first.
	for len(x.sink.pending) > 0 {
		x.sink.flush()
		if x.sink.err != nil {
			return 0, x.sink.err
		}
		if len(x.sink.pending) > 0 {
			if err := x.wait(unix.POLLOUT, x.writeDeadline); err != nil {
				return 0, err
			}
		}
	}
	written := 0
	for written < len(b) {
		written += x.sink.write(b[written:])
		if x.sink.err != nil {
			return written, x.sink.err
		}
		if written < len(b) {
			if err := x.wait(unix.POLLOUT, x.writeDeadline); err != nil {
				return written, err
			}
		}
	}
	return written, nil
}

// wait blocks until the socket is ready for events or the deadline passes.
func (x *physIO) wait(events int16, deadline time.Time) error {
	for {
		timeout := -1
		if !deadline.IsZero() {
			d := time.Until(deadline)
			if d <= 0 {
				return os.ErrDeadlineExceeded
			}
			timeout = int(d/time.Millisecond) + 1
		}
		fds := []unix.PollFd{{Fd: int32(x.src.fd), Events: events}}
		n, err := unix.Poll(fds, timeout)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return os.NewSyscallError("poll", err)
		case n > 0:
			return nil
		}
	}
}

// Close closes the socket, once.
func (x *physIO) Close() error {
	if x.closed.Swap(true) {
		return nil
	}
	return unix.Close(x.src.fd)
}

func (x *physIO) LocalAddr() net.Addr  { return x.local }
func (x *physIO) RemoteAddr() net.Addr { return x.remote }

func (x *physIO) SetDeadline(t time.Time) error {
	x.readDeadline, x.writeDeadline = t, t
	return nil
}

func (x *physIO) SetReadDeadline(t time.Time) error  { x.readDeadline = t; return nil }
func (x *physIO) SetWriteDeadline(t time.Time) error { x.writeDeadline = t; return nil }
