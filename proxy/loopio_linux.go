//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// errWouldBlock is what a loop session's sockets return when no data is at hand; the
// loop then waits for the socket to become ready. It is a temporary net.Error, so that a
// TLS connection over the socket keeps a partial record and reads on later.
var errWouldBlock error = &wouldBlock{}

type wouldBlock struct{}

func (*wouldBlock) Error() string   { return "no data ready" }
func (*wouldBlock) Timeout() bool   { return true }
func (*wouldBlock) Temporary() bool { return true }

// isWouldBlock reports whether err is errWouldBlock. A session meets it on every side
// it finds empty, twice or more per round trip, so the usual case is a type check, not
// errors.Is.
func isWouldBlock(err error) bool {
	if _, ok := err.(*wouldBlock); ok {
		return true // a type check: no call, unlike comparing two interfaces
	}
	return errors.Is(err, errWouldBlock)
}

// endReader is what the bufio.Reader of a loop session's side reads: bytes carried over
// from an earlier reader, then the side's stream (its socket, or TLS over the socket).
type endReader struct {
	held   []byte
	stream io.Reader
}

func (r *endReader) Read(p []byte) (int, error) {
	if len(r.held) > 0 {
		n := copy(p, r.held)
		r.held = r.held[n:]
		if len(r.held) == 0 {
			r.held = nil
		}
		return n, nil
	}
	return r.stream.Read(p)
}

// fdSource reads a non-blocking socket, at most once per readiness the loop reported
// until a read comes short. Reading only what epoll announced spares the read that would
// find nothing.
type fdSource struct {
	fd       int
	readable bool
}

func (s *fdSource) Read(p []byte) (int, error) {
	if !s.readable {
		return 0, errWouldBlock
	}
	for {
		n, err := readNonblock(s.fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			s.readable = false
			return 0, errWouldBlock
		case err != nil:
			return 0, &net.OpError{Op: "read", Net: "loop", Err: os.NewSyscallError("read", err)}
		case n == 0:
			return 0, io.EOF
		}
		if n < len(p) {
			// The socket is probably empty now; the level-triggered epoll set says
			// so if it is not.
			s.readable = false
		}
		return n, nil
	}
}

// readNonblock and writeNonblock are recvfrom(2) and sendto(2) on a non-blocking socket.
// Such a call never waits, so it goes to the kernel without the runtime's system-call
// bookkeeping (entering and leaving the syscall state, in which the monitor may hand
// the loop's processor to another thread): an event loop makes four of them per round
// trip, and the bookkeeping cost about 2% of the proxy's CPU under pgbench. The socket
// calls rather than read(2) and write(2), as PgBouncer makes them: they skip the file
// layer (position lock, access checks): 0.1–0.5 µs less per message sent and received
// over loopback TCP (BenchmarkSocketCalls). MSG_NOSIGNAL spares the SIGPIPE of a write
// to a connection the peer has reset.
func readNonblock(fd int, p []byte) (int, error) {
	return socketIO(unix.SYS_RECVFROM, fd, p, 0)
}

func writeNonblock(fd int, p []byte) (int, error) {
	return socketIO(unix.SYS_SENDTO, fd, p, unix.MSG_NOSIGNAL)
}

