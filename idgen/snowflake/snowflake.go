// Package snowflake is Leaf-snowflake: 64-bit IDs made of the milliseconds since an epoch,
// a worker ID and a sequence within the millisecond.
//
// Guarantees: the IDs of one Engine are strictly increasing; engines holding distinct
// worker IDs never produce the same ID; an engine issues IDs only in milliseconds after
// the high-water mark recorded for its worker ID, so a restart, or another process taking
// the ID over, does not repeat IDs issued before the mark was recorded. Time inside a
// process is measured with the monotonic clock from a wall-clock reading taken at Start,
// so stepping the wall clock while running changes nothing; the wall clock matters at
// Start and, through the mark, at the next Start.
//
// Fencing: no ID is ever stamped with a time at or after its lease's valid-until
// (worker.Lease.ValidUntil). The engine reads the clock once per ID, and that one reading
// both gives the ID its time and is compared with the deadline, under the engine's lock.
// Nothing else decides: a goroutine that would notice an expired lease may not have run
// yet after a pause (SIGSTOP, VM freeze, a long GC), but the first ID after the pause
// reads a clock past the deadline and is refused with idgen.ErrWorkerNotHeld.
//
// TryNext is Next for callers that must never block: where Next would wait (clock behind
// the last ID, sequence used up in this millisecond) or fail, it answers false at once.
package snowflake

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/worker"
)

type state int

const (
	stateNew state = iota
	stateRunning
	stateClosed
)

// Engine issues snowflake IDs. It implements idgen.Generator and idgen.TryGenerator; the
// tag is ignored. Build it with New, then Start it; it is safe for concurrent use.
type Engine struct {
	config

	// Fixed at Start: the wall-clock reading engine time counts from.
	base      time.Time
	baseNanos int64 // base in nanoseconds since the epoch

	mu        sync.Mutex
	state     state
	lease     worker.Lease // nil while no worker ID is held
	workerID  int64        // of lease, or of the last lease while re-acquiring
	highWater int64        // Unix ms recorded for workerID when it was acquired
	last      int64        // ms since the epoch of the last ID, -1 before the first
	seq       int64

	stop    context.CancelFunc // ends the supervisor at Close
	stopCtx context.Context
	wg      sync.WaitGroup
}

var (
	_ idgen.Generator    = (*Engine)(nil)
	_ idgen.TryGenerator = (*Engine)(nil)
)

// New validates the settings and returns an engine that issues nothing until Start.
func New(s Settings) (*Engine, error) {
	c, err := s.validate()
	if err != nil {
		return nil, err
	}
	e := &Engine{config: c, last: -1, workerID: -1}
	e.stopCtx, e.stop = context.WithCancel(context.Background())
	return e, nil
}

// Start acquires a worker ID from the source and waits until the clock has passed the
// high-water mark recorded for it; a gap larger than Settings.MaxStartWait fails with
// idgen.ErrClockBackwards. Start may be called once.
func (e *Engine) Start(ctx context.Context) error {
	e.mu.Lock()
	if e.state != stateNew {
		e.mu.Unlock()
		return fmt.Errorf("snowflake: Start called twice or after Close: %w", idgen.ErrUnavailable)
	}
	e.mu.Unlock()

	lease, err := e.source.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("snowflake: acquire a worker ID from %s: %w", e.source.Name(), err)
	}
	if err := e.admit(ctx, lease, 0, func() int64 { return e.clock.Now().UnixMilli() }, e.maxStartWait); err != nil {
		closeLease(lease, e.log)
		return err
	}
	e.base = e.clock.Now()
	e.baseNanos = e.base.UnixNano() - e.codec.epochMillis*int64(time.Millisecond)
	if now := e.elapsed(); now < 0 || now > e.codec.layout.MaxElapsed() {
		closeLease(lease, e.log)
		if now < 0 {
			return fmt.Errorf("%w: epoch %v is in the future", ErrBadLayout, e.codec.Epoch())
		}
		return ErrTimeOverflow
	}

	e.mu.Lock()
	if e.state != stateNew {
		e.mu.Unlock()
		closeLease(lease, e.log)
		return fmt.Errorf("snowflake: closed during Start: %w", idgen.ErrUnavailable)
	}
	e.state = stateRunning
	e.install(lease)
	e.mu.Unlock()

	e.log.WithFields(logrus.Fields{
		"worker_id": lease.WorkerID(), "source": e.source.Name(), "layout": e.codec.layout.String(),
		"high_water_ms": lease.HighWater(),
	}).Info("snowflake engine started")
	if e.hooks.OnWorkerAcquired != nil {
		e.hooks.OnWorkerAcquired(lease.WorkerID())
	}
	if lease.Done() != nil {
		e.wg.Add(1)
		go e.supervise(lease)
	}
	return nil
}

