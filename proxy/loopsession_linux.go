//go:build linux

package proxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// Bounds of a session served by an event loop.
const (
	// loopMaxMessage is the largest message a loop holds whole. A larger DataRow or
	// CopyData from the upstream is streamed to the client as it arrives; a session
	// that meets any other larger message is handed to a goroutine pair.
	loopMaxMessage = 1 << 20
	// loopBudget is how many messages a session may handle before the loop's other
	// sessions get their turn.
	loopBudget = 32
	// loopOutputLimit is how much output may wait for a slow reader before the loop
	// stops taking input that adds to it.
	loopOutputLimit = 64 << 10
)

// errLoopOwned is returned by the placeholder connections of a session an event loop
// serves; nothing may read or write them directly.
var errLoopOwned = errors.New("connection is served by an event loop")

// loopSession is a session an event loop serves.
type loopSession struct {
	// What every turn of the session looks at first comes first, in one cache line with
	// the start of its client side.
	c    *conn
	loop *eventLoop
	// tx is the session's pooledConn in transaction mode (see txloop_linux.go), nil in
	// session mode; bare: it has given its buffers back while quiet.
	tx   *pooledConn
	bare bool
	// inQuiet: in the loop's quiet list; stillQuiet: no message since the list's last look.
	inQuiet, stillQuiet bool

	dead      bool // torn down or handed over; events for it are ignored
	detached  bool // a handler left the loop to wait for an ID (see detach)
	endOnBack bool // a teardown came while detached
	queued    bool // in loop.again
	finishing bool // ending: waiting for output to drain (or for the client to close)
	draining  bool // the client is drained once the output has gone out (see drain)
	streaming int  // body bytes of an upstream message still to stream to the client

	// out is a run of messages cleared to pass, still in the read buffer it came in,
	// that goes to the plain socket of outTo as the last step of process (see relayRun
	// and writeOut). Writing last lets the session's bookkeeping find its state still
	// in the processor's caches: sending bytes on a local connection runs the peer's
	// receipt and wake-up in the kernel too, which evicts much of it.
	out   []byte
	outTo *loopEnd

	client, upstream loopEnd

	deadline time.Time // when finishing gives up waiting
}

// loopEnd is one of a loop session's two sockets.
type loopEnd struct {
	ls      *loopSession
	fd      int
	token   loopToken
	slot    int32  // in the loop's table of sockets; 0 when not in it
	events  uint32 // the events registered
	watched bool   // in the epoll set
	hup     bool   // the socket reported a hang-up or an error
	pooled  bool   // the upstream side of a session in transaction mode: it reads the pooledConn
	src     fdSource
	sink    fdSink
	in      endReader // what the session's reader of this side reads
	tls     *tls.Conn // the side's TLS connection over src and sink; nil for a plain socket
	// pio is the socket of the connection a session in transaction mode borrows, on its
	// upstream side; src and sink are then pio's.
	pio *physIO
}

// source is the side's socket reader.
func (e *loopEnd) source() *fdSource {
	if e.pio != nil {
		return &e.pio.src
	}
	return &e.src
}

// output is the side's socket writer.
func (e *loopEnd) output() *fdSink {
	if e.pio != nil {
		return &e.pio.sink
	}
	return &e.sink
}

