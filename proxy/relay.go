package proxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/rewrite"
)

func (c *conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// relayToUpstream forwards client messages until the client leaves.
func (c *conn) relayToUpstream() error {
	if c.server.w.Buffered() > 0 {
		// Output left over from an event loop that handed the session over.
		if err := c.server.w.Flush(); err != nil {
			return err
		}
	}
	for {
		if done, err := c.clientStep(); done {
			return err
		}
	}
}

// clientStep handles the next client message, reporting done when the client side has
// ended (Terminate, end of stream or an error). Writes are batched: the upstream buffer
// is flushed only when no further client input is already buffered, so a pipeline of
// messages travels in as few writes as possible.
func (c *conn) clientStep() (done bool, err error) {
	typ, n, err := c.cr.next()
	if err != nil {
		return true, c.clientReadFailed(err)
	}
	return c.clientMessage(typ, n)
}

// clientMessage is clientStep for a message whose header has been read.
func (c *conn) clientMessage(typ byte, n int) (done bool, err error) {
	if typ == clientTerminate && c.reuse != nil {
		err = c.leave(n)
	} else {
		err = c.fromClient(typ, n)
	}
	if err == nil && (typ == clientTerminate || c.cr.br.Buffered() == 0) {
		if err = c.server.w.Flush(); err != nil {
			err = writeError{err}
		}
	}
	if err != nil {
		var we writeError
		if errors.As(err, &we) {
			c.tellClient(sqlstate.ConnectionFailure, "server closed the connection unexpectedly")
		}
		return true, err
	}
	return typ == clientTerminate, nil
}

// fromClient handles one client message whose header has been read. Messages that start
// a request cycle are counted so that the proxy knows when nothing is outstanding; all
// others cross unchanged.
func (c *conn) fromClient(typ byte, n int) error {
	if c.srv.Rewriter != nil {
		return c.fromClientRewriting(typ, n)
	}
	switch typ {
	case clientQuery, clientSync, clientFunctionCall:
		// Query, Sync and FunctionCall are each answered by exactly one ReadyForQuery,
		// whatever happens in between (errors included).
		c.pending.Add(1)
	}
	if err := writeHeader(c.server.w, typ, n); err != nil {
		return writeError{err}
	}
	return c.cr.copyBody(c.server.w, n)
}

// passClientRun finds the client messages buffered whole that cross unchanged, at most
// max of them, does their bookkeeping as fromClient would, and returns them, where the
// reader holds them, and how many they are; the caller relays them upstream as one write
// (relayRun). In a rewriting session they are a Query or Parse whose text the prefilter
// or the rewriter's cache finds needs nothing, and the Bind, Describe, Execute, Sync and
// Flush of statements without hidden parameters. It stops at the first message that needs its
// handler and at one not buffered whole. An event loop calls it, so that a request costs
// one pass over its bytes and one write rather than a handler call and a copy per
// message. byMemo reports that memo cleared the text of every Query and Parse in the run
// by comparing it with the text memo holds (see plainMemo.clears), which is then the
// same for them all.
func (c *conn) passClientRun(max int, memo *plainMemo) (run []byte, count int, byMemo bool) {
	r := &c.cr
	buf, _ := r.br.Peek(r.br.Buffered())
	rewriting := c.srv.Rewriter != nil
	if rewriting {
		// One hold of the session's lock for the whole run, not one per message.
		c.sess.mu.Lock()
		defer c.sess.mu.Unlock()
	}
	off, count, byMemo := 0, 0, rewriting
	for count < max {
		typ, end, ok := wholeAt(buf, off, r.maxBody)
		if !ok {
			break // for the handler: not whole yet, or an error to report
		}
		if !rewriting {
			switch typ {
			case clientTerminate:
				return buf[:off], count, false
			case clientQuery, clientSync, clientFunctionCall:
				c.pending.Add(1)
			}
		} else {
			passes, memoed := c.passesRewritingLocked(typ, buf[off+5:end], memo)
			if !passes {
				break
			}
			byMemo = byMemo && memoed
		}
		off = end
		count++
	}
	return buf[:off], count, byMemo
}

// passesRewritingLocked does the bookkeeping of a client message of a rewriting session
// that crosses unchanged, reporting false, having done nothing, when the message needs
// its handler (see passClientRun). byMemo reports that the message has no text, or that
// memo cleared its text by comparison. The session's lock is held.
func (c *conn) passesRewritingLocked(typ byte, body []byte, memo *plainMemo) (passes, byMemo bool) {
	ss := &c.sess
	if ss.skip || ss.copyIn != nil || ss.local != nil || ss.localStmt != nil || len(ss.stmts) > 0 {
		// A refusal to skip past, a COPY whose rows get keys, a cycle answered locally,
		// or statements with hidden parameters: the handlers know.
		return false, false
	}
	byMemo = true
	switch typ {
	case clientQuery:
		sql, rest, ok := cStringView(body)
		if !ok || len(rest) != 0 {
			return false, false
		}
		if passes, byMemo = c.needsNothing(sql, memo); !passes {
			return false, false
		}
		// As onQuery, then forwardQuery: no unnamed statement is left, and the Query
		// ends any open cycle.
		ss.unnamedGen++
		ss.openLocked()
		ss.cur = nil
		c.pending.Add(1)
	case clientParse:
		name, rest, ok1 := cStringView(body)
		sql, rest, ok2 := cStringView(rest)
		if !ok1 || !ok2 || !isParamTypes(rest) {
			return false, false
		}
		if passes, byMemo = c.needsNothing(sql, memo); !passes {
			return false, false
		}
		// As handleParse, then forwardParse, with nothing to undo: no statement of
		// that name is remembered.
		if name == "" {
			ss.unnamedGen++
		}
		cy := ss.openLocked()
		cy.sent++
		cy.undo = append(cy.undo, undoEntry{noop: true, confirm: serverParseComplete})
	case clientDescribe:
		if len(body) == 0 {
			return false, false
		}
		cy := ss.openLocked()
		cy.sent++
		if body[0] == targetStatement {
			cy.describes = append(cy.describes, 0)
		}
	case clientBind, clientExecute:
		ss.openLocked().sent++
	case clientSync:
		ss.openLocked()
		ss.cur = nil
		c.pending.Add(1)
	case clientFlush:
	default:
		return false, false
	}
	return true, byMemo
}

// needsNothing reports whether the rewriter answers at once that sql needs no rewrite:
// memo (if any) or its prefilter, or its cache of texts, says so; byMemo: memo's
// comparison said so.
func (c *conn) needsNothing(sql string, memo *plainMemo) (ok, byMemo bool) {
	rw := c.srv.rewriter()
	if memo != nil && memo.clears(rw, sql) {
		return true, true
	}
	if cleared, noWords := rw.Prefiltered(sql); cleared {
		if memo != nil {
			memo.remember(rw, sql, noWords)
		}
		return true, false
	}
	p, ok, err := rw.Cached(sql)
	return ok && p == nil && err == nil, false
}

// plainMemo remembers the last text of a Query or Parse a rewriter's prefilter cleared,
// so that the same text again, from clients that parse their statement for every
// execution, is cleared by comparing its bytes rather than by a scan; and, when the text
// has none of the prefilter's words, a text the same but for its numbers, from clients
// that put their values in their Queries (see rewrite.SameButNumbers). An event loop
// keeps one for all its sessions. It also says, once per text, whether the text has any
// of the words transaction mode looks for (scanTxWords), so that a pooled session need
// not look again at a text the memo cleared (see pooledConn.checkText).
type plainMemo struct {
	rw      *rewrite.Rewriter
	text    []byte
	noWords bool
	// txChecked: text has been looked at for transaction mode's words; txFree: it has
	// none of them.
	txChecked, txFree bool
	// otherLength: the last text cleared had another length than text.
	otherLength bool
}

// maxPlainMemo is the longest text a plainMemo remembers.
const maxPlainMemo = 512

// clears reports whether sql is the text last remembered for rw, or the same but for
// its numbers when that text has none of the prefilter's words. Texts of one length are
// compared faster (see rewrite.SameButNumbers): when two texts in a row cleared so have
// another length than the remembered one, as when it has a number of few digits and most
// have more, the second is remembered instead.
func (m *plainMemo) clears(rw *rewrite.Rewriter, sql string) bool {
	switch {
	case m.rw != rw:
		return false
	case !m.noWords:
		return string(m.text) == sql
	case len(m.text) == len(sql):
		m.otherLength = false
		return rewrite.SameButNumbers(m.text, sql)
	case !rewrite.SameButNumbers(m.text, sql):
		return false
	case m.otherLength:
		// As remember would keep it: it has the same words, none, as the text it
		// replaces, and so none of transaction mode's either when that one has none.
		m.text, m.otherLength = append(m.text[:0], sql...), false
	default:
		m.otherLength = true
	}
	return true
}

// remember keeps sql, which rw's prefilter cleared; noWords: sql has none of the
// prefilter's words.
func (m *plainMemo) remember(rw *rewrite.Rewriter, sql string, noWords bool) {
	if len(sql) <= maxPlainMemo {
		m.rw, m.text, m.noWords = rw, append(m.text[:0], sql...), noWords
		m.txChecked, m.otherLength = false, false
	}
}

// freeOfTxWords reports whether the remembered text has none of the words transaction
// mode refuses or notes (scanTxWords). None of them has a digit in it, so neither has a
// text the memo cleared when the remembered text has none (see rewrite.SameButNumbers).
// The remembered text is looked at once.
func (m *plainMemo) freeOfTxWords() bool {
	if !m.txChecked {
		m.txChecked, m.txFree = true, scanTxWords(m.text) == txWords{}
	}
	return m.txFree
}

// clientReadFailed ends the client side after a failed read. A client that just goes away
// at a message boundary is treated like one that sent Terminate, so that the upstream
// backend ends quietly instead of logging an unexpected EOF.
func (c *conn) clientReadFailed(err error) error {
	if errors.Is(err, io.EOF) {
		if c.reuse != nil {
			c.clientLeft = true
		} else {
			_ = writeHeader(c.server.w, clientTerminate, 0)
		}
		_ = c.server.w.Flush()
		return nil
	}
	switch {
	case errors.Is(err, errMessageTooLarge):
		c.tellClient(sqlstate.ProgramLimitExceeded, err.Error())
		c.drainClient()
	case !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, net.ErrClosed) && !isNetError(err):
		c.tellClient(sqlstate.ProtocolViolation, err.Error())
		c.drainClient()
	}
	return err
}

