package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net"
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
	// The fields a transaction touches come first, those of the borrow, the protocol
	// state and the two directions, so that they share as few cache lines as they can;
	// the session's state that a transaction seldom touches follows them.
	c   *conn
	key pool.Key

	mu       sync.Mutex
	srv      *pool.Server[*physConn] // the borrowed connection; nil when none
	pc       *physConn
	readerOn bool // Read may read from pc
	reading  bool // Read is reading from pc right now
	release  bool // give pc back once writers is 0
	closed   bool
	writers  int // Writes in progress
	queries  int // cycles of the borrower, for the pool's figures

	// host is the event loop serving the session (txloop_linux.go), nil while goroutines
	// do. On a loop nothing blocks: a borrow that must wait returns errAwaitServer, the
	// client's messages wait in wbuf (awaiting), and the pool's answer comes back through
	// the loop (granted) as grant and grantErr.
	host     txHost
	wait     *pool.Wait[*physConn]
	awaiting bool
	granted  bool
	grant    *pool.Server[*physConn]
	grantErr error
	// The mailbox of the pool's answer to a wait (see poolAnswer), and poolAnswer and
	// takeAnswer as func values, made once.
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
	// trackExecutes: the session parsed a DEALLOCATE, so each Execute's answer is awaited
	// (see txstmts.go).
	trackExecutes bool
	// keyOK: paramsKey is up to date (see settingsKey).
	keyOK bool

	// Write side: a partial message, and the error that fails the cycle being discarded;
	// obuf is the output buffer of Write, used by the writer only.
	wbuf       []byte
	obuf       []byte
	discarding []byte // ErrorResponse to answer at the Sync; nil when not discarding
	// runs: handle sends messages that go as they are from its input (see passOn), and
	// passed says that clientMessage left the message there.
	runs, passed bool
	// verdictHeld: heldVerdict is the verdict on the message at the head of wbuf, which
	// waits for a connection, so that its text is not looked at again.
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

	// Client state, kept across borrowed connections.
	stmts   map[string]*clientStmt
	unnamed *clientStmt
	// plainText is the last text of a Query or Parse in which scanTxWords found nothing
	// (see checkText).
	plainText []byte
	// textsFree is set while handle handles messages whose texts are known to have none
	// of the words checkText looks for (see write).
	textsFree bool
	// paramsKey stands for params, interned (see settingsKey).
	paramsKey unique.Handle[string]
	params    map[string]string // lower-case name → the client's value

	// Touched by the pool at each wait, and by the session when one is answered.
	waitIn      pool.Wait[*physConn] // where the session waits: one wait at a time
	heldVerdict queryVerdict

	// Seldom touched by a transaction.
	cond sync.Cond
	// waitCtx is the context of the waits for a server connection, kept from one wait to
	// the next until a cancel request ends it (stopWait) or the session parks; inWait:
	// a wait is in progress.
	waitCtx  context.Context
	stopWait context.CancelCauseFunc
	inWait   bool
	// captureNames collects the settings captureSQL returned so far.
	captureNames []string
	// custom holds the custom settings the client SET (see txcustom.go), customSQL the
	// capture query that reads them back ("" until built).
	custom    map[string]bool
	customSQL string
	// localDealloc is the DEALLOCATE of an extended-protocol cycle the proxy answers.
	localDealloc *deallocation
	// deallocPortals holds the portals bound to a DEALLOCATE's statement while the
	// session holds a connection (see txstmts.go).
	deallocPortals map[string]*deallocation

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
//
// The mailbox needs no lock of its own. It is written here, before the loop's lock in
// post, and read by takeAnswer on the loop, which takes the posted work under that lock;
// and it is written again only for the session's next wait, which the loop's goroutine
// begins after takeAnswer emptied it (until then v.wait is set, and borrow does not wait
// again).
func (v *pooledConn) poolAnswer(w *pool.Wait[*physConn], srv *pool.Server[*physConn], err error) {
	v.mailWait, v.mailSrv, v.mailErr = w, srv, err
	if !v.host.post(v.takeAnswerFn) {
		v.mailWait, v.mailSrv, v.mailErr = nil, nil, nil
		if srv != nil {
			go srv.Release(pool.Clean)
		}
	}
}

// takeAnswer takes the pool's answer from the mailbox, on the session's loop.
func (v *pooledConn) takeAnswer() {
	w, srv, err := v.mailWait, v.mailSrv, v.mailErr
	v.mailWait, v.mailSrv, v.mailErr = nil, nil, nil
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
		if v.pc.userChanged {
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

// zstring returns the text up to the first zero byte of b. The names of unnamed
// statements and portals, the most common, are empty: they cost no search.
func zstring(b []byte) string {
	if len(b) > 0 && b[0] == 0 {
		return ""
	}
	if i := indexZero(b); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}
