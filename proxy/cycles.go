package proxy

import "github.com/leafproxy/leafproxy/rewrite"

// statement is what the proxy remembers about a prepared statement (protocol-level Parse
// or SQL PREPARE; PostgreSQL keeps both in one namespace) that has hidden parameters:
// one trailing int8 parameter per slot, which every Bind or EXECUTE must fill with a fresh
// ID. Statements without slots are not remembered.
type statement struct {
	slots []rewrite.Slot
	// fast is set when the statement is a standalone SELECT leaf_next('tag') or
	// leaf_snowflake() without client parameters: a cycle that only binds and executes
	// it may be answered by the proxy.
	fast *rewrite.FastPath
	// batch is set when the statement is SELECT leaf_next('tag', n): the server's text
	// takes the IDs as one hidden int8[] parameter after the client's params, whose types
	// it declared as params. With local set, a cycle that only binds and executes it may
	// be answered by the proxy.
	batch  *rewrite.Batch
	params []uint32
	local  bool
	// decode is set when the statement is SELECT leaf_decode($n): Bind checks the ID.
	decode *rewrite.Decode
}

// hidden is the number of parameters the proxy added to the statement.
func (st *statement) hidden() int {
	if st.batch != nil {
		return len(st.slots) + 1
	}
	return len(st.slots)
}

// undoEntry restores the statement map if the operation that changed it did not happen
// at the server: PostgreSQL skips everything after an error until Sync.
type undoEntry struct {
	name string
	prev *statement // the entry before the change; nil when there was none
	all  map[string]*statement
	noop bool // only marks a completion to expect (Close of a portal or of an unknown name)
	// confirm is the response that confirms it: serverParseComplete, serverCloseComplete
	// or serverErrorResponse (that of a refusal's stand-in); 0: the cycle's success does.
	confirm byte

	// local is the proxy-local unnamed statement a Parse materialized: when the Parse
	// did not happen, the statement is local again, unless the unnamed statement has
	// changed since (localGen is unnamedGen after the materialization).
	local    *localStatement
	localGen uint64
}

// cycle is one request cycle: a Query, or the extended-protocol messages up to a Sync. It
// ends with the upstream's ReadyForQuery.
type cycle struct {
	sent     int  // messages forwarded that each end in one terminal response
	answered int  // terminal responses relayed so far
	failed   bool // the upstream reported an error in this cycle

	// refusal is the proxy's own error for a message it refused, and standIn the ordinal
	// (among the sent messages) of the stand-in Parse sent to fail in its place, or 0 for
	// a stand-in in a Query: the server's error for the stand-in is replaced by the
	// refusal (see refusal.go).
	refusal refusal
	standIn int
	// copyFailure is the proxy's own error for a filled COPY it failed with CopyFail: it
	// replaces the server's error about the CopyFail (see copyfill.go).
	copyFailure refusal

	describes  []int // per Describe of a statement, the hidden parameters to strip
	paramDescs int   // ParameterDescriptions relayed so far

	undo      []undoEntry
	confirmed int // undo entries confirmed by ParseComplete/CloseComplete

	swallow []int // ordinals of terminal responses not to relay (ParseComplete of a materialization)
}

// sessionState is the rewriting proxy's bookkeeping of one session, shared by the two
// relay goroutines under mu. Lock order: conn.cwMu before mu.
type sessionState struct {
	mu     sessionLock
	stmts  map[string]*statement
	queue  []*cycle // cycles awaiting their ReadyForQuery, oldest first
	spare  []*cycle // finished cycles kept for reuse: no allocation per request
	cur    *cycle   // the open extended-protocol cycle (no Sync yet); also in queue
	skip   bool     // after a refusal: discard client messages until Sync
	copyIn *copyIn  // a COPY FROM STDIN whose rows get keys, from its Query to its end
	idsBuf []int64
	outBuf []byte

	// localStmt is the unnamed statement when the proxy answered its Parse itself (the
	// server's unnamed statement is then stale); unnamedGen counts its changes. Both are
	// under mu: a failed materialization restores it from the other goroutine.
	localStmt  *localStatement
	unnamedGen uint64
	// local is the extended-protocol cycle the proxy is answering itself; used only by the
	// client-to-upstream goroutine.
	local      *localCycle
	localSpare *localCycle // reused by every local cycle
}

// unnamed returns the proxy-local unnamed statement, or nil.
func (ss *sessionState) unnamed() *localStatement {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.localStmt
}

// setUnnamed changes the proxy-local unnamed statement.
func (ss *sessionState) setUnnamed(st *localStatement) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.localStmt = st
	ss.unnamedGen++
}

// statementLocked returns the statement named name, or nil.
func (ss *sessionState) statementLocked(name string) *statement { return ss.stmts[name] }

