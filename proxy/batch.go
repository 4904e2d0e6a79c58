package proxy

import (
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/rewrite"
)

// This file answers SELECT leaf_next('tag', n): n fresh IDs as n rows. The batch is
// set-returning, so unlike a single ID it cannot become a literal in the statement: the
// proxy answers it itself wherever it answers the single form (see fastPath and local.go),
// and elsewhere (a Query behind others still outstanding, an extended-protocol cycle in a
// transaction block) sends the server SELECT unnest(<the IDs as an int8 array>) AS
// leaf_next, which yields exactly the rows and messages the proxy would have sent. The
// array is a literal in a Query and one hidden int8[] parameter in a Parse.

// DefaultMaxBatch is the largest n of leaf_next('tag', n) when Server.MaxBatch is zero.
const DefaultMaxBatch = 10_000

func (s *Server) maxBatch() int64 {
	if s.MaxBatch > 0 {
		return int64(s.MaxBatch)
	}
	return DefaultMaxBatch
}

// batchIDs draws n IDs of tag into the session's ID buffer, after checking n.
func (c *conn) batchIDs(tag string, n int64) ([]int64, error) {
	if limit := c.srv.maxBatch(); n < 1 || n > limit {
		return nil, &rewrite.Error{Code: sqlstate.InvalidParameterValue,
			Message: fmt.Sprintf("the number of IDs of leaf_next(tag, n) must be between 1 and %d, got %d", limit, n),
			Hint:    "Ask for at most the proxy's max-batch IDs at a time."}
	}
	c.detach() // a batch may wait for a segment load: the loop goes on without it
	ss := &c.sess
	ids, err := c.srv.IDs.NextBatch(c.ctx, tag, int(n), ss.idsBuf[:0])
	if cap(ids) <= keepBufferSize/8 {
		ss.idsBuf = ids[:0]
	}
	if err != nil {
		return nil, err // the source words its errors; errorResponse gives them a SQLSTATE
	}
	return ids, nil
}

// onBatchQuery answers a Query that is SELECT leaf_next('tag', n): itself when nothing is
// outstanding and the transaction has not failed (as fastPath), else through the server.
func (c *conn) onBatchQuery(b *rewrite.Batch) error {
	ss := &c.sess
	tx, local := c.mayAnswerQuery()
	var ids []int64
	var err error
	switch {
	case b.TagParam > 0:
		_, err = noParams(b.TagParam)
	case b.CountParam > 0:
		_, err = noParams(b.CountParam)
	default:
		ids, err = c.batchIDs(b.Tag, b.Count)
	}
	if err != nil {
		if !local || tx != txIdle {
			return c.refuseQuery(err, "", planRefused)
		}
		return c.answerQueryError(err)
	}
	if local {
		out := appendRowDescription(ss.outBuf[:0], b.Column, false)
		out = appendBatchRows(out, ids, false)
		return c.answerQuery(appendCommandComplete(out, "SELECT "+strconv.Itoa(len(ids))))
	}
	out := append(b.AppendLiteral(ss.outBuf[:0], ids), 0)
	ss.outBuf = keepSmall(out)
	ss.mu.Lock()
	ss.openLocked()
	ss.cur = nil
	ss.mu.Unlock()
	c.pending.Add(1)
	c.rewritten("query")
	return c.send(clientQuery, out)
}

// appendBatchRows appends one DataRow per ID.
func appendBatchRows(b []byte, ids []int64, binaryFormat bool) []byte {
	for _, id := range ids {
		b = appendDataRow(b, id, binaryFormat)
	}
	return b
}

// batchParamTypes returns the types of the parameters $1 … $k of a batch statement, as
// the proxy declares them to the server and reports them in a ParameterDescription: the
// client's, or, where it left them unspecified, text for the tag and int4 for the count.
// complete is false when a parameter has no type either way (the server then refuses
// the statement: it cannot infer the type of a parameter the text does not use).
func batchParamTypes(b *rewrite.Batch, maxParam int, oids []byte) (types []uint32, complete bool) {
	k := max(len(oids)/4, maxParam)
	types = make([]uint32, k)
	complete = true
	for i := range types {
		if 4*i+4 <= len(oids) {
			types[i] = binary.BigEndian.Uint32(oids[4*i:])
		}
		if types[i] != 0 {
			continue
		}
		switch i + 1 {
		case b.TagParam:
			types[i] = oidText
		case b.CountParam:
			types[i] = oidInt4
		default:
			complete = false
		}
	}
	return types, complete
}

// batchArgs reads the tag and count of a batch from a Bind's parameters; types are the
// statement's parameter types.
func batchArgs(b *rewrite.Batch, types []uint32, m *bindMessage) (string, int64, error) {
	tag, n := b.Tag, b.Count
	if b.TagParam > 0 {
		t, err := bindTag(m.params, b.TagParam)
		if err != nil {
			return "", 0, err
		}
		tag = t
	}
	if p := b.CountParam; p > 0 {
		if p > len(m.params) || m.params[p-1] == nil {
			return "", 0, &rewrite.Error{Code: sqlstate.InvalidParameterValue, Message: fmt.Sprintf("the number of IDs of leaf_next(tag, n) in parameter $%d is NULL", p)}
		}
		v, err := bindInt(m.params[p-1], m.format(p-1), types[p-1])
		if err != nil {
			return "", 0, &rewrite.Error{Code: sqlstate.InvalidParameterValue,
				Message: fmt.Sprintf("the number of IDs of leaf_next(tag, n) in parameter $%d: %v", p, err)}
		}
		n = v
	}
	return tag, n, nil
}

// format returns the format code of parameter i (0-based).
func (m *bindMessage) format(i int) uint16 {
	switch len(m.formats) {
	case 0:
		return 0
	case 1:
		return m.formats[0]
	}
	return m.formats[i]
}

