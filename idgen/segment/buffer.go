package segment

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leafproxy/leafproxy/idgen"
)

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

// preload is called by the one Next that crossed s's threshold.
func (e *Engine) preload(tb *tagBuffer, s *segment) {
	tb.mu.Lock()
	if tb.cur.Load() == s && !tb.nextReady && !tb.loading && !tb.closed && !tb.removed {
		e.startLoadLocked(tb)
	}
	tb.mu.Unlock()
}

func (e *Engine) startLoadLocked(tb *tagBuffer) {
	tb.loading = true
	e.wg.Add(1)
	go e.loader(tb)
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

// loader reserves one segment for tb, retrying with backoff until it succeeds, the tag is
// removed or the engine closes. Only one loader per tag runs at a time (tb.loading).
func (e *Engine) loader(tb *tagBuffer) {
	defer e.wg.Done()
	backoff := e.retryBackoff
	log := e.log.WithField("tag", tb.tag)
	for {
		tb.mu.Lock()
		step := e.nextStep(tb.step, tb.minStep, e.now().Sub(tb.lastLoad))
		first := tb.step == 0
		tb.mu.Unlock()
		if first {
			step = 0 // the store reserves the step column's value
		}

		at := e.now()
		ctx, cancel := context.WithTimeout(e.ctx, e.loadTimeout)
		began := time.Now()
		a, err := e.store.Allocate(ctx, tb.tag, step)
		took := time.Since(began)
		cancel()
		if err == nil {
			err = tb.check(a)
		}
		if e.hooks.OnLoad != nil {
			size := a.Size
			if err != nil {
				size = 0
			}
			e.hooks.OnLoad(tb.tag, size, took, err)
		}

		tb.mu.Lock()
		if err == nil {
			e.installLocked(tb, a, at)
			tb.mu.Unlock()
			log.WithFields(map[string]any{"min_id": a.Max - a.Size + 1, "max_id": a.Max, "step": a.Size, "took": took}).Debug("segment loaded")
			return
		}
		tb.failing, tb.lastErr, tb.lastTry = true, err, time.Now()
		close(tb.loaded)
		tb.loaded = make(chan struct{})
		if errors.Is(err, idgen.ErrUnknownTag) || tb.closed || tb.removed {
			// A vanished row is not an outage: stop retrying, and drop the tag now rather
			// than at the next refresh.
			tb.loading = false
			tb.mu.Unlock()
			if errors.Is(err, idgen.ErrUnknownTag) {
				e.dropTag(tb)
			}
			return
		}
		tb.mu.Unlock()
		log.WithError(err).WithField("retry_in", backoff).Warn("loading a segment failed")

		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-tb.poke:
		case <-tb.stop:
		case <-e.stop:
		}
		t.Stop()
		backoff = min(2*backoff, e.maxBackoff)

		tb.mu.Lock()
		if tb.closed || tb.removed || e.state.Load() == stateClosed {
			// No attempt after Close began: it would only delay Close against a dead store.
			tb.loading = false
			tb.mu.Unlock()
			return
		}
		tb.mu.Unlock()
	}
}

// check refuses a range that overlaps IDs this engine already reserved for the tag, which
// only happens when someone moved max_id backwards by hand; handing it out would break
// uniqueness and ordering.
func (tb *tagBuffer) check(a Allocation) error {
	if a.Size <= 0 || a.Max-a.Size < 0 || a.Max > math.MaxInt64-1 {
		return fmt.Errorf("segment: tag %q: store returned an invalid range (%d, %d]", tb.tag, a.Max-a.Size, a.Max)
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if a.Max-a.Size < tb.highest {
		return fmt.Errorf("segment: tag %q: max_id moved backwards: reserved (%d, %d] but IDs up to %d were reserved before", tb.tag, a.Max-a.Size, a.Max, tb.highest)
	}
	return nil
}

// installLocked makes a fresh segment current when the current one is missing or used up,
// else the next one, and wakes every caller waiting for it.
func (e *Engine) installLocked(tb *tagBuffer, a Allocation, at time.Time) {
	s := newSegment(a, e.thresholdPPM, at)
	if cur := tb.cur.Load(); cur == nil {
		tb.pos = 0
		tb.segs[0] = s
		tb.cur.Store(s)
	} else if cur.exhausted() {
		tb.pos = 1 - tb.pos
		tb.segs[tb.pos] = s
		tb.cur.Store(s)
	} else {
		tb.segs[1-tb.pos] = s
		tb.nextReady = true
	}
	tb.step, tb.minStep, tb.lastLoad, tb.highest = a.Size, a.MinStep, at, a.Max
	tb.loads++
	tb.failing, tb.lastErr, tb.loading = false, nil, false
	close(tb.loaded)
	tb.loaded = make(chan struct{})
}

// nextStep is Leaf's dynamic step: the time the previous segment lasted decides the size of
// the next one. prev is 0 before the first load.
func (e *Engine) nextStep(prev, minStep int64, lasted time.Duration) int64 {
	step := prev
	switch {
	case prev == 0:
		return minStep
	case lasted < e.shortSegment:
		step = min(2*prev, max(e.maxStep, prev))
	case lasted > e.longSegment:
		step = prev / 2
	}
	return max(step, minStep, 1)
}

// giveBack seals the tag's segments and returns the unused tail to the store when the
// store's high-water mark is still our newest reservation. Only IDs never handed out go
// back: the current segment from its sealed position, plus the whole next segment, and the
// two only together when the next one directly follows the current one.
//
// Our view of max_id may be stale: a reservation whose reply was lost (the connection died
// after PostgreSQL committed it) moved max_id past expected without our knowing. The
// compare-and-set then fails and the lost range stays a gap. Nothing else can bring
// max_id back to expected: every reservation raises it, and a give-back lowers it only to
// the last ID its own engine handed out, which for anyone but us is at or above expected.
func (e *Engine) giveBack(ctx context.Context, tb *tagBuffer) error {
	tb.mu.Lock()
	cur := tb.cur.Load()
	var next *segment
	if tb.nextReady {
		next = tb.segs[1-tb.pos]
	}
	if cur == nil || tb.removed {
		tb.mu.Unlock()
		return nil
	}
	issued := cur.seal()
	expected, newMax := cur.hi(), cur.lo+issued
	if next != nil {
		next.seal()
		expected, newMax = next.hi(), next.lo
		if next.lo == cur.hi() {
			newMax = cur.lo + issued
		}
	}
	tb.mu.Unlock()
	if newMax >= expected {
		return nil
	}
	log := e.log.WithFields(map[string]any{"tag": tb.tag, "max_id": expected, "new_max_id": newMax})
	ok, err := e.store.GiveBack(ctx, tb.tag, expected, newMax)
	var ids int64
	if ok {
		ids = expected - newMax
	}
	if e.hooks.OnGiveBack != nil {
		e.hooks.OnGiveBack(tb.tag, ids, err)
	}
	switch {
	case err != nil:
		log.WithError(err).Warn("giving back the unused tail failed; it stays a gap")
		return fmt.Errorf("segment: give back %q: %w", tb.tag, err)
	case ok:
		log.Info("gave back the unused tail")
	default:
		log.Info("not giving back the unused tail: another process reserved after us")
	}
	return nil
}
