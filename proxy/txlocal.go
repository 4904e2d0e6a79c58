package proxy

import (
	pg_query "github.com/pganalyze/pg_query_go/v6"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/rewrite"
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
// 0A000. In the extended protocol, a cycle that begins, outside a transaction, with the
// Parse of a DEALLOCATE as the unnamed statement (psycopg sends its DEALLOCATE so) is
// answered by the proxy as long as it deals with that statement and its portal; the rest
// of the cycle, if any, goes to a server connection. A DEALLOCATE parsed elsewhere (a named
// statement, as pgx's statement cache parses every query, or inside a transaction) is the
// client's statement like any other, but the server prepares an empty statement in its
// place, whose Execute's answer the proxy replaces (see txstmts.go).

// noError makes discarding skip messages up to the Sync without an error of its own:
// the error was answered already.
var noError = []byte{}

// deallocation is a DEALLOCATE statement: of one statement, or of all.
type deallocation struct {
	name string
	all  bool
}

// queryVerdict is what transaction mode makes of a Query or a Parse: the ErrorResponse
// refusing it, or the DEALLOCATE the proxy answers itself, or neither.
type queryVerdict struct {
	refusal []byte
	dealloc *deallocation
}

// checkQuery looks at the text of a Query, and notes the custom settings it sets (see
// txcustom.go). Called with mu held.
func (v *pooledConn) checkQuery(body []byte) queryVerdict {
	sql := zbytes(body)
	verdict, w := v.checkText(sql)
	if verdict.refusal != nil || !w.dealloc {
		return verdict
	}
	d, mixed := deallocateIn(string(sql))
	if mixed {
		return queryVerdict{refusal: errorMessage(sqlstate.FeatureNotSupported,
			"DEALLOCATE cannot be used together with other statements in one query string in transaction pool mode",
			"Send the DEALLOCATE as a query of its own.")}
	}
	return queryVerdict{dealloc: d}
}

// checkParse looks at the text of a Parse, like checkQuery. Called with mu held.
func (v *pooledConn) checkParse(body []byte) queryVerdict {
	name := zstring(body)
	sql := zbytes(body[len(name)+1:])
	verdict, w := v.checkText(sql)
	if verdict.refusal != nil || !w.dealloc {
		return verdict
	}
	d, _ := deallocateIn(string(sql))
	return queryVerdict{dealloc: d}
}

// checkText makes one pass over the text of a Query or a Parse (scanTxWords): it returns
// the refusal, if any, and what the pass found; it notes the custom settings the text
// sets. No pass is made when the text is known to have none of the words: textsFree, or
// the same but for its numbers as plainText. Called with mu held.
func (v *pooledConn) checkText(sql []byte) (queryVerdict, txWords) {
	if v.textsFree || len(sql) <= maxPlainText && rewrite.SameButNumbers(v.plainText, sql) {
		return queryVerdict{}, txWords{}
	}
	w := scanTxWords(sql)
	if w == (txWords{}) && len(sql) <= maxPlainText {
		// Nothing to look at: a client that sends the same text again (most do), or
		// the same but for its numbers, is spared the scan. No word of txWords has a
		// digit in it, so that both texts have the same words, with the same kinds of
		// bytes beside them (see rewrite.SameButNumbers).
		v.plainText = append(v.plainText[:0], sql...)
	}
	if r := refusedInTransactionMode(sql, w); r != nil {
		return queryVerdict{refusal: r}, w
	}
	if w.setConfig || w.set {
		v.noteCustomSettings(string(sql), w.setConfig, w.set)
	}
	return queryVerdict{}, w
}

// maxPlainText bounds the text checkText remembers as needing nothing.
const maxPlainText = 4 << 10

// deallocateIn returns the DEALLOCATE that sql is, nil when it is none; mixed reports a
// DEALLOCATE among other statements.
func deallocateIn(sql string) (d *deallocation, mixed bool) {
	tree, err := pg_query.Parse(sql)
	if err != nil {
		return nil, false // the server reports the syntax error
	}
	stmts := tree.GetStmts()
	for _, raw := range stmts {
		if st := raw.GetStmt().GetDeallocateStmt(); st != nil {
			if len(stmts) > 1 {
				return nil, true
			}
			return &deallocation{name: st.GetName(), all: st.GetIsall()}, false
		}
	}
	return nil, false
}

// answerIdle answers a Query or a Parse that needs no server connection, when the session
// holds none (so it is outside a transaction); it reports whether it did. Called with mu
// held.
func (v *pooledConn) answerIdle(typ byte, body []byte, verdict queryVerdict) bool {
	if v.localDealloc != nil {
		if v.answerLocalCycle(typ, body) {
			v.cond.Broadcast()
			return true
		}
		// A message the proxy does not answer: it and the rest of the cycle go to a
		// server connection.
		v.localDealloc = nil
	}
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
		r := verdict.refusal
		if r == nil {
			name := zstring(body)
			if verdict.dealloc == nil || name != "" {
				return false
			}
			// A DEALLOCATE in the extended protocol: the proxy answers the cycle. The
			// statement stays the client's unnamed one, for a Bind in a later cycle.
			v.localDealloc = verdict.dealloc
			v.unnamed = deallocStmt(body[len(name)+1:], verdict.dealloc)
			v.trackExecutes = true
			v.synth = append(v.synth, serverParseComplete, 0, 0, 0, 4)
			break
		}
		if zstring(body) == "" {
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

// answerLocalCycle answers a message of an extended-protocol cycle that began with the
// Parse of a DEALLOCATE as the unnamed statement, while it only deals with that
// statement and its unnamed portal; it reports whether it did. Called with mu held.
func (v *pooledConn) answerLocalCycle(typ byte, body []byte) bool {
	switch typ {
	case clientBind:
		portal := zstring(body)
		if portal != "" || zstring(body[len(portal)+1:]) != "" {
			return false
		}
		v.synth = append(v.synth, serverBindComplete, 0, 0, 0, 4)
	case clientDescribe:
		if len(body) < 2 || body[1] != 0 {
			return false
		}
		if body[0] == targetStatement {
			v.synth = append(v.synth, serverParameterDescription, 0, 0, 0, 6, 0, 0)
		}
		v.synth = append(v.synth, serverNoData, 0, 0, 0, 4)
	case clientExecute:
		if len(body) < 1 || body[0] != 0 {
			return false
		}
		answer := v.deallocate(v.localDealloc, txIdle)
		v.synth = append(v.synth, answer...)
		if answer[0] == serverErrorResponse {
			// As the server, skip to the Sync.
			v.localDealloc, v.discarding = nil, noError
		}
	case clientClose:
		if len(body) < 2 || body[1] != 0 {
			return false
		}
		v.synth = append(v.synth, serverCloseComplete, 0, 0, 0, 4)
	case clientSync:
		v.localDealloc = nil
		v.synth = append(v.synth, serverReadyForQuery, 0, 0, 0, 5, txIdle)
	case clientFlush:
	default:
		return false
	}
	return true
}

// deallocateInTransaction handles a DEALLOCATE while the session holds pc: it appends the
// empty Query whose answer the proxy replaces, or returns the error that fails the
// transaction through the stand-in. Called with mu held.
func (v *pooledConn) deallocateInTransaction(out []byte, d *deallocation) ([]byte, []byte) {
	if !d.all && v.stmts[d.name] == nil {
		return out, unknownStatement(d.name)
	}
	v.outstanding++
	v.queries++
	v.pc.unnamed = nil // a Query replaces the unnamed statement
	v.push(expect{kind: expQuery, dealloc: d})
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
		return unknownStatement(d.name)
	}
	delete(v.stmts, d.name)
	return appendCommandComplete(nil, "DEALLOCATE")
}
