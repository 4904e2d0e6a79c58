package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"
	"unique"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// This file is transaction mode: a session borrows a server connection of the pool
// (physConn) at the first message of a transaction, or of a statement outside one, and
// gives it back at the ReadyForQuery with status I that leaves nothing outstanding.
//
// The session's code does not know: its server connection (serverConn) is built over a
// pooledConn, a net.Conn that stands for "whichever server connection serves this
// session now". What the session writes to it goes to the borrowed connection, with the
// client's statement names mapped to the proxy's own; what it reads is what that
// connection answers, less the answers to what the proxy sent on its own behalf. So
// everything above (rewriting, hidden parameters, the fast path, refusals, COPY) works
// as in session mode.
//
// What a pooledConn does in between:
//   - Statements: a named statement the client parses belongs to the client. It is
//     prepared at the server under a name of the proxy's, derived from its text and
//     parameter types (pstmtName), on each server connection that runs it, once: a Bind
//     or Describe of a statement that connection lacks is preceded by its Parse, whose
//     ParseComplete the client never sees. The unnamed statement is carried the same
//     way from one cycle to the next. A client's Close of a named statement is answered
//     through a Close of a portal that does not exist, which the server acknowledges in
//     order, so that the statement stays prepared for whoever else uses it; a SQL-level
//     DEALLOCATE, as a Query or parsed as any statement, is answered by the proxy (see
//     txlocal.go). Past Server.MaxPreparedStatements on a connection, the least recently
//     used statements are closed there (see txstmts.go).
//   - Settings: the client's values of the settings the server reports (ParameterStatus)
//     and of those it SET itself are applied, with set_config, on each server connection
//     it borrows where they differ; what a client SET is read back from pg_settings when
//     its transaction has ended (see captureSQL), so that search_path and the other
//     settings the server does not report follow the client too.
//   - Refusals: what cannot follow a client from one server connection to the next
//     (session advisory locks, LISTEN, temporary tables, cursors WITH HOLD, SQL-level
//     PREPARE, SET SESSION AUTHORIZATION) is refused with 0A000 (see txrefusal.go),
//     without a server connection when the session holds none (see txlocal.go).
//   - Failures: a wait for a connection that times out, or a server that cannot be
//     reached, fails the cycle with the pool's SQLSTATE (57014, 08001) and the session
//     goes on; a connection lost while borrowed ends this session only (08006), and the
//     connection is closed; a session that ends while it holds a connection in a
//     transaction gives it back broken (closed, never lent again).

// settable tells which reported settings a client may SET, and the proxy carries.
var notCarried = map[string]bool{
	"server_version": true, "server_encoding": true, "is_superuser": true,
	"session_authorization": true, "integer_datetimes": true, "in_hot_standby": true,
	"scram_iterations": true,
}

// captureSQL reads back the settings a client changed with SET (or RESET) once its
// transaction has ended: those with source "session" are exactly what SET, set_config and
// the proxy's own set_config left on the connection. pg_settings never lists role, which
// SET ROLE changes: it is read on its own, lest it stay on the connection for the next client.
const captureSQL = "SELECT name, pg_catalog.current_setting(name) FROM pg_catalog.pg_settings WHERE source = 'session' UNION ALL SELECT 'role', pg_catalog.current_setting('role') WHERE pg_catalog.current_setting('role') <> 'none'"

// clientStmt is a statement the client parsed: the body of its Parse after the name
// (query, parameter types) and the name it has at the server; dealloc, for the Parse of
// a DEALLOCATE, what it deallocates (rest is then an empty statement's, see txstmts.go).
type clientStmt struct {
	rest    []byte
	sname   string
	dealloc *deallocation
}

// pstmtName is the server-side name of a statement: a digest of its text and parameter
// types, so that clients preparing the same statement share it on a server connection.
func pstmtName(rest []byte) string {
	sum := sha256.Sum256(rest)
	return "leafproxy_" + hex.EncodeToString(sum[:12])
}

// expectKind is what a message sent to a server connection awaits an answer to.
type expectKind byte

const (
	expParse         expectKind = iota + 1 // the client's Parse: ParseComplete
	expInjectedParse                       // the proxy's Parse of a client's statement: ParseComplete, swallowed
	expClose                               // the client's Close: CloseComplete
	expInjectedClose                       // the proxy's Close before a Parse again: CloseComplete, swallowed
	expSync                                // Sync: ReadyForQuery
	expQuery                               // Query or FunctionCall: ReadyForQuery
	expInjectedQuery                       // the proxy's Query (settings): everything up to ReadyForQuery, swallowed
	expExecute                             // the client's Execute, once it parsed a DEALLOCATE (see txstmts.go)
)

// expect is an answer the proxy expects from the server, in order (see pooledConn.queue).
type expect struct {
	kind expectKind
	// name is the server-side statement of a Parse or of the proxy's Close ("" for the
	// unnamed one), client the client's name of the statement of its own Parse or Close.
	name, client string
	// was: the proxy's Close closes a statement that was prepared (restored when the
	// server skips the Close); stmt: the client's statement its Close forgot.
	was  bool
	stmt *clientStmt
	// dropped: the client's statements the DEALLOCATE of an Execute forgot (restored when
	// the server skips the Execute).
	dropped map[string]*clientStmt
	// refusal replaces the server's error for a refused statement's stand-in.
	refusal []byte
	// capture: the injected query is captureSQL.
	capture bool
	// dealloc: the empty Query in the place of a DEALLOCATE (see txlocal.go), or the
	// Execute of a portal of a DEALLOCATE's statement (see txstmts.go).
	dealloc *deallocation
}

