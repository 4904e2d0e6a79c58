//go:build linux

package proxy

import (
	"bufio"
	"errors"
	"net"
	"os"
	"sync"
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

	// The socket's registration in the epoll set of an event loop while the connection
	// is idle (see park), guarded by regMu: home is that loop and parked its entry in the
	// loop's table of sockets (whose ls is nil); both nil when the socket is in no set,
	// or in the set of the session that borrows it.
	regMu  sync.Mutex
	home   *eventLoop
	parked *loopEnd
}

// A session of an event loop that gives its connection back clean leaves the socket in
// the loop's epoll set (park), where the loop's next borrower of the connection finds it
// (adopt): a borrow then costs no epoll_ctl to add the socket and none to remove it,
// which with more clients than connections is two system calls per transaction. While
// the connection is idle, the loop's table holds the registration under a placeholder
// end of the connection's own. Whatever comes on an idle connection (the server closing
// it, say) takes it out of the set (idleEvent), lest the level-triggered set report it
// again and again; so does a borrower of another loop (adopt) and a close (Close).

// park moves the registration of e, the server side of a session of l that gives the
// connection back clean, from e to the connection; it reports false when there is none
// to move. Called on l's goroutine.
func (x *physIO) park(l *eventLoop, e *loopEnd) bool {
	if e.slot == 0 || !e.watched || e.hup || l.ends[e.slot] != e {
		return false
	}
	x.regMu.Lock()
	defer x.regMu.Unlock()
	if x.closed.Load() {
		return false
	}
	pe := x.parked
	if pe == nil {
		pe = &loopEnd{pio: x}
		x.parked = pe
	}
	pe.fd, pe.token, pe.slot, pe.events, pe.watched = e.fd, e.token, e.slot, e.events, true
	x.home = l
	l.ends[e.slot] = pe
	e.slot, e.watched, e.events = 0, false, 0
	return true
}

// adopt moves the registration the connection kept in l's epoll set to e, the server
// side of the session of l that borrows it, reporting false when it kept none there; a
// registration kept in another loop's set is taken out of it. Called on l's goroutine.
func (x *physIO) adopt(l *eventLoop, e *loopEnd) bool {
	x.regMu.Lock()
	defer x.regMu.Unlock()
	home, pe := x.home, x.parked
	if home == nil {
		return false
	}
	x.home = nil
	if home != l {
		// The other loop's table keeps pe until the loop frees the slot itself.
		x.parked = nil
		home.dropParked(pe, true)
		return false
	}
	e.fd, e.token, e.slot, e.events, e.watched = pe.fd, pe.token, pe.slot, pe.events, true
	l.ends[pe.slot] = e
	pe.slot = 0
	return true
}

// idleEvent handles readiness of a connection parked in l's epoll set: it leaves the
// set, for a level-triggered set would report it again and again; its next borrower finds
// what came. Called on l's goroutine.
func (x *physIO) idleEvent(l *eventLoop, pe *loopEnd) {
	x.regMu.Lock()
	defer x.regMu.Unlock()
	if x.home != l || x.parked != pe {
		return // moved meanwhile; the slot is freed by the mover's dropParked
	}
	x.home = nil
	if !x.closed.Load() {
		_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, pe.fd, nil)
	}
	l.ends[pe.slot] = nil
	l.freeSlots = append(l.freeSlots, pe.slot)
	pe.slot = 0
}

// dropParked takes pe, the placeholder of a connection parked in l's set, out of l:
// out of the epoll set when del (the socket is still open; l.mu keeps l's epoll
// descriptor from closing meanwhile), and out of l's table on l's own goroutine. Called
// by another goroutine with the connection's regMu held.
func (l *eventLoop) dropParked(pe *loopEnd, del bool) {
	l.mu.Lock()
	if del && !l.stopped {
		_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, pe.fd, nil)
	}
	l.mu.Unlock()
	l.post(func() {
		if pe.slot > 0 && l.ends[pe.slot] == pe {
			l.ends[pe.slot] = nil
			l.freeSlots = append(l.freeSlots, pe.slot)
		}
	})
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
	return pollWait(x.src.fd, events, deadline)
}

// pollWait blocks until the socket fd is ready for events or the deadline passes.
func pollWait(fd int, events int16, deadline time.Time) error {
	for {
		timeout := -1
		if !deadline.IsZero() {
			d := time.Until(deadline)
			if d <= 0 {
				return os.ErrDeadlineExceeded
			}
			timeout = int(d/time.Millisecond) + 1
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: events}}
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

// Close closes the socket, once; closing takes it out of any epoll set.
func (x *physIO) Close() error {
	x.regMu.Lock()
	defer x.regMu.Unlock()
	if x.closed.Swap(true) {
		return nil
	}
	if x.home != nil {
		x.home.dropParked(x.parked, false)
		x.home, x.parked = nil, nil
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
