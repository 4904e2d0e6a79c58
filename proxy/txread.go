package proxy

import (
	"encoding/binary"
	"io"
	"slices"
	"strings"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// The borrowed connection's messages on their way to the session, in transaction mode:
// each whole message is handled where the connection's buffer holds it (serverMessage),
// the answers to what the proxy sent on its own swallowed, and the rest goes straight
// into the session's reader (see emit).

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
	// connection is given back. Each is handled where pc's buffer holds it, looked at
	// through one Peek: nothing else reads pc meanwhile, and taking messages off does not
	// move the bytes behind them. They are taken off pc in one Discard, before a
	// ReadyForQuery, the one message whose handling may give pc back (serverMessage copies
	// what it keeps of it first), after which another session may read into that buffer;
	// or at the end of the walk. Not once the gathered message gave pc back.
	var buffered []byte
	if v.pc == pc {
		buffered, _ = pc.br.Peek(pc.br.Buffered())
	}
	off, taken := 0, 0
	for v.pc == pc && !v.closed && len(buffered)-off >= 5 {
		n := int(binary.BigEndian.Uint32(buffered[off+1:])) + 1
		if n < 5 || len(buffered)-off < n {
			break
		}
		msg := buffered[off : off+n]
		off += n
		if msg[0] == serverReadyForQuery {
			_, _ = pc.br.Discard(off - taken)
			taken = off
		}
		v.serverMessage(msg)
	}
	if off > taken {
		_, _ = pc.br.Discard(off - taken)
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
		switch tag := zbytes(body); {
		case string(tag) == "SET" || string(tag) == "RESET":
			v.needCapture = true
		case string(tag) == "DISCARD ALL" || string(tag) == "DEALLOCATE ALL":
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
