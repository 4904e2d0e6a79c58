//go:build linux

package proxy

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// Sessions in transaction mode on the event loops. Such a session is a loopSession whose
// client side is its socket, as in session mode, and whose server side is its pooledConn
// (tx): the session's server reader and writer read and write the pooledConn, which
// reads and writes whichever pooled connection (physConn) the session borrows, without
// blocking. While the session holds one, the loop watches that connection's socket as
// the session's upstream side (loopEnd.pio), and lets go of it before the connection
// goes back to the pool (dropServer), where a session of another loop may take it. A
// connection given back clean keeps its place in the loop's epoll set for the loop's
// next borrower (see physIO.park). Runs of messages that need no handler of the session
// cross as in session mode: a client's run goes to the pooledConn in one Write
// (relayToPool), which still looks at each message, and the answers the pooledConn put
// in the session's reader go to the client in one write from there (relayRun).
//
// Nothing blocks on the loop: a borrow that must wait leaves the client's messages in the
// pooledConn, and the loop stops reading the client until the pool's answer arrives
// (posted to the loop, see pooledConn.borrow) and the messages have gone (pump).
//
// A session that holds no connection and has nothing in progress, and stays so for a
// tenth to a fifth of a second (sweepQuiet), gives its four buffers back, as a parked
// session does (park.go), and takes them again when its client sends something: an idle
// session costs its socket and what it keeps for the client, and no goroutine. A busy
// session keeps its buffers from one transaction to the next.

// txOnLoops reports whether transaction-mode sessions are served by event loops, and
// the pool's connections therefore live outside the runtime's poller (physIO).
func (s *Server) txOnLoops() bool { return !s.GoroutineRelay }

// adoptPooled hands a session in transaction mode to an event loop once its startup is
// done, reporting false when goroutines must serve it (see adopt).
func (s *Server) adoptPooled(c *conn, v *pooledConn) bool {
	clientSock, clientTLS, ok := loopSocket(c.client)
	if !s.loopsServe() || !ok {
		return false
	}
	c.cwMu.mu.Lock()
	defer c.cwMu.mu.Unlock()
	if c.cw.Flush() != nil {
		return false
	}
	l, cfd := s.assignLoop(c, clientSock)
	if l == nil {
		return false
	}
	ls := &loopSession{c: c, loop: l, tx: v}
	ls.client.init(ls, cfd, clientTLS, c.cr.br)
	ls.upstream = loopEnd{ls: ls, fd: -1, pooled: true, in: endReader{held: bufferedCopy(c.server.r.br), stream: v}}
	c.cr.br.Reset(&ls.client.in)
	c.cw.Reset(ls.client.out())
	c.server.r.br.Reset(&ls.upstream.in)

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		unix.Close(cfd)
		s.loops.release(l)
		return true
	}
	ls.client.attachTLS()
	c.client = &loopConn{ls: ls, local: clientSock.LocalAddr(), remote: clientSock.RemoteAddr()}
	v.mu.Lock()
	v.host = ls
	v.mu.Unlock()
	c.loop.Store(ls)
	c.singleGoroutine(true)
	l.post(ls.register)
	c.mu.Unlock()
	clientSock.Close()
	return true
}

// post is the txHost's: f runs on the session's loop.
func (ls *loopSession) post(f func()) bool { return ls.loop.post(f) }

// resume is the txHost's: the wait for a connection has ended.
func (ls *loopSession) resume() { ls.process() }

// release is the txHost's. The pool may lend the connection at once to another session
// of this loop, whose answer is then posted from this goroutine: the loop hears of it
// without a wake-up through its eventfd, two system calls spared per transaction when
// clients outnumber the connections (see eventLoop.inRelease). Not while the session is
// detached: this goroutine is then not the loop's runner.
func (ls *loopSession) release(srv *pool.Server[*physConn], st pool.State) {
	if ls.detached {
		srv.Release(st)
		return
	}
	ls.loop.inRelease.Store(true)
	defer ls.loop.inRelease.Store(false)
	srv.Release(st)
}

// dropServer is the txHost's: the session stops watching the borrowed connection's
// socket at once. With keep, on the loop's goroutine, the socket stays in the loop's
// epoll set, parked with the connection for the loop's next borrower (see physIO.park);
// otherwise it leaves the set, and its place in the loop's table is given back by
// syncServer, on the loop.
func (ls *loopSession) dropServer(keep bool) {
	e := &ls.upstream
	if !keep || ls.detached || e.pio == nil || !e.pio.park(ls.loop, e) {
		ls.loop.unwatch(e)
	}
	e.pio, e.hup = nil, false
}

