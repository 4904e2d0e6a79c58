package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// Parking: a session in transaction mode that holds no server connection and has nothing
// outstanding costs little more than its socket and the state it carries for the client
// (statements, settings). While it works it runs on a goroutine pair like a session-mode
// session: the client side (relayToUpstream's steps) and the server side (relayToClient's
// steps over the pooledConn). Once it has been quiet for a while, both goroutines end and
// its four buffers go back to a pool: the session is parked. The parking lot (park_linux.go),
// one goroutine and an epoll set per server, watches the client sockets of the parked
// sessions and starts the goroutine pair again, with buffers, when one becomes readable
// (a message, or the client's close).
//
// Who decides: the lot's goroutine looks at the sessions every parkTick. A session whose
// client side has waited for the client since the previous look, and whose state is
// quiet (see parkableLocked), is interrupted: the lot sets a read deadline in the past on
// the client socket. The client side, woken by the timeout with nothing read, stops the
// server side (which waits in pooledConn.Read with nothing to deliver, and then returns
// errParked) and parks the session. Only a wait for the first byte of a message is ever
// interrupted: the client side clears the deadline before it reads anything further.
//
// A TLS client is never parked: the TLS connection may hold decrypted input the socket
// does not show, and its own buffers stay anyway.

// parkTick is how often the lot looks for sessions to park: a session is parked after
// one to two ticks without traffic.
var parkTick = 500 * time.Millisecond

// errParked ends the server side of a session being parked; see pooledConn.Read.
var errParked = errors.New("session parked")

// Buffers of running sessions; parked sessions hold none.
var (
	parkReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, readBufferSize) }}
	parkWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, writeBufferSize) }}
)

func takeReader(r io.Reader) *bufio.Reader {
	br := parkReaders.Get().(*bufio.Reader)
	br.Reset(r)
	return br
}

func takeWriter(w io.Writer) *bufio.Writer {
	bw := parkWriters.Get().(*bufio.Writer)
	bw.Reset(w)
	return bw
}

func putReader(br *bufio.Reader) {
	if br != nil && br.Size() == readBufferSize {
		br.Reset(nil)
		parkReaders.Put(br)
	}
}

func putWriter(bw *bufio.Writer) {
	if bw != nil && bw.Size() == writeBufferSize {
		bw.Reset(nil)
		parkWriters.Put(bw)
	}
}

// parkState is what a pooledConn keeps for parking; under pooledConn.mu.
type parkState struct {
	lot *parkLot // nil: the session is never parked (TLS, or no lot on this platform)
	// blocked: the client side waits for the first byte of a client message; seen: the
	// lot has seen it so at its last look; interrupted: the lot set the read deadline.
	blocked, seen, interrupted bool
	// waiting: the server side waits in Read with nothing to deliver; parking: the client
	// side asks it to end.
	waiting, parking bool
	token            uint32 // the session's token in the lot's epoll set while parked
}

// parkableLocked reports whether the session may be parked now: it holds no server
// connection, owes the client nothing and has nothing half done. v.mu is held.
func (v *pooledConn) parkableLocked() bool { return v.park.waiting && v.quietLocked() }

// quietLocked is parkableLocked without the server side's part. v.mu is held.
func (v *pooledConn) quietLocked() bool {
	c := v.c
	return !v.closed && v.srv == nil && len(v.rout) == 0 && len(v.synth) == 0 &&
		v.discarding == nil && len(v.wbuf) == 0 && v.rstream == 0 &&
		c.pending.Load() == 0 && c.server.txStatus.Load() == txIdle
}

// relayPooled runs a session in transaction mode once its startup is done: on an event
// loop where it can (txloop_linux.go), else on a goroutine pair. It reports whether the
// session goes on without the calling goroutine (on a loop, or parked).
func (c *conn) relayPooled(v *pooledConn) (parked bool) {
	if c.srv.adoptPooled(c, v) {
		return true
	}
	if lot := c.srv.parkLot(); lot != nil {
		if _, ok := c.client.(syscall.Conn); ok {
			v.mu.Lock()
			if !v.closed && lot.enter(v) {
				v.park.lot = lot
			}
			v.mu.Unlock()
		}
	}
	return c.runPooled(v)
}

// runPooled runs the session's goroutine pair until the session ends or parks; it reports
// whether it parked.
func (c *conn) runPooled(v *pooledConn) (parked bool) {
	defer c.recoverPanic()
	for {
		upDone := make(chan error, 1)
		go func() {
			defer c.recoverPanic()
			err := c.relayToClient()
			if errors.Is(err, errParked) {
				upDone <- err
				return
			}
			if err != nil && !c.isClosed() {
				c.log.WithError(err).Debug("upstream side ended")
			}
			c.close()
			upDone <- err
		}()
		outcome := parkNotNow
		for outcome == parkNotNow {
			park, err := c.pooledClientSide(v)
			if !park {
				if err != nil && !c.isClosed() {
					c.log.WithError(err).Debug("client side ended")
				}
				c.close()
				<-upDone
				c.log.Debug("session ended")
				return false
			}
			outcome = c.park(v, upDone)
		}
		switch outcome {
		case parkDone:
			return true
		case parkEnded:
			c.close()
			c.log.Debug("session ended")
			return false
		}
		// parkRestart: a new server side.
	}
}