func isNetError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne)
}

// tellClient sends a final FATAL error to the client unless a response is being relayed at
// this moment, in which case a message of ours would corrupt the stream.
func (c *conn) tellClient(code, message string) {
	if !c.cwMu.TryLock() {
		return
	}
	if !c.told.CompareAndSwap(false, true) {
		c.cwMu.Unlock()
		return
	}
	defer c.cwMu.Unlock()
	_ = c.client.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.cw.Write(fatal(code, message))
	_ = c.cw.Flush()
}

// relayToClient forwards upstream messages until the upstream connection ends.
func (c *conn) relayToClient() error {
	c.cwMu.Lock()
	err := c.cw.Flush() // output left over from an event loop, if any
	c.cwMu.Unlock()
	if err != nil {
		return err
	}
	for {
		if done, err := c.upstreamStep(); done {
			return err
		}
	}
}

// upstreamStep handles the next upstream message, reporting done when the upstream side
// has ended (after a FATAL error, at the end of the stream or on an error). The client
// buffer is flushed when no further upstream input is buffered.
func (c *conn) upstreamStep() (done bool, err error) {
	typ, n, err := c.server.r.next()
	if err != nil {
		if c.keeping.Load() && errors.Is(err, os.ErrDeadlineExceeded) {
			// The client left; the server connection may serve another session.
			c.upstreamStopped = true
			return true, nil
		}
		return true, c.upstreamReadFailed(err)
	}
	return c.upstreamMessage(typ, n)
}

