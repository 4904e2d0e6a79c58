package proxy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"unsafe"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/rewrite"
)

// This file is the client-to-upstream half of SQL rewriting (Server.Rewriter set): Query,
// Parse, Bind, Describe and Close are decoded, rewritten when their plan needs IDs, and
// recorded in the session's bookkeeping; everything else crosses unchanged.

// fromClientRewriting handles one client message whose header has been read.
func (c *conn) fromClientRewriting(typ byte, n int) error {
	ss := &c.sess
	if ss.skip {
		// After a refusal the proxy behaves like the server after an error: everything
		// up to Sync is discarded (Flush still flushes what came before).
		switch typ {
		case clientSync:
			ss.skip = false
		case clientFlush, clientTerminate:
		default:
			_, err := c.cr.br.Discard(n)
			return unexpected(err)
		}
	}
	if typ == clientCopyData || typ == clientCopyDone || typ == clientCopyFail {
		ss.mu.Lock()
		ci := ss.copyIn
		ss.mu.Unlock()
		if ci != nil {
			return c.onCopyIn(ci, typ, n)
		}
	}
	if handled, err := c.fromClientLocal(typ, n); handled || err != nil {
		return err
	}
	switch typ {
	case clientQuery:
		return c.onQuery(n)
	case clientParse:
		return c.onParse(n)
	case clientBind:
		return c.onBind(n)
	case clientDescribe:
		return c.onDescribe(n)
	case clientClose:
		return c.onClose(n)
	case clientExecute:
		ss.countSent()
	case clientSync, clientFunctionCall:
		c.closeCycle()
	}
	if err := writeHeader(c.server.w, typ, n); err != nil {
		return writeError{err}
	}
	return c.cr.copyBody(c.server.w, n)
}

// send writes one message upstream.
func (c *conn) send(typ byte, body []byte) error {
	if err := writeHeader(c.server.w, typ, len(body)); err != nil {
		return writeError{err}
	}
	if _, err := c.server.w.Write(body); err != nil {
		return writeError{err}
	}
	return nil
}

// cStringView is cString without the copy: the string shares b's memory, so it is only
// valid while b is, and must be copied before it is kept.
func cStringView(b []byte) (string, []byte, bool) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return "", nil, false
	}
	if i == 0 {
		return "", b[1:], true
	}
	return unsafe.String(&b[0], i), b[i+1:], true
}

// cString splits a NUL-terminated string off the front of b.
func cString(b []byte) (string, []byte, bool) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return "", nil, false
	}
	return string(b[:i]), b[i+1:], true
}

func (c *conn) onQuery(n int) error {
	body, err := c.cr.readBody(n)
	if err != nil {
		return err
	}
	ss := &c.sess
	// A Query drops the unnamed statement at the server: neither a local one nor the
	// server's may be bound locally any more.
	ss.setUnnamed(nil)
	ss.mu.Lock()
	if st := ss.stmts[""]; st != nil && (st.fast != nil || st.local) {
		ss.stmts[""] = &statement{slots: st.slots, batch: st.batch}
	}
	ss.mu.Unlock()
	// A view of the body, not a copy: a statement that needs no rewrite costs no
	// allocation. It is valid until the next read from the client; c.plan and the
	// refusal keep copies of their own.
	sql, rest, ok := cStringView(body)
	if !ok || len(rest) != 0 {
		return c.forwardQuery(body) // malformed: the server reports it
	}
	plan, err := c.plan(sql)
	if err != nil {
		return c.refuseQuery(err, strings.Clone(sql), planRefused)
	}
	if plan == nil {
		return c.forwardQuery(body)
	}
	if plan.Batch != nil {
		return c.onBatchQuery(plan.Batch)
	}
	if d := plan.Decode; d != nil && d.Param == 0 {
		if done, err := c.decodeQuery(d); done || err != nil {
			return err
		}
	}
	if plan.FastPath != nil {
		if done, err := c.fastPath(plan.FastPath); done || err != nil {
			return err
		}
	}
	if x := plan.CopyFill; x != nil && x.Format.Kind != "binary" && c.server.unsafeEncoding.Load() {
		return c.refuseQuery(errUnsafeEncoding(), sql, planRefused)
	}
	out, drawn, err := c.literal(plan, ss.outBuf[:0])
	if err != nil {
		return c.refuseQuery(err, strings.Clone(sql), drawn)
	}
	out = append(out, 0)
	ss.outBuf = keepSmall(out)
	ss.mu.Lock()
	cy := ss.openLocked()
	ss.cur = nil
	ss.applySQLEffectsLocked(cy, plan)
	if x := plan.CopyFill; x != nil {
		ss.copyIn = c.newCopyIn(cy, x)
	}
	ss.mu.Unlock()
	c.pending.Add(1)
	c.rewritten("query")
	return c.send(clientQuery, out)
}

