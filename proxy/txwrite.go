package proxy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"slices"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// The session's messages on their way to the borrowed connection, in transaction mode:
// each whole message is looked at once (clientMessage), the client's statement names
// mapped to the proxy's, and what goes as it is is written from the session's buffer
// without a copy (see handle).

// Write takes the session's messages for the server: whole messages are handled as they
// complete (see clientMessage) and what the server must get is written to the borrowed
// connection. On an event loop, messages that must wait for a connection wait in wbuf
// (awaiting) until pump; and as nothing there blocks, nor runs the session meanwhile,
// Write holds mu throughout, the write to the connection included.
func (v *pooledConn) Write(p []byte) (int, error) { return v.write(p, false) }

// write is Write; textsFree says that no Query or Parse in p, which holds whole messages
// only, has any of the words transaction mode looks for (an event loop's memo of cleared
// texts knows it, see relayToPool): checkText need not look for them while p is handled
// where it is, with the session's lock held throughout.
func (v *pooledConn) write(p []byte, textsFree bool) (int, error) {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return 0, net.ErrClosed
	}
	held := v.host != nil
	if held {
		defer v.mu.Unlock()
	} else {
		v.writers++
		defer v.endWrite()
	}
	if v.awaiting {
		v.wbuf = append(v.wbuf, p...)
		if !held {
			v.mu.Unlock()
		}
		return len(p), nil
	}
	// Whole messages are handled where they are: in p, or in wbuf once a partial one
	// has been completed there.
	if len(v.wbuf) > 0 {
		v.wbuf = append(v.wbuf, p...)
		return len(p), v.handle(v.wbuf, true, held)
	}
	v.textsFree = textsFree && held
	return len(p), v.handle(p, false, held)
}

// pump handles the messages that waited for a connection, once the wait has ended; the
// session's loop calls it.
func (v *pooledConn) pump() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.awaiting || !v.granted || v.closed {
		return nil
	}
	v.awaiting = false
	return v.handle(v.wbuf, true, true)
}

// handle handles the whole messages at the start of in, which is wbuf (inBuf) or the
// caller's, and writes what the server must get; the rest (a partial message, or
// messages waiting for a connection) stays in wbuf. Called with mu held, which it lets go
// unless the caller holds it throughout (held, on an event loop).
//
// Messages that go to the server as they are (see passOn) are written from in itself
// while nothing else is to go before them: most cycles then cost no copy. Not from wbuf
// when mu is let go before the write, for wbuf is compacted first.
func (v *pooledConn) handle(in []byte, inBuf, held bool) error {
	out := v.obuf[:0]
	var pc *physConn
	done := 0
	runFrom, runTo := 0, 0 // the run of in that goes out as it is, while out is empty
	v.runs = held || !inBuf
	for len(in)-done >= 5 {
		n := int(binary.BigEndian.Uint32(in[done+1:])) + 1
		if n < 5 || len(in)-done < n {
			break
		}
		var err error
		v.passed = false
		out, pc, err = v.clientMessage(out, pc, in[done:done+n])
		if err == errAwaitServer {
			v.awaiting = true
			break
		}
		if err != nil {
			v.runs, v.textsFree = false, false
			if !held {
				v.mu.Unlock()
			}
			return err
		}
		switch {
		case v.passed:
			if runTo == runFrom {
				runFrom = done
			}
			runTo = done + n
		case runTo > runFrom:
			// Something else than the message as it is, or nothing at all: the run
			// goes first, and what follows is built in out.
			out = slices.Insert(out, 0, in[runFrom:runTo]...)
			runFrom, runTo, v.runs = 0, 0, false
		}
		done += n
	}
	v.runs, v.textsFree = false, false
	if cap(out) <= keepBufferSize {
		v.obuf = out[:0]
	}
	if runTo > runFrom {
		out = in[runFrom:runTo]
	}
	var err error
	if held && len(out) > 0 {
		_, err = pc.nc.Write(out) // does not block on a loop; out may be part of wbuf
		out = nil
	}
	if inBuf {
		v.wbuf = v.wbuf[:copy(v.wbuf, v.wbuf[done:])]
	} else if done < len(in) {
		v.wbuf = append(v.wbuf, in[done:]...)
	}
	if len(v.wbuf) == 0 && cap(v.wbuf) > keepBufferSize {
		v.wbuf = nil
	}
	if held {
		return err
	}
	v.mu.Unlock()
	if len(out) > 0 {
		if _, err := pc.nc.Write(out); err != nil {
			return err
		}
	}
	return nil
}

// passOn appends msg, a message of the session that goes to the server as it is, to out;
// while out is empty and handle keeps runs, it leaves msg where it is, and passed tells
// handle to send it from there.
func (v *pooledConn) passOn(out, msg []byte) []byte {
	if v.runs && len(out) == 0 {
		v.passed = true
		return out
	}
	return append(out, msg...)
}

