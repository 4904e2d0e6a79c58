package segment

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/leafproxy/leafproxy/idgen"
)

// Loading segments: reserving the next range of a tag in the store, adapting its step,
// and giving the unused tail back at shutdown.
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
