package snowflake_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/idgen/worker"
)

// fakeClock is a clock the test moves by hand; Sleep advances it instead of waiting.
// Its readings carry no monotonic part, so the engine sees every jump, backwards too.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	slept []time.Duration
}

func newFakeClock(unixMillis int64) *fakeClock {
	return &fakeClock{now: time.UnixMilli(unixMillis)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slept = append(c.slept, d)
	if d > 0 {
		c.now = c.now.Add(d)
	}
	return ctx.Err()
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (c *fakeClock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.slept...)
}

// fakeSource hands out fakeLeases with a fixed worker ID and high-water mark.
type fakeSource struct {
	id, highWater int64
	mu            sync.Mutex
	leases        []*fakeLease
	fail          error
	gate          chan struct{} // when set, Acquire waits for it to close
}

func (s *fakeSource) Name() string { return "fake" }

func (s *fakeSource) Acquire(ctx context.Context) (worker.Lease, error) {
	s.mu.Lock()
	gate := s.gate
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, s.fail
	}
	l := &fakeLease{id: s.id, hw: s.highWater, done: make(chan struct{})}
	s.leases = append(s.leases, l)
	return l, nil
}

func (s *fakeSource) Lease(i int) *fakeLease {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i >= len(s.leases) {
		return nil
	}
	return s.leases[i]
}

// fakeLease never expires until the test gives it a deadline (setValidUntil) or loses it.
type fakeLease struct {
	id, hw     int64
	recorded   atomic.Int64
	validUntil atomic.Pointer[time.Time] // nil: never expires
	closed     atomic.Bool
	done       chan struct{}
	loseOnce   sync.Once
}

func (l *fakeLease) WorkerID() int64  { return l.id }
func (l *fakeLease) HighWater() int64 { return l.hw }
func (l *fakeLease) Record(ms int64)  { worker.RecordMax(&l.recorded, ms) }
func (l *fakeLease) ValidUntil() time.Time {
	if t := l.validUntil.Load(); t != nil {
		return *t
	}
	return time.Time{}
}
func (l *fakeLease) setValidUntil(t time.Time) { l.validUntil.Store(&t) }

// fence makes the lease invalid from the beginning of time, as a source does while it
// cannot prove ownership.
func (l *fakeLease) fence() { l.setValidUntil(time.Unix(0, 1)) }

// regain makes the lease valid for good again.
func (l *fakeLease) regain()               { l.validUntil.Store(nil) }
func (l *fakeLease) Done() <-chan struct{} { return l.done }
func (l *fakeLease) Close(context.Context) error {
	l.closed.Store(true)
	return nil
}
func (l *fakeLease) lose() {
	l.fence()
	l.loseOnce.Do(func() { close(l.done) })
}

// quietLogger returns a logger whose lines the test can inspect instead of printing them.
func quietLogger() (*logrus.Logger, *test.Hook) {
	return test.NewNullLogger()
}

// startEngine builds and starts an engine, closing it when the test ends.
func startEngine(t *testing.T, s snowflake.Settings) *snowflake.Engine {
	t.Helper()
	if s.Logger == nil {
		s.Logger, _ = quietLogger()
	}
	e, err := snowflake.New(s)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e
}

// waitUntil polls cond until it holds or the deadline passes.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
