package proxy

import (
	pg_query "github.com/pganalyze/pg_query_go/v6"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// What a session cannot carry from one server connection to the next is refused in
// transaction mode, before it reaches the database: the statement's text is replaced by
// the stand-in of refusal.go, whose error the client sees as 0A000 with a hint naming
// session mode, so that a transaction block fails where it would have.
//
// Refused: LISTEN, SQL-level PREPARE, DECLARE … WITH HOLD, CREATE TEMP (tables, views,
// sequences, CREATE TABLE AS and SELECT INTO), and the session-level advisory lock
// functions (pg_advisory_lock, pg_advisory_lock_shared, pg_try_advisory_lock,
// pg_try_advisory_lock_shared; the _xact_ ones are fine), and SET or RESET SESSION
// AUTHORIZATION (and SET session_authorization): the session user is no setting the proxy
// can carry or reset, and it would stay on the connection for the next client, whose
// ParameterStatus would still name its own user. SET LOCAL SESSION AUTHORIZATION is
// fine: it ends with the transaction, which keeps its connection till then. A lock function is found by
// its name in the text, so a string literal that names one is refused too; one called
// from a server-side function is not found.

// cursorOptHold is PostgreSQL's CURSOR_OPT_HOLD.
const cursorOptHold = 0x0020

// refusalHint names the way out.
const refusalHint = "Use a database or user whose pool-mode is session for this."

// refusedInTransactionMode returns the ErrorResponse that refuses sql, nil when sql can
// run in transaction mode.
func refusedInTransactionMode[T string | []byte](sql T, w txWords) []byte {
	if w.lock {
		return refusedMessage("session-level advisory locks")
	}
	if !w.refusable {
		return nil
	}
	tree, err := pg_query.Parse(string(sql))
	if err != nil {
		return nil // the server reports the syntax error
	}
	for _, raw := range tree.GetStmts() {
		if what := refusedStatement(raw.GetStmt()); what != "" {
			return refusedMessage(what)
		}
	}
	return nil
}

// refusedStatement names what stmt needs that transaction mode cannot give, or "".
func refusedStatement(stmt *pg_query.Node) string {
	temp := func(rv *pg_query.RangeVar) bool { return rv.GetRelpersistence() == "t" }
	switch {
	case stmt.GetListenStmt() != nil:
		return "LISTEN"
	case stmt.GetPrepareStmt() != nil:
		return "SQL-level PREPARE"
	case stmt.GetDeclareCursorStmt() != nil && stmt.GetDeclareCursorStmt().GetOptions()&cursorOptHold != 0:
		return "cursors WITH HOLD"
	case stmt.GetCreateStmt() != nil && temp(stmt.GetCreateStmt().GetRelation()),
		stmt.GetCreateTableAsStmt() != nil && temp(stmt.GetCreateTableAsStmt().GetInto().GetRel()),
		stmt.GetViewStmt() != nil && temp(stmt.GetViewStmt().GetView()),
		stmt.GetCreateSeqStmt() != nil && temp(stmt.GetCreateSeqStmt().GetSequence()),
		stmt.GetSelectStmt() != nil && temp(stmt.GetSelectStmt().GetIntoClause().GetRel()):
		return "temporary tables"
	case stmt.GetVariableSetStmt() != nil && stmt.GetVariableSetStmt().GetName() == "session_authorization" &&
		!stmt.GetVariableSetStmt().GetIsLocal():
		return "SET or RESET SESSION AUTHORIZATION"
	}
	return ""
}

// txWords is what one pass over the text of a Query or Parse found of the words
// transaction mode looks for; each makes the statement worth a closer look.
type txWords struct {
	lock      bool // a session-level advisory lock function: refused without parsing
	refusable bool // LISTEN, PREPARE, HOLD, TEMP or AUTHORIZATION: parsed, maybe refused
	dealloc   bool // DEALLOCATE, which the proxy answers (txlocal.go)
	setConfig bool // a set_config call (txcustom.go)
	set       bool // SET or RESET, maybe SESSION or LOCAL, of a name with a dot (txcustom.go)
}

// scanTxWords looks through sql once, in any case, for the words of txWords. Most bytes
// start none of them; a letter that starts one is looked at further only when the next
// letter is that word's second, as it rarely is in ordinary statements.
func scanTxWords[T string | []byte](sql T) (w txWords) {
	for i := 0; i+1 < len(sql); i++ {
		c := sql[i] | ('a' - 'A') // a letter in lower case; no other byte becomes one
		if !txWordStart[c] {
			continue
		}
		switch uint16(c)<<8 | uint16(sql[i+1]|('a'-'A')) {
		case 'p'<<8 | 'g':
			if hasWordAt(sql, i, "pg_advisory_lock") || hasWordAt(sql, i, "pg_try_advisory_lock") {
				w.lock = true
			}
		case 'p'<<8 | 'r', 'l'<<8 | 'i', 'h'<<8 | 'o', 't'<<8 | 'e', 'a'<<8 | 'u':
			w.refusable = w.refusable || hasWordAt(sql, i, refusableWord[c])
		case 'd'<<8 | 'e':
			w.dealloc = w.dealloc || hasWordAt(sql, i, "deallocate")
		case 's'<<8 | 'e':
			if hasWordAt(sql, i, "set_config") {
				w.setConfig = true
			} else if !w.set && customSetAt(sql, i) {
				w.set = true
			}
		}
	}
	return w
}

// txWordStart tells the first letters of the words of scanTxWords, in lower case.
var txWordStart = [256]bool{'p': true, 'l': true, 'h': true, 't': true, 'a': true, 'd': true, 's': true}

// refusableWord is, by its first letter, each word of txWords.refusable, in lower case;
// no two share a first letter.
var refusableWord = [256]string{'p': "prepare", 'l': "listen", 'h': "hold", 't': "temp", 'a': "authorization"}

func refusedMessage(what string) []byte {
	return errorMessage(sqlstate.FeatureNotSupported, what+" cannot be used in transaction pool mode", refusalHint)
}
