//go:build linux

package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// fdConn is a server connection's socket that an event loop gave up, outside the
// runtime's poller: session mode's server connection on its way to the next session
// (see keepUpstream). It costs no system call to make, where a net.Conn over the
// descriptor costs eight (duplicating it, asking what it is, registering it with the
// poller); its reads and writes block in poll(2), which suits the one reset it gets;
// and the loop that adopts the next session takes its descriptor as it is (take).
type fdConn struct {
	fd            int // -1 once closed or taken
	local, remote net.Addr
	// The deadlines, in Unix nanoseconds (0: none): atomic, since the output a loop left
	// unwritten may be written by a goroutine of its own (tlsTransport.resumeOn).
	readDeadline, writeDeadline atomic.Int64
}

func (c *fdConn) Read(b []byte) (int, error) {
	for {
		if c.fd < 0 {
			return 0, net.ErrClosed
		}
		n, err := readNonblock(c.fd, b)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
		case err != nil:
			return 0, &net.OpError{Op: "read", Net: "fd", Err: os.NewSyscallError("recvfrom", err)}
		case n == 0 && len(b) > 0:
			return 0, io.EOF
		default:
			return n, nil
		}
		if err := pollWait(c.fd, unix.POLLIN, deadline(&c.readDeadline)); err != nil {
			return 0, err
		}
	}
}

func (c *fdConn) Write(b []byte) (int, error) {
	written := 0
	for written < len(b) {
		if c.fd < 0 {
			return written, net.ErrClosed
		}
		n, err := writeNonblock(c.fd, b[written:])
		if n > 0 {
			written += n
		}
		switch err {
		case nil, unix.EAGAIN, unix.EINTR:
		default:
			return written, &net.OpError{Op: "write", Net: "fd", Err: os.NewSyscallError("sendto", err)}
		}
		if written < len(b) {
			if err := pollWait(c.fd, unix.POLLOUT, deadline(&c.writeDeadline)); err != nil {
				return written, err
			}
		}
	}
	return written, nil
}

// Close closes the socket, unless a loop took it.
func (c *fdConn) Close() error {
	if c.fd < 0 {
		return nil
	}
	fd := c.fd
	c.fd = -1
	return unix.Close(fd)
}

// take hands the descriptor to the caller, an event loop; Close then does nothing.
func (c *fdConn) take() int {
	fd := c.fd
	c.fd = -1
	return fd
}

// quiet reports whether nothing can be read from the socket: no byte came and the
// server did not hang up (see socketQuiet).
func (c *fdConn) quiet() bool { return c.fd >= 0 && peekQuiet(c.fd) }

func (c *fdConn) LocalAddr() net.Addr                { return c.local }
func (c *fdConn) RemoteAddr() net.Addr               { return c.remote }
func (c *fdConn) SetReadDeadline(t time.Time) error  { setDeadline(&c.readDeadline, t); return nil }
func (c *fdConn) SetWriteDeadline(t time.Time) error { setDeadline(&c.writeDeadline, t); return nil }
func (c *fdConn) SetDeadline(t time.Time) error {
	setDeadline(&c.readDeadline, t)
	setDeadline(&c.writeDeadline, t)
	return nil
}

func setDeadline(d *atomic.Int64, t time.Time) {
	if t.IsZero() {
		d.Store(0)
	} else {
		d.Store(t.UnixNano())
	}
}

func deadline(d *atomic.Int64) time.Time {
	if ns := d.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// inRuntimePoller puts the server connection's socket back in the runtime's poller when
// it is an fdConn (under TLS or not): goroutines that serve a session need deadlines
// that wake a blocked read, which poll(2) does not give.
func (sc *serverConn) inRuntimePoller() error {
	nc, t := socketUnder(sc.nc)
	fc, ok := nc.(*fdConn)
	if !ok {
		return nil
	}
	if sc.r.br.Buffered() > 0 || sc.w.Buffered() > 0 {
		return errors.New("server connection with buffered bytes")
	}
	conn, err := fileConn(fc.take())
	if err != nil {
		return err
	}
	if t != nil {
		t.resumeOn(conn, nil)
		conn = sc.nc // the TLS connection, over its new socket
	} else {
		sc.nc = conn
	}
	sc.r.br.Reset(conn)
	sc.w.Reset(conn)
	return nil
}
