package proxy

import (
	"bytes"

	pg_query "github.com/pganalyze/pg_query_go/v6"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/rewrite"
)

// This file is how the proxy answers a statement with an error of its own (a rewrite
// refusal, an ID that cannot be had) without the server's transaction state drifting from
// the one PostgreSQL would have. Nothing of the refused statement is forwarded. In its
// place the server gets a stand-in: a statement that fails during parse analysis, before
// it can do anything, and without touching the catalog. The server thus fails at the same
// point in the stream as it would have failed the refused statement: a transaction block
// is aborted (the client's later statements get 25P02 and COMMIT rolls back), outside a
// block nothing happens, and a savepoint can recover the transaction, all exactly as in
// PostgreSQL, whatever was pipelined before. The client gets the proxy's error where the
// server's error for the stand-in would have been, and the server's ReadyForQuery.
//
// In a transaction that had already failed, the server answers the stand-in with 25P02,
// because its check for an aborted transaction comes before parse analysis; that error
// is relayed unchanged, as PostgreSQL would have answered the refused statement with it.
// So is any other error the stand-in meets (a cancel, a shutdown): it is the server's
// account of what happened.
//
// One kind of refusal stays local, because the proxy's answer is exactly the server's: an
// ID error of the fast path outside a transaction block. The fast path runs only with
// nothing outstanding, so the idle status ('I') the proxy knows is current, and a statement that
// fails outside a block changes nothing at the server. Every other refusal costs a round
// trip; refusals are rare, and the fast path's success stays local.

// standInSQL fails with 42703 (undefined_column) in parse analysis: a column reference in
// a SELECT without FROM cannot resolve, and resolving it looks at the empty range table
// only. Its name tells whoever reads the server's log where it comes from.
const (
	standInSQL    = "SELECT " + standInColumn
	standInColumn = "leafproxy_refused_statement"
)

// Stand-in messages. A Parse fails in parse analysis, before the server would store the
// statement, so the named stand-in never creates one and cannot collide with a statement
// of the client's. The unnamed one replaces a refused Parse of the unnamed statement:
// the server drops its unnamed statement first, as it would have for the refused Parse.
var (
	standInParseNamed   = parseBody(standInColumn, standInSQL)
	standInParseUnnamed = parseBody("", standInSQL)
)

func parseBody(name, query string) []byte {
	b := append([]byte(name), 0)
	b = append(b, query...)
	return append(b, 0, 0, 0) // no parameter types
}

// refusal is an error of the proxy's own.
type refusal struct {
	msg  []byte // the whole ErrorResponse message
	code string // its SQLSTATE
}

// What refuseQuery learns about where a Query string failed.
const (
	planRefused     = -1 // the rewriter refused the string
	sessionConflict = -2 // the string touches a statement with hidden parameters
)

// refuseQuery answers a Query with an error of the proxy's own: the stand-in goes upstream
// in its place, and its error is replaced by the proxy's. In a string of several
// statements, the ones before the refused statement go first, rewritten, so that the
// server runs them and fails where PostgreSQL would have (a BEGIN among them opens the
// block that the failure then aborts). failedSlot is the index of the slot whose ID could
// not be had, or planRefused or sessionConflict.
func (c *conn) refuseQuery(err error, sql string, failedSlot int) error {
	r := errorResponse(err)
	ss := &c.sess
	ss.mu.Lock()
	if cy := ss.cur; cy != nil {
		// An extended-protocol cycle is open: the proxy counts the Query's ReadyForQuery
		// as that cycle's. The stand-in is then an unnamed Parse, which drops the unnamed
		// statement as a Query does, and a Sync ends the cycle. After an error in the
		// cycle the server skips the Parse, as it would have skipped the Query. (A Parse
		// holds one statement: the statements before the refused one are not run.)
		ss.cur = nil
		var parse []byte
		if !cy.failed {
			parse = ss.standInLocked(cy, r, true)
		}
		ss.mu.Unlock()
		c.pending.Add(1)
		if parse != nil {
			if err := c.send(clientParse, parse); err != nil {
				return err
			}
		}
		return c.send(clientSync, nil)
	}
	ss.mu.Unlock()
	out, plan := c.statementsBefore(sql, failedSlot)
	out = append(append(out, standInSQL...), 0)
	ss.mu.Lock()
	cy := ss.openLocked()
	ss.cur = nil
	cy.refusal = r
	if plan != nil {
		ss.applySQLEffectsLocked(cy, plan)
		// The statements before the stand-in ran if the server got as far as the stand-in.
		cy.undo = append(cy.undo, undoEntry{noop: true, confirm: serverErrorResponse})
	}
	ss.mu.Unlock()
	c.pending.Add(1)
	return c.send(clientQuery, out)
}

