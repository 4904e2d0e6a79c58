package proxy

import (
	"encoding/binary"

	"github.com/leafproxy/leafproxy/rewrite"
)

// This file is the fast path of the extended protocol: a cycle (the messages up to a Sync)
// that only parses, binds, describes, executes and closes a standalone
// SELECT leaf_next('tag') or leaf_snowflake() is answered by the proxy itself, with the
// messages PostgreSQL would send for the rewritten statement.
//
// A cycle is answered locally only when it starts with nothing outstanding upstream and
// outside a transaction block ('I'): no response of the server can be due before the
// proxy's own, portals cannot outlive the cycle (the implicit transaction ends at Sync),
// and a failed transaction ('E') always reaches the server, which reports 25P02.
// The proxy's responses are held until Sync. When a message the proxy cannot answer
// arrives before that, the responses are dropped and the client's messages of the cycle
// are replayed upstream as if they had just arrived, so that the whole cycle is the
// server's: a mixed cycle never interleaves the proxy's answers with the server's.
//
// An unnamed statement whose Parse the proxy answered (the only statement that can be
// parsed locally: a named one might already exist at the server, which must then refuse
// it) exists at the proxy alone. When a cycle that goes upstream refers to it, the
// rewritten Parse is sent first under the same name and its ParseComplete is not relayed:
// the statement is materialized. Named statements are always parsed upstream, but one
// that is a fast path is bound, described and executed locally.

// maxLocalMessage is the largest client message the proxy considers answering itself;
// the fast path's messages are a few dozen bytes.
const maxLocalMessage = 4 << 10

// localStatement is an unnamed statement that exists at the proxy only.
type localStatement struct {
	localQuery
	parse []byte // the client's Parse body, rewritten and sent to materialize it
}

// localQuery is what the proxy answers for a statement: one ID (fast), a batch, or the
// decoding of an ID.
type localQuery struct {
	fast   *rewrite.FastPath
	batch  *rewrite.Batch
	decode *rewrite.Decode
	params []uint32 // parameter types, as a ParameterDescription reports them
}

// appendDescription appends the statement's RowDescription.
func (q localQuery) appendDescription(b []byte, binaryFormat bool) []byte {
	if q.decode != nil {
		return appendDecodeDescription(b, binaryFormat)
	}
	return appendRowDescription(b, q.column(), binaryFormat)
}

func (q localQuery) column() string {
	if q.batch != nil {
		return q.batch.Column
	}
	return q.fast.Column
}

// localPortal is the unnamed portal of a local cycle.
type localPortal struct {
	localQuery
	binary bool // result format: 8-byte big-endian rather than text
	ran    bool // its one row has been sent

	// A batch's IDs, drawn at Bind as when the server runs it, and how many rows have
	// gone out.
	ids  []int64
	sent int
	row  []byte // leaf_decode's DataRow, made at Bind
}

// localCycle is an extended-protocol cycle the proxy is answering itself.
type localCycle struct {
	start  *localStatement // the local unnamed statement when the cycle began
	msgs   []byte          // the client's messages so far, whole, to replay upstream
	out    []byte          // the responses so far, sent at Sync
	portal *localPortal    // nil: no unnamed portal
	failed bool            // an error was answered: skip to Sync, like the server
	store  localPortal
}

// fastStatement returns the fast path of a statement parsed upstream when binding and
// executing it can be answered locally: it has no parameters of the client's.
func fastStatement(plan *rewrite.Plan, params int) *rewrite.FastPath {
	if plan.FastPath == nil || params != 0 || plan.Execute != nil {
		return nil
	}
	return plan.FastPath
}

