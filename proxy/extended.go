package proxy

import (
	"encoding/binary"
	"fmt"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/rewrite"
)

// onParse rewrites a Parse whose plan needs IDs: the slots become hidden parameters
// $n+1 … $n+k of type int8, where n = max(number of OIDs the client sent, highest $i in
// the text), after the client's OIDs padded with zeros (unspecified) up to n.
func (c *conn) onParse(n int) error {
	body, err := c.cr.readBody(n)
	if err != nil {
		return err
	}
	return c.handleParse(body, nil, nil)
}

// parsedText is the plan of a Parse's text, made by answerParse when the proxy could not
// answer the Parse itself and handed on to handleParse, so that the text is planned once.
type parsedText struct {
	plan    *rewrite.Plan
	err     error
	planned bool
}

// handleParse forwards a Parse, rewritten when its plan needs IDs. With mat set, it
// materializes that proxy-local statement: its ParseComplete is not relayed, since the
// client already had one from the proxy. pre, when planned, is the plan of the Parse's
// text already made.
func (c *conn) handleParse(body []byte, mat *localStatement, pre *parsedText) error {
	ss := &c.sess
	name, rest, ok1 := cString(body)
	if name == "" && mat == nil {
		ss.setUnnamed(nil) // the server's unnamed statement is replaced
	}
	query, rest, ok2 := cStringView(rest) // only planned: c.plan copies what it keeps
	if !ok1 || !ok2 || !isParamTypes(rest) {
		return c.forwardParse(body, name) // malformed: the server reports it
	}
	oids := rest[2:]
	var plan *rewrite.Plan
	var err error
	if pre != nil && pre.planned {
		plan, err = extendedPlan(pre.plan, pre.err)
	} else {
		plan, err = c.planParse(query)
	}
	if err != nil {
		return c.refuseExtended(err, name == "")
	}
	switch {
	case plan == nil:
		return c.forwardParse(body, name)
	case plan.Batch != nil:
		return c.parseBatch(name, plan, oids, mat)
	}
	slots, extra, err := c.hiddenSlots(plan)
	if err != nil {
		return c.refuseExtended(err, name == "")
	}
	params := max(len(oids)/4, plan.MaxParam)
	switch {
	case plan.Decode != nil && plan.Decode.Param > 0:
		// Remembered so that Bind can check the ID (see bindDecode).
		out := appendParseText(ss.outBuf[:0], name, plan, params, 0)
		out = append(out, rest...)
		ss.outBuf = keepSmall(out)
		return c.sendParse(name, &statement{decode: plan.Decode}, plan, mat, out)
	case len(slots) == 0:
		// Nothing to fill per execution, but the text may still change (a PREPARE
		// declares the hidden parameters of the statement it creates).
		out := appendParseText(ss.outBuf[:0], name, plan, params, 0)
		out = append(out, rest...)
		ss.outBuf = keepSmall(out)
		ss.mu.Lock()
		ss.applySQLEffectsLocked(ss.openLocked(), plan)
		ss.mu.Unlock()
		return c.forwardParse(out, name)
	case params+len(slots) > 65535:
		return c.refuseExtended(&rewrite.Error{Code: sqlstate.ProgramLimitExceeded, Message: "too many parameters with the hidden leaf ID parameters"}, name == "")
	}
	out := appendParseText(ss.outBuf[:0], name, plan, params, extra)
	out = appendParamTypes(out, oids, params, slots, plan.UnreferencedParams)
	ss.outBuf = keepSmall(out)
	return c.sendParse(name, &statement{slots: slots, fast: fastStatement(plan, params)}, plan, mat, out)
}

// isParamTypes reports whether the rest of a Parse body after the text is a well-formed
// list of parameter types: a count, then as many OIDs.
func isParamTypes(rest []byte) bool {
	return len(rest) >= 2 && be16(rest) >= 0 && len(rest) == 2+4*be16(rest)
}

// planParse plans the text of a Parse, refusing what the extended protocol cannot carry.
func (c *conn) planParse(query string) (*rewrite.Plan, error) {
	return extendedPlan(c.plan(query))
}

// extendedPlan refuses a plan that the extended protocol cannot carry.
func extendedPlan(plan *rewrite.Plan, err error) (*rewrite.Plan, error) {
	if err == nil && plan != nil && plan.CopyFill != nil {
		return nil, &rewrite.Error{Code: sqlstate.FeatureNotSupported,
			Message: "COPY … FROM STDIN whose rows the proxy gives keys is not supported in the extended query protocol",
			Hint:    "Send the COPY as a simple query, as pgx's CopyFrom and psql do."}
	}
	return plan, err
}