// bindInt reads an integer parameter: text digits, or a binary int2, int4 or int8.
func bindInt(v []byte, format uint16, oid uint32) (int64, error) {
	if format == 0 || oid == oidText || oid == 1043 /* varchar */ {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q is not an integer", v)
		}
		return n, nil
	}
	switch len(v) {
	case 2:
		return int64(int16(binary.BigEndian.Uint16(v))), nil
	case 4:
		return int64(int32(binary.BigEndian.Uint32(v))), nil
	case 8:
		return int64(binary.BigEndian.Uint64(v)), nil
	}
	return 0, fmt.Errorf("a binary value of %d bytes is not an integer", len(v))
}

// appendInt8Array appends the IDs as one Bind parameter value (length and bytes) of type
// int8[], in the text or the binary format.
func appendInt8Array(b []byte, ids []int64, binaryFormat bool) []byte {
	at := len(b)
	b = append(b, 0, 0, 0, 0)
	if binaryFormat {
		b = binary.BigEndian.AppendUint32(b, 1) // dimensions
		b = binary.BigEndian.AppendUint32(b, 0) // no NULLs
		b = binary.BigEndian.AppendUint32(b, oidInt8)
		b = binary.BigEndian.AppendUint32(b, uint32(len(ids)))
		b = binary.BigEndian.AppendUint32(b, 1) // lower bound
		for _, id := range ids {
			b = appendInt8Value(b, id, true)
		}
	} else {
		b = append(b, '{')
		for i, id := range ids {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, id, 10)
		}
		b = append(b, '}')
	}
	binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-4))
	return b
}

// parseBatch sends the Parse of a batch statement: SELECT unnest($k::int8[]) AS name,
// where $k follows the client's parameters, which keep the types batchParamTypes gives.
func (c *conn) parseBatch(name string, plan *rewrite.Plan, oids []byte, mat *localStatement) error {
	ss := &c.sess
	b := plan.Batch
	types, _ := batchParamTypes(b, plan.MaxParam, oids)
	if len(types)+1 > 65535 {
		return c.refuseExtended(&rewrite.Error{Code: sqlstate.ProgramLimitExceeded, Message: "too many parameters with the hidden leaf ID parameter"}, name == "")
	}
	out := append(ss.outBuf[:0], name...)
	out = append(out, 0)
	out = b.AppendParam(out, len(types)+1)
	out = append(out, 0)
	out = binary.BigEndian.AppendUint16(out, uint16(len(types)+1))
	for _, t := range types {
		out = binary.BigEndian.AppendUint32(out, t)
	}
	out = binary.BigEndian.AppendUint32(out, oidInt8Array)
	ss.outBuf = keepSmall(out)
	return c.sendParse(name, &statement{batch: b, params: types, local: true}, plan, mat, out)
}

// bindBatch draws the IDs of a batch statement's execution and appends them to the Bind
// as its hidden int8[] parameter: in binary when one format code says binary for all,
// else as text (with a text code of its own when the client gave one code per parameter).
func (c *conn) bindBatch(st *statement, name string, body []byte) error {
	ss := &c.sess
	m, _, ok := parseBind(body)
	if !ok || (len(m.formats) > 1 && len(m.formats) != len(m.params)) {
		return c.forwardExtended(clientBind, body) // the server reports the malformed Bind
	}
	if len(m.params) != len(st.params) {
		return c.refuseExtended(&rewrite.Error{Code: sqlstate.ProtocolViolation,
			Message: fmt.Sprintf("bind message supplies %d parameters, but prepared statement %q requires %d", len(m.params), name, len(st.params))}, false)
	}
	tag, n, err := batchArgs(st.batch, st.params, &m)
	if err != nil {
		return c.refuseExtended(err, false)
	}
	ids, err := c.batchIDs(tag, n)
	if err != nil {
		return c.refuseExtended(err, false)
	}
	out := appendBindParams(ss.outBuf[:0], &m, 1)
	out = appendInt8Array(out, ids, m.hiddenBinary())
	out = append(out, m.results...)
	ss.outBuf = keepSmall(out)
	return c.forwardExtended(clientBind, out)
}

// bindLocalBatch draws the IDs of a local batch portal at Bind, where the server path
// draws them too (bindBatch), so that a bad argument or a failed draw fails the Bind in
// both. It reports false after answering an error.
func (c *conn) bindLocalBatch(lc *localCycle, p *localPortal, m *bindMessage) bool {
	tag, n, err := batchArgs(p.batch, p.params, m)
	var ids []int64
	if err == nil {
		ids, err = c.batchIDs(tag, n)
	}
	if err != nil {
		c.failLocal(lc, err)
		return false
	}
	p.ids = append(p.ids, ids...)
	return true
}

// executeLocalBatch answers an Execute of a local batch portal: each sends up to maxRows
// of the rows left (all when maxRows is 0), with a PortalSuspended when it stopped at
// maxRows, as the server does.
func (c *conn) executeLocalBatch(lc *localCycle, p *localPortal, maxRows int32) {
	if !p.ran {
		p.ran = true
		c.rewritten("fast_path")
	}
	rows := p.ids[p.sent:]
	if maxRows > 0 && int(maxRows) <= len(rows) {
		lc.out = appendBatchRows(lc.out, rows[:maxRows], p.binary)
		p.sent += int(maxRows)
		lc.out = appendEmpty(lc.out, serverPortalSuspended)
		return
	}
	lc.out = appendBatchRows(lc.out, rows, p.binary)
	p.sent += len(rows)
	lc.out = appendCommandComplete(lc.out, "SELECT "+strconv.Itoa(len(rows)))
}