// inlinePlanMax is the longest text an event loop plans itself when the rewriter must
// scan or parse it: up to about 15 µs for a new text of a known shape and 100 µs for a
// new shape. Longer texts cost about 0.1 µs per byte to scan and more to parse (4 ms for
// a 1,000-row INSERT), so they are planned off the loop.
const inlinePlanMax = 256

// plan plans sql. On an event loop, a text the rewriter cannot answer from its caches
// and longer than inlinePlanMax is planned after detaching, so that a bulk INSERT holds
// up only its own session, not every session of the loop.
//
// sql may be a view of a reused buffer (see onQuery): what the rewriter answers from the
// prefilter or its cache needs no copy, and only a text it must plan, and may keep in its
// cache, is copied.
func (c *conn) plan(sql string) (*rewrite.Plan, error) {
	rw := c.srv.rewriter() // one rewriter for both steps, even when SetRewriter runs between them
	if p, ok, err := rw.Cached(sql); ok {
		return p, err
	}
	c.leaveLoopFor(len(sql))
	return rw.Plan(strings.Clone(sql))
}

// leaveLoopFor detaches from an event loop before parsing a text of n bytes, when that
// takes longer than the loop's other sessions should wait.
func (c *conn) leaveLoopFor(n int) {
	if n > inlinePlanMax {
		c.detach()
	}
}

// literal appends the text of plan with fresh literal IDs to dst. When the IDs cannot be
// had, drawn is the number of the plan's slots that got one before the failure; a string
// that touches a statement with hidden parameters is refused with drawn set to
// sessionConflict.
func (c *conn) literal(plan *rewrite.Plan, dst []byte) (out []byte, drawn int, err error) {
	ss := &c.sess
	ss.mu.Lock()
	conflict := plan.SessionConflict(ss.hasSlotsLocked)
	var prepared *statement
	if plan.Execute != nil {
		prepared = ss.statementLocked(plan.Execute.Name)
	}
	ss.mu.Unlock()
	if conflict != nil {
		return nil, sessionConflict, conflict
	}
	ids, err := c.planIDs(plan, prepared, noParams)
	if err != nil {
		return nil, len(ids), err
	}
	return plan.AppendLiteral(dst, ids), 0, nil
}

// forwardQuery sends a Query unchanged.
func (c *conn) forwardQuery(body []byte) error {
	c.closeCycle()
	return c.send(clientQuery, body)
}

// noParams is the tag lookup of a simple Query, which has no parameters.
func noParams(param int) (string, error) {
	return "", &rewrite.Error{Code: sqlstate.UndefinedParameter, Message: fmt.Sprintf("there is no parameter $%d", param)}
}

// planIDs draws one ID per slot of plan and, for an EXECUTE of a statement with hidden
// parameters, one per slot of that statement. tagOf returns the tag of a leaf_next($n).
// On failure the IDs drawn before the failing slot are returned with the error.
func (c *conn) planIDs(plan *rewrite.Plan, prepared *statement, tagOf func(int) (string, error)) ([]int64, error) {
	ss := &c.sess
	ids := ss.idsBuf[:0]
	for _, slot := range plan.Slots {
		id, err := c.slotID(slot, tagOf)
		if err != nil {
			return ids, err
		}
		ids = append(ids, id)
	}
	if plan.Execute != nil && prepared != nil {
		for _, slot := range prepared.slots {
			id, err := c.slotID(slot, plan.Execute.Tag)
			if err != nil {
				return ids, err
			}
			ids = append(ids, id)
		}
	}
	ss.idsBuf = ids
	return ids, nil
}

func (c *conn) slotID(slot rewrite.Slot, tagOf func(int) (string, error)) (int64, error) {
	var tag string
	if slot.Kind == rewrite.SlotTagParam {
		t, err := tagOf(slot.Param)
		if err != nil {
			return 0, err
		}
		tag = t
	}
	return c.nextID(slot, tag)
}