// socketIO is recvfrom or sendto of p on fd, with flags, and no address.
func socketIO(trap uintptr, fd int, p []byte, flags uintptr) (int, error) {
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	// syscall's own RawSyscall6, a Go function: x/sys/unix's is an assembly stub that
	// reaches it through an ABI wrapper, two more calls per read or write.
	n, _, errno := syscall.RawSyscall6(trap, uintptr(fd), uintptr(ptr), uintptr(len(p)), flags, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// fdSink writes to a non-blocking socket for a bufio.Writer. It never fails: what the
// socket does not take now is kept in pending for the loop to write when the socket is
// writable, and an error is kept in err for the loop to act on. A bufio.Writer stops for
// good at its writer's first error or short write, so neither may reach it.
type fdSink struct {
	fd       int
	pending  []byte
	err      error
	deferred deferredSend // bytes the loop sends at the end of its turn, before anything else
}

func (s *fdSink) Write(p []byte) (int, error) {
	if s.err != nil {
		return len(p), nil
	}
	if s.deferred.n > 0 {
		s.sendDeferred()
	}
	if len(s.pending) > 0 {
		s.pending = append(s.pending, p...)
		return len(p), nil
	}
	s.writeOrKeep(p)
	return len(p), nil
}

// writeOrKeep writes p as far as the socket takes it and keeps the rest pending, unless
// the write failed.
func (s *fdSink) writeOrKeep(p []byte) {
	written := s.write(p)
	if written < len(p) && s.err == nil {
		s.pending = append(s.pending, p[written:]...)
	}
}

// write writes p until the socket takes no more, returning how much it took.
func (s *fdSink) write(p []byte) int {
	written := 0
	for written < len(p) {
		n, err := writeNonblock(s.fd, p[written:])
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return written
		case err != nil:
			s.err = err
			return written
		}
		written += n
	}
	return written
}

// flush writes what is pending, as far as the socket takes it.
func (s *fdSink) flush() {
	s.sendDeferred()
	if len(s.pending) == 0 || s.err != nil {
		return
	}
	n := s.write(s.pending)
	rest := copy(s.pending, s.pending[n:])
	s.pending = s.pending[:rest]
}

// shrink drops a large pending buffer once it is empty.
func (s *fdSink) shrink() {
	if len(s.pending) == 0 && cap(s.pending) > loopOutputLimit {
		s.pending = nil
	}
}

// drained reports whether nothing is pending and shrink has nothing to give back.
func (s *fdSink) drained() bool {
	return len(s.pending) == 0 && cap(s.pending) <= loopOutputLimit
}

// loopConn stands in for a socket an event loop owns, in the fields of conn that hold the
// connections: closing it asks the loop to end the session; nothing else may use it.
type loopConn struct {
	ls            *loopSession
	local, remote net.Addr
}

func (lc *loopConn) Read([]byte) (int, error)         { return 0, errLoopOwned }
func (lc *loopConn) Write([]byte) (int, error)        { return 0, errLoopOwned }
func (lc *loopConn) Close() error                     { lc.ls.loop.post(lc.ls.teardown); return nil }
func (lc *loopConn) LocalAddr() net.Addr              { return lc.local }
func (lc *loopConn) RemoteAddr() net.Addr             { return lc.remote }
func (lc *loopConn) SetDeadline(time.Time) error      { return nil }
func (lc *loopConn) SetReadDeadline(time.Time) error  { return nil }
func (lc *loopConn) SetWriteDeadline(time.Time) error { return nil }

// handOff moves the session from the loop to a goroutine pair, for a message larger
// than a loop holds: the goroutines stream it. Input already read and output not yet
// written carry over.
func (ls *loopSession) handOff() {
	c, l := ls.c, ls.loop
	ls.flushWriters()
	ls.dead = true
	l.remove(&ls.client)
	l.remove(&ls.upstream)
	delete(l.timed, ls)
	client, cerr := fileConn(ls.client.fd)
	upstream, uerr := fileConn(ls.upstream.fd)
	l.group.release(l)
	if cerr != nil || uerr != nil {
		for _, nc := range []net.Conn{client, upstream} {
			if nc != nil {
				nc.Close()
			}
		}
		c.log.WithError(errors.Join(cerr, uerr)).Warn("cannot hand the session to goroutines")
		c.close()
		return
	}
	// Two goroutines serve the session from now on; none runs yet.
	c.singleGoroutine(false)
	clientStream, clientWriter := ls.client.resume(client)
	upstreamStream, upstreamWriter := ls.upstream.resume(upstream)
	c.cwMu.Lock()
	c.cr.br = carryOver(c.cr.br, &ls.client.in, clientStream)
	c.server.r.br = carryOver(c.server.r.br, &ls.upstream.in, upstreamStream)
	c.cw, c.server.w = clientWriter, upstreamWriter
	c.cwMu.Unlock()

	c.mu.Lock()
	closed := c.closed
	if !closed {
		c.client, c.server.nc = clientStream, upstreamStream
		c.loop.Store(nil)
	}
	c.mu.Unlock()
	if closed {
		client.Close()
		upstream.Close()
		return
	}
	c.log.Debug("session handed from its event loop to goroutines for a large message")
	go c.relay()
}

// fileConn turns a socket descriptor the loop owns into a net.Conn; the descriptor is
// closed.
func fileConn(fd int) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "socket")
	defer f.Close()
	return net.FileConn(f)
}

// resume returns the side's stream once goroutines serve it over nc, a connection over
// the loop's descriptor, and a writer of that stream. The output the loop left unwritten
// goes first: in the writer's buffer, which the relay flushes as it starts, or for a TLS
// side, which goes on over its TLS connection, written by the transport (resumeOn).
func (e *loopEnd) resume(nc net.Conn) (net.Conn, *bufio.Writer) {
	if e.tls == nil {
		w := bufio.NewWriterSize(nc, max(writeBufferSize, len(e.sink.pending)))
		_, _ = w.Write(e.sink.pending)
		return nc, w
	}
	e.tls.NetConn().(*tlsTransport).resumeOn(nc, e.sink.pending)
	return e.tls, bufio.NewWriterSize(e.tls, writeBufferSize)
}

// carryOver returns a reader of stream that starts with what br and in still hold.
func carryOver(br *bufio.Reader, in *endReader, stream io.Reader) *bufio.Reader {
	held := append(bufferedCopy(br), in.held...)
	if len(held) > 0 {
		stream = io.MultiReader(bytes.NewReader(held), stream)
	}
	return bufio.NewReaderSize(stream, readBufferSize)
}

// keepUpstream gives the server connection of a session that ends to a later session
// when the client left it idle (see conn.leftIdle), reporting whether it did. The loop
// sends the connection its DISCARD ALL, which a loop must not wait for the answer to: the
// connection's descriptor, out of the loop's epoll set, becomes a connection of its own
// (fdConn), as in handOff (output the socket did not take yet goes with it), and the
// session that takes it reads the answer (sessionPool.vet), by when it is usually there.
func (ls *loopSession) keepUpstream() bool {
	c := ls.c
	out := ls.upstream.output()
	if len(out.pending) > 0 || out.err != nil || !c.leftIdle() {
		return false
	}
	if c.server.sendReset(); out.err != nil {
		return false
	}
	nc := &fdConn{fd: ls.upstream.fd, local: c.server.nc.LocalAddr(), remote: c.server.nc.RemoteAddr()}
	ls.upstream.fd = -1 // nc's now
	stream, w := ls.upstream.resume(nc)
	c.mu.Lock()
	sc := c.server
	keep := !c.closed
	if keep {
		sc.r.br = carryOver(sc.r.br, &ls.upstream.in, stream)
		sc.w, sc.nc = w, stream
		c.serverKept = true
	}
	c.mu.Unlock()
	if !keep {
		stream.Close()
		return true
	}
	c.srv.sessionPool.put(c.reuse, sc, c.srv.sessionLimits(c.reuse.pool), true)
	return true
}