// hiddenSlots returns the hidden parameters of a planned Parse: the plan's own slots,
// then, for an EXECUTE of a statement with hidden parameters, that statement's (their
// tags are EXECUTE's literals), whose number is extra.
func (c *conn) hiddenSlots(plan *rewrite.Plan) (slots []rewrite.Slot, extra int, err error) {
	if plan.Execute == nil {
		return plan.Slots, 0, nil
	}
	ss := &c.sess
	ss.mu.Lock()
	prepared := ss.statementLocked(plan.Execute.Name)
	ss.mu.Unlock()
	if prepared == nil || len(prepared.slots) == 0 {
		return plan.Slots, 0, nil
	}
	slots = append(make([]rewrite.Slot, 0, len(plan.Slots)+len(prepared.slots)), plan.Slots...)
	for _, sl := range prepared.slots {
		if sl.Kind == rewrite.SlotTagParam {
			tag, err := plan.Execute.Tag(sl.Param)
			if err != nil {
				return nil, 0, err
			}
			sl = rewrite.Slot{Kind: rewrite.SlotTag, Tag: tag}
		}
		slots = append(slots, sl)
	}
	return slots, len(prepared.slots), nil
}

// appendParseText appends the start of a rewritten Parse body: the statement name and
// the rewritten text, whose hidden parameters are numbered from params+1 (extra of them
// belong to the statement an EXECUTE runs).
func appendParseText(out []byte, name string, plan *rewrite.Plan, params, extra int) []byte {
	out = append(out, name...)
	out = append(out, 0)
	if extra > 0 {
		out = plan.AppendExecuteParams(out, params+1, extra)
	} else {
		out = plan.AppendParams(out, params+1)
	}
	return append(out, 0)
}

// appendParamTypes appends the parameter types of a rewritten Parse: the client's oids
// padded with zeros (unspecified) up to params, then int8 for each hidden parameter. A
// parameter in unreferenced only carried a leaf_next tag and is no longer referenced by
// the rewritten text, so the server could not infer its type: it becomes text.
func appendParamTypes(out, oids []byte, params int, slots []rewrite.Slot, unreferenced []int) []byte {
	out = binary.BigEndian.AppendUint16(out, uint16(params+len(slots)))
	out = append(out, oids...)
	for i := len(oids) / 4; i < params; i++ {
		out = binary.BigEndian.AppendUint32(out, 0)
	}
	typesAt := len(out) - 4*params
	for _, p := range unreferenced {
		if p >= 1 && p <= params {
			at := typesAt + 4*(p-1)
			if binary.BigEndian.Uint32(out[at:]) == 0 {
				binary.BigEndian.PutUint32(out[at:], oidText)
			}
		}
	}
	for range slots {
		out = binary.BigEndian.AppendUint32(out, oidInt8)
	}
	return out
}

// sendParse records the statement a rewritten Parse creates and sends the Parse.
func (c *conn) sendParse(name string, st *statement, plan *rewrite.Plan, mat *localStatement, out []byte) error {
	ss := &c.sess
	ss.mu.Lock()
	cy := ss.openLocked()
	cy.sent++
	ss.setStatementLocked(cy, name, st, serverParseComplete)
	if mat != nil {
		cy.swallow = append(cy.swallow, cy.sent)
		ss.localStmt = nil
		ss.unnamedGen++
		u := &cy.undo[len(cy.undo)-1]
		u.local, u.localGen = mat, ss.unnamedGen
	}
	ss.applySQLEffectsLocked(cy, plan)
	ss.mu.Unlock()
	if mat == nil {
		c.rewritten("parse")
	}
	return c.send(clientParse, out)
}

// forwardParse sends a Parse unchanged; the statement it creates has no hidden parameters.
func (c *conn) forwardParse(body []byte, name string) error {
	ss := &c.sess
	ss.mu.Lock()
	cy := ss.openLocked()
	cy.sent++
	ss.setStatementLocked(cy, name, nil, serverParseComplete)
	ss.mu.Unlock()
	return c.send(clientParse, body)
}

// bindMessage is a decoded Bind body; the slices point into the body.
type bindMessage struct {
	head    []byte   // portal and statement names, NUL-terminated
	formats []uint16 // parameter format codes
	params  [][]byte // nil is SQL NULL
	results []byte   // result format codes with their count
}

// hiddenBinary reports whether the values of hidden parameters appended to m (see
// appendBindParams) are in binary format: when the client gave one format for all, and
// it is binary.
func (m *bindMessage) hiddenBinary() bool { return len(m.formats) == 1 && m.formats[0] == 1 }

func parseBind(body []byte) (bindMessage, string, bool) {
	var m bindMessage
	_, rest, ok1 := cString(body)
	stmt, rest, ok2 := cString(rest)
	if !ok1 || !ok2 || len(rest) < 2 {
		return m, "", false
	}
	m.head = body[:len(body)-len(rest)]
	nf := be16(rest)
	rest = rest[2:]
	if nf < 0 || len(rest) < 2*nf+2 {
		return m, "", false
	}
	m.formats = make([]uint16, nf)
	for i := range nf {
		m.formats[i] = binary.BigEndian.Uint16(rest[2*i:])
	}
	rest = rest[2*nf:]
	np := be16(rest)
	rest = rest[2:]
	if np < 0 {
		return m, "", false
	}
	m.params = make([][]byte, np)
	for i := range np {
		if len(rest) < 4 {
			return m, "", false
		}
		l := int(int32(binary.BigEndian.Uint32(rest)))
		rest = rest[4:]
		if l < 0 {
			continue // NULL
		}
		if len(rest) < l {
			return m, "", false
		}
		m.params[i] = rest[:l:l]
		rest = rest[l:]
	}
	if len(rest) < 2 {
		return m, "", false
	}
	m.results = rest
	return m, stmt, true
}