// statementsBefore returns the statements of the Query string sql that precede the
// refused one, rewritten with fresh IDs and ending in a newline, and their plan (nil when
// they need no rewriting). It returns nothing when the refused statement is the first or
// cannot be told: the string then fails before any of it runs.
func (c *conn) statementsBefore(sql string, failedSlot int) ([]byte, *rewrite.Plan) {
	if sql == "" || failedSlot == sessionConflict {
		return nil, nil
	}
	c.leaveLoopFor(len(sql))
	tree, err := pg_query.Parse(sql)
	if err != nil || len(tree.Stmts) < 2 {
		return nil, nil
	}
	// The refused statement is the first that the rewriter refuses on its own, or the
	// one holding the slot whose ID failed (slots are numbered in textual order).
	refused, slots := -1, 0
	for i, st := range tree.Stmts {
		start, end := int(st.StmtLocation), len(sql)
		if st.StmtLen > 0 {
			end = start + int(st.StmtLen)
		}
		if start < 0 || start > end || end > len(sql) {
			return nil, nil
		}
		plan, err := c.plan(sql[start:end])
		if err != nil {
			if failedSlot == planRefused {
				refused = i
				break
			}
			return nil, nil
		}
		if plan != nil {
			slots += len(plan.Slots)
		}
		if failedSlot >= 0 && failedSlot < slots {
			refused = i
			break
		}
	}
	if refused <= 0 {
		return nil, nil
	}
	// Up to the refused statement's start, which is just after the semicolon that ends
	// the statement before it.
	prefix := sql[:tree.Stmts[refused].StmtLocation]
	plan, err := c.plan(prefix)
	if err != nil {
		return nil, nil
	}
	if plan == nil {
		return append([]byte(prefix), '\n'), nil
	}
	out, _, err := c.literal(plan, nil)
	if err != nil {
		return nil, nil
	}
	return append(out, '\n'), plan
}

// refuseExtended answers an extended-protocol message with an error of the proxy's own:
// a stand-in Parse goes upstream in its place, and its error is replaced by the proxy's.
// Like the server after an error, the proxy then ignores the client's messages until
// Sync. unnamed is set for a refused Parse of the unnamed statement.
func (c *conn) refuseExtended(err error, unnamed bool) error {
	r := errorResponse(err)
	ss := &c.sess
	ss.mu.Lock()
	ss.skip = true
	cy := ss.openLocked()
	if cy.failed {
		// The server already failed this cycle and skips to Sync: it would have skipped
		// the refused message too.
		ss.mu.Unlock()
		return nil
	}
	parse := ss.standInLocked(cy, r, unnamed)
	ss.mu.Unlock()
	return c.send(clientParse, parse)
}

// standInLocked records that the stand-in Parse it returns is the next message of cy,
// failing in the place of a message refused with r.
func (ss *sessionState) standInLocked(cy *cycle, r refusal, unnamed bool) []byte {
	cy.sent++
	cy.refusal, cy.standIn = r, cy.sent
	if unnamed {
		// Undone unless the server gets as far as the stand-in.
		ss.setStatementLocked(cy, "", nil, serverErrorResponse)
		return standInParseUnnamed
	}
	cy.undo = append(cy.undo, undoEntry{noop: true, confirm: serverErrorResponse})
	return standInParseNamed
}

// upstreamError marks the oldest cycle failed and, when body is the stand-in's failure,
// returns the proxy's refusal that the client gets in its place.
func (c *conn) upstreamError(body []byte) *refusal {
	ss := &c.sess
	ss.mu.Lock()
	defer ss.mu.Unlock()
	cy := ss.headLocked()
	if cy == nil {
		return nil
	}
	// In the extended protocol, the error is the stand-in's when every message before it
	// has had its response; in a Query, when it is the cycle's first and reads like it.
	// Otherwise an earlier message or statement failed and the server skipped the
	// stand-in, as it would have skipped the refused one.
	standIn := !cy.failed && cy.refusal.msg != nil && (cy.standIn == 0 || cy.standIn == cy.answered+1)
	cy.failed = true
	if !standIn {
		return nil
	}
	r := cy.refusal
	cy.refusal = refusal{}
	// The stand-in's own failure. Any other error at the stand-in (25P02 in a failed
	// transaction, a cancel, a shutdown) is the server's word and reaches the client.
	mine := bytes.Equal(errorField(body, fieldCode), []byte(sqlstate.UndefinedColumn)) &&
		(cy.standIn != 0 || bytes.Contains(errorField(body, fieldMessage), []byte(standInColumn)))
	if mine || cy.standIn != 0 {
		cy.confirmLocked(serverErrorResponse) // the server got as far as the stand-in
	}
	if !mine {
		return nil
	}
	return &r
}

// errorField returns the value of one field of an ErrorResponse or NoticeResponse body,
// or nil.
func errorField(body []byte, field byte) []byte {
	for len(body) > 0 && body[0] != 0 {
		end := bytes.IndexByte(body, 0)
		if end < 0 {
			return nil
		}
		if body[0] == field {
			return body[1:end]
		}
		body = body[end+1:]
	}
	return nil
}
