package proxy

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/rewrite"
)

// IDSource supplies the IDs the proxy injects. The proxy never depends on the ID engines
// themselves; cmd/leafproxy wires a router of segment and snowflake engines in here.
type IDSource interface {
	// Next returns a fresh ID of a tag (leaf_next('tag') and fill rules).
	Next(ctx context.Context, tag string) (int64, error)
	// NextSnowflake returns a fresh snowflake ID (leaf_snowflake()).
	NextSnowflake(ctx context.Context) (int64, error)
	// NextBatch appends n fresh IDs of a tag to dst (leaf_next('tag', n)), strictly
	// increasing within the batch. On failure it returns the IDs issued before it.
	NextBatch(ctx context.Context, tag string, n int, dst []int64) ([]int64, error)
}

// IDProber is implemented by an IDSource that can hand out an ID without waiting. The
// proxy's event loops serve rewriting sessions only with such a source: a loop asks for
// IDs with TryNext, and only when none is at hand does the session's handler leave the
// loop to another goroutine while it waits in Next, so that one session's wait (for a
// segment still loading, say) never holds up the others.
type IDProber interface {
	// TryNext returns an ID of tag when one is at hand now; ok=false means nothing was
	// issued and Next would wait or fail. It never blocks.
	TryNext(tag string) (id int64, ok bool)
	// TryNextSnowflake is TryNext for leaf_snowflake().
	TryNextSnowflake() (id int64, ok bool)
}

// OIDs the proxy declares or reports.
const (
	oidInt8      = 20
	oidInt4      = 23
	oidText      = 25
	oidInt8Array = 1016
)

// nextID returns the ID for one slot; tag is the tag of a SlotTagParam slot.
//
// An ID at hand (IDProber) is taken without further ado. Otherwise the session waits in
// the source's Next, and that wait is what the client's statement is doing: a
// CancelRequest for the session ends it (see cancelIDWait), and the statement fails with
// PostgreSQL's 57014 while the session stays usable.
func (c *conn) nextID(slot rewrite.Slot, tag string) (int64, error) {
	id, err := c.drawID(slot, tag)
	if err == nil && slot.Max > 0 && id > slot.Max {
		// The key column is an integer or smallint: the ID must not reach the server, which
		// would store it as another number or fail part way through a statement.
		return 0, &rewrite.Error{Code: sqlstate.NumericValueOutOfRange,
			Message: fmt.Sprintf("ID %d of tag %q is out of range for the key column (at most %d)", id, slot.Tag, slot.Max),
			Hint:    "The tag's IDs have outgrown the column's type: change the key column to bigint (ALTER TABLE … ALTER COLUMN … TYPE bigint)."}
	}
	return id, err
}

// drawID takes one ID for slot from the ID source.
func (c *conn) drawID(slot rewrite.Slot, tag string) (int64, error) {
	if p, ok := c.srv.IDs.(IDProber); ok {
		if id, ok := tryNextID(p, slot, tag); ok {
			return id, nil
		}
	}
	c.detach() // this goroutine may now wait; the loop goes on without it
	// What the client sent before this statement goes to the server now rather than
	// after the wait: it runs meanwhile, and a cancel request can reach it there. Only
	// whole messages are buffered here (a statement's IDs are had before it is written).
	_ = c.server.w.Flush()
	ctx, done := c.beginIDWait()
	defer done()
	var id int64
	var err error
	switch slot.Kind {
	case rewrite.SlotSnowflake:
		id, err = c.srv.IDs.NextSnowflake(ctx)
	case rewrite.SlotTagParam:
		id, err = c.srv.IDs.Next(ctx, tag)
	default:
		id, err = c.srv.IDs.Next(ctx, slot.Tag)
	}
	if err != nil && errors.Is(context.Cause(ctx), errQueryCanceled) {
		return 0, errQueryCanceled
	}
	return id, err
}

// beginIDWait returns the context of a wait for an ID, which a cancel request for the
// session ends, and the function that ends the wait.
func (c *conn) beginIDWait() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(c.ctx)
	c.mu.Lock()
	c.idWait = cancel
	c.mu.Unlock()
	return ctx, func() {
		c.mu.Lock()
		c.idWait = nil
		c.mu.Unlock()
		cancel(nil)
	}
}

// waitingForID reports whether the session waits for an ID now.
func (c *conn) waitingForID() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.idWait != nil
}

// cancelIDWait ends the session's wait for an ID, reporting false when it is not waiting.
func (c *conn) cancelIDWait() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idWait == nil {
		return false
	}
	c.idWait(errQueryCanceled)
	c.idWait = nil
	return true
}

// queryCanceledError is the failure of a statement whose wait for an ID the client
// cancelled, in PostgreSQL's words.
type queryCanceledError struct{}

func (queryCanceledError) Error() string    { return "canceling statement due to user request" }
func (queryCanceledError) SQLState() string { return sqlstate.QueryCanceled }

var errQueryCanceled error = queryCanceledError{}

// tryNextID asks p for an ID at hand, without waiting. adopt lets only sessions whose IDs
// is an IDProber onto a loop.
func tryNextID(p IDProber, slot rewrite.Slot, tag string) (int64, bool) {
	switch slot.Kind {
	case rewrite.SlotSnowflake:
		return p.TryNextSnowflake()
	case rewrite.SlotTagParam:
		return p.TryNext(tag)
	default:
		return p.TryNext(slot.Tag)
	}
}

// errorResponse encodes err as an ErrorResponse of severity ERROR. Rewrite refusals keep
// their SQLSTATE, hint and position; other errors give their SQLState() when they have
// one, else 58000, and their Detail() and Hint() when they have them.
func errorResponse(err error) refusal {
	msg := &pgproto3.ErrorResponse{Severity: severityError, Code: sqlstate.SystemError, Message: err.Error()}
	var re *rewrite.Error
	var coded interface{ SQLState() string }
	switch {
	case errors.As(err, &re):
		msg.Code, msg.Message, msg.Hint, msg.Position = re.Code, re.Message, re.Hint, int32(re.Position)
	case errors.As(err, &coded) && coded.SQLState() != "":
		msg.Code = coded.SQLState()
	}
	var detailed interface{ Detail() string }
	if errors.As(err, &detailed) {
		msg.Detail = detailed.Detail()
	}
	var hinted interface{ Hint() string }
	if msg.Hint == "" && errors.As(err, &hinted) {
		msg.Hint = hinted.Hint()
	}
	return refusal{msg: encodeError(msg), code: msg.Code}
}

// countError reports an error the proxy answered a client with itself to the OnError hook.
func (c *conn) countError(r refusal) {
	if c.srv.OnError != nil {
		c.srv.OnError(r.code)
	}
}