// admit checks that the lease's worker ID fits the layout and waits until now() has
// passed its high-water mark and floor (Unix ms), failing when the gap exceeds maxWait
// (maxWait < 0: no bound).
func (e *Engine) admit(ctx context.Context, lease worker.Lease, floor int64, now func() int64, maxWait time.Duration) error {
	id := lease.WorkerID()
	if id < 0 || id > e.codec.layout.MaxWorker() {
		return fmt.Errorf("snowflake: worker ID %d from %s does not fit %d worker bits: %w",
			id, e.source.Name(), e.codec.layout.WorkerBits, worker.ErrExhausted)
	}
	hw := max(lease.HighWater(), floor)
	for {
		n := now()
		if n > hw {
			return nil
		}
		gap := time.Duration(hw-n+1) * time.Millisecond
		if maxWait >= 0 && gap > maxWait {
			return fmt.Errorf("%w: worker %d was last used at %d ms, %v ahead of this clock (more than the %v the engine waits)",
				idgen.ErrClockBackwards, id, hw, gap, maxWait)
		}
		e.log.WithFields(logrus.Fields{"worker_id": id, "high_water_ms": hw, "wait": gap}).
			Warn("clock is behind the worker ID's high-water mark; waiting")
		if err := e.clock.Sleep(ctx, gap); err != nil {
			return fmt.Errorf("snowflake: waiting for the high-water mark of worker %d: %w", id, err)
		}
	}
}

// install makes lease the current one; e.mu must be held.
func (e *Engine) install(lease worker.Lease) {
	e.lease = lease
	e.workerID = lease.WorkerID()
	e.highWater = lease.HighWater()
}

// reading reads the clock: the time since base. An ID's time and the check of its lease
// come from one reading.
func (e *Engine) reading() time.Duration { return e.clock.Since(e.base) }

// millisAt returns the engine's time of reading r in ms since the epoch.
func (e *Engine) millisAt(r time.Duration) int64 {
	return (e.baseNanos + int64(r)) / int64(time.Millisecond)
}

// elapsed returns the engine's time now in ms since the epoch.
func (e *Engine) elapsed() int64 { return e.millisAt(e.reading()) }

// fence refuses the clock reading r unless it is before the lease's deadline; e.mu must be
// held and e.lease set. The ID of reading r is stamped with r's millisecond, at or before
// r, so an accepted reading stamps a time before the deadline.
func (e *Engine) fence(r time.Duration) error {
	until := e.lease.ValidUntil()
	if until.IsZero() || r < until.Sub(e.base) {
		return nil
	}
	return fmt.Errorf("%w: the lease on worker %d is not valid now (its deadline passed %v ago: not renewed in time, or held by another process)",
		idgen.ErrWorkerNotHeld, e.workerID, r-until.Sub(e.base))
}

// Next returns a new ID. The tag is ignored: one engine serves every snowflake tag.
func (e *Engine) Next(ctx context.Context, _ string) (int64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.next(ctx, true)
}

// TryNext returns a new ID if one can be issued now, for callers that must not block (an
// event loop serving many sessions). The tag is ignored. It implements idgen.TryGenerator.
//
// It never sleeps and does no I/O, and it does not even wait for the engine's mutex: while
// another caller holds it (a Next waiting out the clock, or for the next millisecond)
// TryNext answers false. With ok true the ID is exactly what Next would have issued: same
// layout, strictly above every ID issued before, the millisecond recorded for the
// high-water mark. With ok false nothing was issued and no hook was called (no
// OnClockBackwards, no OnSequenceExhausted); that is its answer wherever Next would wait
// or fail: engine not running, worker ID not held, clock behind the last ID, sequence used
// up in this millisecond, time bits exhausted. The caller then calls Next.
func (e *Engine) TryNext(string) (id int64, ok bool) {
	if !e.mu.TryLock() {
		return 0, false
	}
	defer e.mu.Unlock()
	id, err := e.next(context.Background(), false)
	return id, err == nil
}

// errWouldWait is next's answer, with wait false, where it would have to wait. It never
// leaves the package.
var errWouldWait = errors.New("snowflake: no ID without waiting")

