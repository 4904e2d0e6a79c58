package pool

import (
	"errors"
	"fmt"
	"time"
)

// Sentinels for the conditions a caller tests with errors.Is. Every error Acquire
// returns for them is an *Error that also carries a SQLSTATE.
var (
	// ErrWaitTimeout: an Acquire waited QueryWaitTimeout without getting a connection.
	ErrWaitTimeout = errors.New("pool: timed out waiting for a server connection")
	// ErrServerDown: the key's server could not be dialled; the *Error wraps the dial's
	// error as well.
	ErrServerDown = errors.New("pool: server unavailable")
	// ErrClosed: the Pool is shutting down or closed.
	ErrClosed = errors.New("pool: closed")
)

// SQLSTATEs of the errors above.
//
// PgBouncer reports query_wait_timeout with its generic 08P01 and disconnects the client.
// leafproxy keeps the client's session, so the timeout is a statement-level failure: it
// takes 57014 (query_canceled), the code PostgreSQL gives a statement that ran out of
// statement_timeout, which drivers already treat as "this statement failed, the
// connection is fine". 53300 (too_many_connections) is what PostgreSQL answers a new
// connection at startup; it is kept for refusing sessions, not statements.
const (
	CodeWaitTimeout   = "57014" // query_canceled
	CodeServerDown    = "08001" // sqlclient_unable_to_establish_sqlconnection
	CodeCannotConnect = "57P03" // cannot_connect_now: the pool is shutting down
)

// Error is what Acquire returns for a pool condition: Kind is one of the sentinels,
// Code the SQLSTATE to give the client and Cause, for ErrServerDown, the dial's error.
type Error struct {
	Kind  error
	Code  string
	Key   Key
	Cause error
}

func (e *Error) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("%v for database %q user %q: %v", e.Kind, e.Key.Database, e.Key.User, e.Cause)
	}
	return fmt.Sprintf("%v for database %q user %q", e.Kind, e.Key.Database, e.Key.User)
}

// Unwrap lets errors.Is and errors.As see both the sentinel and the cause.
func (e *Error) Unwrap() []error {
	if e.Cause != nil {
		return []error{e.Kind, e.Cause}
	}
	return []error{e.Kind}
}

// SQLState returns the SQLSTATE the session should answer with.
func (e *Error) SQLState() string { return e.Code }

func waitTimeoutError(k Key, d time.Duration) error {
	return &Error{Kind: ErrWaitTimeout, Code: CodeWaitTimeout, Key: k,
		Cause: fmt.Errorf("query-wait-timeout %v reached", d)}
}

// serverDownError wraps a dial failure. When the failure carries a SQLSTATE of its own
// (PostgreSQL's 57P03 "the database system is starting up", 28P01, 53300), that is the
// one the client gets; otherwise 08001.
func serverDownError(k Key, cause error) error {
	code := CodeServerDown
	var coded interface{ SQLState() string }
	if errors.As(cause, &coded) && coded.SQLState() != "" {
		code = coded.SQLState()
	}
	return &Error{Kind: ErrServerDown, Code: code, Key: k, Cause: cause}
}

func closedError(k Key) error {
	return &Error{Kind: ErrClosed, Code: CodeCannotConnect, Key: k}
}
