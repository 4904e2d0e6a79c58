package idgen

import (
	"context"
	"fmt"
)

// BatchGenerator is implemented by engines that can hand out many IDs of a tag at once
// more cheaply than one Next per ID (the segment engine reserves them from its buffer
// with one atomic add).
//
// NextBatch appends n fresh IDs of tag to dst and returns the extended slice. The IDs are
// strictly increasing within the batch. On failure it returns dst extended by the IDs
// issued before the failure (they are spent, like any ID a failed statement drew) and the
// error.
type BatchGenerator interface {
	NextBatch(ctx context.Context, tag string, n int, dst []int64) ([]int64, error)
}

// NextBatch asks g for n IDs of tag: in one call when g implements BatchGenerator, else
// one Next per ID. n below 1 is ErrBadArgument.
func NextBatch(ctx context.Context, g Generator, tag string, n int, dst []int64) ([]int64, error) {
	if n < 1 {
		return dst, fmt.Errorf("%w: a batch needs at least one ID, got %d", ErrBadArgument, n)
	}
	if b, ok := g.(BatchGenerator); ok {
		return b.NextBatch(ctx, tag, n, dst)
	}
	for range n {
		id, err := g.Next(ctx, tag)
		if err != nil {
			return dst, err
		}
		dst = append(dst, id)
	}
	return dst, nil
}

// NextBatch returns n IDs of tag from its engine (see BatchGenerator).
func (r *Router) NextBatch(ctx context.Context, tag string, n int, dst []int64) ([]int64, error) {
	if tag == "" {
		return dst, fmt.Errorf("%w: empty tag", ErrBadArgument)
	}
	g := r.engine(tag)
	if g == nil {
		return dst, fmt.Errorf("%w: no engine configured for tag %q", ErrUnavailable, tag)
	}
	return NextBatch(ctx, g, tag, n, dst)
}