// adopt hands an established session to an event loop, reporting false when it must be
// served by a goroutine pair instead: a connection that is no TCP or Unix socket (with or
// without TLS), a rewriting proxy whose IDs is no IDProber, or an explicit
// GoroutineRelay. The session's buffered input and output carry over, and so does TLS:
// the loop reads and writes the same TLS connections over its duplicates of the sockets.
func (s *Server) adopt(c *conn) bool {
	clientSock, clientTLS, ok1 := loopSocket(c.client)
	upstreamSock, upstreamTLS, ok2 := loopSocket(c.server.nc)
	if !s.loopsServe() || !ok1 || !ok2 {
		return false
	}
	// The real mutex: whoever else holds it (Shutdown's closeIfIdle) is done before the
	// session changes hands, and looks at c.loop again once it has it.
	c.cwMu.mu.Lock()
	defer c.cwMu.mu.Unlock()
	if c.cw.Flush() != nil || c.server.w.Flush() != nil {
		return false
	}
	l, cfd := s.assignLoop(c, clientSock)
	if l == nil {
		return false
	}
	ufd, err := dupSocket(upstreamSock)
	if err != nil {
		unix.Close(cfd)
		s.loops.release(l)
		return false
	}
	ls := &loopSession{c: c, loop: l}
	ls.client.init(ls, cfd, clientTLS, c.cr.br)
	ls.upstream.init(ls, ufd, upstreamTLS, c.server.r.br)
	// The session's buffers move over with it (their unread input was copied above and
	// their output flushed): a new connection costs four buffers, not eight.
	c.cr.br.Reset(&ls.client.in)
	c.server.r.br.Reset(&ls.upstream.in)
	c.cw.Reset(ls.client.out())
	c.server.w.Reset(ls.upstream.out())

	if testHookBeforeTakeover != nil {
		testHookBeforeTakeover(c)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		unix.Close(cfd)
		unix.Close(ufd)
		s.loops.release(l)
		return true
	}
	// The TLS connections move onto the loop's sockets only now: a close that came first
	// closed them over their own sockets (and sent close_notify there).
	ls.client.attachTLS()
	ls.upstream.attachTLS()
	c.client = &loopConn{ls: ls, local: clientSock.LocalAddr(), remote: clientSock.RemoteAddr()}
	c.server.nc = &loopConn{ls: ls, local: upstreamSock.LocalAddr(), remote: upstreamSock.RemoteAddr()}
	c.loop.Store(ls)
	// From now on only the loop's goroutine (or a handler it detached) runs the session.
	c.singleGoroutine(true)
	// Posted under c.mu: a close that follows posts its teardown after the registration.
	l.post(ls.register)
	c.mu.Unlock()
	// The loop now owns duplicates of the sockets; closing the originals takes them out
	// of the runtime's poller. A TLS connection is not closed, which would end it for
	// the peer: only the socket under it.
	clientSock.Close()
	upstreamSock.Close()
	return true
}

// loopsServe reports whether event loops may serve the server's sessions: not with
// GoroutineRelay, nor for a rewriting proxy whose IDs is no IDProber (a loop must know
// whether an ID is at hand without waiting).
func (s *Server) loopsServe() bool {
	if _, ok := s.IDs.(IDProber); s.Rewriter != nil && !ok {
		return false
	}
	return !s.GoroutineRelay
}

// assignLoop returns the event loop a new session of c goes to, and a duplicate of
// clientSock, the client's socket, for the loop; nil when none can start or the socket
// cannot be duplicated (the loop's place is then given back).
func (s *Server) assignLoop(c *conn, clientSock net.Conn) (*eventLoop, int) {
	l, err := s.loops.assign(s.eventLoops(), s.PlainSends)
	if err != nil {
		c.log.WithError(err).Warn("cannot start an event loop; using goroutines")
		return nil, -1
	}
	cfd, err := dupSocket(clientSock)
	if err != nil {
		s.loops.release(l)
		return nil, -1
	}
	return l, cfd
}

// testHookBeforeTakeover, when set by a test, runs in adopt just before the loop takes
// the session over.
var testHookBeforeTakeover func(*conn)

// loopSocket returns the TCP or Unix socket under nc and, when nc is TLS over one, the
// TLS connection; ok is false for anything else.
func loopSocket(nc net.Conn) (sock net.Conn, tc *tls.Conn, ok bool) {
	if tc, isTLS := nc.(*tls.Conn); isTLS {
		t, isOurs := tc.NetConn().(*tlsTransport)
		if !isOurs {
			return nil, nil, false
		}
		sock, _, ok = loopSocket(t.Conn)
		return sock, tc, ok
	}
	switch nc.(type) {
	case *net.TCPConn, *net.UnixConn, *fdConn:
		return nc, nil, true
	}
	return nil, nil, false
}

// init sets up a side over the descriptor fd, with the TLS connection tc over it (nil
// for none, else see attachTLS), carrying over what br holds unread.
func (e *loopEnd) init(ls *loopSession, fd int, tc *tls.Conn, br *bufio.Reader) {
	e.ls, e.fd, e.tls = ls, fd, tc
	e.src, e.sink = fdSource{fd: fd}, fdSink{fd: fd}
	e.in = endReader{held: bufferedCopy(br), stream: &e.src}
	if tc != nil {
		e.in.stream = tc
	}
}

