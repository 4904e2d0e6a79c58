package proxy

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgproto3"

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

// codeSystemError is the SQLSTATE for an ID source failure that carries none of its own
// (58000, system_error: an error external to PostgreSQL).
const codeSystemError = "58000"

// OIDs the proxy declares or reports.
const (
	oidInt8      = 20
	oidInt4      = 23
	oidText      = 25
	oidInt8Array = 1016
)

// nextID returns the ID for one slot; tag is the tag of a SlotTagParam slot.
func (c *conn) nextID(slot rewrite.Slot, tag string) (int64, error) {
	if ls := c.loop.Load(); ls != nil && !ls.detached {
		if id, ok := c.tryNextID(slot, tag); ok {
			return id, nil
		}
		ls.detach() // this goroutine may now wait; the loop goes on without it
	}
	switch slot.Kind {
	case rewrite.SlotSnowflake:
		return c.srv.IDs.NextSnowflake(c.ctx)
	case rewrite.SlotTagParam:
		return c.srv.IDs.Next(c.ctx, tag)
	default:
		return c.srv.IDs.Next(c.ctx, slot.Tag)
	}
}

// tryNextID is nextID without waiting; adopt lets only sessions whose IDs is an IDProber
// onto a loop.
func (c *conn) tryNextID(slot rewrite.Slot, tag string) (int64, bool) {
	p := c.srv.IDs.(IDProber)
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
// one, else 58000.
func errorResponse(err error) refusal {
	msg := &pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: codeSystemError, Message: err.Error()}
	var re *rewrite.Error
	var coded interface{ SQLState() string }
	switch {
	case errors.As(err, &re):
		msg.Code, msg.Message, msg.Hint, msg.Position = re.Code, re.Message, re.Hint, int32(re.Position)
	case errors.As(err, &coded) && coded.SQLState() != "":
		msg.Code = coded.SQLState()
	}
	b, _ := msg.Encode(nil)
	return refusal{msg: b, code: msg.Code}
}

// countError reports an error the proxy answered a client with itself to the OnError hook.
func (c *conn) countError(r refusal) {
	if c.srv.OnError != nil {
		c.srv.OnError(r.code)
	}
}

// idError wraps an ID source failure so that the client learns where it came from.
type idError struct{ err error }

func (e *idError) Error() string { return "leaf ID source: " + e.err.Error() }
func (e *idError) Unwrap() error { return e.err }

// SQLState returns the source's own SQLSTATE, or 58000.
func (e *idError) SQLState() string {
	var coded interface{ SQLState() string }
	if errors.As(e.err, &coded) && coded.SQLState() != "" {
		return coded.SQLState()
	}
	return codeSystemError
}