// pooledConn is the server side of a session in transaction mode; see the top of the
// file. Write is called by whoever flushes the session's server writer, Read by the
// goroutine that relays the server's messages; both may block, neither holds mu then. On
// an event loop neither blocks, and Read holds mu while it reads the borrowed connection.
type pooledConn struct {
	c   *conn
	key pool.Key

	mu       sync.Mutex
	cond     sync.Cond
	srv      *pool.Server[*physConn] // the borrowed connection; nil when none
	pc       *physConn
	readerOn bool // Read may read from pc
	reading  bool // Read is reading from pc right now
	writers  int  // Writes in progress
	release  bool // give pc back once writers is 0
	closed   bool
	queries  int // cycles of the borrower, for the pool's figures
	// waitCtx is the context of the waits for a server connection, kept from one wait to
	// the next until a cancel request ends it (stopWait) or the session parks; inWait:
	// a wait is in progress.
	waitCtx  context.Context
	stopWait context.CancelCauseFunc
	inWait   bool

	// host is the event loop serving the session (txloop_linux.go), nil while goroutines
	// do. On a loop nothing blocks: a borrow that must wait returns errAwaitServer, the
	// client's messages wait in wbuf (awaiting), and the pool's answer comes back through
	// the loop (granted) as grant and grantErr.
	host     txHost
	wait     *pool.Wait[*physConn]
	waitIn   pool.Wait[*physConn] // where the session waits: one wait at a time
	awaiting bool
	granted  bool
	grant    *pool.Server[*physConn]
	grantErr error
	// The mailbox of the pool's answer to a wait (see poolAnswer), and poolAnswer and
	// takeAnswer as func values, made once.
	mailMu       sync.Mutex
	mailWait     *pool.Wait[*physConn]
	mailSrv      *pool.Server[*physConn]
	mailErr      error
	onAnswer     func(*pool.Wait[*physConn], *pool.Server[*physConn], error)
	takeAnswerFn func()

	// Protocol state of the borrowed connection. queue is consumed from its front; qarr
	// is the array it lives in, where it starts again when empty (see push).
	queue       []expect
	qarr        []expect
	outstanding int  // ReadyForQuery messages the server still owes
	unsynced    bool // extended-protocol messages sent since the last Sync
	txStatus    byte
	needCapture bool // a SET ran: read the settings back when idle
	// captureNames collects the settings captureSQL returned so far.
	captureNames []string

	// Client state, kept across borrowed connections.
	stmts   map[string]*clientStmt
	unnamed *clientStmt
	params  map[string]string // lower-case name → the client's value
	// custom holds the custom settings the client SET (see txcustom.go), customSQL the
	// capture query that reads them back ("" until built).
	custom    map[string]bool
	customSQL string
	// plainText is the last text of a Query or Parse in which scanTxWords found nothing
	// (see checkText).
	plainText []byte
	// localDealloc is the DEALLOCATE of an extended-protocol cycle the proxy answers.
	localDealloc *deallocation
	// deallocPortals holds the portals bound to a DEALLOCATE's statement while the
	// session holds a connection; trackExecutes: the session parsed a DEALLOCATE, so each
	// Execute's answer is awaited (see txstmts.go).
	deallocPortals map[string]*deallocation
	trackExecutes  bool
	// paramsKey stands for params, interned (see settingsKey); keyOK: it is up to date.
	paramsKey unique.Handle[string]
	keyOK     bool

	// Write side: a partial message, and the error that fails the cycle being discarded;
	// obuf is the output buffer of Write, used by the writer only.
	wbuf       []byte
	obuf       []byte
	discarding []byte // ErrorResponse to answer at the Sync; nil when not discarding
	// runs: handle sends messages that go as they are from its input (see passOn), and
	// passed says that clientMessage left the message there.
	runs, passed bool
	// heldVerdict is the verdict on the message at the head of wbuf, which waits for a
	// connection (verdictHeld), so that its text is not looked at again.
	heldVerdict queryVerdict
	verdictHeld bool

	// Read side: bytes ready for the caller, answers of the proxy's own, and the rest of
	// a large message streamed from pc.
	rout    []byte
	roff    int // bytes of rout already read; 0 when rout is empty
	synth   []byte
	rstream int       // touched by the reader only
	rpc     *physConn // the connection rstream belongs to; reader only
	rbuf    []byte    // the message being read; reader only
	rneed   int       // bytes of the message in rbuf still to come; reader only
	// direct is the caller's buffer of the Read in progress, which serverMessage fills
	// as far as it can (see emit); nil between Reads.
	direct []byte

	park parkState
}

func newPooledConn(c *conn, key pool.Key) *pooledConn {
	v := &pooledConn{c: c, key: key, txStatus: txIdle, stmts: make(map[string]*clientStmt), params: make(map[string]string)}
	v.cond.L = &v.mu
	return v
}

// acquire borrows a server connection for the session.
// A cancel request ends the wait, and the statement fails with 57014 as a cancelled one.
func (v *pooledConn) acquire() (*pool.Server[*physConn], error) {
	p, err := v.c.srv.serverPool()
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	if v.waitCtx == nil || v.waitCtx.Err() != nil {
		v.waitCtx, v.stopWait = context.WithCancelCause(v.c.ctx)
	}
	ctx := v.waitCtx
	v.inWait = true
	v.mu.Unlock()
	srv, err := p.Acquire(ctx, v.key)
	v.mu.Lock()
	v.inWait = false
	v.mu.Unlock()
	if err != nil && errors.Is(context.Cause(ctx), errWaitCancelled) {
		return nil, errWaitCancelled
	}
	return srv, err
}

