package proxy

import (
	"fmt"

	pg_query "github.com/pganalyze/pg_query_go/v6"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// What transaction mode answers without the database: refusals that need no server
// connection, and SQL-level DEALLOCATE.
//
// A refusal outside a transaction (the session holds no server connection) is answered at
// once, without borrowing one: a refused statement outside a transaction block changes
// nothing at the server, so there is nothing to fail there, and a refusal must not queue
// behind other clients' transactions, nor time out with 57014 when the pool is busy. A
// refused Parse is answered with its error at once and, as the server would, the
// messages up to the Sync are skipped, which gets ReadyForQuery. Inside a transaction the
// stand-in still goes to the server (refusal.go), so that the transaction fails there.
//
// SQL-level PREPARE is refused in transaction mode, so a DEALLOCATE can only name the
// client's protocol-level statements (Rails and psycopg deallocate them with SQL). The
// server knows them under the proxy's names, shared by other clients, so DEALLOCATE name,
// DEALLOCATE PREPARE name and DEALLOCATE ALL are answered per client: the client's
// statements are forgotten (the server keeps its own for whoever else uses them), and the
// client gets CommandComplete, or 26000 for a name it does not have, or 25P02 in a failed
// transaction block. Outside a transaction nothing goes to the server. Inside one the
// answer must come in order after what the server still owes: an empty Query goes in the
// DEALLOCATE's place, and its EmptyQueryResponse is replaced by the answer; a DEALLOCATE
// of a name the client does not have fails the transaction as PostgreSQL's would, through
// the stand-in. A DEALLOCATE in a Query string of several statements is refused with
// 0A000; one in the extended protocol (Parse of a DEALLOCATE text) reaches the server,
// which knows no statement of the client's name.

// noError makes discarding skip messages up to the Sync without an error of its own:
// the error was answered already.
var noError = []byte{}

// deallocation is a DEALLOCATE statement: of one statement, or of all.
type deallocation struct {
	name string
	all  bool
}

// queryVerdict is what transaction mode makes of a Query: the ErrorResponse refusing it,
// or the DEALLOCATE the proxy answers itself, or neither.
type queryVerdict struct {
	refusal []byte
	dealloc *deallocation
}

// checkQuery looks at the text of a Query, and notes the custom settings it sets (see
// txcustom.go). Called with mu held.
func (v *pooledConn) checkQuery(body []byte) queryVerdict {
	sql := zstring(body)
	if r := refusedInTransactionMode(sql); r != nil {
		return queryVerdict{refusal: r}
	}
	v.noteCustomSettings(sql)
	if !containsFold(sql, "deallocate") {
		return queryVerdict{}
	}
	tree, err := pg_query.Parse(sql)
	if err != nil {
		return queryVerdict{} // the server reports the syntax error
	}
	stmts := tree.GetStmts()
	for _, raw := range stmts {
		d := raw.GetStmt().GetDeallocateStmt()
		if d == nil {
			continue
		}
		if len(stmts) > 1 {
			return queryVerdict{refusal: errorMessage(sqlstate.FeatureNotSupported,
				"DEALLOCATE cannot be used together with other statements in one query string in transaction pool mode",
				"Send the DEALLOCATE as a query of its own.")}
		}
		return queryVerdict{dealloc: &deallocation{name: d.GetName(), all: d.GetIsall()}}
	}
	return queryVerdict{}
}

// answerIdle answers a Query or a Parse that needs no server connection, when the session
// holds none (so it is outside a transaction); it reports whether it did. Called with mu
// held.
func (v *pooledConn) answerIdle(typ byte, body []byte, verdict queryVerdict) bool {
	switch typ {
	case clientQuery:
		switch {
		case verdict.refusal != nil:
			v.synth = append(v.synth, verdict.refusal...)
		case verdict.dealloc != nil:
			v.synth = append(v.synth, v.deallocate(verdict.dealloc, txIdle)...)
		default:
			return false
		}
		v.synth = append(v.synth, serverReadyForQuery, 0, 0, 0, 5, txIdle)
	case clientParse:
		name := zstring(body)
		r := v.checkParse(zstring(body[len(name)+1:]))
		if r == nil {
			return false
		}
		if name == "" {
			v.unnamed = nil // the server drops it before it parses
		}
		v.synth = append(v.synth, r...)
		v.discarding = noError
	default:
		return false
	}
	v.cond.Broadcast()
	return true
}

// deallocateInTransaction handles a DEALLOCATE while the session holds pc: it appends the
// empty Query whose answer the proxy replaces, or returns the error that fails the
// transaction through the stand-in. Called with mu held.
func (v *pooledConn) deallocateInTransaction(out []byte, d *deallocation) ([]byte, []byte) {
	if !d.all && v.stmts[d.name] == nil {
		return out, errorMessage(sqlstate.InvalidSQLStatementName, fmt.Sprintf("prepared statement %q does not exist", d.name), "")
	}
	v.outstanding++
	v.queries++
	v.pc.unnamed = nil // a Query replaces the unnamed statement
	v.queue = append(v.queue, expect{kind: expQuery, dealloc: d})
	return appendQuery(out, ""), nil
}

// deallocate runs d on the client's statements in a session whose transaction status is
// status, and returns the answer: CommandComplete or an ErrorResponse.
func (v *pooledConn) deallocate(d *deallocation, status byte) []byte {
	if status == txFailed {
		return errorMessage(sqlstate.InFailedSQLTransaction, "current transaction is aborted, commands ignored until end of transaction block", "")
	}
	if d.all {
		clear(v.stmts)
		return appendCommandComplete(nil, "DEALLOCATE ALL")
	}
	if v.stmts[d.name] == nil {
		return errorMessage(sqlstate.InvalidSQLStatementName, fmt.Sprintf("prepared statement %q does not exist", d.name), "")
	}
	delete(v.stmts, d.name)
	return appendCommandComplete(nil, "DEALLOCATE")
}
