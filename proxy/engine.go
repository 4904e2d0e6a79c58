package proxy

import (
	"io"
	"net"
	"sync"
	"time"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// engine is what a session's handlers need from the I/O engine that serves the session:
// a goroutine pair (goroutinePair) or an event loop (loopSession). Both drive
// the same handlers, clientStep and upstreamStep (an event loop, which has read the
// message's header already, calls their second halves clientMessage and
// upstreamMessage), one message at a time; everything
// else a session does (closing when idle, draining the client, surviving a panic) is
// written once, here, and asks its engine only for what differs.
type engine interface {
	// whenQuiet runs f when none of the session's handlers runs, with the client writer
	// to f alone, or not at all when a response is being relayed right now or the
	// session is ending. When f reports true the session ends once what f wrote has
	// gone out. It may be called from any goroutine.
	whenQuiet(f func() bool)
	// drainClient ends the client side once the message at hand is done: the proxy
	// stops writing and discards what the client still sends (see drain).
	drainClient()
	// detach lets the running handler block (to wait for an ID, or to plan a long text)
	// without holding up other sessions.
	detach()
	// abort ends the session at once; its handler panicked.
	abort()
}

// engine returns the engine that serves the session now.
func (c *conn) engine() engine {
	if ls := c.loop.Load(); ls != nil {
		return ls
	}
	return goroutinePair{c}
}

// closeIfIdle ends the session when it is between transactions with nothing outstanding,
// telling the client why. Used by Shutdown, from its own goroutine.
func (c *conn) closeIfIdle() {
	c.mu.Lock()
	started := c.server != nil && !c.closed
	c.mu.Unlock()
	if started {
		if v := c.pooled(); v != nil && v.endIfParked() {
			return
		}
		c.engine().whenQuiet(c.endIfIdle)
	}
}

// endIfIdle sends the client the FATAL error of a server shutting down when the session is
// idle, reporting whether it did; the engine then ends the session.
func (c *conn) endIfIdle() bool {
	if c.cw == nil || c.server.txStatus.Load() != txIdle || c.pending.Load() != 0 {
		return false
	}
	_, _ = c.cw.Write(fatal(sqlstate.AdminShutdown, "terminating connection due to administrator command"))
	return true
}

// drainClient ends the proxy's side of the client connection and reads what the client
// still sends (the rest of an oversized message, say) until it closes; see drain.
func (c *conn) drainClient() { c.engine().drainClient() }

// detach lets the running handler block without holding up an event loop's other
// sessions; under a goroutine pair it does nothing.
func (c *conn) detach() { c.engine().detach() }

// recoverPanic, deferred by whatever runs a session's handlers, ends the session whose
// handler panicked: a bug in the relay must cost one connection, not the process or the
// other sessions of an event loop.
func (c *conn) recoverPanic() {
	r := recover()
	if r == nil {
		return
	}
	c.log.WithField("panic", r).Error("connection handler panicked")
	c.engine().abort()
}

// Bounds of drain.
const (
	drainTimeout = time.Second
	drainLimit   = 16 << 20
)

// drain ends the proxy's side of the client connection nc and reads what the client still
// sends through r until it closes, for drainTimeout and drainLimit bytes at most: closing a
// socket with unread input resets the connection, and the reset can destroy the error
// the client has not read yet.
func drain(nc net.Conn, r io.Reader) {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = nc.SetReadDeadline(time.Now().Add(drainTimeout))
	_, _ = io.CopyN(io.Discard, r, drainLimit)
}

// goroutinePair is the engine of a session served by two goroutines, one per direction
// (see relay).
type goroutinePair struct{ c *conn }

func (p goroutinePair) whenQuiet(f func() bool) {
	c := p.c
	// Another goroutine's: the mutex itself, whoever serves the session (sessionLock).
	if !c.cwMu.mu.TryLock() {
		return // a response is being relayed right now: not quiet
	}
	if ls := c.loop.Load(); ls != nil {
		c.cwMu.mu.Unlock() // a loop took the session over meanwhile
		ls.whenQuiet(f)
		return
	}
	end := f()
	if end {
		_ = c.client.SetWriteDeadline(time.Now().Add(time.Second))
		_ = c.cw.Flush()
	}
	c.cwMu.mu.Unlock()
	if end {
		c.close()
	}
}

func (p goroutinePair) drainClient() { drain(p.c.client, p.c.cr.br) }

func (goroutinePair) detach() {}

func (p goroutinePair) abort() { p.c.close() }

// relay runs an established session on a goroutine pair: this goroutine carries the
// client's messages upstream while a second one carries the server's messages to the
// client. Whichever direction ends first closes both connections, which ends the other;
// except that when the client left a server connection fit for another session, the
// server side is stopped by a read deadline instead, at a message boundary, and the
// connection is kept (see keepServer).
func (c *conn) relay() {
	defer c.recoverPanic()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer c.recoverPanic()
		if err := c.relayToClient(); err != nil && !c.isClosed() {
			c.log.WithError(err).Debug("upstream side ended")
		}
		if !c.keeping.Load() {
			c.close()
		}
	}()
	if err := c.relayToUpstream(); err != nil && !c.isClosed() {
		c.log.WithError(err).Debug("client side ended")
	}
	if c.leftIdle() {
		c.keeping.Store(true)
		c.mu.Lock()
		if !c.closed {
			_ = c.server.nc.SetReadDeadline(time.Now())
		}
		c.mu.Unlock()
		<-done
		c.keepServer(c.upstreamStopped)
	} else {
		c.close()
		<-done
	}
	c.log.Debug("session ended")
}

// sessionLock is a mutex of a session's own state (conn.cwMu, sessionState.mu) that costs
// nothing while one goroutine at a time serves the session, as an event loop does: it
// locks only while a goroutine pair serves it. single changes only while no handler of
// the session runs (when a loop adopts the session, before its first handler there, and
// when the loop hands the session off, before the goroutines start), and only the
// session's handlers use these methods; another goroutine (Shutdown, say) locks mu itself.
type sessionLock struct {
	mu     sync.Mutex
	single bool
}

func (l *sessionLock) Lock() {
	if !l.single {
		l.mu.Lock()
	}
}

func (l *sessionLock) Unlock() {
	if !l.single {
		l.mu.Unlock()
	}
}

func (l *sessionLock) TryLock() bool { return l.single || l.mu.TryLock() }