// errAwaitServer stops the handling of a session's messages on an event loop until the
// pool lends the session a connection.
var errAwaitServer = errors.New("waiting for a server connection")

// txHost is the event loop that serves a session in transaction mode.
type txHost interface {
	// post runs f on the loop's goroutine, reporting false when the loop has stopped.
	post(f func()) bool
	// dropServer stops watching the socket of the borrowed connection; called by the
	// session's goroutine just before the connection goes back to the pool, where another
	// loop may take it at once. With keep, the connection goes back clean and its socket
	// may stay in the loop's epoll set for the next borrower of the loop (see
	// physIO.park).
	dropServer(keep bool)
	// resume runs the session on its loop after a wait for a connection has ended; called
	// on the loop's goroutine.
	resume()
	// release gives srv back to the pool as st says.
	release(srv *pool.Server[*physConn], st pool.State)
}

// borrow gets a server connection for the session; mu is held. On goroutines it waits,
// letting go of mu meanwhile. On an event loop it returns errAwaitServer when none is
// free at once; the pool's answer comes through granted, and the next borrow returns it.
func (v *pooledConn) borrow() (*pool.Server[*physConn], error) {
	if v.host == nil {
		v.mu.Unlock()
		srv, err := v.acquire()
		v.mu.Lock()
		return srv, err
	}
	if v.granted {
		srv, err := v.grant, v.grantErr
		v.grant, v.grantErr, v.granted = nil, nil, false
		return srv, err
	}
	if v.wait != nil {
		return nil, errAwaitServer
	}
	p, err := v.c.srv.serverPool()
	if err != nil {
		return nil, err
	}
	if v.onAnswer == nil {
		v.onAnswer, v.takeAnswerFn = v.poolAnswer, v.takeAnswer
	}
	srv, w, err := p.AcquireFuncIn(v.key, &v.waitIn, v.onAnswer)
	if w != nil {
		v.wait = w
		return nil, errAwaitServer
	}
	return srv, err
}

// poolAnswer is AcquireFunc's done: the pool's answer to the session's wait goes in the
// mailbox, and the loop is asked to take it. The pool's lock is held. A session has one
// wait at a time, so one place suffices, and nothing allocates per wait.
func (v *pooledConn) poolAnswer(w *pool.Wait[*physConn], srv *pool.Server[*physConn], err error) {
	v.mailMu.Lock()
	v.mailWait, v.mailSrv, v.mailErr = w, srv, err
	v.mailMu.Unlock()
	if !v.host.post(v.takeAnswerFn) && srv != nil {
		go srv.Release(pool.Clean)
	}
}

// takeAnswer takes the pool's answer from the mailbox, on the session's loop.
func (v *pooledConn) takeAnswer() {
	v.mailMu.Lock()
	w, srv, err := v.mailWait, v.mailSrv, v.mailErr
	v.mailWait, v.mailSrv, v.mailErr = nil, nil, nil
	v.mailMu.Unlock()
	if w == nil {
		return
	}
	v.mu.Lock()
	if v.closed || v.wait != w {
		v.mu.Unlock()
		if srv != nil {
			srv.Release(pool.Clean)
		}
		return
	}
	v.wait = nil
	v.grant, v.grantErr, v.granted = srv, err, true
	v.mu.Unlock()
	v.host.resume()
}

// cancelWaitLocked ends the session's wait on an event loop for a connection, if any,
// with err; v.mu is held.
func (v *pooledConn) cancelWaitLocked(err error) {
	if v.wait == nil {
		return
	}
	p := v.c.srv.existingPool()
	if p == nil || !p.CancelWait(v.wait) {
		return // the answer is on its way
	}
	v.wait = nil
	v.grant, v.grantErr, v.granted = nil, err, true
	if err != nil {
		host := v.host
		host.post(host.resume)
	}
}

// dropWaitContext lets go of the context of the waits for a server connection; v.mu is
// held.
func (v *pooledConn) dropWaitContext() {
	if v.stopWait != nil && !v.inWait {
		v.stopWait(nil)
		v.waitCtx, v.stopWait = nil, nil
	}
}

// errWaitCancelled ends a wait for a server connection that the client cancelled.
var errWaitCancelled = errors.New("canceling statement due to user request")

// take makes srv the session's connection and appends to out what applies the client's
// settings to it.
func (v *pooledConn) take(out []byte, srv *pool.Server[*physConn]) []byte {
	v.srv, v.pc = srv, srv.Conn()
	if v.pc.io != nil {
		v.pc.io.onLoop = v.host != nil
	}
	v.readerOn, v.release, v.queries = true, false, 0
	v.cond.Broadcast()
	return v.applySettings(out)
}

// giveBack returns the borrowed connection to the pool.
func (v *pooledConn) giveBack(st pool.State) {
	if v.srv == nil {
		return
	}
	if st == pool.Clean {
		v.srv.CountTransaction(v.queries)
		if v.pc.sessionUserChanged() {
			st = pool.NeedsReset
		}
	}
	if io := v.pc.io; io != nil {
		if len(io.sink.pending) > 0 && st != pool.Broken {
			st = pool.Broken // output the server never got: its state is unknown
		}
		if v.host != nil {
			v.host.dropServer(st == pool.Clean)
		}
		io.onLoop = false
	}
	if v.host != nil {
		v.host.release(v.srv, st)
	} else {
		v.srv.Release(st)
	}
	v.srv, v.pc = nil, nil
	v.readerOn, v.release, v.reading = false, false, false
	v.queue = v.queue[:0]
	v.outstanding, v.unsynced = 0, false
	v.cond.Broadcast()
}