// setStatementLocked changes the statement map, logging how to undo it in cy.
func (ss *sessionState) setStatementLocked(cy *cycle, name string, st *statement, confirm byte) {
	prev := ss.stmts[name]
	if prev == nil && st == nil {
		if confirm != 0 {
			cy.undo = append(cy.undo, undoEntry{noop: true, confirm: confirm})
		}
		return
	}
	cy.undo = append(cy.undo, undoEntry{name: name, prev: prev, confirm: confirm})
	if st == nil {
		delete(ss.stmts, name)
		return
	}
	if ss.stmts == nil {
		ss.stmts = make(map[string]*statement)
	}
	ss.stmts[name] = st
}

// clearStatementsLocked forgets every statement (DEALLOCATE ALL, DISCARD ALL).
func (ss *sessionState) clearStatementsLocked(cy *cycle) {
	if len(ss.stmts) == 0 {
		return
	}
	cy.undo = append(cy.undo, undoEntry{all: ss.stmts})
	ss.stmts = nil
}

// hasSlotsLocked reports whether the statement name has hidden parameters; "" asks about
// any statement.
func (ss *sessionState) hasSlotsLocked(name string) bool {
	if name == "" {
		return len(ss.stmts) > 0
	}
	return ss.stmts[name] != nil
}

// confirmLocked marks the next undo entry awaiting this completion message as done.
func (cy *cycle) confirmLocked(typ byte) {
	for i := cy.confirmed; i < len(cy.undo); i++ {
		if cy.undo[i].confirm == typ {
			// Entries confirmed by success alone that precede it are settled too: the
			// server got that far.
			cy.confirmed = i + 1
			return
		}
	}
}

// settleLocked applies the end of a cycle to the statement map: changes the server did
// not make are undone, newest first.
func (ss *sessionState) settleLocked(cy *cycle) {
	if !cy.failed {
		return
	}
	for i := len(cy.undo) - 1; i >= cy.confirmed; i-- {
		u := cy.undo[i]
		if u.local != nil && ss.unnamedGen == u.localGen {
			ss.localStmt = u.local
		}
		switch {
		case u.noop:
		case u.all != nil:
			ss.stmts = u.all
		case u.prev == nil:
			delete(ss.stmts, u.name)
		default:
			if ss.stmts == nil {
				ss.stmts = make(map[string]*statement)
			}
			ss.stmts[u.name] = u.prev
		}
	}
}

// openLocked returns the open extended-protocol cycle, starting one when there is none.
func (ss *sessionState) openLocked() *cycle {
	if ss.cur == nil {
		ss.cur = ss.newCycleLocked()
		ss.queue = append(ss.queue, ss.cur)
	}
	return ss.cur
}

// countSent counts one more message of the open cycle that the server answers with one
// terminal response (an Execute, say).
func (ss *sessionState) countSent() {
	ss.mu.Lock()
	ss.openLocked().sent++
	ss.mu.Unlock()
}

// closeCycle ends the open cycle with a message the next ReadyForQuery answers: a Sync, a
// FunctionCall or a Query (which, sent inside an open cycle, ends it at the server too).
func (c *conn) closeCycle() {
	ss := &c.sess
	ss.mu.Lock()
	ss.openLocked()
	ss.cur = nil
	ss.mu.Unlock()
	c.pending.Add(1)
}

// maxSpareCycles bounds the finished cycles a session keeps for reuse.
const maxSpareCycles = 4

func (ss *sessionState) newCycleLocked() *cycle {
	if n := len(ss.spare); n > 0 {
		cy := ss.spare[n-1]
		ss.spare = ss.spare[:n-1]
		return cy
	}
	return &cycle{}
}

// recycleLocked keeps a finished cycle for reuse; nothing may refer to it any more.
func (ss *sessionState) recycleLocked(cy *cycle) {
	if len(ss.spare) >= maxSpareCycles {
		return
	}
	clear(cy.undo) // drop the statements the entries point to
	*cy = cycle{describes: cy.describes[:0], undo: cy.undo[:0], swallow: cy.swallow[:0]}
	ss.spare = append(ss.spare, cy)
}

// headLocked returns the oldest cycle awaiting an answer, or nil.
func (ss *sessionState) headLocked() *cycle {
	if len(ss.queue) == 0 {
		return nil
	}
	return ss.queue[0]
}

func (ss *sessionState) popLocked() *cycle {
	cy := ss.queue[0]
	// Shift rather than reslice so that the backing array is reused; queues are as
	// short as the client's pipeline.
	n := copy(ss.queue, ss.queue[1:])
	ss.queue[n] = nil
	ss.queue = ss.queue[:n]
	return cy
}