// syncServer makes the session's upstream side the socket of the connection it holds
// now, if any; it reports false when the loop cannot watch it.
func (ls *loopSession) syncServer() bool {
	// The loop's goroutine alone borrows and gives back the session's connection (v.pc):
	// it reads it without the lock.
	v := ls.tx
	var pio *physIO
	if v.pc != nil {
		pio = v.pc.io
	}
	e := &ls.upstream
	if e.pio == pio && (pio == nil) == (e.slot == 0) {
		return true
	}
	if e.slot != 0 {
		ls.loop.remove(e)
	}
	e.pio, e.hup = pio, false
	if pio == nil {
		return true
	}
	e.fd = pio.src.fd
	if pio.adopt(ls.loop, e) {
		return true
	}
	return ls.loop.add(e) == nil
}

// txQuiet reports whether a session in transaction mode may give its buffers back: it
// holds no connection and has nothing in progress or buffered.
func (ls *loopSession) txQuiet() bool {
	c, v := ls.c, ls.tx
	if v.awaiting || v.pc != nil {
		return false // fields the loop's goroutine alone changes: no need for the lock
	}
	if ls.bare || ls.finishing || ls.streaming > 0 || len(ls.client.sink.pending) > 0 ||
		len(ls.client.in.held) > 0 || len(ls.upstream.in.held) > 0 || ls.upstream.slot != 0 {
		return false
	}
	if c.cr.br.Buffered() > 0 || c.cw.Buffered() > 0 || c.server.r.br.Buffered() > 0 || c.server.w.Buffered() > 0 {
		return false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.quietLocked() && !v.awaiting && v.wait == nil && !v.granted
}

// sweepQuiet gives back the buffers of the sessions in the quiet list that have stayed
// quiet since its last look, and marks the others still quiet for the next.
func (l *eventLoop) sweepQuiet(now time.Time) {
	l.lastSweep = now
	kept := l.quiet[:0]
	for _, ls := range l.quiet {
		switch {
		case ls.dead || ls.bare || ls.detached || !ls.txQuiet():
			ls.inQuiet = false
		case ls.stillQuiet:
			ls.putBuffers()
			ls.inQuiet = false
		default:
			ls.stillQuiet = true
			kept = append(kept, ls)
		}
	}
	clear(l.quiet[len(kept):])
	l.quiet = kept
}

// inputAtHand reports whether the pooledConn's Read may bring something now, or an error:
// answers of the proxy's own, or a borrowed connection with input buffered, its socket
// readable, or TLS (whose layer may hold input the socket does not show). Called by the
// session's loop, whose goroutine alone changes the fields it reads.
func (v *pooledConn) inputAtHand() bool {
	if v.roff < len(v.rout) || len(v.synth) > 0 {
		return true
	}
	pc := v.pc
	if pc == nil || !v.readerOn {
		return false
	}
	return pc.br.Buffered() > 0 || pc.io == nil || pc.io.src.readable || pc.io.tls
}

// putBuffers gives a quiet session's buffers back.
func (ls *loopSession) putBuffers() {
	ls.dropBuffers()
	ls.bare = true
	ls.c.srv.pooling.bare.Add(1)
}

// dropBuffers gives the session's buffers back to the pool they came from.
func (ls *loopSession) dropBuffers() { ls.c.putBuffers(ls.tx) }

// takeBuffers gives a session that gave its buffers back new ones.
func (ls *loopSession) takeBuffers() {
	if !ls.bare {
		return
	}
	c := ls.c
	c.cr.br = takeReader(&ls.client.in)
	c.cw = takeWriter(ls.client.out())
	c.server.r.br = takeReader(&ls.upstream.in)
	c.server.w = takeWriter(ls.tx)
	ls.bare = false
	c.srv.pooling.bare.Add(-1)
}

// serverFailed ends a session in transaction mode whose borrowed connection failed.
func (ls *loopSession) serverFailed() {
	ls.c.tellClient(sqlstate.ConnectionFailure, "server closed the connection unexpectedly")
	ls.finish()
}
