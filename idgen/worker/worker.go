// Package worker defines where a snowflake engine gets its worker ID from, and the static
// source. The ZooKeeper (Leaf-compatible) and PostgreSQL lease sources live in the
// subpackages zookeeper and postgres.
//
// A Source hands out a Lease. While a lease is valid, no other process holding a valid
// lease from the same store (the same ZooKeeper tree, the same leaf_worker_lease table, the
// same state directory) has the same worker ID. A lease also carries the durable time
// high-water mark: the last millisecond the previous holder of the ID used, so that the
// next holder starts after it.
//
// Fencing. A lease that can be lost is valid only until a deadline, Lease.ValidUntil, a
// reading of the source's clock: the send time of the last request that proved ownership
// (a renewal, a ZooKeeper answer), plus how long that proof lasts (the lease TTL, the
// session timeout), minus a guard. The deadline is a plain value, not a flag a goroutine
// turns off, so the user of the ID (the snowflake engine) compares it with the very clock
// reading it stamps the ID with: a process that was paused (GC, SIGSTOP, VM freeze, CPU
// throttling) sees a past deadline the moment it runs again, before any goroutine of the
// source had the chance to notice. A process that takes an ID over waits out both the
// previous holder's high-water mark and the end of its lease.
package worker

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// Source hands out worker IDs.
type Source interface {
	// Name names the kind of source ("static", "zookeeper", "postgres") for status pages.
	Name() string
	// Acquire claims a worker ID. The lease is usable until Close, while the clock reads
	// before its ValidUntil, and until Done is closed.
	Acquire(ctx context.Context) (Lease, error)
}

// Lease is one claimed worker ID.
type Lease interface {
	// WorkerID is the claimed worker ID.
	WorkerID() int64
	// HighWater is the last millisecond (Unix time) recorded for this worker ID before it
	// was acquired, or the end of the previous holder's lease when that is later; 0 when
	// nothing was recorded. The engine issues IDs only after it.
	HighWater() int64
	// Record notes the last millisecond (Unix time) used in an ID. It must be cheap: the
	// engine calls it once per new millisecond. The source persists the largest value
	// recorded at least every few seconds (ZooKeeper node data, lease row, cache file).
	Record(unixMillis int64)
	// ValidUntil returns the instant from which the worker ID must not be used: no ID may
	// carry a time at or after it. It is a reading of the source's clock, which must be
	// the clock of the lease's user (time.Now, monotonic reading included, unless both
	// are given another); the user compares it with the clock reading it stamps an ID
	// with. The deadline moves forward when the source proves ownership again, and lies
	// in the past while ownership is not proven (renewals failing, a ZooKeeper session
	// lost, another live process holding the ID). The zero Time means the lease never
	// expires (static IDs).
	ValidUntil() time.Time
	// Done is closed when the lease is lost for good and a new one must be acquired.
	// It is nil for leases that cannot be lost.
	Done() <-chan struct{}
	// Close persists the last recorded millisecond and releases the ID.
	Close(ctx context.Context) error
}

// Errors of the sources, tested with errors.Is.
var (
	// ErrExhausted: every worker ID is taken (all lease rows held, or the ZooKeeper
	// sequence number has passed the largest worker ID).
	ErrExhausted = errors.New("worker: no worker ID left")
	// ErrClockBehind: the recorded high-water mark of the worker ID is in the future of
	// this machine's clock, so IDs issued now could repeat earlier ones.
	ErrClockBehind = errors.New("worker: clock is behind the recorded timestamp of the worker ID")
	// ErrUnreachable: the store could not be reached and no fallback applied.
	ErrUnreachable = errors.New("worker: worker ID store unreachable")
	// ErrInUse: another process holds the static worker ID's state file (the same ID and
	// the same state directory), so both would issue the same IDs.
	ErrInUse = errors.New("worker: worker ID in use by another process")
	// ErrBadState: the static worker ID's state file cannot be read as a high-water
	// mark. The source refuses to guess one: a mark too low could repeat IDs.
	ErrBadState = errors.New("worker: bad worker ID state file")
)

// MaxID is the largest worker ID of the default layout (10 worker bits).
const MaxID = 1023

// RecordMax stores ms in v unless v already holds a larger value. Sources use it to
// implement Lease.Record.
func RecordMax(v *atomic.Int64, ms int64) {
	for {
		old := v.Load()
		if ms <= old || v.CompareAndSwap(old, ms) {
			return
		}
	}
}

// Hooks let the caller count what happens to a lease (metrics live outside idgen). Nil
// fields are skipped. They are called from the source's own goroutines and must not block.
type Hooks struct {
	// OnReportError: persisting the high-water mark failed (the store is unreachable).
	OnReportError func(workerID int64, err error)
	// OnReconnect: the connection to the store came back after an outage.
	OnReconnect func(workerID int64)
	// OnSessionExpired: the ZooKeeper session expired; a new one is being made.
	OnSessionExpired func(workerID int64)
	// OnFenced: the lease could not be renewed in time; the ID must not be used.
	OnFenced func(workerID int64)
	// OnRegained: a fenced lease was renewed again.
	OnRegained func(workerID int64)
}

// ReportError calls OnReportError when it is set.
func (h Hooks) ReportError(id int64, err error) {
	if h.OnReportError != nil {
		h.OnReportError(id, err)
	}
}

// Reconnect calls OnReconnect when it is set.
func (h Hooks) Reconnect(id int64) {
	if h.OnReconnect != nil {
		h.OnReconnect(id)
	}
}

// SessionExpired calls OnSessionExpired when it is set.
func (h Hooks) SessionExpired(id int64) {
	if h.OnSessionExpired != nil {
		h.OnSessionExpired(id)
	}
}

// Fenced calls OnFenced when it is set.
func (h Hooks) Fenced(id int64) {
	if h.OnFenced != nil {
		h.OnFenced(id)
	}
}

// Regained calls OnRegained when it is set.
func (h Hooks) Regained(id int64) {
	if h.OnRegained != nil {
		h.OnRegained(id)
	}
}