// mayHaveInput reports whether reading the side may bring bytes (or an error): not when
// its plain socket has been read short since epoll last reported it readable and nothing
// carried over is left. The session's reader holds whatever else there is. The server
// side of a session in transaction mode reads its pooledConn, which may hold answers of
// the proxy's own (see pooledConn.inputAtHand).
func (e *loopEnd) mayHaveInput() bool {
	if e.pooled {
		return e.pooledInput()
	}
	return e.src.readable || len(e.in.held) > 0 || e.tls != nil
}

// pooledInput is mayHaveInput for the upstream side of a session in transaction mode;
// kept out of line so that mayHaveInput, asked for every side at every pass of process,
// is inlined there.
//
//go:noinline
func (e *loopEnd) pooledInput() bool {
	return len(e.in.held) > 0 || e.ls.tx.inputAtHand()
}

// attachTLS points the side's TLS connection, if any, at the loop's reader and writer.
// Called under conn.mu once the session is the loop's, so that nothing else uses the
// TLS connection from then on.
func (e *loopEnd) attachTLS() {
	if e.tls != nil {
		t := e.tls.NetConn().(*tlsTransport)
		t.r, t.w = &e.src, &e.sink
	}
}

// out is what the session's writer of this side writes to.
func (e *loopEnd) out() io.Writer {
	if e.tls != nil {
		return e.tls
	}
	return &e.sink
}