func (v *pooledConn) endWrite() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.writers--
	if v.writers == 0 && v.release && v.srv != nil {
		v.giveBack(pool.Clean)
	}
}

// clientMessage handles one whole message of the session, appending what pc must get to
// out. Messages for one Write all go to one connection: one is borrowed only when none
// is held, and none is given back while a Write is in progress. Called with mu held; it
// lets go of it while it waits for a connection.
func (v *pooledConn) clientMessage(out []byte, pc *physConn, msg []byte) ([]byte, *physConn, error) {
	typ, body := msg[0], msg[5:]
	if typ == clientTerminate {
		return out, pc, nil // a pooled connection outlives its borrowers
	}
	if v.discarding != nil {
		if typ == clientSync {
			v.synth = append(v.synth, v.discarding...)
			v.synth = append(v.synth, serverReadyForQuery, 0, 0, 0, 5, txIdle)
			v.discarding = nil
			v.cond.Broadcast()
		}
		return out, pc, nil
	}
	var verdict queryVerdict
	switch {
	case v.verdictHeld:
		// The message waited for a connection: it was looked at already.
		verdict, v.heldVerdict, v.verdictHeld = v.heldVerdict, queryVerdict{}, false
	case typ == clientQuery:
		verdict = v.checkQuery(body)
	case typ == clientParse:
		verdict = v.checkParse(body)
	}
	if v.pc == nil && v.answerIdle(typ, body, verdict) {
		return out, pc, nil
	}
	if v.pc == nil {
		switch typ {
		case clientSync: // an empty cycle: nothing to ask a server
			v.synth = append(v.synth, serverReadyForQuery, 0, 0, 0, 5, txIdle)
			v.cond.Broadcast()
			return out, pc, nil
		case clientFlush, clientCopyData, clientCopyDone, clientCopyFail:
			return out, pc, nil
		}
		srv, err := v.borrow()
		if err == errAwaitServer {
			v.heldVerdict, v.verdictHeld = verdict, true
			return out, pc, err
		}
		if v.closed {
			if srv != nil {
				srv.Release(pool.Clean)
			}
			return out, pc, net.ErrClosed
		}
		if err != nil {
			v.c.log.WithError(err).Info("no server connection for a transaction")
			e := acquireError(err)
			if typ == clientQuery || typ == clientFunctionCall {
				v.synth = append(v.synth, e...)
				v.synth = append(v.synth, serverReadyForQuery, 0, 0, 0, 5, txIdle)
				v.cond.Broadcast()
			} else {
				v.discarding = e
			}
			return out, pc, nil
		}
		out = v.take(out, srv)
	}
	pc = v.pc
	if !v.readerOn {
		v.readerOn, v.release = true, false
		v.cond.Broadcast()
	}
	switch typ {
	case clientQuery:
		if verdict.dealloc != nil {
			var r []byte
			if out, r = v.deallocateInTransaction(out, verdict.dealloc); r == nil {
				return out, pc, nil
			}
			verdict.refusal = r
		}
		v.outstanding++
		v.queries++
		pc.unnamed = nil // a Query replaces the unnamed statement
		e := expect{kind: expQuery}
		if r := verdict.refusal; r != nil {
			e.refusal = r
			v.push(e)
			return appendQuery(out, standInSQL), pc, nil
		}
		v.push(e)
	case clientFunctionCall:
		v.outstanding++
		v.queries++
		v.push(expect{kind: expQuery})
	case clientSync:
		v.outstanding++
		v.queries++
		v.unsynced = false
		v.push(expect{kind: expSync})
	case clientParse:
		v.unsynced = true
		return v.parse(out, msg, verdict), pc, nil
	case clientBind:
		v.unsynced = true
		return v.bind(out, msg), pc, nil
	case clientDescribe:
		v.unsynced = true
		if len(body) >= 2 && body[0] == targetStatement {
			stmt, ok := v.ensure(&out, zstring(body[1:]))
			if ok {
				return appendMessage(out, clientDescribe, []byte{targetStatement}, []byte(stmt), []byte{0}), pc, nil
			}
		}
	case clientClose:
		v.unsynced = true
		if len(body) >= 2 && body[0] == targetStatement {
			name := zstring(body[1:])
			if name != "" {
				v.push(expect{kind: expClose, client: name, stmt: v.stmts[name]})
				delete(v.stmts, name)
				return appendMessage(out, clientClose, []byte{targetPortal}, []byte(noPortal), []byte{0}), pc, nil
			}
			v.unnamed, pc.unnamed = nil, nil
		} else if len(body) >= 2 {
			delete(v.deallocPortals, zstring(body[1:]))
		}
		v.push(expect{kind: expClose})
	case clientExecute:
		v.unsynced = true
		if v.trackExecutes {
			return v.execute(out, msg), pc, nil
		}
	case clientFlush:
		v.unsynced = true
	}
	return v.passOn(out, msg), pc, nil
}