// idle reports whether the borrowed connection owes nothing and is outside a transaction.
func (v *pooledConn) idle() bool {
	return v.outstanding == 0 && !v.unsynced && v.txStatus == txIdle && len(v.queue) == 0
}

// Write takes the session's messages for the server: whole messages are handled as they
// complete (see clientMessage) and what the server must get is written to the borrowed
// connection. On an event loop, messages that must wait for a connection wait in wbuf
// (awaiting) until pump; and as nothing there blocks, nor runs the session meanwhile,
// Write holds mu throughout, the write to the connection included.
func (v *pooledConn) Write(p []byte) (int, error) {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return 0, net.ErrClosed
	}
	held := v.host != nil
	if held {
		defer v.mu.Unlock()
	} else {
		v.writers++
		defer v.endWrite()
	}
	if v.awaiting {
		v.wbuf = append(v.wbuf, p...)
		if !held {
			v.mu.Unlock()
		}
		return len(p), nil
	}
	// Whole messages are handled where they are: in p, or in wbuf once a partial one
	// has been completed there.
	if len(v.wbuf) > 0 {
		v.wbuf = append(v.wbuf, p...)
		return len(p), v.handle(v.wbuf, true, held)
	}
	return len(p), v.handle(p, false, held)
}

// pump handles the messages that waited for a connection, once the wait has ended; the
// session's loop calls it.
func (v *pooledConn) pump() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.awaiting || !v.granted || v.closed {
		return nil
	}
	v.awaiting = false
	return v.handle(v.wbuf, true, true)
}

// handle handles the whole messages at the start of in, which is wbuf (inBuf) or the
// caller's, and writes what the server must get; the rest (a partial message, or
// messages waiting for a connection) stays in wbuf. Called with mu held, which it lets go
// unless the caller holds it throughout (held, on an event loop).
//
// Messages that go to the server as they are (see passOn) are written from in itself
// while nothing else is to go before them: most cycles then cost no copy. Not from wbuf
// when mu is let go before the write, for wbuf is compacted first.
func (v *pooledConn) handle(in []byte, inBuf, held bool) error {
	out := v.obuf[:0]
	var pc *physConn
	done := 0
	runFrom, runTo := 0, 0 // the run of in that goes out as it is, while out is empty
	v.runs = held || !inBuf
	for len(in)-done >= 5 {
		n := int(binary.BigEndian.Uint32(in[done+1:])) + 1
		if n < 5 || len(in)-done < n {
			break
		}
		var err error
		v.passed = false
		out, pc, err = v.clientMessage(out, pc, in[done:done+n])
		if err == errAwaitServer {
			v.awaiting = true
			break
		}
		if err != nil {
			v.runs = false
			if !held {
				v.mu.Unlock()
			}
			return err
		}
		switch {
		case v.passed:
			if runTo == runFrom {
				runFrom = done
			}
			runTo = done + n
		case runTo > runFrom:
			// Something else than the message as it is, or nothing at all: the run
			// goes first, and what follows is built in out.
			out = slices.Insert(out, 0, in[runFrom:runTo]...)
			runFrom, runTo, v.runs = 0, 0, false
		}
		done += n
	}
	v.runs = false
	if cap(out) <= keepBufferSize {
		v.obuf = out[:0]
	}
	if runTo > runFrom {
		out = in[runFrom:runTo]
	}
	var err error
	if held && len(out) > 0 {
		_, err = pc.nc.Write(out) // does not block on a loop; out may be part of wbuf
		out = nil
	}
	if inBuf {
		v.wbuf = v.wbuf[:copy(v.wbuf, v.wbuf[done:])]
	} else {
		v.wbuf = append(v.wbuf, in[done:]...)
	}
	if len(v.wbuf) == 0 && cap(v.wbuf) > keepBufferSize {
		v.wbuf = nil
	}
	if held {
		return err
	}
	v.mu.Unlock()
	if len(out) > 0 {
		if _, err := pc.nc.Write(out); err != nil {
			return err
		}
	}
	return nil
}

// passOn appends msg, a message of the session that goes to the server as it is, to out;
// while out is empty and handle keeps runs, it leaves msg where it is, and passed tells
// handle to send it from there.
func (v *pooledConn) passOn(out, msg []byte) []byte {
	if v.runs && len(out) == 0 {
		v.passed = true
		return out
	}
	return append(out, msg...)
}

func (v *pooledConn) endWrite() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.writers--
	if v.writers == 0 && v.release && v.srv != nil {
		v.giveBack(pool.Clean)
	}
}

