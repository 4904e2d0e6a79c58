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
	s := &c.sess
	switch typ {
	case 'Z':
		body, err := c.ur.readBody(n)
		if err != nil {
			return false, err
		}
		if len(body) != 1 {
			return false, fmt.Errorf("ReadyForQuery of %d bytes", len(body))
		}
		c.txStatus.Store(uint32(body[0]))
		return false, c.readyForQuery(body)
	case 'E':
		body, err := c.ur.readBody(n)
		if err != nil {
			return false, err
		}
		s.mu.Lock()
		if cy := s.headLocked(); cy != nil {
			cy.failed = true
		}
		s.mu.Unlock()
		return isFatal(body), c.writeClient(typ, body)
	case 't':
		body, err := c.ur.readBody(n)
		if err != nil {
			return false, err
		}
		return false, c.writeClient(typ, c.stripHidden(body))
	}
	if typ == '1' {
		if swallow, inject := c.swallowNext(); swallow {
			// The ParseComplete of a materialized local statement: the client had its own.
			if _, err := c.ur.br.Discard(n); err != nil {
				return false, unexpected(err)
			}
			_, err := c.cw.Write(inject)
			return false, err
		}
	}
	if err := writeHeader(c.cw, typ, n); err != nil {
		return false, err
	}
	if err := c.ur.copyBody(c.cw, n); err != nil {
		return false, err
	}
	switch typ {
	case '1', '2', '3', 'n', 'T', 'C', 'I', 's':
		// The one response that ends a Parse, Bind, Close, Describe or Execute.
		s.mu.Lock()
		defer s.mu.Unlock()
		cy := s.headLocked()
		if cy == nil {
			return false, nil
		}
		cy.answered++
		if typ == '1' || typ == '3' {
			cy.confirmLocked(typ)
		}
		if cy.inject != nil && !cy.failed && cy.answered == cy.injectAt {
			_, err := c.cw.Write(cy.inject)
			cy.inject = nil
			return false, err
		}
	}
	return false, nil
}

// swallowNext reports whether the next terminal response of the oldest cycle answers a
// materializing Parse, counting it as answered if so; inject is a refusal of the proxy's
// own that is due right after it.
func (c *conn) swallowNext() (swallow bool, inject []byte) {
	s := &c.sess
	s.mu.Lock()
	defer s.mu.Unlock()
	cy := s.headLocked()
	if cy == nil || len(cy.swallow) == 0 || cy.swallow[0] != cy.answered+1 {
		return false, nil
	}
	cy.swallow = cy.swallow[1:]
	cy.answered++
	cy.confirmLocked('1')
	if cy.inject != nil && !cy.failed && cy.answered == cy.injectAt {
		inject, cy.inject = cy.inject, nil
	}
	return true, inject
}

// stripHidden removes the hidden parameters of the described statement from a
// ParameterDescription, so the client sees the parameters it wrote.
func (c *conn) stripHidden(body []byte) []byte {
	s := &c.sess
	s.mu.Lock()
	hidden := 0
	if cy := s.headLocked(); cy != nil {
		if cy.paramDescs < len(cy.describes) {
			hidden = cy.describes[cy.paramDescs]
		}
		cy.paramDescs++
	}
	s.mu.Unlock()
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

// readyForQuery ends the oldest cycle: a refusal still due is sent, the statement map
// settles, ReadyForQuery goes out, and then any answers of the proxy's own that were
// queued behind this cycle follow, each with its ReadyForQuery.
func (c *conn) readyForQuery(body []byte) error {
	s := &c.sess
	s.mu.Lock()
	defer s.mu.Unlock()
	c.pending.Add(-1)
	if len(s.queue) > 0 {
		cy := s.popLocked()
		if s.cur == cy {
			s.cur = nil // a server-initiated end of an open cycle (should not happen)
		}
		inject := cy.inject
		if cy.failed {
			inject = nil
		}
		s.settleLocked(cy)
		s.recycleLocked(cy)
		if inject != nil {
			if _, err := c.cw.Write(inject); err != nil {
				return err
			}
		}
	}
	if err := c.writeClient('Z', body); err != nil {
		return err
	}
	for len(s.queue) > 0 && s.queue[0].local != nil {
		cy := s.popLocked()
		local := cy.local
		s.recycleLocked(cy)
		c.pending.Add(-1)
		if _, err := c.cw.Write(local); err != nil {
			return err
		}
		if err := c.writeClient('Z', body); err != nil {
			return err
		}
	}
	return nil
}
