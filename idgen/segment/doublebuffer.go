package segment

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leafproxy/leafproxy/idgen"
)

// The double buffer of Leaf-segment: each tag has a current segment that Next hands IDs
// out of and a next one that a loader (loader.go) fills in the background.

// segment is one reserved range (lo, lo+size]. Next and TryNext take IDs from it with one
// atomic add on used; used may run past size (callers that found it empty), which is
// harmless because the ID is computed as lo+n only for n <= size, so the counter can never
// wrap an ID around, and an add past size issues nothing.
type segment struct {
	used      atomic.Int64
	lo        int64 // the range's IDs are lo+1 .. lo+size
	size      int64
	preloadAt int64     // the n whose caller starts the next load: exactly one caller sees it
	loadedAt  time.Time // engine clock when the reservation was made
}

// newSegment builds the segment for a reservation. thresholdPPM is PreloadThreshold in
// millionths, so that the threshold is exact integer arithmetic (0.9 is not exact in
// floating point, and 10*(1-0.9) rounds down to 0, one ID early).
func newSegment(a Allocation, thresholdPPM int64, at time.Time) *segment {
	s := &segment{lo: a.Max - a.Size, size: a.Size, loadedAt: at}
	// Leaf loads the next segment once idle < threshold*size, that is once
	// size-n < ceil(threshold*size), n being how many IDs are handed out.
	keep := (thresholdPPM*s.size + ppm - 1) / ppm
	s.preloadAt = min(max(s.size-keep+1, 1), s.size)
	return s
}

const ppm = 1_000_000

func (s *segment) hi() int64 { return s.lo + s.size }

// issued is how many IDs of s have been (or are being) handed out.
func (s *segment) issued() int64 { return min(s.used.Load(), s.size) }

func (s *segment) exhausted() bool { return s.used.Load() >= s.size }

// seal makes s hand out nothing more and returns how many IDs it had handed out. Any add
// after the swap yields n > size, so nothing past the returned count can be issued.
func (s *segment) seal() int64 { return min(s.used.Swap(s.size), s.size) }

// tagBuffer is Leaf's SegmentBuffer: the current segment and the next one of a tag.
type tagBuffer struct {
	tag string
	cur atomic.Pointer[segment] // what Next reads without a lock; nil until the first load

	mu        sync.Mutex
	segs      [2]*segment // Leaf's two buffers; segs[pos] is cur
	pos       int
	nextReady bool // segs[1-pos] holds a loaded, unused segment
	loading   bool // a loader goroutine runs (attempting or waiting to retry)
	loaded    chan struct{}
	poke      chan struct{} // wakes a loader waiting to retry
	stop      chan struct{} // closed when the tag is removed
	removed   bool
	closed    bool
	failing   bool // the last load attempt failed
	lastErr   error
	lastTry   time.Time // monotonic: end of the last failed attempt
	step      int64     // size of the last segment; 0 before the first load
	minStep   int64     // leaf_alloc.step as the last load saw it
	lastLoad  time.Time // engine clock of the last successful reservation
	highest   int64     // highest ID this engine reserved for the tag
	loads     int64
}

func newTagBuffer(tag string) *tagBuffer {
	return &tagBuffer{
		tag:    tag,
		loaded: make(chan struct{}),
		poke:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
	}
}

// remove is called (under the engine's refreshMu) when the tag's row is gone.
func (tb *tagBuffer) remove() {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if !tb.removed {
		tb.removed = true
		close(tb.stop)
	}
}

// take hands out the next ID of tb's current segment if it has one left: one atomic add,
// no lock, no allocation. Next and TryNext both issue every buffered ID through it. An add
// that lands past the segment's size issues nothing and leaves the segment as it was
// (used up), so a caller that finds it empty loses no ID.
func (e *Engine) take(tb *tagBuffer) (int64, bool) {
	if s := tb.cur.Load(); s != nil {
		if n := s.used.Add(1); n <= s.size {
			if n == s.preloadAt {
				e.preload(tb, s)
			}
			return s.lo + n, true
		}
	}
	return 0, false
}

// advanceLocked reports whether the current segment has IDs left, switching to the next
// segment first when the current one is used up and the next one is loaded. It never
// waits. tb.mu must be held.
func (tb *tagBuffer) advanceLocked() bool {
	if s := tb.cur.Load(); s != nil && !s.exhausted() {
		return true // another caller switched or installed meanwhile
	}
	if !tb.nextReady {
		return false
	}
	tb.pos = 1 - tb.pos
	tb.nextReady = false
	tb.cur.Store(tb.segs[tb.pos])
	return true
}

// trySwitch is TryNext once the current segment is missing or used up.
func (e *Engine) trySwitch(tb *tagBuffer) (int64, bool) {
	for {
		tb.mu.Lock()
		if tb.closed || tb.removed || e.state.Load() == stateClosed {
			tb.mu.Unlock() // Next fails for these: closing, or the row is gone
			return 0, false
		}
		if !tb.advanceLocked() {
			// Start the load Next would start, so that the caller's Next finds it in
			// flight. With the store known to be down the retry loop owns the loading.
			if !tb.loading && !tb.failing {
				e.startLoadLocked(tb)
			}
			tb.mu.Unlock()
			return 0, false
		}
		tb.mu.Unlock()
		if id, ok := e.take(tb); ok {
			return id, true
		}
		// Other callers used up the segment we switched to; look again.
	}
}

// nextSlow runs when the current segment is missing or used up.
func (e *Engine) nextSlow(ctx context.Context, tb *tagBuffer) (int64, error) {
	for {
		if id, ok := e.take(tb); ok {
			return id, nil
		}
		tb.mu.Lock()
		if tb.closed || e.state.Load() == stateClosed {
			tb.mu.Unlock()
			return 0, fmt.Errorf("%w: tag %q: %w", idgen.ErrUnavailable, tb.tag, ErrClosed)
		}
		if tb.removed {
			tb.mu.Unlock()
			return 0, fmt.Errorf("%w: %q was removed", idgen.ErrUnknownTag, tb.tag)
		}
		if tb.advanceLocked() {
			tb.mu.Unlock()
			continue
		}
		if tb.failing {
			// The store is known to be down: answer now rather than at the caller's
			// deadline, and let the retry run early if it has not for a while.
			err := tb.lastErr
			if time.Since(tb.lastTry) >= e.retryBackoff {
				select {
				case tb.poke <- struct{}{}:
				default:
				}
			}
			tb.mu.Unlock()
			return 0, e.unavailable(tb.tag, err)
		}
		if !tb.loading {
			e.startLoadLocked(tb)
		}
		wait := tb.loaded
		tb.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				// The caller gave up (a client cancelled its statement, say): that says
				// nothing about the store, so it is neither an outage nor counted as one.
				return 0, fmt.Errorf("segment: tag %q: waiting for a segment: %w", tb.tag, ctx.Err())
			}
			if e.hooks.OnUnavailable != nil {
				e.hooks.OnUnavailable(tb.tag)
			}
			return 0, fmt.Errorf("%w: tag %q: waiting for a segment: %w", idgen.ErrUnavailable, tb.tag, ctx.Err())
		}
	}
}

func (e *Engine) unavailable(tag string, cause error) error {
	if errors.Is(cause, idgen.ErrUnknownTag) {
		return cause // the row vanished; the loader is dropping the tag
	}
	if e.hooks.OnUnavailable != nil {
		e.hooks.OnUnavailable(tag)
	}
	return fmt.Errorf("%w: tag %q: both segments used up and the last load failed: %w", idgen.ErrUnavailable, tag, cause)
}
