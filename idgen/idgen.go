// Package idgen defines what the ID engines share: the Generator interface, the optional
// TryGenerator for callers that must not block and BatchGenerator for many IDs at once, the
// sentinel errors callers test for, and a Router that sends each tag to its engine.
//
// The engines themselves live in the subpackages segment (Leaf-segment, ranges reserved in
// PostgreSQL) and snowflake (time + worker ID + sequence); worker IDs come from the
// subpackage worker. None of them knows about the PostgreSQL wire protocol.
package idgen

import (
	"context"
	"errors"
)

// Generator hands out unique 64-bit IDs per tag.
type Generator interface {
	// Next returns a fresh ID for tag. It waits no longer than ctx allows.
	Next(ctx context.Context, tag string) (int64, error)
}

// TryGenerator is implemented by engines that can hand out an ID without waiting, for
// callers that must never block (a proxy's event loop serving many sessions at once).
//
// TryNext never blocks: it waits on no channel, sleep or I/O, and runs no query itself
// (it may start the background load that Next would start anyway). With ok true it has
// issued exactly one ID, as Next would have issued it: same uniqueness, same ordering,
// same metrics and hooks as a successful Next. With ok false it has issued nothing and
// counted nothing as a failure; that is its answer wherever Next would wait or fail
// (unknown tag, engine not running, buffers empty, clock behind, worker ID not held…),
// and the caller then calls Next, which waits, fails or counts as it always does.
type TryGenerator interface {
	TryNext(tag string) (id int64, ok bool)
}

// TryNext asks g for an ID of tag without waiting when g implements TryGenerator. For any
// other Generator, and for nil, ok is false: the caller calls Next as it would anyway.
// Wrappers of a Generator (metrics, say) use it to pass TryNext through.
func TryNext(g Generator, tag string) (id int64, ok bool) {
	if t, isTry := g.(TryGenerator); isTry {
		return t.TryNext(tag)
	}
	return 0, false
}

// Errors every engine reports the same way, so that callers (the proxy, the HTTP API)
// can map them to SQLSTATEs and status codes with errors.Is.
var (
	// ErrUnknownTag: no such tag (no leaf_alloc row for a segment tag).
	ErrUnknownTag = errors.New("idgen: unknown tag")
	// ErrUnavailable: the engine cannot issue now (store down and buffers empty, engine
	// not started or closed). Retrying later may succeed.
	ErrUnavailable = errors.New("idgen: ID source unavailable")
	// ErrClockBackwards: the clock moved back further than the engine will wait out.
	ErrClockBackwards = errors.New("idgen: clock moved backwards")
	// ErrWorkerNotHeld: the snowflake engine does not (or no longer) hold its worker ID.
	ErrWorkerNotHeld = errors.New("idgen: worker ID not held")
	// ErrBadArgument: the request itself is malformed (an empty tag, say).
	ErrBadArgument = errors.New("idgen: bad argument")
)