// clientMessage handles one whole message of the session, appending what pc must get to
// out. Messages for one Write all go to one connection: one is borrowed only when none
// is held, and none is given back while a Write is in progress. Called with mu held; it
// lets go of it while it waits for a connection.
func (v *pooledConn) clientMessage(out []byte, pc *physConn, msg []byte) ([]byte, *physConn, error) {
	typ, body := msg[0], msg[5:]
	if typ == clientTerminate {
		return out, pc, nil // a pooled connection outlives its borrowers
	}
	if v.discarding != nil {
		if typ == clientSync {
			v.synth = append(v.synth, v.discarding...)
			v.synth = append(v.synth, serverReadyForQuery, 0, 0, 0, 5, txIdle)
			v.discarding = nil
			v.cond.Broadcast()
		}
		return out, pc, nil
	}
	var verdict queryVerdict
	switch {
	case v.verdictHeld:
		// The message waited for a connection: it was looked at already.
		verdict, v.heldVerdict, v.verdictHeld = v.heldVerdict, queryVerdict{}, false
	case typ == clientQuery:
		verdict = v.checkQuery(body)
	case typ == clientParse:
		verdict = v.checkParse(body)
	}
	if v.pc == nil && v.answerIdle(typ, body, verdict) {
		return out, pc, nil
	}
	if v.pc == nil {
		switch typ {
		case clientSync: // an empty cycle: nothing to ask a server
			v.synth = append(v.synth, serverReadyForQuery, 0, 0, 0, 5, txIdle)
			v.cond.Broadcast()
			return out, pc, nil
		case clientFlush, clientCopyData, clientCopyDone, clientCopyFail:
			return out, pc, nil
		}
		srv, err := v.borrow()
		if err == errAwaitServer {
			v.heldVerdict, v.verdictHeld = verdict, true
			return out, pc, err
		}
		if v.closed {
			if srv != nil {
				srv.Release(pool.Clean)
			}
			return out, pc, net.ErrClosed
		}
		if err != nil {
			v.c.log.WithError(err).Info("no server connection for a transaction")
			e := acquireError(err)
			if typ == clientQuery || typ == clientFunctionCall {
				v.synth = append(v.synth, e...)
				v.synth = append(v.synth, serverReadyForQuery, 0, 0, 0, 5, txIdle)
				v.cond.Broadcast()
			} else {
				v.discarding = e
			}
			return out, pc, nil
		}
		out = v.take(out, srv)
	}
	pc = v.pc
	if !v.readerOn {
		v.readerOn, v.release = true, false
		v.cond.Broadcast()
	}
	switch typ {
	case clientQuery:
		if verdict.dealloc != nil {
			var r []byte
			if out, r = v.deallocateInTransaction(out, verdict.dealloc); r == nil {
				return out, pc, nil
			}
			verdict.refusal = r
		}
		v.outstanding++
		v.queries++
		pc.unnamed = nil // a Query replaces the unnamed statement
		e := expect{kind: expQuery}
		if r := verdict.refusal; r != nil {
			e.refusal = r
			v.push(e)
			return appendQuery(out, standInSQL), pc, nil
		}
		v.push(e)
	case clientFunctionCall:
		v.outstanding++
		v.queries++
		v.push(expect{kind: expQuery})
	case clientSync:
		v.outstanding++
		v.queries++
		v.unsynced = false
		v.push(expect{kind: expSync})
	case clientParse:
		v.unsynced = true
		return v.parse(out, msg, verdict), pc, nil
	case clientBind:
		v.unsynced = true
		return v.bind(out, msg), pc, nil
	case clientDescribe:
		v.unsynced = true
		if len(body) >= 2 && body[0] == targetStatement {
			stmt, ok := v.ensure(&out, zstring(body[1:]))
			if ok {
				return appendMessage(out, clientDescribe, []byte{targetStatement}, []byte(stmt), []byte{0}), pc, nil
			}
		}
	case clientClose:
		v.unsynced = true
		if len(body) >= 2 && body[0] == targetStatement {
			name := zstring(body[1:])
			if name != "" {
				v.push(expect{kind: expClose, client: name, stmt: v.stmts[name]})
				delete(v.stmts, name)
				return appendMessage(out, clientClose, []byte{targetPortal}, []byte(noPortal), []byte{0}), pc, nil
			}
			v.unnamed, pc.unnamed = nil, nil
		} else if len(body) >= 2 {
			delete(v.deallocPortals, zstring(body[1:]))
		}
		v.push(expect{kind: expClose})
	case clientExecute:
		v.unsynced = true
		if v.trackExecutes {
			return v.execute(out, msg), pc, nil
		}
	case clientFlush:
		v.unsynced = true
	}
	return v.passOn(out, msg), pc, nil
}

// push queues an answer the server owes the proxy. The queue is consumed from its front
// (v.queue[1:]), which loses the array's first places: an empty queue starts again at the
// front of its array, so that once the array is large enough for a session's cycles, its
// appends allocate nothing.
func (v *pooledConn) push(e expect) {
	if len(v.queue) == 0 {
		v.queue = v.qarr[:0]
	}
	v.queue = append(v.queue, e)
	if cap(v.queue) > cap(v.qarr) {
		v.qarr = v.queue[:0] // grown into a new array, which starts with the queue
	}
}

// noPortal is a portal name no client can have: the proxy closes it in answer to a
// client's Close of a statement, for the server's CloseComplete in order.
const noPortal = "leafproxy no portal"

