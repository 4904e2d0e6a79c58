package rewrite

import "fmt"

// Error is a rewrite refusal. It carries what a PostgreSQL ErrorResponse
// needs, so the proxy can answer the client without contacting the database.
//
// The rewriter reports sqlstate.InvalidParameterValue (a bad leaf_next argument),
// sqlstate.FeatureNotSupported (a call or INSERT the proxy cannot rewrite safely),
// sqlstate.StatementTooComplex (nested too deeply to parse safely) and
// sqlstate.InternalError (a rewriter bug, never expected).
type Error struct {
	Code     string // SQLSTATE, one of the catalogue in internal/sqlstate
	Message  string
	Hint     string
	Position int // 1-based character position in the SQL text, 0 when unknown
}

// Error implements error.
func (e *Error) Error() string {
	if e.Position > 0 {
		return fmt.Sprintf("%s (SQLSTATE %s, position %d)", e.Message, e.Code, e.Position)
	}
	return fmt.Sprintf("%s (SQLSTATE %s)", e.Message, e.Code)
}

// SQLState returns the SQLSTATE code, matching the interface pgx and
// lib/pq errors share.
func (e *Error) SQLState() string { return e.Code }

// hintOnce explains where leaf_* calls work.
const hintOnce = "leaf_next() and leaf_snowflake() become one ID per call site and execution, so they work only where PostgreSQL evaluates them once: " +
	"the target list of a SELECT without FROM, INSERT … VALUES rows, and CALL or EXECUTE arguments. " +
	"Fetch IDs with SELECT leaf_next('tag') first, or use INSERT … VALUES."