// fromClientLocal answers a client message locally when it can, reporting whether it
// handled the message (it may also have replayed the cycle and forwarded the message).
func (c *conn) fromClientLocal(typ byte, n int) (bool, error) {
	ss := &c.sess
	lc := ss.local
	switch {
	case lc == nil:
		if !c.mayStartLocal(typ, n) {
			return false, nil
		}
	case lc.failed:
		// After an error the server ignores everything up to Sync; so does the proxy.
		switch typ {
		case clientSync:
			if _, err := c.cr.br.Discard(n); err != nil {
				return true, unexpected(err)
			}
			return true, c.finishLocal()
		case clientFlush:
			if _, err := c.cr.br.Discard(n); err != nil {
				return true, unexpected(err)
			}
			return true, c.flushLocal()
		case clientTerminate:
			return false, nil
		}
		_, err := c.cr.br.Discard(n)
		return true, unexpected(err)
	case n > maxLocalMessage || !isLocalType(typ):
		if err := c.replayLocal(); err != nil {
			return true, err
		}
		if ss.skip && typ != clientFlush && typ != clientTerminate {
			// The replay ended in a refusal: discarded up to Sync.
			_, err := c.cr.br.Discard(n)
			return true, unexpected(err)
		}
		return false, nil
	}
	body, err := c.cr.readBody(n)
	if err != nil {
		return true, err
	}
	var parsed parsedText
	if c.answerLocal(typ, body, &parsed) {
		if typ == clientSync {
			return true, c.finishLocal()
		}
		lc := ss.local
		lc.msgs = append(lc.msgs, typ)
		lc.msgs = binary.BigEndian.AppendUint32(lc.msgs, uint32(len(body)+4))
		lc.msgs = append(lc.msgs, body...)
		return true, nil
	}
	if ss.local != nil {
		if err := c.replayLocal(); err != nil {
			return true, err
		}
	}
	if ss.skip {
		// The replay ended in a refusal: the messages up to Sync are discarded.
		if typ != clientSync {
			return true, nil
		}
		ss.skip = false
	}
	return true, c.dispatch(typ, body, &parsed)
}

func isLocalType(typ byte) bool {
	switch typ {
	case clientParse, clientBind, clientDescribe, clientExecute, clientClose, clientSync:
		return true
	}
	return false
}

// mayStartLocal reports whether a message could begin a local cycle: nothing is
// outstanding, the session is outside a transaction block, and the message may refer to
// a fast-path statement.
func (c *conn) mayStartLocal(typ byte, n int) bool {
	ss := &c.sess
	if n > maxLocalMessage || c.pending.Load() != 0 || c.server.txStatus.Load() != txIdle {
		return false
	}
	switch typ {
	case clientParse:
	case clientBind, clientDescribe, clientClose:
		if ss.unnamed() != nil {
			break
		}
		ss.mu.Lock()
		none := len(ss.stmts) == 0
		ss.mu.Unlock()
		if none {
			return false
		}
	default:
		return false
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.queue) == 0 && ss.cur == nil && !ss.skip
}

// begin returns the local cycle, starting one.
func (ss *sessionState) begin() *localCycle {
	if ss.local == nil {
		lc := ss.localSpare
		if lc == nil {
			lc = &localCycle{}
			ss.localSpare = lc
		}
		*lc = localCycle{start: ss.unnamed(), msgs: keepSmall(lc.msgs), out: keepSmall(lc.out)}
		ss.local = lc
	}
	return ss.local
}