// parse handles a Parse: the statement is the client's, prepared at the server under its
// server-side name. verdict refuses it, or makes it a DEALLOCATE's (see checkParse).
func (v *pooledConn) parse(out, msg []byte, verdict queryVerdict) []byte {
	body := msg[5:]
	name := zstring(body)
	rest := body[len(name)+1:]
	r := verdict.refusal
	if r == nil && name != "" && v.stmts[name] != nil {
		r = errorMessage(sqlstate.DuplicatePreparedStatement, fmt.Sprintf("prepared statement %q already exists", name), "")
	}
	if r != nil {
		if name == "" {
			v.unnamed, v.pc.unnamed = nil, nil
		}
		v.push(expect{kind: expParse, refusal: r})
		return appendMessage(out, clientParse, standInParseNamed)
	}
	var st *clientStmt
	if verdict.dealloc != nil {
		st = deallocStmt(rest, verdict.dealloc)
		v.trackExecutes = true
	} else if u := v.unnamed; name == "" && u != nil && u.dealloc == nil && bytes.Equal(u.rest, rest) {
		st = u // the unnamed statement parsed again with the same text, as most clients do
	} else {
		st = &clientStmt{rest: append([]byte(nil), rest...)}
	}
	if name == "" {
		v.unnamed, v.pc.unnamed = st, st
		v.push(expect{kind: expParse})
		if st.dealloc != nil {
			return appendMessage(out, clientParse, []byte{0}, st.rest)
		}
		return v.passOn(out, msg)
	}
	st.sname = pstmtName(st.rest)
	v.stmts[name] = st
	if v.pc.prepared.has(st.sname) {
		// Prepared here by this client or another: parse it again, so that the client
		// gets the server's own answer to its Parse.
		v.pc.prepared.remove(st.sname)
		out = appendMessage(out, clientClose, []byte{targetStatement}, []byte(st.sname), []byte{0})
		v.push(expect{kind: expInjectedClose, name: st.sname, was: true})
	}
	out = v.makeRoom(out)
	v.pc.prepared.use(st.sname)
	v.push(expect{kind: expParse, name: st.sname, client: name})
	return appendMessage(out, clientParse, []byte(st.sname), []byte{0}, st.rest)
}

// ensure makes the client's statement name exist on pc, parsing it there first when
// needed, and returns its server-side name; ok is false for a name the client never
// parsed (the server then says it does not exist).
func (v *pooledConn) ensure(out *[]byte, name string) (string, bool) {
	if name == "" {
		switch {
		case v.unnamed == nil:
			*out = v.closeUnnamed(*out)
		case v.pc.unnamed != v.unnamed:
			*out = appendMessage(*out, clientParse, []byte{0}, v.unnamed.rest)
			v.push(expect{kind: expInjectedParse})
			v.pc.unnamed = v.unnamed
		}
		return "", true
	}
	st := v.stmts[name]
	if st == nil {
		return "", false
	}
	if !v.pc.prepared.has(st.sname) {
		*out = v.makeRoom(*out)
		*out = appendMessage(*out, clientParse, []byte(st.sname), []byte{0}, st.rest)
		v.push(expect{kind: expInjectedParse, name: st.sname})
	}
	v.pc.prepared.use(st.sname)
	return st.sname, true
}

// bind handles a Bind: its statement gets its server-side name.
func (v *pooledConn) bind(out, msg []byte) []byte {
	body := msg[5:]
	portal := zstring(body)
	rest := body[len(portal)+1:]
	name := zstring(rest)
	sname, ok := v.ensure(&out, name)
	if v.trackExecutes {
		st := v.unnamed
		if name != "" {
			st = v.stmts[name]
		}
		v.bindPortal(portal, st)
	}
	if !ok || name == "" {
		return v.passOn(out, msg)
	}
	return appendMessage(out, clientBind, []byte(portal), []byte{0}, []byte(sname), []byte{0}, rest[len(name)+1:])
}

// Read returns the server's messages for the session, less the answers to what the
// proxy sent on its own, and the proxy's answers for cycles no server ran.
func (v *pooledConn) Read(p []byte) (int, error) {
	v.mu.Lock()
	for {
		if v.roff < len(v.rout) {
			n := copy(p, v.rout[v.roff:])
			v.roff += n
			if v.roff == len(v.rout) {
				// Drained: the buffer is reused from its start.
				v.rout, v.roff = v.rout[:0], 0
				if cap(v.rout) > keepBufferSize {
					v.rout = nil
				}
			}
			v.mu.Unlock()
			return n, nil
		}
		if v.closed {
			v.mu.Unlock()
			return 0, io.EOF
		}
		if len(v.synth) > 0 {
			v.rout, v.synth = v.synth, v.rout[:0]
			continue
		}
		if v.pc == nil || !v.readerOn {
			if v.host != nil {
				v.mu.Unlock()
				return 0, errWouldBlock
			}
			if v.park.parking {
				v.mu.Unlock()
				return 0, errParked
			}
			v.park.waiting = true
			v.cond.Wait()
			v.park.waiting = false
			continue
		}
		pc := v.pc
		var n int
		var err error
		if v.host != nil {
			n, err = v.readServer(pc, p, true) // a loop's reads never block
		} else {
			v.reading = true
			v.mu.Unlock()
			n, err = v.readServer(pc, p, false)
			v.mu.Lock()
			v.reading = false
		}
		if err != nil && isWouldBlock(err) {
			closed := v.closed
			v.mu.Unlock()
			if closed {
				return 0, io.EOF
			}
			return 0, err
		}
		if err != nil {
			closed := v.closed
			if v.pc == pc {
				v.giveBack(pool.Broken)
			}
			v.mu.Unlock()
			if closed {
				return 0, io.EOF
			}
			return 0, err
		}
		if n > 0 {
			v.mu.Unlock()
			return n, nil
		}
	}
}