// pooledClientSide carries the client's messages until the client side ends, or until
// the lot interrupts a wait for the client and the session may park (park true).
func (c *conn) pooledClientSide(v *pooledConn) (park bool, err error) {
	for {
		if c.cr.br.Buffered() == 0 && v.park.lot != nil {
			if c.awaitClient(v) {
				return true, nil
			}
		}
		if done, err := c.clientStep(); done {
			return false, err
		}
	}
}

// awaitClient waits until the client sends something, and reports true when the lot
// interrupted the wait instead and the session looks parkable.
func (c *conn) awaitClient(v *pooledConn) bool {
	for {
		v.mu.Lock()
		v.park.blocked, v.park.seen = true, false
		v.mu.Unlock()
		_, err := c.cr.br.Peek(1)
		v.mu.Lock()
		v.park.blocked = false
		interrupted := v.park.interrupted
		v.park.interrupted = false
		parkable := v.parkableLocked()
		v.mu.Unlock()
		if !interrupted {
			return false // input, or an error that the next read reports
		}
		_ = c.client.SetReadDeadline(noDeadline)
		if c.cr.br.Buffered() > 0 {
			return false
		}
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			return false
		}
		if parkable {
			return true
		}
	}
}

// Outcomes of park.
const (
	parkDone    = iota // parked: the goroutine is free
	parkNotNow         // not parked, the server side still runs
	parkRestart        // not parked, the server side has ended: start it again
	parkEnded          // the session ended meanwhile
)

// park stops the server side and hands the session, without buffers, to the lot.
func (c *conn) park(v *pooledConn, upDone chan error) int {
	v.mu.Lock()
	if !v.parkableLocked() {
		v.mu.Unlock()
		return parkNotNow
	}
	v.park.parking = true
	v.cond.Broadcast()
	v.mu.Unlock()
	if err := <-upDone; !errors.Is(err, errParked) {
		return parkEnded
	}
	v.mu.Lock()
	v.park.parking = false
	ok := v.quietLocked() && c.server.r.br.Buffered() == 0 && c.cr.br.Buffered() == 0
	v.mu.Unlock()
	if !ok {
		return parkRestart
	}
	c.cwMu.mu.Lock()
	defer c.cwMu.mu.Unlock()
	if c.cw.Buffered() > 0 || c.server.w.Buffered() > 0 {
		return parkRestart
	}
	c.putBuffers(v)
	v.mu.Lock()
	v.dropWaitContext()
	lot := v.park.lot
	v.mu.Unlock()
	if lot.park(v) {
		return parkDone
	}
	c.takeBuffers(v)
	return parkRestart
}

// putBuffers gives the buffers of a session in transaction mode that has nothing in them
// back to the pools they came from: those of its reader and writer on either side, and
// its pooledConn's.
func (c *conn) putBuffers(v *pooledConn) {
	putReader(c.cr.br)
	putWriter(c.cw)
	putReader(c.server.r.br)
	putWriter(c.server.w)
	c.cr.br, c.cw, c.server.r.br, c.server.w = nil, nil, nil, nil
	c.cr.body, c.server.r.body = nil, nil
	v.mu.Lock()
	v.rbuf, v.wbuf, v.obuf, v.rout, v.synth, v.plainText = nil, nil, nil, nil, nil, nil
	v.mu.Unlock()
}

// takeBuffers gives a parked session its buffers back. c.cwMu.mu is held.
func (c *conn) takeBuffers(v *pooledConn) {
	c.cr.br = takeReader(c.client)
	c.cw = takeWriter(c.client)
	c.server.r.br = takeReader(v)
	c.server.w = takeWriter(v)
}

// resume runs a parked session again; the lot calls it, on a new goroutine, when the
// client socket becomes readable.
func (c *conn) resume(v *pooledConn) {
	c.cwMu.mu.Lock()
	c.takeBuffers(v)
	c.cwMu.mu.Unlock()
	c.runPooled(v)
}

// endIfParked ends a parked session for Shutdown, telling the client why, and reports
// whether it did.
func (v *pooledConn) endIfParked() bool {
	v.mu.Lock()
	lot := v.park.lot
	v.mu.Unlock()
	if lot == nil || !lot.unpark(v) {
		return false
	}
	c := v.c
	_ = c.client.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.client.Write(fatal(sqlstate.AdminShutdown, "terminating connection due to administrator command"))
	c.close()
	c.log.Debug("session ended")
	return true
}

// ParkedSessions counts the sessions in transaction mode that are parked now: those of the
// parking lot, and those on event loops that hold no buffers.
func (s *Server) ParkedSessions() int {
	n := int(s.pooling.bare.Load())
	if lot := s.existingParkLot(); lot != nil {
		n += lot.parkedCount()
	}
	return n
}
