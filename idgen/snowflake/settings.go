package snowflake

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/worker"
)

// Defaults of Settings.
const (
	DefaultRandomStart  = 100                  // Leaf: a new millisecond starts at rand(100)
	DefaultMaxBackwards = 5 * time.Millisecond // Leaf: wait out at most 5 ms of clock going back
	DefaultMaxStartWait = 5 * time.Second      // wait at most this long for the high-water mark
	DefaultRetryBackoff = time.Second          // between attempts to re-acquire a lost worker ID
)

// NoRandomStart as Settings.RandomStart makes every millisecond start its sequence at 0.
const NoRandomStart = -1

// Settings configure an Engine. The zero value of every field means its default; only
// Source is required.
type Settings struct {
	// Layout of the IDs; the zero value means DefaultLayout (41/10/12).
	Layout Layout
	// Epoch the time bits count from; the zero value means DefaultEpochMillis.
	Epoch time.Time
	// Source of the worker ID (required).
	Source worker.Source
	// RandomStart: each new millisecond starts its sequence at a random value in
	// [0, RandomStart), so that id % n spreads over n shards even at low rates (Leaf uses
	// 100). 0 means DefaultRandomStart; NoRandomStart (or any negative value) disables it.
	RandomStart int
	// Rand returns a random value in [0, n). The default is math/rand/v2's Int64N.
	Rand func(n int64) int64
	// MaxBackwards is how far the clock may go back before Next fails with
	// idgen.ErrClockBackwards; within it, Next waits twice the offset and checks again.
	// 0 means DefaultMaxBackwards; a negative value never waits.
	MaxBackwards time.Duration
	// MaxStartWait bounds how far the recorded high-water mark of the worker ID may be
	// ahead of this clock at Start: a smaller gap is waited out, a larger one fails Start
	// with idgen.ErrClockBackwards. 0 means DefaultMaxStartWait; negative never waits.
	MaxStartWait time.Duration
	// RetryBackoff is the pause between attempts to acquire a new worker ID after the
	// source lost the old one. 0 means DefaultRetryBackoff.
	RetryBackoff time.Duration
	// Clock is the time source; nil means the system clock. Tests replace it.
	Clock Clock
	// Logger receives what happens to the engine (never per ID); nil means logrus'
	// standard logger.
	Logger logrus.FieldLogger
	// Hooks let the caller count events in its metrics.
	Hooks Hooks
}

// Hooks are called on events worth a metric; nil fields are skipped. They run on the
// calling goroutine (some with the engine's lock held) and must be quick.
type Hooks struct {
	// OnClockBackwards: Next saw the clock behind the last ID by offset. recovered tells
	// whether waiting helped; when it did not, Next returned idgen.ErrClockBackwards.
	OnClockBackwards func(offset time.Duration, recovered bool)
	// OnSequenceExhausted: a millisecond ran out of sequence numbers and Next waited for
	// the next one.
	OnSequenceExhausted func()
	// OnWorkerLost: the source lost the worker ID; Next fails with idgen.ErrWorkerNotHeld
	// until a new one is acquired.
	OnWorkerLost func(workerID int64)
	// OnWorkerAcquired: a worker ID was acquired (at Start and after a loss).
	OnWorkerAcquired func(workerID int64)
}

// Clock tells the time and waits. Now's readings are compared with Sub, so the system
// clock's monotonic readings keep the engine immune to wall-clock steps within a process.
type Clock interface {
	Now() time.Time
	// Since returns the time elapsed since t, a reading of Now. The engine calls it for
	// every ID: the system clock answers it from the monotonic clock alone, which costs
	// half of Now. It must equal Now().Sub(t).
	Since(t time.Time) time.Duration
	// Sleep waits for d or until ctx is done, whichever comes first.
	Sleep(ctx context.Context, d time.Duration) error
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Since(t time.Time) time.Duration { return time.Since(t) }

// spinBelow is the longest wait done by yielding in a loop instead of a timer. The
// runtime's timers wake a sub-millisecond sleep up to a millisecond late, which would
// cost a saturated engine a whole millisecond of sequence numbers at every wrap; Leaf
// spins for the same reason.
const spinBelow = time.Millisecond

func (systemClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	if d <= spinBelow {
		for start := time.Now(); time.Since(start) < d; {
			runtime.Gosched()
		}
		return ctx.Err()
	}
	if ctx.Done() == nil {
		time.Sleep(d)
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Errors of the engine besides the idgen sentinels it wraps.
var (
	// ErrTimeOverflow: the time bits cannot hold the current time any more (Leaf issue
	// #106). It matches idgen.ErrUnavailable with errors.Is as well.
	ErrTimeOverflow = fmt.Errorf("snowflake: time bits exhausted, no IDs can be issued: %w", idgen.ErrUnavailable)
	// ErrNoSource: Settings.Source is nil.
	ErrNoSource = errors.New("snowflake: no worker ID source configured")
)

// config is the validated form of Settings.
type config struct {
	codec        Codec
	source       worker.Source
	randomStart  int64
	rand         func(int64) int64
	maxBackwards int64 // ms
	maxStartWait time.Duration
	retryBackoff time.Duration
	clock        Clock
	log          logrus.FieldLogger
	hooks        Hooks
}

func (s Settings) validate() (config, error) {
	c := config{source: s.Source, rand: s.Rand, clock: s.Clock, log: s.Logger, hooks: s.Hooks}
	var err error
	if c.codec, err = NewCodec(s.Layout, s.Epoch); err != nil {
		return c, err
	}
	if c.source == nil {
		return c, ErrNoSource
	}
	switch {
	case s.RandomStart == 0:
		c.randomStart = DefaultRandomStart
	case s.RandomStart > 0:
		c.randomStart = int64(s.RandomStart)
	}
	if c.randomStart > c.codec.layout.MaxSequence() {
		return c, fmt.Errorf("%w: random start %d exceeds the %d sequence bits", ErrBadLayout, c.randomStart, c.codec.layout.SequenceBits)
	}
	if c.rand == nil {
		c.rand = rand.Int64N
	}
	switch {
	case s.MaxBackwards == 0:
		c.maxBackwards = DefaultMaxBackwards.Milliseconds()
	case s.MaxBackwards > 0:
		c.maxBackwards = s.MaxBackwards.Milliseconds()
	}
	switch {
	case s.MaxStartWait == 0:
		c.maxStartWait = DefaultMaxStartWait
	case s.MaxStartWait > 0:
		c.maxStartWait = s.MaxStartWait
	}
	c.retryBackoff = s.RetryBackoff
	if c.retryBackoff <= 0 {
		c.retryBackoff = DefaultRetryBackoff
	}
	if c.clock == nil {
		c.clock = systemClock{}
	}
	if c.log == nil {
		c.log = logrus.StandardLogger()
	}
	return c, nil
}
