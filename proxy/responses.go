package proxy

import (
	"encoding/binary"
	"fmt"
)

// This file is the upstream-to-client half of SQL rewriting: it keeps the session's
// bookkeeping in step with the server's answers, strips hidden parameters from
// ParameterDescription, and places the proxy's own responses exactly where the server's
// would have been.

// fromUpstreamRewriting handles one upstream message whose header has been read; the
// caller holds cwMu.
func (c *conn) fromUpstreamRewriting(typ byte, n int) (fatal bool, err error) {
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
		return false, c.readyForQuery(body)
	case serverErrorResponse:
		body, err := c.server.r.readBody(n)
		if err != nil {
			return false, err
		}
		mine := c.copyFailure(body)
		if mine == nil {
			mine = c.upstreamError(body)
		}
		if mine != nil {
			c.countError(*mine)
			_, err := c.cw.Write(mine.msg)
			return false, err
		}
		return isFatal(body), c.writeClient(typ, body)
	case serverParameterDescription:
		body, err := c.server.r.readBody(n)
		if err != nil {
			return false, err
		}
		return false, c.writeClient(typ, c.stripHidden(body))
	case serverParameterStatus:
		body, err := c.server.r.readBody(n)
		if err != nil {
			return false, err
		}
		c.noteParameterStatus(body)
		return false, c.writeClient(typ, body)
	case serverCopyInResponse:
		body, err := c.server.r.readBody(n)
		if err != nil {
			return false, err
		}
		return false, c.writeClient(typ, c.stripCopyKeys(body))
	case serverParseComplete, serverBindComplete, serverCloseComplete, serverNoData,
		serverRowDescription, serverCommandComplete, serverEmptyQueryResponse, serverPortalSuspended:
		// The one response that ends a Parse, Bind, Close, Describe or Execute.
		if !c.terminalResponse(typ) {
			_, err := c.server.r.br.Discard(n)
			return false, unexpected(err)
		}
	}
	if err := writeHeader(c.cw, typ, n); err != nil {
		return false, err
	}
	return false, c.server.r.copyBody(c.cw, n)
}

// terminalResponse counts a response that ends one message of the oldest cycle and
// reports whether it goes to the client: the ParseComplete of a materialized local
// statement does not, since the client already had the proxy's.
func (c *conn) terminalResponse(typ byte) bool {
	c.sess.mu.Lock()
	defer c.sess.mu.Unlock()
	return c.countTerminalLocked(typ, true)
}

// terminalPassesLocked is terminalResponse for a response relayed with others in one
// write (see passUpstreamRun): it counts the response and reports true, or reports false,
// having counted nothing, for one that terminalResponse would not relay. The session's
// lock is held.
func (c *conn) terminalPassesLocked(typ byte) bool { return c.countTerminalLocked(typ, false) }

// countTerminalLocked is terminalResponse, or terminalPassesLocked when take is false: a
// response the client does not get is then left for terminalResponse. The session's lock
// is held.
func (c *conn) countTerminalLocked(typ byte, take bool) bool {
	ss := &c.sess
	cy := ss.headLocked()
	if cy == nil {
		return true
	}
	if cy.swallows(typ) {
		if take {
			cy.countResponse(typ)
			cy.swallow = cy.swallow[1:]
		}
		return false
	}
	cy.countResponse(typ)
	return true
}

// swallows reports whether typ, the cycle's next response, is the ParseComplete of a
// materialized local statement, which the client does not get. The session's lock is held.
func (cy *cycle) swallows(typ byte) bool {
	return typ == serverParseComplete && len(cy.swallow) > 0 && cy.swallow[0] == cy.answered+1
}

// countResponse counts typ, a response that ends one of the cycle's messages, and
// confirms the statement change a ParseComplete or CloseComplete answers. The session's
// lock is held.
func (cy *cycle) countResponse(typ byte) {
	cy.answered++
	if typ == serverParseComplete || typ == serverCloseComplete {
		cy.confirmLocked(typ)
	}
}

// stripHidden removes the hidden parameters of the described statement from a
// ParameterDescription, so the client sees the parameters it wrote.
func (c *conn) stripHidden(body []byte) []byte {
	ss := &c.sess
	ss.mu.Lock()
	hidden := 0
	if cy := ss.headLocked(); cy != nil {
		if cy.paramDescs < len(cy.describes) {
			hidden = cy.describes[cy.paramDescs]
		}
		cy.paramDescs++
	}
	ss.mu.Unlock()
	if hidden == 0 || len(body) < 2 {
		return body
	}
	count := be16(body)
	if count < hidden || len(body) != 2+4*count {
		return body
	}
	binary.BigEndian.PutUint16(body, uint16(count-hidden))
	return body[:2+4*(count-hidden)]
}

// readyForQuery ends the oldest cycle: the statement map settles and ReadyForQuery goes
// out.
func (c *conn) readyForQuery(body []byte) error {
	c.endCycle()
	return c.writeClient(serverReadyForQuery, body)
}

// endCycle is what a ReadyForQuery does to the session's bookkeeping: the oldest cycle
// ends and the statement map settles.
func (c *conn) endCycle() {
	c.sess.mu.Lock()
	defer c.sess.mu.Unlock()
	c.endCycleLocked()
}

// endCycleLocked is endCycle with the session's lock held.
func (c *conn) endCycleLocked() {
	ss := &c.sess
	c.pending.Add(-1)
	if len(ss.queue) > 0 {
		cy := ss.popLocked()
		if ss.cur == cy {
			ss.cur = nil // a server-initiated end of an open cycle (should not happen)
		}
		if ss.copyIn != nil && ss.copyIn.cy == cy {
			ss.copyIn = nil // the COPY failed before the client finished, or never started
		}
		ss.settleLocked(cy)
		ss.recycleLocked(cy)
	}
}