// readServer reads from pc: the next piece of a streamed message straight into p, or
// whole messages, which serverMessage handles (with mu held: held says the caller holds
// it throughout, else readServer takes it for them) into p as far as it has room (see
// emit). It returns the bytes it put in p. On an event loop pc's reads do not block,
// and the caller holds mu: a message that has not arrived whole waits in rbuf (rneed
// more bytes to come), and errWouldBlock says that nothing more is to be had now.
func (v *pooledConn) readServer(pc *physConn, p []byte, held bool) (int, error) {
	if v.rpc != pc {
		v.rpc, v.rstream, v.rneed = pc, 0, 0
	}
	if v.rstream > 0 {
		n, err := pc.br.Read(p[:min(len(p), v.rstream)])
		v.rstream -= n
		if err != nil && n == 0 {
			return 0, err
		}
		return n, nil
	}
	if v.rneed == 0 {
		h, err := pc.br.Peek(5)
		if len(h) < 5 {
			return 0, err
		}
		n := int(binary.BigEndian.Uint32(h[1:])) - 4
		if n < 0 || n > v.c.srv.maxMessageSize() {
			return 0, errMessageTooLarge
		}
		if (h[0] == serverDataRow || h[0] == serverCopyData) && n > keepBufferSize {
			if !held {
				v.mu.Lock()
			}
			injected := len(v.queue) > 0 && v.queue[0].kind == expInjectedQuery
			if !held {
				v.mu.Unlock()
			}
			if !injected {
				v.rstream = n
				copied := copy(p, h) // p is a bufio.Reader's buffer: never shorter than 5
				_, _ = pc.br.Discard(5)
				return copied, nil
			}
		}
		if pc.br.Buffered() < 5+n {
			// Not here whole: the message is gathered in rbuf.
			msg := slices.Grow(v.rbuf[:0], 5+n)[:5]
			copy(msg, h)
			_, _ = pc.br.Discard(5)
			v.rbuf, v.rneed = msg, n
		}
	}
	var gathered []byte
	if v.rneed > 0 {
		for v.rneed > 0 {
			// What is buffered, or what one read of the socket brings.
			if pc.br.Buffered() == 0 {
				if _, err := pc.br.Peek(1); err != nil {
					if err == io.EOF {
						err = io.ErrUnexpectedEOF
					}
					return 0, err
				}
			}
			chunk, _ := pc.br.Peek(min(v.rneed, pc.br.Buffered()))
			v.rbuf = append(v.rbuf, chunk...)
			_, _ = pc.br.Discard(len(chunk))
			v.rneed -= len(chunk)
		}
		gathered = v.rbuf
		if cap(gathered) > keepBufferSize {
			v.rbuf = nil
		}
	}
	if !held {
		v.mu.Lock()
		defer v.mu.Unlock()
	}
	v.direct = p[:0:len(p)]
	if gathered != nil {
		v.serverMessage(gathered)
	}
	// The messages already buffered whole go in the same turn, under one lock, until the
	// connection is given back. Each is handled where pc's buffer holds it, taken off pc
	// first: serverMessage copies what it keeps of it before it may give pc back, after
	// which another session may read into that buffer.
	for v.pc == pc && !v.closed && pc.br.Buffered() >= 5 {
		h, _ := pc.br.Peek(5)
		n := int(binary.BigEndian.Uint32(h[1:])) - 4
		if n < 0 || pc.br.Buffered() < 5+n {
			break
		}
		msg, _ := pc.br.Peek(5 + n)
		_, _ = pc.br.Discard(5 + n)
		v.serverMessage(msg)
	}
	put := len(v.direct)
	v.direct = nil
	return put, nil
}

// emit queues msg, a message of the server or of the proxy's own, for the session:
// straight into the buffer of the Read in progress (direct) while it has room and
// nothing waits in rout, else in rout, which the next Reads drain.
func (v *pooledConn) emit(msg []byte) {
	if len(v.rout) == 0 && len(v.direct)+len(msg) <= cap(v.direct) {
		v.direct = append(v.direct, msg...)
		return
	}
	v.rout = append(v.rout, msg...)
}

// serverMessage handles one whole message of the borrowed connection, queueing what the
// session must get in rout. Called with mu held.
func (v *pooledConn) serverMessage(msg []byte) {
	typ, body := msg[0], msg[5:]
	pc := v.pc
	if typ == serverParameterStatus {
		if name, value, ok := splitParameterStatus(body); ok {
			lname := strings.ToLower(name)
			pc.setParam(lname, value)
			pc.applied = false
			if !notCarried[lname] && v.params[lname] != value {
				v.params[lname] = value
				v.keyOK = false
			}
		}
		v.emit(msg)
		return
	}
	var front *expect
	if len(v.queue) > 0 {
		front = &v.queue[0]
	}
	if front != nil && front.kind == expInjectedQuery {
		switch typ {
		case serverDataRow:
			if front.capture {
				v.captured(body)
			}
		case serverErrorResponse:
			v.c.log.WithField("error", string(errorField(body, fieldMessage))).Warn("applying a client's settings on a pooled connection failed")
		case serverReadyForQuery:
			if front.capture {
				v.endCapture()
			}
			v.queue = v.queue[1:]
			v.outstanding--
			v.afterReady(body)
		}
		return
	}
	switch typ {
	case serverParseComplete:
		if front != nil {
			v.queue = v.queue[1:]
			if front.kind == expInjectedParse {
				return
			}
		}
	case serverCloseComplete:
		if front != nil {
			v.queue = v.queue[1:]
			if front.kind == expInjectedClose {
				return
			}
		}
	case serverEmptyQueryResponse, serverPortalSuspended:
		if front != nil && front.kind == expExecute {
			msg = v.executed(front, msg)
		} else if front != nil && front.dealloc != nil && typ == serverEmptyQueryResponse {
			msg = v.deallocate(front.dealloc, v.txStatus)
		}
	case serverErrorResponse:
		if front != nil && front.refusal != nil {
			if code := string(errorField(body, fieldCode)); code == sqlstate.UndefinedColumn {
				msg = front.refusal
			}
		}
		if front != nil && front.kind != expQuery && front.kind != expSync {
			// The server skips to the Sync: forget what it will not answer, and what
			// the proxy noted of the messages it does not run.
			v.skipToSync()
		}
	case serverCommandComplete:
		switch tag := zstring(body); {
		case tag == "SET" || tag == "RESET":
			v.needCapture = true
		case tag == "DISCARD ALL" || tag == "DEALLOCATE ALL":
			v.serverDroppedAll()
			v.needCapture = true
		}
		if front != nil && front.kind == expExecute {
			msg = v.executed(front, msg)
		}
	case serverReadyForQuery:
		for len(v.queue) > 0 {
			k := v.queue[0].kind
			v.queue = v.queue[1:]
			if k == expSync || k == expQuery {
				break
			}
		}
		v.outstanding--
		v.emit(msg)
		v.afterReady(body)
		return
	}
	v.emit(msg)
}