// localOf returns what the proxy answers for the statement name, if it may.
func (ss *sessionState) localOf(name string) (localQuery, bool) {
	if name == "" {
		if st := ss.unnamed(); st != nil {
			return st.localQuery, true
		}
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if st := ss.stmts[name]; st != nil {
		switch {
		case st.fast != nil:
			return localQuery{fast: st.fast}, true
		case st.batch != nil && st.local:
			return localQuery{batch: st.batch, params: st.params}, true
		}
	}
	return localQuery{}, false
}

// answerLocal answers one message of a local cycle, reporting false when the proxy cannot.
// A Parse's plan is left in parsed for handleParse.
func (c *conn) answerLocal(typ byte, body []byte, parsed *parsedText) bool {
	switch typ {
	case clientParse:
		return c.answerParse(body, parsed)
	case clientBind:
		return c.answerBind(body)
	case clientDescribe:
		return c.answerDescribe(body)
	case clientExecute:
		return c.answerExecute(body)
	case clientClose:
		return c.answerClose(body)
	case clientSync:
		return c.sess.local != nil && len(body) == 0
	}
	return false
}

// answerParse answers a Parse of the unnamed statement whose plan the proxy can answer
// itself (a fast path, a batch or a decoding), creating the local statement. The plan of
// a text it cannot answer is left in parsed.
func (c *conn) answerParse(body []byte, parsed *parsedText) bool {
	ss := &c.sess
	// Only the unnamed statement; parameter types only for a batch.
	if len(body) < 1 || body[0] != 0 {
		return false
	}
	query, rest, ok := cStringView(body[1:]) // only planned: c.plan copies what it keeps
	if !ok || !isParamTypes(rest) {
		return false
	}
	plan, err := c.plan(query)
	*parsed = parsedText{plan: plan, err: err, planned: true}
	if err != nil || plan == nil {
		return false
	}
	var q localQuery
	switch {
	case plan.Batch != nil:
		types, complete := batchParamTypes(plan.Batch, plan.MaxParam, rest[2:])
		if !complete {
			return false // the server refuses it
		}
		q = localQuery{batch: plan.Batch, params: types}
	case plan.Decode != nil:
		types, complete := decodeParamTypes(plan.Decode, plan.MaxParam, rest[2:])
		if !complete {
			return false // the server refuses it
		}
		q = localQuery{decode: plan.Decode, params: types}
	case be16(rest) == 0 && fastStatement(plan, plan.MaxParam) != nil:
		q = localQuery{fast: plan.FastPath}
	default:
		return false
	}
	lc := ss.begin()
	ss.setUnnamed(&localStatement{localQuery: q, parse: append([]byte(nil), body...)})
	lc.out = appendEmpty(lc.out, serverParseComplete)
	return true
}

// answerBind answers a Bind of a local statement into the unnamed portal. A batch draws
// its IDs here, and leaf_decode makes its row, as the server would run them at Bind.
func (c *conn) answerBind(body []byte) bool {
	ss := &c.sess
	m, stmt, ok := parseBind(body)
	if !ok || string(m.head[:1]) != "\x00" || (len(m.formats) > 1 && len(m.formats) != len(m.params)) {
		return false
	}
	binaryResult := false
	switch results := m.results; {
	case len(results) == 2 && be16(results) == 0:
	case len(results) == 4 && be16(results) == 1 && be16(results[2:]) <= 1:
		binaryResult = be16(results[2:]) == 1
	default:
		return false // the server reports what is wrong with it
	}
	q, ok := ss.localOf(stmt)
	if !ok || len(m.params) != len(q.params) {
		return false // the server reports a wrong number of parameters
	}
	var row []byte
	var argErr error
	if q.decode != nil {
		id, ok, err := decodeArg(q.decode, q.params, &m)
		if !ok {
			return false // the server judges the value
		}
		if argErr = err; err == nil {
			if row, ok = c.decodeRow(nil, q.decode, id, binaryResult); !ok {
				return false // the server prints the timestamp
			}
		}
	}
	lc := ss.begin()
	if argErr != nil {
		c.failLocal(lc, argErr)
		return true
	}
	lc.store = localPortal{localQuery: q, binary: binaryResult, ids: lc.store.ids[:0], row: row}
	if q.batch != nil && !c.bindLocalBatch(lc, &lc.store, &m) {
		return true
	}
	lc.portal = &lc.store
	lc.out = appendEmpty(lc.out, serverBindComplete)
	return true
}

// answerDescribe answers a Describe of a local statement or of the local portal.
func (c *conn) answerDescribe(body []byte) bool {
	ss := &c.sess
	if len(body) < 2 {
		return false
	}
	name, rest, ok := cString(body[1:])
	if !ok || len(rest) != 0 {
		return false
	}
	switch body[0] {
	case targetStatement:
		q, ok := ss.localOf(name)
		if !ok {
			return false
		}
		lc := ss.begin()
		lc.out = appendParameterDescription(lc.out, q.params)
		lc.out = q.appendDescription(lc.out, false)
	case targetPortal:
		if name != "" || ss.local == nil || ss.local.portal == nil {
			return false
		}
		lc := ss.local
		lc.out = lc.portal.appendDescription(lc.out, lc.portal.binary)
	default:
		return false
	}
	return true
}

// answerExecute answers an Execute of the local portal: its rows, then CommandComplete,
// or PortalSuspended when the rows filled the fetch.
func (c *conn) answerExecute(body []byte) bool {
	ss := &c.sess
	if len(body) != 5 || body[0] != 0 || ss.local == nil || ss.local.portal == nil {
		return false
	}
	lc := ss.local
	p := lc.portal
	maxRows := int32(binary.BigEndian.Uint32(body[1:]))
	switch {
	case p.batch != nil:
		c.executeLocalBatch(lc, p, maxRows)
	case p.ran:
		// A portal runs once; fetching from an exhausted one yields no rows.
		lc.out = appendCommandComplete(lc.out, "SELECT 0")
	case p.decode != nil:
		p.ran = true
		c.rewritten("fast_path")
		lc.out = appendOneRowEnd(append(lc.out, p.row...), maxRows)
	default:
		c.executeFast(lc, p, maxRows)
	}
	return true
}

// executeFast answers an Execute of a fast-path portal: one ID, drawn now.
func (c *conn) executeFast(lc *localCycle, p *localPortal, maxRows int32) {
	id, err := c.nextID(p.fast.Slot, "")
	if err != nil {
		// A local cycle runs outside a transaction block with nothing outstanding:
		// an error there changes nothing at the server, so the proxy's answer is
		// exactly the server's and nothing needs to fail upstream.
		c.failLocal(lc, err)
		return
	}
	p.ran = true
	c.rewritten("fast_path")
	lc.out = appendOneRowEnd(appendDataRow(lc.out, id, p.binary), maxRows)
}

// appendOneRowEnd appends what follows the one row of a portal: PortalSuspended when the
// row filled the fetch (maxRows 1: the server does not yet know the portal is exhausted
// and suspends it), else CommandComplete.
func appendOneRowEnd(b []byte, maxRows int32) []byte {
	if maxRows == 1 {
		return appendEmpty(b, serverPortalSuspended)
	}
	return appendCommandComplete(b, "SELECT 1")
}

// failLocal answers err in the local cycle, which then skips to Sync, as the server does
// after an error.
func (c *conn) failLocal(lc *localCycle, err error) {
	r := errorResponse(err)
	c.countError(r)
	lc.out = append(lc.out, r.msg...)
	lc.failed = true
}

// answerClose answers a Close of the local unnamed statement or of the local portal.
func (c *conn) answerClose(body []byte) bool {
	ss := &c.sess
	if len(body) != 2 || body[1] != 0 {
		return false
	}
	switch body[0] {
	case targetStatement:
		if ss.unnamed() == nil {
			return false // the server's unnamed statement
		}
		lc := ss.begin()
		ss.setUnnamed(nil)
		lc.out = appendEmpty(lc.out, serverCloseComplete)
	case targetPortal:
		if ss.local == nil || ss.local.portal == nil {
			return false
		}
		ss.local.portal = nil
		ss.local.out = appendEmpty(ss.local.out, serverCloseComplete)
	default:
		return false
	}
	return true
}

// mayAnswerQuery reports whether the proxy may answer a Query itself, with the current
// transaction status: nothing is queued or outstanding upstream, so the status is
// current, and the transaction has not failed (the server must report 25P02).
func (c *conn) mayAnswerQuery() (tx uint32, ok bool) {
	ss := &c.sess
	ss.mu.Lock()
	idle := len(ss.queue) == 0 && ss.cur == nil
	ss.mu.Unlock()
	tx = c.server.txStatus.Load()
	return tx, idle && c.pending.Load() == 0 && tx != txFailed
}

// answerQuery sends the proxy's own answer to a Query, out, and a ReadyForQuery.
func (c *conn) answerQuery(out []byte) error {
	c.sess.outBuf = keepSmall(out)
	c.rewritten("fast_path")
	c.cwMu.Lock()
	defer c.cwMu.Unlock()
	return c.writeLocalLocked(out)
}

// answerQueryError answers a Query with the proxy's own error and a ReadyForQuery. Only
// outside a transaction block with nothing outstanding (mayAnswerQuery): a failed Query
// there changes nothing at the server, so the proxy's answer is exactly the server's.
func (c *conn) answerQueryError(err error) error {
	r := errorResponse(err)
	c.countError(r)
	c.cwMu.Lock()
	defer c.cwMu.Unlock()
	return c.writeLocalLocked(r.msg)
}

// finishLocal ends a local cycle at Sync: the responses and a ReadyForQuery go out.
func (c *conn) finishLocal() error {
	ss := &c.sess
	lc := ss.local
	ss.local = nil
	c.cwMu.Lock()
	defer c.cwMu.Unlock()
	err := c.writeLocalLocked(lc.out)
	lc.out = keepSmall(lc.out)
	lc.msgs = keepSmall(lc.msgs)
	lc.portal = nil
	lc.store = localPortal{} // a batch's IDs are not kept past the cycle
	return err
}

// flushLocal sends the responses of a failed local cycle so far (Flush). A cycle that has
// not failed is replayed instead, since its responses may still be the server's to give.
func (c *conn) flushLocal() error {
	lc := c.sess.local
	c.cwMu.Lock()
	defer c.cwMu.Unlock()
	if _, err := c.cw.Write(lc.out); err != nil {
		return err
	}
	lc.out = lc.out[:0]
	return c.cw.Flush()
}

// replayLocal turns the local cycle into an upstream one: the proxy's responses are
// dropped and the client's messages are handled as if they had just arrived.
func (c *conn) replayLocal() error {
	ss := &c.sess
	lc := ss.local
	ss.local = nil
	ss.setUnnamed(lc.start)
	msgs := lc.msgs
	for len(msgs) > 0 {
		typ := msgs[0]
		n := int(binary.BigEndian.Uint32(msgs[1:])) - 4
		body := msgs[5 : 5+n]
		msgs = msgs[5+n:]
		if ss.skip {
			continue // after a refusal, up to Sync
		}
		if err := c.dispatch(typ, body, nil); err != nil {
			return err
		}
	}
	lc.msgs = keepSmall(lc.msgs)
	lc.out = keepSmall(lc.out)
	lc.portal = nil
	return nil
}

// dispatch handles an extended-protocol message whose body has been read, upstream.
// parsed, if not nil, is what answerParse planned of a Parse.
func (c *conn) dispatch(typ byte, body []byte, parsed *parsedText) error {
	switch typ {
	case clientParse:
		return c.handleParse(body, nil, parsed)
	case clientBind:
		return c.handleBind(body)
	case clientDescribe:
		return c.handleDescribe(body)
	case clientClose:
		return c.handleClose(body)
	case clientExecute:
		return c.forwardExtended(clientExecute, body)
	case clientSync:
		c.closeCycle()
	}
	return c.send(typ, body)
}

// materialize creates the local unnamed statement at the server, ahead of a message of
// an upstream cycle that refers to it.
func (c *conn) materialize() error {
	ss := &c.sess
	st := ss.unnamed()
	return c.handleParse(st.parse, st, nil)
}