// upstreamMessage is upstreamStep for a message whose header has been read.
func (c *conn) upstreamMessage(typ byte, n int) (done bool, err error) {
	c.cwMu.Lock()
	sawFatal, err := c.fromUpstream(typ, n)
	if err == nil && c.server.r.br.Buffered() == 0 {
		err = c.cw.Flush()
	}
	c.cwMu.Unlock()
	if err != nil {
		return true, err
	}
	// The backend ends the session after a FATAL; so does the proxy, once the error has
	// reached the client.
	return sawFatal, nil
}

// fromUpstream handles one upstream message whose header has been read, reporting whether
// it was a FATAL (or PANIC) error.
func (c *conn) fromUpstream(typ byte, n int) (fatal bool, err error) {
	if c.srv.Rewriter != nil {
		return c.fromUpstreamRewriting(typ, n)
	}
	switch typ {
	case serverReadyForQuery:
		body, err := c.server.r.readBody(n)
		if err != nil {
			return false, err
		}
		if len(body) != 1 {
			return false, fmt.Errorf("ReadyForQuery of %d bytes", len(body))
		}
		c.server.txStatus.Store(uint32(body[0]))
		c.pending.Add(-1)
		return false, c.writeClient(typ, body)
	case serverErrorResponse:
		body, err := c.server.r.readBody(n)
		if err != nil {
			return false, err
		}
		return isFatal(body), c.writeClient(typ, body)
	}
	if err := writeHeader(c.cw, typ, n); err != nil {
		return false, err
	}
	return false, c.server.r.copyBody(c.cw, n)
}