// dupSocket returns a close-on-exec duplicate of nc's descriptor; an fdConn's own
// descriptor, which it gives up.
func dupSocket(nc net.Conn) (int, error) {
	if fc, ok := nc.(*fdConn); ok {
		if fd := fc.take(); fd >= 0 {
			return fd, nil
		}
		return -1, net.ErrClosed
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return -1, errors.New("not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var dupErr error
	if err := rc.Control(func(orig uintptr) {
		fd, dupErr = unix.FcntlInt(orig, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	if dupErr != nil {
		return -1, dupErr
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// bufferedCopy returns a copy of what br holds unread.
func bufferedCopy(br *bufio.Reader) []byte {
	if br.Buffered() == 0 {
		return nil
	}
	p, _ := br.Peek(br.Buffered())
	return append([]byte(nil), p...)
}

// register puts the session's sockets in the loop's epoll set and handles any input that
// came before.
func (ls *loopSession) register() {
	if ls.c.isClosed() {
		ls.teardown()
		return
	}
	if ls.loop.add(&ls.client) != nil || (ls.tx == nil && ls.loop.add(&ls.upstream) != nil) {
		ls.teardown()
		return
	}
	ls.c.log.Debug("session served by an event loop")
	ls.process()
}

// event handles the readiness of one of the session's sockets.
func (ls *loopSession) event(end *loopEnd, events uint32) {
	if ls.dead || ls.detached || (ls.tx != nil && end == &ls.upstream && end.pio == nil) {
		return // in transaction mode: a connection given back meanwhile
	}
	if events&(unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		end.hup = true
	}
	if events&(unix.EPOLLIN|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		end.source().readable = true
	}
	if events&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		end.output().flush()
	}
	ls.process()
}

// mayRead reports whether messages from end may be handled now: not while the output to
// the other side is backed up, nor while the replies to end's own side pile up.
func (ls *loopSession) mayRead(end *loopEnd) bool {
	other := &ls.upstream
	if end == &ls.upstream {
		other = &ls.client
	} else if ls.streaming > 0 {
		// A client message may answer the client itself, which must not land inside
		// the message being streamed to it.
		return false
	} else if ls.tx != nil && ls.tx.awaiting {
		return false // the client's messages wait for a server connection
	}
	return len(other.output().pending) == 0 && len(end.output().pending) < loopOutputLimit
}

// process handles the messages that are buffered whole, as the goroutine relay would,
// then writes the output and updates what the loop waits for.
func (ls *loopSession) process() {
	if ls.dead || ls.detached {
		return
	}
	defer ls.c.recoverPanic()
	if ls.finishing {
		ls.finishStep()
		return
	}
	c := ls.c
	if ls.tx != nil {
		ls.stillQuiet = false
		ls.takeBuffers()
		if ls.tx.awaiting && ls.tx.pump() != nil {
			ls.serverFailed()
			return
		}
	}
	budget := loopBudget
	for budget > 0 {
		moved := false
		for _, side := range [2]*loopEnd{&ls.client, &ls.upstream} {
			r := &c.cr
			if side == &ls.upstream {
				r = &c.server.r
				if ls.streaming > 0 {
					if !ls.mayRead(side) {
						continue
					}
					ls.writeOut()
					streamed, failed := ls.stream()
					if failed {
						ls.finish()
						return
					}
					if streamed {
						moved = true
						budget--
					}
					continue
				}
			}
			if r.br.Buffered() < 5 && !side.mayHaveInput() || !ls.mayRead(side) {
				// Nothing to read (the reader's calls down to the socket are spared), or
				// not now. Input is looked for first: most sides that may read have none.
				continue
			}
			// A fill of the reader may move the bytes of the run still to go out; the
			// handlers write in order after it.
			ls.writeOut()
			typ, n, ready, tooLarge := ls.whole(r, &side.in)
			if tooLarge {
				if side == &ls.upstream && ls.startStream() {
					moved = true
					continue
				}
				ls.handOff()
				return
			}
			if !ready {
				continue
			}
			moved = true
			if n >= 0 {
				// The messages that cross unchanged go out together.
				var run []byte
				var k int
				if side == &ls.client {
					var byMemo bool
					run, k, byMemo = c.passClientRun(budget, &ls.loop.plain)
					if ls.tx == nil {
						ls.relayRun(&c.cr, c.server.w, &ls.upstream, run)
					} else if err := ls.relayToPool(run, byMemo && ls.loop.plain.freeOfTxWords()); err != nil {
						c.tellClient(sqlstate.ConnectionFailure, "server closed the connection unexpectedly")
						ls.finish()
						return
					}
				} else {
					run, k = c.passUpstreamRun(budget)
					c.cwMu.Lock()
					ls.relayRun(&c.server.r, c.cw, &ls.client, run)
					c.cwMu.Unlock()
				}
				if k > 0 {
					budget -= k
					continue
				}
			}
			budget--
			var done bool
			switch {
			case n < 0 && side == &ls.client:
				done, _ = c.clientStep() // meets the error
			case n < 0:
				done, _ = c.upstreamStep()
			case side == &ls.client:
				_, _ = r.br.Discard(5)
				done, _ = c.clientMessage(typ, n)
			default:
				_, _ = r.br.Discard(5)
				done, _ = c.upstreamMessage(typ, n)
			}
			if ls.detached {
				// This goroutine is no longer the loop's: hand the rest back.
				ls.loop.post(func() { ls.reattach(done) })
				return
			}
			if done {
				ls.finish()
				return
			}
		}
		if !moved {
			break
		}
	}
	if !ls.bare && (c.cw.Buffered() > 0 || c.server.w.Buffered() > 0) {
		ls.flushWriters() // only when a handler left output
	}
	if !ls.settle(budget) || ls.out == nil {
		return
	}
	// The run relayed last goes out now that the rest is done; should the socket not
	// take it all, or fail, the session settles again around what is left.
	if ls.loop.batch.deferSend(ls.outTo, ls.out) {
		ls.out, ls.outTo = nil, nil
		return
	}
	to := ls.outTo
	ls.writeOut()
	if len(to.sink.pending) > 0 || to.sink.err != nil {
		ls.settle(budget)
	}
}

// queueAgain gives the session another turn of its loop, after every other ready
// session has had one (see eventLoop.runAgain).
func (ls *loopSession) queueAgain() {
	if !ls.queued {
		ls.queued = true
		ls.loop.again = append(ls.loop.again, ls)
	}
}

// settle acts on the session's output after process has handled its input: it ends
// the session whose client is gone or whose server connection failed (reporting false),
// gives back the memory of large messages, queues the session for another turn when it
// used up its budget, and tells the loop what to wait for.
func (ls *loopSession) settle(budget int) bool {
	if budget > 0 && ls.steady() {
		return true
	}
	switch {
	case ls.client.sink.err != nil:
		// The client is gone; so is the session.
		ls.teardown()
		return false
	case ls.upstream.output().err != nil:
		ls.c.tellClient(sqlstate.ConnectionFailure, "server closed the connection unexpectedly")
		ls.finish()
		return false
	}
	ls.shrink()
	if budget <= 0 {
		ls.queueAgain()
	}
	ls.rewatch()
	if ls.tx != nil && !ls.inQuiet && !ls.dead && ls.txQuiet() {
		ls.inQuiet = true
		ls.loop.quiet = append(ls.loop.quiet, ls)
	}
	return !ls.dead
}

// steady reports whether settling would leave the session as it is, as it does after
// most turns in session mode: nothing is pending for either socket nor held in a grown
// buffer, no write has failed, nothing streams, and both sockets are watched for input
// alone. It is the same test as settle's steps make one by one, in a few comparisons.
func (ls *loopSession) steady() bool {
	c, u := &ls.client, &ls.upstream
	return ls.tx == nil && !ls.dead && !ls.finishing && ls.streaming == 0 &&
		c.sink.drained() && u.sink.drained() && c.sink.err == nil && u.sink.err == nil &&
		c.watched && c.events == unix.EPOLLIN && u.watched && u.events == unix.EPOLLIN &&
		(ls.bare || ls.c.cr.br.Size() <= readBufferSize && ls.c.server.r.br.Size() <= readBufferSize)
}

// whole reports whether the next message from r is buffered whole, reading from the
// socket as needed, and returns its type and body length so that the handler need not
// read the header again. A failed read counts as ready with n = -1, so that the handler
// meets the error as the goroutine relay does; tooLarge means the message is beyond what
// a loop holds.
func (ls *loopSession) whole(r *msgReader, in *endReader) (typ byte, n int, ready, tooLarge bool) {
	typ, n, err := r.peekHeader()
	if err != nil {
		// Waiting for the header, or a header that next() rejects in the handler.
		return 0, -1, !isWouldBlock(err), false
	}
	need := 5 + n
	if need > loopMaxMessage && ls.tx == nil {
		// In transaction mode the pooledConn holds whole messages anyway, so that the
		// loop does too, up to the message size limit, which the handler checks.
		return 0, -1, false, true
	}
	for need > r.br.Size() {
		// Fill the buffer before growing it, so that memory follows the bytes that
		// came and not the length a header announced.
		if _, err := r.br.Peek(r.br.Size()); err != nil {
			return 0, -1, !isWouldBlock(err), false
		}
		r.br = rebuffer(r.br, in, min(need, 2*r.br.Size()))
	}
	if r.br.Buffered() < need {
		if _, err := r.br.Peek(need); err != nil {
			return 0, -1, !isWouldBlock(err), false
		}
	}
	return typ, n, true, false
}

// relayRun writes run, the first bytes r holds (a run of messages cleared to pass), to the
// side to, as relayRun does through w. When w holds nothing and r nothing more, they go
// straight from r's buffer to the socket of a plain side, without a copy into w, at the
// end of process (see out).
func (ls *loopSession) relayRun(r *msgReader, w *bufio.Writer, to *loopEnd, run []byte) {
	if len(run) == 0 || w.Buffered() > 0 || to.tls != nil || to.pio != nil || r.br.Buffered() != len(run) {
		ls.writeOut() // w goes out after it
		relayRun(r, w, run)
		return
	}
	ls.writeOut()
	// The bytes stay where they are until r reads again, which writeOut precedes.
	ls.out, ls.outTo = run, to
	_, _ = r.br.Discard(len(run))
}

// relayToPool hands run, the first bytes the client's reader holds (a run of messages
// cleared to pass), to the session's pooledConn in transaction mode, which looks at each
// on its way to whichever connection the session borrows. When the run is all the reader
// holds and nothing waits in the writer, the pooledConn takes it from the reader's buffer
// itself; otherwise it joins the writer, flushed when the reader holds nothing more.
// textsFree: no Query or Parse in run has any of the words transaction mode looks for,
// which the pooledConn then need not look for. It returns the error the handlers would
// have met writing them.
func (ls *loopSession) relayToPool(run []byte, textsFree bool) error {
	if len(run) == 0 {
		return nil
	}
	r, w := &ls.c.cr, ls.c.server.w
	var err error
	if w.Buffered() == 0 && r.br.Buffered() == len(run) {
		_, err = ls.tx.write(run, textsFree)
	} else if _, err = w.Write(run); err == nil && r.br.Buffered() == len(run) {
		err = w.Flush()
	}
	_, _ = r.br.Discard(len(run))
	return err
}

// writeOut writes the run of messages process has left to go out last, if any, to its
// socket; what the socket does not take now waits in pending. It must run before the
// reader the bytes are in reads again (a fill moves them) and before anything else is
// written to that socket.
func (ls *loopSession) writeOut() {
	if ls.out == nil {
		return
	}
	p, to := ls.out, ls.outTo
	ls.out, ls.outTo = nil, nil
	_, _ = to.sink.Write(p)
}

// startStream starts forwarding the upstream's next message, too large for the loop to
// hold, to the client as its bytes arrive. Only a DataRow or CopyData qualifies: the
// proxy passes them on untouched in every mode (see fromUpstream). It reports false for
// any other message, and for one over the message size limit, which the handler reports.
func (ls *loopSession) startStream() bool {
	c := ls.c
	typ, n, err := c.server.r.peekHeader()
	if err != nil || (typ != serverDataRow && typ != serverCopyData) {
		return false
	}
	_, _ = c.server.r.br.Discard(5)
	c.cwMu.Lock()
	_ = writeHeader(c.cw, typ, n) // the sink keeps a write error for the loop to act on
	c.cwMu.Unlock()
	ls.streaming = n
	return true
}

// stream forwards what has arrived of the message being streamed to the client. It
// reports whether bytes moved, and failed when the upstream ended mid-message.
func (ls *loopSession) stream() (streamed, failed bool) {
	c := ls.c
	br := c.server.r.br
	if br.Buffered() == 0 {
		if _, err := br.Peek(1); err != nil {
			return false, !isWouldBlock(err)
		}
	}
	chunk := min(ls.streaming, br.Buffered())
	p, _ := br.Peek(chunk)
	c.cwMu.Lock()
	_, _ = c.cw.Write(p)
	c.cwMu.Unlock()
	_, _ = br.Discard(chunk)
	ls.streaming -= chunk
	return true, false
}

// abort is the engine's: it ends the session whose handler panicked.
func (ls *loopSession) abort() {
	if ls.detached {
		// This goroutine is no longer the loop's; the runner ends the session.
		ls.loop.post(func() {
			ls.endOnBack = true
			ls.reattach(true)
		})
		return
	}
	ls.teardown()
}

// rebuffer returns a reader of the given size over in that starts with what br holds.
func rebuffer(br *bufio.Reader, in *endReader, size int) *bufio.Reader {
	if held := bufferedCopy(br); held != nil {
		in.held = append(held, in.held...)
	}
	return bufio.NewReaderSize(in, size)
}

// shrink gives back the memory of a large message once it has been handled.
func (ls *loopSession) shrink() {
	if ls.bare {
		return
	}
	c := ls.c
	if c.cr.br.Size() > readBufferSize && c.cr.br.Buffered() <= readBufferSize {
		c.cr.br = rebuffer(c.cr.br, &ls.client.in, readBufferSize)
	}
	if c.server.r.br.Size() > readBufferSize && c.server.r.br.Buffered() <= readBufferSize {
		c.server.r.br = rebuffer(c.server.r.br, &ls.upstream.in, readBufferSize)
	}
	ls.client.sink.shrink()
	ls.upstream.sink.shrink()
}

func (ls *loopSession) flushWriters() {
	ls.writeOut()
	if ls.bare {
		return
	}
	c := ls.c
	c.cwMu.Lock()
	_ = c.cw.Flush()
	c.cwMu.Unlock()
	_ = c.server.w.Flush()
}

// rewatch tells the loop which events of the session's sockets matter now.
func (ls *loopSession) rewatch() {
	if ls.tx != nil && !ls.syncServer() {
		ls.c.log.Warn("an event loop cannot watch a server connection")
		ls.teardown()
		return
	}
	var cw, uw uint32
	if len(ls.client.sink.pending) > 0 {
		cw |= unix.EPOLLOUT
	}
	if len(ls.upstream.output().pending) > 0 {
		uw |= unix.EPOLLOUT
	}
	if !ls.finishing {
		if ls.mayRead(&ls.client) || ls.awaitingQuietClient() {
			cw |= unix.EPOLLIN
		}
		if ls.mayRead(&ls.upstream) {
			uw |= unix.EPOLLIN
		}
	}
	ls.loop.watch(&ls.client, cw)
	if ls.tx == nil || ls.upstream.pio != nil {
		ls.loop.watch(&ls.upstream, uw)
	}
}

// awaitingQuietClient reports whether a session in transaction mode waits for a server
// connection while its client's socket has shown nothing more to read: the socket then
// stays watched, which spares taking it out of the epoll set and putting it back for
// every transaction that waits. Should the client send more meanwhile, the loop hears of
// it once and takes the socket out then: a level-triggered set would report it again
// and again.
func (ls *loopSession) awaitingQuietClient() bool {
	return ls.tx != nil && ls.tx.awaiting && !ls.client.src.readable
}

// finish ends the session once its output has been written (or drainTimeout has passed),
// like the goroutine relay's last flush before closing.
func (ls *loopSession) finish() {
	ls.finishing = true
	ls.deadline = time.Now().Add(drainTimeout)
	ls.loop.timed[ls] = struct{}{}
	ls.finishStep()
}

func (ls *loopSession) finishStep() {
	ls.flushWriters()
	client, upstream := &ls.client.sink, ls.upstream.output()
	if client.err != nil {
		ls.teardown()
		return
	}
	if len(client.pending) > 0 || (len(upstream.pending) > 0 && upstream.err == nil) {
		ls.rewatch()
		return
	}
	if !ls.draining {
		ls.teardown()
		return
	}
	// The client's socket leaves the loop for a goroutine that drains it as a goroutine
	// pair would, and the session ends.
	ls.loop.remove(&ls.client)
	nc, err := fileConn(ls.client.fd)
	ls.client.fd = -1
	if err == nil {
		go func() {
			drain(nc, nc)
			nc.Close()
		}()
	}
	ls.teardown()
}

// teardown closes the session's sockets and gives back its place in the loop.
func (ls *loopSession) teardown() {
	if ls.dead {
		return
	}
	if ls.detached {
		// The detached goroutine may still use the sockets; they close when it is done.
		ls.endOnBack = true
		return
	}
	ls.dead = true
	ls.out, ls.outTo = nil, nil // the session ends: nothing more goes out
	l := ls.loop
	l.remove(&ls.client)
	if ls.client.fd >= 0 {
		unix.Close(ls.client.fd)
	}
	if ls.tx != nil {
		if ls.bare {
			ls.c.srv.pooling.bare.Add(-1)
		}
		// The server connection goes back to the pool, never closed here.
		ls.tx.endOnLoop()
		l.remove(&ls.upstream)
		if !ls.bare {
			// The buffers serve the next session: a login allocates none.
			ls.dropBuffers()
			ls.bare = true
		}
	} else {
		l.remove(&ls.upstream)
		if !ls.keepUpstream() {
			unix.Close(ls.upstream.fd)
		}
	}
	delete(l.timed, ls)
	ls.c.close()
	ls.c.log.Debug("session ended")
	l.group.release(l)
}

// drainClient is the engine's: the client is drained once the session's output has
// gone out (see finishStep).
func (ls *loopSession) drainClient() { ls.draining = true }

// whenQuiet is the engine's: f runs on the loop, between two handlers.
func (ls *loopSession) whenQuiet(f func() bool) {
	ls.loop.post(func() {
		if ls.dead || ls.detached || ls.finishing {
			return
		}
		if ls.tx != nil {
			ls.takeBuffers()
		}
		if f() {
			ls.finish()
		} else if ls.tx != nil && !ls.inQuiet && ls.txQuiet() {
			ls.inQuiet = true
			ls.loop.quiet = append(ls.loop.quiet, ls)
		}
	})
}

// detach is called by a handler on the loop's goroutine that must wait (for an ID) in
// the middle of a message. Another goroutine takes over the loop, as the runtime hands a
// processor on when a thread blocks in a system call, and the session sits out: its
// sockets leave the epoll set until this goroutine has finished the message and posted
// the session back (reattach). Until then the new runner leaves the session alone.
func (ls *loopSession) detach() {
	if ls.detached {
		return
	}
	ls.detached = true
	l := ls.loop
	// Its bytes in the loop's batch go now: the goroutine may write to its sockets.
	ls.client.sink.sendDeferred()
	ls.upstream.sink.sendDeferred()
	// What the turn's receive batch holds goes to memory of its own, for the goroutine
	// and for the sessions whose events the next runner does not see again.
	l.recv.release()
	l.unwatch(&ls.client)
	l.unwatch(&ls.upstream)
	l.gen.Add(1)
	go l.run()
}

// reattach takes a session back after a detached handler is done; done is what its step
// reported.
func (ls *loopSession) reattach(done bool) {
	ls.detached = false
	switch {
	case ls.endOnBack:
		ls.teardown()
	case done:
		ls.finish()
	default:
		// Nothing may follow: process may detach again, and this goroutine with it.
		ls.process()
	}
}