// push queues an answer the server owes the proxy. The queue is consumed from its front
// (v.queue[1:]), which loses the array's first places: an empty queue starts again at the
// front of its array, so that once the array is large enough for a session's cycles, its
// appends allocate nothing.
func (v *pooledConn) push(e expect) {
	if len(v.queue) == 0 {
		v.queue = v.qarr[:0]
	}
	v.queue = append(v.queue, e)
	if cap(v.queue) > cap(v.qarr) {
		v.qarr = v.queue[:0] // grown into a new array, which starts with the queue
	}
}

// noPortal is a portal name no client can have: the proxy closes it in answer to a
// client's Close of a statement, for the server's CloseComplete in order.
const noPortal = "leafproxy no portal"

// parse handles a Parse: the statement is the client's, prepared at the server under its
// server-side name. verdict refuses it, or makes it a DEALLOCATE's (see checkParse).
func (v *pooledConn) parse(out, msg []byte, verdict queryVerdict) []byte {
	body := msg[5:]
	name := zstring(body)
	rest := body[len(name)+1:]
	r := verdict.refusal
	if r == nil && name != "" && v.stmts[name] != nil {
		r = errorMessage(sqlstate.DuplicatePreparedStatement, fmt.Sprintf("prepared statement %q already exists", name), "")
	}
	if r != nil {
		if name == "" {
			v.unnamed, v.pc.unnamed = nil, nil
		}
		v.push(expect{kind: expParse, refusal: r})
		return appendMessage(out, clientParse, standInParseNamed)
	}
	var st *clientStmt
	if verdict.dealloc != nil {
		st = deallocStmt(rest, verdict.dealloc)
		v.trackExecutes = true
	} else if u := v.unnamed; name == "" && u != nil && u.dealloc == nil && bytes.Equal(u.rest, rest) {
		st = u // the unnamed statement parsed again with the same text, as most clients do
	} else {
		st = &clientStmt{rest: append([]byte(nil), rest...)}
	}
	if name == "" {
		v.unnamed, v.pc.unnamed = st, st
		v.push(expect{kind: expParse})
		if st.dealloc != nil {
			return appendMessage(out, clientParse, []byte{0}, st.rest)
		}
		return v.passOn(out, msg)
	}
	st.sname = pstmtName(st.rest)
	v.stmts[name] = st
	if v.pc.prepared.has(st.sname) {
		// Prepared here by this client or another: parse it again, so that the client
		// gets the server's own answer to its Parse.
		v.pc.prepared.remove(st.sname)
		out = appendMessage(out, clientClose, []byte{targetStatement}, []byte(st.sname), []byte{0})
		v.push(expect{kind: expInjectedClose, name: st.sname, was: true})
	}
	out = v.makeRoom(out)
	v.pc.prepared.use(st.sname)
	v.push(expect{kind: expParse, name: st.sname, client: name})
	return appendMessage(out, clientParse, []byte(st.sname), []byte{0}, st.rest)
}

// ensure makes the client's statement name exist on pc, parsing it there first when
// needed, and returns its server-side name; ok is false for a name the client never
// parsed (the server then says it does not exist).
func (v *pooledConn) ensure(out *[]byte, name string) (string, bool) {
	if name == "" {
		switch {
		case v.unnamed == nil:
			*out = v.closeUnnamed(*out)
		case v.pc.unnamed != v.unnamed:
			*out = appendMessage(*out, clientParse, []byte{0}, v.unnamed.rest)
			v.push(expect{kind: expInjectedParse})
			v.pc.unnamed = v.unnamed
		}
		return "", true
	}
	st := v.stmts[name]
	if st == nil {
		return "", false
	}
	if !v.pc.prepared.has(st.sname) {
		*out = v.makeRoom(*out)
		*out = appendMessage(*out, clientParse, []byte(st.sname), []byte{0}, st.rest)
		v.push(expect{kind: expInjectedParse, name: st.sname})
	}
	v.pc.prepared.use(st.sname)
	return st.sname, true
}

// bind handles a Bind: its statement gets its server-side name.
func (v *pooledConn) bind(out, msg []byte) []byte {
	body := msg[5:]
	portal := zstring(body)
	rest := body[len(portal)+1:]
	name := zstring(rest)
	sname, ok := v.ensure(&out, name)
	if v.trackExecutes {
		st := v.unnamed
		if name != "" {
			st = v.stmts[name]
		}
		v.bindPortal(portal, st)
	}
	if !ok || name == "" {
		return v.passOn(out, msg)
	}
	return appendMessage(out, clientBind, []byte(portal), []byte{0}, []byte(sname), []byte{0}, rest[len(name)+1:])
}