// onBind appends one fresh ID per hidden parameter of the statement. Format codes: none
// (all text) → text IDs; one (applies to all) → IDs in that format; one per parameter →
// a text code per ID and text IDs.
func (c *conn) onBind(n int) error {
	ss := &c.sess
	ss.mu.Lock()
	none := len(ss.stmts) == 0
	ss.mu.Unlock()
	if none && ss.unnamed() == nil {
		// No statement has hidden parameters: stream the Bind, however large.
		ss.countSent()
		if err := writeHeader(c.server.w, clientBind, n); err != nil {
			return writeError{err}
		}
		return c.cr.copyBody(c.server.w, n)
	}
	body, err := c.cr.readBody(n)
	if err != nil {
		return err
	}
	return c.handleBind(body)
}

func (c *conn) handleBind(body []byte) error {
	ss := &c.sess
	stmtName, ok := bindStatement(body)
	if ok && stmtName == "" && ss.unnamed() != nil {
		if err := c.materialize(); err != nil {
			return err
		}
	}
	var st *statement
	if ok {
		ss.mu.Lock()
		st = ss.statementLocked(stmtName)
		ss.mu.Unlock()
	}
	if st == nil {
		return c.forwardExtended(clientBind, body)
	}
	if st.batch != nil {
		return c.bindBatch(st, stmtName, body)
	}
	if st.decode != nil {
		return c.bindDecode(st.decode, body)
	}
	m, _, ok := parseBind(body)
	if !ok || (len(m.formats) > 1 && len(m.formats) != len(m.params)) {
		return c.forwardExtended(clientBind, body) // the server reports the malformed Bind
	}
	ids := ss.idsBuf[:0]
	for _, slot := range st.slots {
		id, err := c.slotID(slot, func(p int) (string, error) { return bindTag(m.params, p) })
		if err != nil {
			return c.refuseExtended(err, false)
		}
		ids = append(ids, id)
	}
	ss.idsBuf = ids

	out := appendBindParams(ss.outBuf[:0], &m, len(ids))
	for _, id := range ids {
		out = appendInt8Value(out, id, m.hiddenBinary())
	}
	out = append(out, m.results...)
	ss.outBuf = keepSmall(out)
	return c.forwardExtended(clientBind, out)
}

// appendBindParams appends the start of a rewritten Bind body, up to the values of its
// hidden parameters, which the caller appends next, and its result formats: the client's
// names, its parameter formats (with text for each of the hidden parameters when it gave
// one per parameter), the parameter count and the client's values.
func appendBindParams(out []byte, m *bindMessage, hidden int) []byte {
	out = append(out, m.head...)
	formats := len(m.formats)
	if formats > 1 {
		formats += hidden
	}
	out = binary.BigEndian.AppendUint16(out, uint16(formats))
	for _, f := range m.formats {
		out = binary.BigEndian.AppendUint16(out, f)
	}
	for i := len(m.formats); i < formats; i++ {
		out = binary.BigEndian.AppendUint16(out, 0)
	}
	out = binary.BigEndian.AppendUint16(out, uint16(len(m.params)+hidden))
	for _, p := range m.params {
		if p == nil {
			out = binary.BigEndian.AppendUint32(out, 0xffffffff)
			continue
		}
		out = binary.BigEndian.AppendUint32(out, uint32(len(p)))
		out = append(out, p...)
	}
	return out
}

// bindStatement returns the statement name of a Bind body.
func bindStatement(body []byte) (string, bool) {
	_, rest, ok := cString(body)
	if !ok {
		return "", false
	}
	name, _, ok := cString(rest)
	return name, ok
}

// bindTag returns the tag passed as parameter p (1-based) of a Bind: its bytes, which are
// the same in text and binary format for a text value.
func bindTag(params [][]byte, p int) (string, error) {
	if p < 1 || p > len(params) {
		return "", &rewrite.Error{Code: sqlstate.InvalidParameterValue, Message: fmt.Sprintf("Bind has no parameter $%d for the leaf_next tag", p)}
	}
	if len(params[p-1]) == 0 {
		return "", &rewrite.Error{Code: sqlstate.InvalidParameterValue, Message: fmt.Sprintf("the leaf_next tag in parameter $%d is NULL or empty", p)}
	}
	return string(params[p-1]), nil
}

// forwardExtended sends an extended-protocol message that gets one terminal response.
func (c *conn) forwardExtended(typ byte, body []byte) error {
	c.sess.countSent()
	return c.send(typ, body)
}