// applySQLEffectsLocked records what a SQL-level PREPARE or DEALLOCATE does to the
// session's statements; a failed cycle undoes it.
func (ss *sessionState) applySQLEffectsLocked(cy *cycle, plan *rewrite.Plan) {
	if plan.Prepare != nil && len(plan.Prepare.Slots) > 0 {
		ss.setStatementLocked(cy, plan.Prepare.Name, &statement{slots: plan.Prepare.Slots}, 0)
	}
	if d := plan.Deallocate; d != nil {
		if d.All {
			ss.clearStatementsLocked(cy)
		} else {
			ss.setStatementLocked(cy, d.Name, nil, 0)
		}
	}
}

// fastPath answers a standalone SELECT leaf_next('tag') or leaf_snowflake() itself, with
// the messages PostgreSQL would send, when nothing is outstanding and the transaction has
// not failed. It reports false when the query must go to the server instead.
func (c *conn) fastPath(fp *rewrite.FastPath) (bool, error) {
	tx, ok := c.mayAnswerQuery()
	if !ok {
		return false, nil
	}
	id, err := c.nextID(fp.Slot, "")
	if err != nil {
		if tx != txIdle {
			// Inside a transaction block the error must fail the server's transaction.
			return true, c.refuseQuery(err, "", planRefused)
		}
		return true, c.answerQueryError(err)
	}
	out := appendRowDescription(c.sess.outBuf[:0], fp.Column, false)
	out = appendDataRow(out, id, false)
	return true, c.answerQuery(appendCommandComplete(out, "SELECT 1"))
}

// rewritten reports a rewritten or locally answered statement to the OnRewrite hook.
func (c *conn) rewritten(kind string) {
	if c.srv.OnRewrite != nil {
		c.srv.OnRewrite(kind)
	}
}

// writeLocalLocked sends the proxy's own response and a ReadyForQuery with the current
// transaction status to the client. The caller holds cwMu.
func (c *conn) writeLocalLocked(msgs []byte) error {
	if _, err := c.cw.Write(msgs); err != nil {
		return err
	}
	if err := c.writeClient(serverReadyForQuery, []byte{byte(c.server.txStatus.Load())}); err != nil {
		return err
	}
	return c.cw.Flush()
}

// keepSmall returns b for reuse unless it grew past what a session keeps.
func keepSmall(b []byte) []byte {
	if cap(b) > keepBufferSize {
		return nil
	}
	return b[:0]
}

func (c *conn) onDescribe(n int) error {
	body, err := c.cr.readBody(n)
	if err != nil {
		return err
	}
	return c.handleDescribe(body)
}

func (c *conn) handleDescribe(body []byte) error {
	ss := &c.sess
	if len(body) > 1 && body[0] == targetStatement && body[1] == 0 && ss.unnamed() != nil {
		if err := c.materialize(); err != nil {
			return err
		}
	}
	ss.mu.Lock()
	cy := ss.openLocked()
	cy.sent++
	if len(body) > 0 && body[0] == targetStatement {
		hidden := 0
		if name, _, ok := cString(body[1:]); ok {
			if st := ss.statementLocked(name); st != nil {
				hidden = st.hidden()
			}
		}
		cy.describes = append(cy.describes, hidden)
	}
	ss.mu.Unlock()
	return c.send(clientDescribe, body)
}

func (c *conn) onClose(n int) error {
	body, err := c.cr.readBody(n)
	if err != nil {
		return err
	}
	return c.handleClose(body)
}

func (c *conn) handleClose(body []byte) error {
	ss := &c.sess
	if len(body) > 1 && body[0] == targetStatement && body[1] == 0 {
		// The server closes whatever unnamed statement it has; the local one is gone too.
		ss.setUnnamed(nil)
	}
	ss.mu.Lock()
	cy := ss.openLocked()
	cy.sent++
	name, _, ok := cString(body[min(1, len(body)):])
	if ok && len(body) > 0 && body[0] == targetStatement {
		ss.setStatementLocked(cy, name, nil, serverCloseComplete)
	} else {
		cy.undo = append(cy.undo, undoEntry{noop: true, confirm: serverCloseComplete})
	}
	ss.mu.Unlock()
	return c.send(clientClose, body)
}

// be16 reads a big-endian int16 count.
func be16(b []byte) int { return int(int16(binary.BigEndian.Uint16(b))) }