// next issues an ID; e.mu must be held. With wait false it neither waits nor calls a hook:
// where it would (clock behind the last ID, sequence used up), it returns errWouldWait.
func (e *Engine) next(ctx context.Context, wait bool) (int64, error) {
	if e.lease == nil {
		if e.state == stateRunning {
			return 0, fmt.Errorf("%w: worker ID lost, acquiring a new one", idgen.ErrWorkerNotHeld)
		}
		return 0, fmt.Errorf("snowflake: engine not started or closed: %w", idgen.ErrUnavailable)
	}
	r := e.reading()
	if err := e.fence(r); err != nil {
		return 0, err
	}
	checked := r
	now := e.millisAt(r)
	if now < e.last {
		if !wait {
			return 0, errWouldWait
		}
		var err error
		if r, err = e.waitBackwards(ctx, now); err != nil {
			return 0, err
		}
		now = e.millisAt(r)
	}
	seq := e.seq
	if now == e.last {
		seq = (seq + 1) & e.codec.layout.MaxSequence()
		if seq == 0 {
			if !wait {
				return 0, errWouldWait
			}
			if e.hooks.OnSequenceExhausted != nil {
				e.hooks.OnSequenceExhausted()
			}
			var err error
			if r, err = e.waitNextMilli(ctx); err != nil {
				return 0, err
			}
			now = e.millisAt(r)
			seq = e.startSeq()
		}
	} else {
		seq = e.startSeq()
	}
	if now > e.codec.layout.MaxElapsed() {
		return 0, ErrTimeOverflow
	}
	// The invariant: now is the millisecond of r, and r is before the lease's deadline.
	// After a wait r is a newer reading than the one checked, so check again.
	if r != checked {
		if err := e.fence(r); err != nil {
			return 0, err
		}
	}
	if now != e.last {
		e.last = now
		e.lease.Record(now + e.codec.epochMillis)
	}
	e.seq = seq
	return e.codec.compose(now, e.workerID, seq), nil
}

func (e *Engine) startSeq() int64 {
	if e.randomStart <= 1 {
		return 0
	}
	return e.rand(e.randomStart)
}

// waitBackwards handles a clock behind the last ID as Leaf does: up to maxBackwards,
// wait twice the offset and look again; beyond it, or if that did not help, fail. It
// returns the clock reading that is no longer behind.
func (e *Engine) waitBackwards(ctx context.Context, now int64) (time.Duration, error) {
	offset := e.last - now
	d := time.Duration(offset) * time.Millisecond
	if offset <= e.maxBackwards {
		if err := e.clock.Sleep(ctx, 2*d); err != nil {
			return 0, fmt.Errorf("%w: waiting out %v: %w", idgen.ErrClockBackwards, d, err)
		}
		if r := e.reading(); e.millisAt(r) >= e.last {
			if e.hooks.OnClockBackwards != nil {
				e.hooks.OnClockBackwards(d, true)
			}
			return r, nil
		}
	}
	if e.hooks.OnClockBackwards != nil {
		e.hooks.OnClockBackwards(d, false)
	}
	return 0, fmt.Errorf("%w: by %v (the engine waits out at most %v)", idgen.ErrClockBackwards, d,
		time.Duration(e.maxBackwards)*time.Millisecond)
}

// waitNextMilli waits until the engine's time has passed e.last and returns that reading.
func (e *Engine) waitNextMilli(ctx context.Context) (time.Duration, error) {
	for {
		r := e.reading()
		nanos := e.baseNanos + int64(r)
		now := nanos / int64(time.Millisecond)
		if now > e.last {
			return r, nil
		}
		if e.last-now > e.maxBackwards {
			return 0, fmt.Errorf("%w: by %d ms while waiting for the next millisecond", idgen.ErrClockBackwards, e.last-now)
		}
		if err := e.clock.Sleep(ctx, time.Duration((e.last+1)*int64(time.Millisecond)-nanos)); err != nil {
			return 0, err
		}
	}
}

// supervise replaces a lease the source lost for good.
func (e *Engine) supervise(lease worker.Lease) {
	defer e.wg.Done()
	for {
		select {
		case <-e.stopCtx.Done():
			return
		case <-lease.Done():
		}
		e.mu.Lock()
		if e.lease == lease {
			e.lease = nil
		}
		e.mu.Unlock()
		id := lease.WorkerID()
		e.log.WithFields(logrus.Fields{"worker_id": id, "source": e.source.Name()}).
			Error("worker ID lost; snowflake IDs are refused until a new one is acquired")
		if e.hooks.OnWorkerLost != nil {
			e.hooks.OnWorkerLost(id)
		}
		closeLease(lease, e.log)

		if lease = e.reacquire(); lease == nil {
			return
		}
		if lease.Done() == nil {
			return
		}
	}
}

