package worker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
)

// DefaultReportInterval is how often the static source writes its high-water mark when
// Static.ReportInterval is zero: the design's "at least every 3 s".
const DefaultReportInterval = 3 * time.Second

// Static is a Source that always hands out the same configured worker ID. Two processes
// configured with the same ID collide: use it only where the IDs are assigned by hand.
//
// With StateDir empty (the zero value) nothing is recorded, and a restart after the wall
// clock stepped back can repeat IDs. With StateDir set, the high-water mark is kept in
// {StateDir}/worker-{ID}.highwater (see the state file format below), so the engine starts
// only after the last millisecond the previous run used, and an exclusive lock on
// {StateDir}/worker-{ID}.lock keeps a second process with the same ID and directory from
// starting.
//
// The state file holds Java properties, like Leaf's workerID.properties cache:
//
//	workerID=5
//	timestamp=1767225600000
//
// A file that does not parse, or names another worker ID, fails Acquire with ErrBadState.
type Static struct {
	// ID is the worker ID.
	ID int64
	// StateDir is the directory of the state and lock files; it is created when missing.
	// Empty: no high-water mark and no lock.
	StateDir string
	// ReportInterval is the longest time between writes of the high-water mark while
	// IDs are issued; Close writes it too. 0 means DefaultReportInterval.
	ReportInterval time.Duration
	// Logger receives failed writes of the state file; nil means logrus' standard logger.
	Logger logrus.FieldLogger
	// Hooks: OnReportError is called when a write of the state file fails.
	Hooks Hooks
}

// Name returns "static".
func (s Static) Name() string { return "static" }

// Acquire returns a lease on s.ID that is never lost. With a StateDir it locks the ID's
// lock file, failing with ErrInUse when another process holds it, and reads the
// high-water mark, failing with ErrBadState when the state file is corrupt.
func (s Static) Acquire(ctx context.Context) (Lease, error) {
	if s.ID < 0 {
		return nil, fmt.Errorf("worker: static worker ID %d is negative", s.ID)
	}
	l := &staticLease{id: s.ID}
	if s.StateDir == "" {
		return l, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st, err := openState(s.StateDir, s.ID)
	if err != nil {
		return nil, err
	}
	hw, err := st.read()
	if err != nil {
		st.unlock()
		return nil, err
	}
	l.state = st
	l.highWater = hw
	l.written = hw
	l.interval = s.ReportInterval
	if l.interval <= 0 {
		l.interval = DefaultReportInterval
	}
	l.log = s.Logger
	if l.log == nil {
		l.log = logrus.StandardLogger()
	}
	l.log = l.log.WithFields(logrus.Fields{"worker_id": s.ID, "state_file": st.path})
	l.hooks = s.Hooks
	l.log.WithField("high_water_ms", hw).Info("locked the static worker ID; its high-water mark is kept in the state file")
	l.stop = make(chan struct{})
	l.stopped = make(chan struct{})
	go l.run()
	return l, nil
}

// staticLease is a static worker ID; with a state file its goroutine writes the
// high-water mark every interval.
type staticLease struct {
	id        int64
	highWater int64
	last      atomic.Int64

	// Set only with a state directory.
	state    *stateFile
	interval time.Duration
	log      logrus.FieldLogger
	hooks    Hooks
	stop     chan struct{}
	stopped  chan struct{}

	mu      sync.Mutex // serialises writes: run's and Close's
	written int64      // the mark in the file
	failing bool       // the last write failed (log the first failure only)

	closeOnce sync.Once
	closeErr  error
}

func (l *staticLease) WorkerID() int64       { return l.id }
func (l *staticLease) HighWater() int64      { return l.highWater }
func (l *staticLease) Record(ms int64)       { RecordMax(&l.last, ms) }
func (l *staticLease) ValidUntil() time.Time { return time.Time{} } // never expires
func (l *staticLease) Done() <-chan struct{} { return nil }

// run writes the mark every interval until Close.
func (l *staticLease) run() {
	defer close(l.stopped)
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.persist() // a failure is logged and counted; the next tick retries
		}
	}
}

// persist writes the recorded mark when it passed the one in the file.
func (l *staticLease) persist() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	hw := l.last.Load()
	if hw <= l.written {
		return nil
	}
	if err := l.state.write(hw); err != nil {
		if !l.failing {
			l.log.WithError(err).Warn("writing the worker ID high-water mark failed; retrying")
		}
		l.failing = true
		l.hooks.ReportError(l.id, err)
		return err
	}
	if l.failing {
		l.failing = false
		l.log.Info("writing the worker ID high-water mark works again")
	}
	l.written = hw
	return nil
}

// Close writes the last recorded millisecond and releases the lock. The write is quick
// local I/O, so ctx only bounds the wait for a write already under way.
func (l *staticLease) Close(ctx context.Context) error {
	if l.state == nil {
		return nil
	}
	l.closeOnce.Do(func() {
		close(l.stop)
		select {
		case <-l.stopped:
		case <-ctx.Done():
			l.closeErr = fmt.Errorf("worker: closing static worker %d: %w", l.id, ctx.Err())
			// The lock stays until the process exits: releasing it with a write under
			// way could let a successor read a mark older than ours.
			return
		}
		if err := l.persist(); err != nil {
			l.closeErr = fmt.Errorf("worker: writing the high-water mark of static worker %d: %w", l.id, err)
		}
		l.state.unlock()
	})
	return l.closeErr
}
