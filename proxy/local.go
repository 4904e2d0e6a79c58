package proxy

import (
	"encoding/binary"
	"strconv"

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
	fast  *rewrite.FastPath
	parse []byte // the client's Parse body, rewritten and sent to materialize it
}

// localPortal is the unnamed portal of a local cycle.
type localPortal struct {
	fast   *rewrite.FastPath
	binary bool // result format: 8-byte big-endian rather than text
	ran    bool // its one row has been sent
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
	s := &c.sess
	lc := s.local
	switch {
	case lc == nil:
		if !c.mayStartLocal(typ, n) {
			return false, nil
		}
	case lc.failed:
		// After an error the server ignores everything up to Sync; so does the proxy.
		switch typ {
		case 'S':
			if _, err := c.cr.br.Discard(n); err != nil {
				return true, unexpected(err)
			}
			return true, c.finishLocal()
		case 'H':
			if _, err := c.cr.br.Discard(n); err != nil {
				return true, unexpected(err)
			}
			return true, c.flushLocal()
		case 'X':
			return false, nil
		}
		_, err := c.cr.br.Discard(n)
		return true, unexpected(err)
	case n > maxLocalMessage || !isLocalType(typ):
		if err := c.replayLocal(); err != nil {
			return true, err
		}
		if s.skip && typ != 'H' && typ != 'X' {
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
	if c.answerLocal(typ, body) {
		if typ == 'S' {
			return true, c.finishLocal()
		}
		lc := s.local
		lc.msgs = append(lc.msgs, typ)
		lc.msgs = binary.BigEndian.AppendUint32(lc.msgs, uint32(len(body)+4))
		lc.msgs = append(lc.msgs, body...)
		return true, nil
	}
	if s.local != nil {
		if err := c.replayLocal(); err != nil {
			return true, err
		}
	}
	if s.skip {
		// The replay ended in a refusal: the messages up to Sync are discarded.
		if typ != 'S' {
			return true, nil
		}
		s.skip = false
	}
	return true, c.dispatch(typ, body)
}

func isLocalType(typ byte) bool {
	switch typ {
	case 'P', 'B', 'D', 'E', 'C', 'S':
		return true
	}
	return false
}

// mayStartLocal reports whether a message could begin a local cycle: nothing is
// outstanding, the session is outside a transaction block, and the message may refer to
// a fast-path statement.
func (c *conn) mayStartLocal(typ byte, n int) bool {
	s := &c.sess
	if n > maxLocalMessage || c.pending.Load() != 0 || c.txStatus.Load() != 'I' {
		return false
	}
	switch typ {
	case 'P':
	case 'B', 'D', 'C':
		if s.unnamed() != nil {
			break
		}
		s.mu.Lock()
		none := len(s.stmts) == 0
		s.mu.Unlock()
		if none {
			return false
		}
	default:
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue) == 0 && s.cur == nil && !s.skip
}

// begin returns the local cycle, starting one.
func (s *sessionState) begin() *localCycle {
	if s.local == nil {
		lc := s.localSpare
		if lc == nil {
			lc = &localCycle{}
			s.localSpare = lc
		}
		*lc = localCycle{start: s.unnamed(), msgs: keepSmall(lc.msgs), out: keepSmall(lc.out)}
		s.local = lc
	}
	return s.local
}

// fastOf returns the fast path of the statement name, if it has one.
func (s *sessionState) fastOf(name string) *rewrite.FastPath {
	if name == "" {
		if st := s.unnamed(); st != nil {
			return st.fast
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.stmts[name]; st != nil {
		return st.fast
	}
	return nil
}

// answerLocal answers one message of a local cycle, reporting false when the proxy cannot.
func (c *conn) answerLocal(typ byte, body []byte) bool {
	s := &c.sess
	switch typ {
	case 'P':
		// Only the unnamed statement, without parameter types of the client's.
		if len(body) < 1 || body[0] != 0 {
			return false
		}
		query, rest, ok := cStringView(body[1:]) // only planned: c.plan copies what it keeps
		if !ok || len(rest) != 2 || be16(rest) != 0 {
			return false
		}
		plan, err := c.plan(query)
		if err != nil || plan == nil || fastStatement(plan, plan.MaxParam) == nil {
			return false
		}
		lc := s.begin()
		s.setUnnamed(&localStatement{fast: plan.FastPath, parse: append([]byte(nil), body...)})
		lc.out = append(lc.out, '1', 0, 0, 0, 4)
	case 'B':
		portal, rest, ok1 := cString(body)
		stmt, rest, ok2 := cString(rest)
		if !ok1 || !ok2 || portal != "" || len(rest) < 6 || be16(rest) != 0 || be16(rest[2:]) != 0 {
			return false
		}
		binaryResult := false
		switch results := rest[4:]; {
		case len(results) == 2 && be16(results) == 0:
		case len(results) == 4 && be16(results) == 1 && be16(results[2:]) <= 1:
			binaryResult = be16(results[2:]) == 1
		default:
			return false // the server reports what is wrong with it
		}
		fast := s.fastOf(stmt)
		if fast == nil {
			return false
		}
		lc := s.begin()
		lc.store = localPortal{fast: fast, binary: binaryResult}
		lc.portal = &lc.store
		lc.out = append(lc.out, '2', 0, 0, 0, 4)
	case 'D':
		if len(body) < 2 {
			return false
		}
		name, rest, ok := cString(body[1:])
		if !ok || len(rest) != 0 {
			return false
		}
		switch body[0] {
		case 'S':
			fast := s.fastOf(name)
			if fast == nil {
				return false
			}
			lc := s.begin()
			lc.out = append(lc.out, 't', 0, 0, 0, 6, 0, 0)
			lc.out = appendRowDescription(lc.out, fast.Column, false)
		case 'P':
			if name != "" || s.local == nil || s.local.portal == nil {
				return false
			}
			lc := s.local
			lc.out = appendRowDescription(lc.out, lc.portal.fast.Column, lc.portal.binary)
		default:
			return false
		}
	case 'E':
		if len(body) != 5 || body[0] != 0 || s.local == nil || s.local.portal == nil {
			return false
		}
		lc := s.local
		p := lc.portal
		if p.ran {
			// A portal runs once; fetching from an exhausted one yields no rows.
			lc.out = appendCommandComplete(lc.out, "SELECT 0")
			break
		}
		id, err := c.nextID(p.fast.Slot, "")
		if err != nil {
			// A local cycle runs outside a transaction block with nothing outstanding:
			// an error there changes nothing at the server, so the proxy's answer is
			// exactly the server's and nothing needs to fail upstream.
			r := errorResponse(&idError{err})
			c.countError(r)
			lc.out = append(lc.out, r.msg...)
			lc.failed = true
			break
		}
		p.ran = true
		c.rewritten("fast_path")
		lc.out = appendDataRow(lc.out, id, p.binary)
		if maxRows := int32(binary.BigEndian.Uint32(body[1:])); maxRows == 1 {
			// The row filled the fetch: the server does not yet know the portal is
			// exhausted and suspends it.
			lc.out = append(lc.out, 's', 0, 0, 0, 4)
		} else {
			lc.out = appendCommandComplete(lc.out, "SELECT 1")
		}
	case 'C':
		if len(body) != 2 || body[1] != 0 {
			return false
		}
		switch body[0] {
		case 'S':
			if s.unnamed() == nil {
				return false // the server's unnamed statement
			}
			lc := s.begin()
			s.setUnnamed(nil)
			lc.out = append(lc.out, '3', 0, 0, 0, 4)
		case 'P':
			if s.local == nil || s.local.portal == nil {
				return false
			}
			s.local.portal = nil
			s.local.out = append(s.local.out, '3', 0, 0, 0, 4)
		default:
			return false
		}
	case 'S':
		return s.local != nil && len(body) == 0
	default:
		return false
	}
	return true
}

// finishLocal ends a local cycle at Sync: the responses and a ReadyForQuery go out.
func (c *conn) finishLocal() error {
	s := &c.sess
	lc := s.local
	s.local = nil
	c.cwMu.Lock()
	defer c.cwMu.Unlock()
	err := c.writeLocalLocked(lc.out)
	lc.out = keepSmall(lc.out)
	lc.msgs = keepSmall(lc.msgs)
	lc.portal = nil
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
	s := &c.sess
	lc := s.local
	s.local = nil
	s.setUnnamed(lc.start)
	msgs := lc.msgs
	for len(msgs) > 0 {
		typ := msgs[0]
		n := int(binary.BigEndian.Uint32(msgs[1:])) - 4
		body := msgs[5 : 5+n]
		msgs = msgs[5+n:]
		if s.skip {
			continue // after a refusal, up to Sync
		}
		if err := c.dispatch(typ, body); err != nil {
			return err
		}
	}
	lc.msgs = keepSmall(lc.msgs)
	lc.out = keepSmall(lc.out)
	lc.portal = nil
	return nil
}

// dispatch handles an extended-protocol message whose body has been read, upstream.
func (c *conn) dispatch(typ byte, body []byte) error {
	switch typ {
	case 'P':
		return c.handleParse(body, nil)
	case 'B':
		return c.handleBind(body)
	case 'D':
		return c.handleDescribe(body)
	case 'C':
		return c.handleClose(body)
	case 'E':
		return c.forwardExtended('E', body)
	case 'S':
		c.closeCycle()
	}
	return c.send(typ, body)
}

// materialize creates the local unnamed statement at the server, ahead of a message of
// an upstream cycle that refers to it.
func (c *conn) materialize() error {
	s := &c.sess
	st := s.unnamed()
	return c.handleParse(st.parse, st)
}

// appendRowDescription appends the RowDescription PostgreSQL sends for the rewritten
// fast-path statement: one int8 column.
func appendRowDescription(b []byte, column string, binaryFormat bool) []byte {
	b = append(b, 'T')
	b = binary.BigEndian.AppendUint32(b, uint32(4+2+len(column)+1+18))
	b = binary.BigEndian.AppendUint16(b, 1)
	b = append(b, column...)
	b = append(b, 0)
	b = binary.BigEndian.AppendUint32(b, 0) // table OID
	b = binary.BigEndian.AppendUint16(b, 0) // column number
	b = binary.BigEndian.AppendUint32(b, oidInt8)
	b = binary.BigEndian.AppendUint16(b, 8)          // typlen
	b = binary.BigEndian.AppendUint32(b, 0xffffffff) // typmod -1
	format := uint16(0)
	if binaryFormat {
		format = 1
	}
	return binary.BigEndian.AppendUint16(b, format)
}

func appendDataRow(b []byte, id int64, binaryFormat bool) []byte {
	var digits [20]byte
	value := strconv.AppendInt(digits[:0], id, 10)
	if binaryFormat {
		value = binary.BigEndian.AppendUint64(digits[:0], uint64(id))
	}
	b = append(b, 'D')
	b = binary.BigEndian.AppendUint32(b, uint32(4+2+4+len(value)))
	b = binary.BigEndian.AppendUint16(b, 1)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	return append(b, value...)
}

func appendCommandComplete(b []byte, tag string) []byte {
	b = append(b, 'C')
	b = binary.BigEndian.AppendUint32(b, uint32(4+len(tag)+1))
	b = append(b, tag...)
	return append(b, 0)
}
