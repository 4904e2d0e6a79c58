package segment

import (
	"context"
	"fmt"

	"github.com/leafproxy/leafproxy/idgen"
)

// NextBatch appends n IDs of tag to dst. It implements idgen.BatchGenerator.
//
// The batch is one reservation from the tag's buffers where it can be: one atomic add of
// the IDs still wanted on the current segment. The caller whose add crosses the end of
// the segment owns the IDs up to that end (later adds land past it and issue nothing, as
// with Next), and the rest spills into the next segment, which Next's path switches to,
// loads or waits for. Segments this process reserves come in increasing order, so the
// batch is strictly increasing.
func (e *Engine) NextBatch(ctx context.Context, tag string, n int, dst []int64) ([]int64, error) {
	if n < 1 {
		return dst, fmt.Errorf("%w: a batch needs at least one ID, got %d", idgen.ErrBadArgument, n)
	}
	tb := (*e.tags.Load())[tag]
	if tb == nil {
		// Unknown to the current list: the single path reloads it (or fails).
		id, err := e.nextUnknown(ctx, tag)
		if err != nil {
			return dst, err
		}
		dst = append(dst, id)
		n--
		if tb = (*e.tags.Load())[tag]; tb == nil && n > 0 {
			return dst, fmt.Errorf("%w: %q", idgen.ErrUnknownTag, tag)
		}
	}
	for n > 0 {
		var got int
		dst, got = e.takeRange(tb, n, dst)
		n -= got
		if n == 0 {
			break
		}
		// The current segment is missing or used up: switch, load or wait as Next does.
		id, err := e.nextSlow(ctx, tb)
		if err != nil {
			return dst, err
		}
		dst = append(dst, id)
		n--
	}
	return dst, nil
}

// takeRange appends up to n IDs of tb's current segment to dst with one atomic add and
// reports how many it took; it starts the preload when the range covers the preload
// point.
func (e *Engine) takeRange(tb *tagBuffer, n int, dst []int64) ([]int64, int) {
	s := tb.cur.Load()
	if s == nil {
		return dst, 0
	}
	k := int64(n)
	end := s.used.Add(k)
	start := end - k // the IDs s.lo+start+1 .. s.lo+min(end, size) are ours
	if start >= s.size {
		return dst, 0
	}
	end = min(end, s.size)
	for i := start + 1; i <= end; i++ {
		dst = append(dst, s.lo+i)
	}
	if start < s.preloadAt && s.preloadAt <= end {
		e.preload(tb, s)
	}
	return dst, int(end - start)
}
