package proxy

import (
	"fmt"
	"maps"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// The server-side statements of a pooled connection, and the bookkeeping that keeps the
// proxy's account of them true (see txsession.go for how a client's statements map to
// them).
//
// How many: a client with a statement cache (pgx's holds 512 statements per connection)
// or an ORM prepares as many distinct statements as it has queries, and on a long-lived
// pooled connection the statements of every client that ran there pile up, each holding
// its parse tree and cached plans in the server's memory. Past Server.MaxPreparedStatements
// on a connection, the least recently used ones are closed there (a Close the proxy sends,
// whose CloseComplete the client never sees) as a new one is prepared; a client that
// needs one again gets it prepared again, as on a connection that never had it. A
// statement the borrower of the connection used since it borrowed it is never closed:
// its portals may be open. So a connection holds at most the cap, or the statements of
// one borrow when that is more.
//
// Account: the proxy notes a statement prepared or closed when it sends the Parse or
// Close, ahead of the server's answer, so that the next messages of a pipeline see it.
// When the server skips to the Sync after an error, the notes of what it did not run are
// undone, latest first, so that each restores what its own message found. A DISCARD ALL
// (or a DEALLOCATE ALL the proxy could not answer itself, run in a function) drops every
// statement of the connection: the proxy forgets them, but not those of the messages
// sent after it, which the server still runs.

// preparedSet holds the server-side names of the statements the proxy prepared on a
// server connection, most recently used first. The zero value is empty.
type preparedSet struct {
	byName     map[string]*preparedEntry
	head, tail *preparedEntry
	// borrow counts the borrows of the connection: the entries stamped with it were
	// used by the present borrower.
	borrow uint64
}

type preparedEntry struct {
	name       string
	borrow     uint64
	prev, next *preparedEntry
}

func (s *preparedSet) has(name string) bool { return s.byName[name] != nil }

func (s *preparedSet) len() int { return len(s.byName) }

// use notes name prepared, used by the present borrower.
func (s *preparedSet) use(name string) {
	e := s.byName[name]
	if e == nil {
		if s.byName == nil {
			s.byName = make(map[string]*preparedEntry)
		}
		e = &preparedEntry{name: name}
		s.byName[name] = e
	} else if e == s.head {
		e.borrow = s.borrow
		return
	} else {
		s.unlink(e)
	}
	e.borrow = s.borrow
	e.next = s.head
	if s.head != nil {
		s.head.prev = e
	}
	s.head = e
	if s.tail == nil {
		s.tail = e
	}
}

func (s *preparedSet) remove(name string) {
	if e := s.byName[name]; e != nil {
		s.unlink(e)
		delete(s.byName, name)
	}
}

func (s *preparedSet) unlink(e *preparedEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		s.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		s.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (s *preparedSet) clear() {
	s.byName, s.head, s.tail = nil, nil, nil
}

// endBorrow makes every statement closable again: the borrower gave the connection back.
func (s *preparedSet) endBorrow() { s.borrow++ }

// victim returns the least recently used statement the present borrower did not use; ""
// when there is none.
func (s *preparedSet) victim() string {
	for e := s.tail; e != nil; e = e.prev {
		if e.borrow != s.borrow {
			return e.name
		}
	}
	return ""
}

// makeRoom closes on pc, before the proxy prepares another statement there, the least
// recently used statements past Server.MaxPreparedStatements. Called with mu held.
func (v *pooledConn) makeRoom(out []byte) []byte {
	limit := v.c.srv.MaxPreparedStatements
	if limit <= 0 {
		return out
	}
	for v.pc.prepared.len() >= limit {
		name := v.pc.prepared.victim()
		if name == "" {
			break
		}
		v.pc.prepared.remove(name)
		v.push(expect{kind: expInjectedClose, name: name, was: true})
		out = appendMessage(out, clientClose, []byte{targetStatement}, []byte(name), []byte{0})
	}
	return out
}

// skipToSync handles an error the server answered an extended-protocol message with: it
// skips the messages up to the Sync, so the answers they await go, and the notes taken
// when they were sent are undone, latest first. Called with mu held.
func (v *pooledConn) skipToSync() {
	n := 0
	for n < len(v.queue) && v.queue[n].kind != expSync {
		n++
	}
	for i := n - 1; i >= 0; i-- {
		v.undo(&v.queue[i])
	}
	v.queue = v.queue[n:]
}

// undo takes back what the proxy noted when it sent the message e awaits the answer of,
// which the server skipped or failed.
func (v *pooledConn) undo(e *expect) {
	pc := v.pc
	switch e.kind {
	case expParse, expInjectedParse:
		if e.refusal != nil {
			return // a stand-in: nothing was noted
		}
		if e.name != "" {
			pc.prepared.remove(e.name)
		} else {
			pc.unnamed = nil
		}
		if e.kind == expParse {
			// The client's statement was not created.
			if e.client != "" {
				delete(v.stmts, e.client)
			} else {
				v.unnamed = nil
			}
		}
	case expInjectedClose:
		if e.was {
			pc.prepared.use(e.name) // still there
		}
	case expClose:
		if e.stmt != nil && v.stmts[e.client] == nil {
			v.stmts[e.client] = e.stmt // the client still has it
		}
	case expExecute:
		for name, st := range e.dropped {
			if v.stmts[name] == nil {
				v.stmts[name] = st // not deallocated
			}
		}
	}
}

// serverDroppedAll follows a DISCARD ALL or DEALLOCATE ALL the server ran: every named
// statement of pc is gone, and so are the client's and its portals, but for those of the
// messages sent after it, which the server has yet to run. Called with mu held.
func (v *pooledConn) serverDroppedAll() {
	v.pc.prepared.clear()
	var kept map[string]*clientStmt
	for i := range v.queue {
		e := &v.queue[i]
		switch {
		case e.kind == expInjectedClose:
			e.was = false // nothing to restore if it is skipped
		case e.kind == expExecute:
			e.dropped = nil
		case (e.kind == expParse || e.kind == expInjectedParse) && e.refusal == nil && e.name != "":
			v.pc.prepared.use(e.name)
			if e.kind == expParse && e.client != "" && v.stmts[e.client] != nil {
				if kept == nil {
					kept = make(map[string]*clientStmt)
				}
				kept[e.client] = v.stmts[e.client]
			}
		}
	}
	clear(v.stmts)
	for name, st := range kept {
		v.stmts[name] = st
	}
	v.deallocPortals = nil
}

// closeUnnamed closes the unnamed statement of pc before a Bind or Describe of the unnamed
// statement from a client that has none: the one the server has may be another
// client's, which the client must neither run nor see; the server answers 26000, as it
// would have the client. Called with mu held.
func (v *pooledConn) closeUnnamed(out []byte) []byte {
	v.pc.unnamed = nil
	v.push(expect{kind: expInjectedClose})
	return appendMessage(out, clientClose, []byte{targetStatement, 0})
}

// A DEALLOCATE in the extended protocol (see txlocal.go) is the client's statement like
// any other, but the server prepares an empty statement in its place: its Describe
// answers as a DEALLOCATE's would (no columns), and the Execute of a portal bound to it
// answers EmptyQueryResponse, which the proxy replaces with the DEALLOCATE's answer.

// deallocStmt returns the client statement of a Parse of the DEALLOCATE d, whose body
// after the name is rest: an empty query, with the parameter types of the client's.
func deallocStmt(rest []byte, d *deallocation) *clientStmt {
	query := zbytes(rest)
	b := make([]byte, 0, len(rest)-len(query))
	b = append(b, 0)
	if len(query) < len(rest) {
		b = append(b, rest[len(query)+1:]...)
	}
	return &clientStmt{rest: b, dealloc: d}
}

// bindPortal notes the statement st (nil when unknown) a Bind binds to portal: one of a
// DEALLOCATE makes the portal's Execute the proxy's to answer. Called with mu held.
func (v *pooledConn) bindPortal(portal string, st *clientStmt) {
	if st != nil && st.dealloc != nil {
		if v.deallocPortals == nil {
			v.deallocPortals = make(map[string]*deallocation)
		}
		v.deallocPortals[portal] = st.dealloc
		return
	}
	delete(v.deallocPortals, portal)
}

// execute handles an Execute once the session has parsed a DEALLOCATE: every Execute's
// answer is awaited in order, so that the EmptyQueryResponse of a DEALLOCATE's portal is
// told from that of an empty statement of the client's. The DEALLOCATE takes effect when
// it is sent, as a Parse or Close does, so that the next messages of a pipeline see it;
// it is undone if the server skips it (in a failed transaction the server fails the
// Bind already). Of a name the client does not have, the Execute fails, and the
// transaction with it, as PostgreSQL's DEALLOCATE would: through the stand-in
// (refusal.go), whose error is replaced. Called with mu held.
func (v *pooledConn) execute(out, msg []byte) []byte {
	d := v.deallocPortals[zstring(msg[5:])]
	e := expect{kind: expExecute, dealloc: d}
	switch {
	case d == nil:
	case d.all:
		e.dropped = maps.Clone(v.stmts)
		clear(v.stmts)
	case v.stmts[d.name] == nil:
		v.push(expect{kind: expParse, refusal: unknownStatement(d.name)})
		return appendMessage(out, clientParse, standInParseNamed)
	default:
		e.dropped = map[string]*clientStmt{d.name: v.stmts[d.name]}
		delete(v.stmts, d.name)
	}
	v.push(e)
	return append(out, msg...)
}

// executed handles the end of an Execute's answer while the session awaits them (see
// execute): it returns what the client gets in place of msg. Called with mu held.
func (v *pooledConn) executed(front *expect, msg []byte) []byte {
	d := front.dealloc
	v.queue = v.queue[1:]
	if d != nil && msg[0] == serverEmptyQueryResponse {
		return appendCommandComplete(nil, deallocTag(d))
	}
	return msg
}

func deallocTag(d *deallocation) string {
	if d.all {
		return "DEALLOCATE ALL"
	}
	return "DEALLOCATE"
}

func unknownStatement(name string) []byte {
	return errorMessage(sqlstate.InvalidSQLStatementName, fmt.Sprintf("prepared statement %q does not exist", name), "")
}