// Close ends the session's side: a connection borrowed in a transaction, or owing
// answers, is given back broken and closed; an idle one goes back to the pool.
func (v *pooledConn) Close() error {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return nil
	}
	v.closed = true
	if v.host == nil {
		v.endLocked()
	} else {
		// The loop may be using the connection right now: it gives it back as it ends
		// the session (endOnLoop).
		v.cancelWaitLocked(nil)
	}
	v.cond.Broadcast()
	lot := v.park.lot
	v.mu.Unlock()
	if lot != nil {
		lot.leave(v)
	}
	return nil
}

// endLocked gives back what the session holds as it ends: a connection borrowed in a
// transaction, or owing answers, is given back broken and closed; an idle one goes back
// to the pool. v.mu is held.
func (v *pooledConn) endLocked() {
	if v.srv != nil {
		if v.idle() && !v.reading && v.writers == 0 && !v.needCapture {
			v.giveBack(pool.Clean)
		} else {
			v.giveBack(pool.Broken)
		}
	}
	v.cancelWaitLocked(nil)
	if v.granted && v.grant != nil {
		v.grant.Release(pool.Clean)
	}
	v.grant, v.grantErr, v.granted = nil, nil, false
}

// endOnLoop ends the session's side on its event loop, which calls it as it ends the
// session.
func (v *pooledConn) endOnLoop() {
	v.mu.Lock()
	v.closed = true
	v.endLocked()
	v.mu.Unlock()
}

// cancelTarget returns the CancelRequest for what the session runs now and the address
// of its server; nil when it holds no server connection. A wait for one ends.
func (v *pooledConn) cancelTarget() ([]byte, string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.inWait && v.stopWait != nil {
		v.stopWait(errWaitCancelled)
	}
	v.cancelWaitLocked(errWaitCancelled)
	if v.pc == nil {
		return nil, ""
	}
	b := make([]byte, 16)
	binary.BigEndian.PutUint32(b, 16)
	binary.BigEndian.PutUint32(b[4:], cancelRequestCode)
	copy(b[8:], v.pc.key[:])
	return b, v.pc.addr
}

func (v *pooledConn) LocalAddr() net.Addr                { return pooledAddr{} }
func (v *pooledConn) RemoteAddr() net.Addr               { return pooledAddr{} }
func (v *pooledConn) SetDeadline(t time.Time) error      { return nil }
func (v *pooledConn) SetReadDeadline(t time.Time) error  { return nil }
func (v *pooledConn) SetWriteDeadline(t time.Time) error { return nil }

type pooledAddr struct{}

func (pooledAddr) Network() string { return "pool" }
func (pooledAddr) String() string  { return "pool" }

// acquireError is the ErrorResponse for a failed borrow.
func acquireError(err error) []byte {
	if errors.Is(err, errWaitCancelled) {
		return errorMessage(sqlstate.QueryCanceled, err.Error(), "")
	}
	code := sqlstate.ConnectionUnable
	var pe *pool.Error
	if errors.As(err, &pe) && pe.Code != "" {
		code = pe.Code
	}
	return errorMessage(code, err.Error(), "")
}

// errorMessage encodes an ErrorResponse of severity ERROR.
func errorMessage(code, message, hint string) []byte {
	msg := &pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: code, Message: message, Hint: hint}
	b, _ := msg.Encode(nil)
	return b
}

// appendMessage appends a message of type typ whose body is the concatenation of parts.
func appendMessage(b []byte, typ byte, parts ...[]byte) []byte {
	start := len(b)
	b = append(b, typ, 0, 0, 0, 0)
	for _, p := range parts {
		b = append(b, p...)
	}
	binary.BigEndian.PutUint32(b[start+1:], uint32(len(b)-start-1))
	return b
}

// zbytes returns b up to its first zero byte.
func zbytes(b []byte) []byte {
	if i := indexZero(b); i >= 0 {
		return b[:i]
	}
	return b
}

// zstring returns the text up to the first zero byte of b.
func zstring(b []byte) string {
	if i := indexZero(b); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}