// passUpstreamRun finds the upstream messages buffered whole that cross unchanged, at
// most max of them: the rows, completions and ReadyForQuery of a statement that needed no
// rewrite. It does their bookkeeping as fromUpstream would and returns them, where the
// reader holds them, and how many they are; the caller relays them to the client as one
// write (relayRun). It stops at the first message whose handler must decode or change it
// (an ErrorResponse, a ParameterStatus, a ParseComplete not to relay, say) and at one not
// buffered whole.
func (c *conn) passUpstreamRun(max int) (run []byte, count int) {
	r := &c.server.r
	buf, _ := r.br.Peek(r.br.Buffered())
	rewriting := c.srv.Rewriter != nil
	if rewriting {
		// One hold of the session's lock for the whole run, not one per message.
		c.sess.mu.Lock()
		defer c.sess.mu.Unlock()
	}
	off, count := 0, 0
	for count < max {
		typ, end, ok := wholeAt(buf, off, r.maxBody)
		if !ok {
			break // for the handler: not whole yet, or an error to report
		}
		switch typ {
		case serverReadyForQuery:
			if end-off != 6 { // a ReadyForQuery carries one byte
				return buf[:off], count
			}
			if st := uint32(buf[off+5]); c.server.txStatus.Load() != st {
				// Stored only when it changes (this goroutine is the only writer): a
				// store is a locked instruction, and the status rarely changes.
				c.server.txStatus.Store(st)
			}
			if rewriting {
				c.endCycleLocked()
			} else {
				c.pending.Add(-1)
			}
		case serverErrorResponse, serverParameterDescription, serverParameterStatus, serverCopyInResponse:
			return buf[:off], count
		case serverParseComplete, serverBindComplete, serverCloseComplete, serverNoData,
			serverRowDescription, serverCommandComplete, serverEmptyQueryResponse, serverPortalSuspended:
			if rewriting && !c.terminalPassesLocked(typ) {
				return buf[:off], count
			}
		}
		off = end
		count++
	}
	return buf[:off], count
}

// wholeAt reports the type of the message at off in buf and the offset just past it, or
// false when it is not buffered whole or its length is out of bounds (its handler reads
// it, or reports the error).
func wholeAt(buf []byte, off, maxBody int) (typ byte, end int, ok bool) {
	if len(buf)-off < 5 {
		return 0, 0, false
	}
	l := int(binary.BigEndian.Uint32(buf[off+1:]))
	end = off + 1 + l
	if l < 4 || l-4 > maxBody || end > len(buf) {
		return 0, 0, false
	}
	return buf[off], end, true
}

// relayRun writes run, the first bytes r holds (a run of messages cleared to pass, as
// passClientRun or passUpstreamRun returns it), to w, and flushes w when r holds nothing
// more.
func relayRun(r *msgReader, w *bufio.Writer, run []byte) {
	if len(run) == 0 {
		return
	}
	_, _ = w.Write(run) // on a loop the sink keeps a write error for the loop to act on
	_, _ = r.br.Discard(len(run))
	if r.br.Buffered() == 0 {
		_ = w.Flush()
	}
}

// upstreamReadFailed tells the client, in PostgreSQL's words, that the server went away
// without a FATAL of its own (killed backend, crashed server, network failure).
func (c *conn) upstreamReadFailed(err error) error {
	if c.isClosed() {
		return nil
	}
	if errors.Is(err, errParked) {
		return err // transaction mode: the session parks (park.go)
	}
	if errors.Is(err, errMessageTooLarge) {
		c.tellClient(sqlstate.ProgramLimitExceeded, "the server sent a message larger than the proxy's limit: "+err.Error())
		return err
	}
	c.log.WithError(err).Info("upstream connection lost")
	c.tellClient(sqlstate.ConnectionFailure, "server closed the connection unexpectedly")
	return err
}

// isFatal reports whether an ErrorResponse body has severity FATAL or PANIC. The
// unlocalized severity (V) decides when present; S may be translated.
func isFatal(body []byte) bool {
	severity := errorField(body, fieldSeverityUnlocalized)
	if severity == nil {
		severity = errorField(body, fieldSeverity)
	}
	s := string(severity)
	return s == severityFatal || s == severityPanic
}