// reacquire acquires and installs a new lease, retrying until it succeeds or the engine
// is closed (then it returns nil).
func (e *Engine) reacquire() worker.Lease {
	for {
		lease, err := e.source.Acquire(e.stopCtx)
		if err == nil {
			// Engine time, not the wall clock: the IDs we would issue use engine time. The
			// mark may be far ahead after an unlucky takeover; wait it out rather than
			// take another ID, since any other free ID can carry the same problem.
			// The floor is our own last millisecond: a new worker ID may be smaller than
			// the old one, and IDs must keep increasing.
			e.mu.Lock()
			floor := e.last + e.codec.epochMillis
			e.mu.Unlock()
			err = e.admit(e.stopCtx, lease, floor, func() int64 { return e.elapsed() + e.codec.epochMillis }, -1)
			if err != nil {
				closeLease(lease, e.log)
			}
		}
		if err != nil {
			if e.stopCtx.Err() != nil {
				return nil
			}
			e.log.WithError(err).WithField("source", e.source.Name()).Warn("acquiring a new worker ID failed; retrying")
			if e.clock.Sleep(e.stopCtx, e.retryBackoff) != nil {
				return nil
			}
			continue
		}
		e.mu.Lock()
		if e.state != stateRunning {
			e.mu.Unlock()
			closeLease(lease, e.log)
			return nil
		}
		e.install(lease)
		e.mu.Unlock()
		e.log.WithFields(logrus.Fields{"worker_id": lease.WorkerID(), "source": e.source.Name()}).
			Info("acquired a new worker ID")
		if e.hooks.OnWorkerAcquired != nil {
			e.hooks.OnWorkerAcquired(lease.WorkerID())
		}
		return lease
	}
}

// Close stops issuing IDs, lets the source persist the last millisecond used and releases
// the worker ID. Next fails with idgen.ErrUnavailable afterwards.
func (e *Engine) Close(ctx context.Context) error {
	e.mu.Lock()
	if e.state == stateClosed {
		e.mu.Unlock()
		return nil
	}
	e.state = stateClosed
	lease := e.lease
	e.lease = nil
	e.mu.Unlock()
	e.stop()
	e.wg.Wait()
	if lease == nil {
		return nil
	}
	if err := lease.Close(ctx); err != nil {
		return fmt.Errorf("snowflake: release worker %d: %w", lease.WorkerID(), err)
	}
	return nil
}

func closeLease(l worker.Lease, log logrus.FieldLogger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.Close(ctx); err != nil {
		log.WithError(err).WithField("worker_id", l.WorkerID()).Warn("releasing worker ID failed")
	}
}

// Codec returns the codec of the engine's layout and epoch.
func (e *Engine) Codec() Codec { return e.codec }

// Decompose splits an ID of this engine's layout into its parts.
func (e *Engine) Decompose(id int64) Parts { return e.codec.Decompose(id) }

// Compose builds the ID of the given parts in this engine's layout.
func (e *Engine) Compose(p Parts) (int64, error) { return e.codec.Compose(p) }

// Info is the engine's state for a status page.
type Info struct {
	Running         bool   // started and not closed
	Held            bool   // a worker ID is held and its lease valid now
	WorkerID        int64  // -1 before the first one is acquired
	Source          string // the source's name
	Layout          Layout
	Epoch           time.Time
	LastMillis      int64 // Unix ms of the last ID issued, 0 before the first
	HighWaterMillis int64 // the mark recorded for the worker ID when it was acquired
}

// Info returns the engine's state.
func (e *Engine) Info() Info {
	e.mu.Lock()
	defer e.mu.Unlock()
	in := Info{
		Running:         e.state == stateRunning,
		Held:            e.lease != nil && e.state == stateRunning && e.fence(e.reading()) == nil,
		WorkerID:        e.workerID,
		Source:          e.source.Name(),
		Layout:          e.codec.layout,
		Epoch:           e.codec.Epoch(),
		HighWaterMillis: e.highWater,
	}
	if e.last >= 0 {
		in.LastMillis = e.last + e.codec.epochMillis
	}
	return in
}
