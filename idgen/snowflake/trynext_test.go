package snowflake_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/idgen/worker"
)

// tryFixture is an engine on a fake clock whose hook calls the test counts.
type tryFixture struct {
	clock *fakeClock
	src   *fakeSource
	e     *snowflake.Engine

	mu        sync.Mutex
	backwards []string // OnClockBackwards calls: "offset recovered|failed"
	exhausted int      // OnSequenceExhausted calls
}

func newTryFixture(t *testing.T) *tryFixture {
	t.Helper()
	f := &tryFixture{clock: newFakeClock(t0), src: &fakeSource{id: 5}}
	log, _ := quietLogger()
	var err error
	f.e, err = snowflake.New(snowflake.Settings{Source: f.src, Clock: f.clock, Logger: log,
		RandomStart: snowflake.NoRandomStart,
		Hooks: snowflake.Hooks{
			OnClockBackwards: func(off time.Duration, ok bool) {
				f.mu.Lock()
				defer f.mu.Unlock()
				f.backwards = append(f.backwards, off.String()+map[bool]string{true: " recovered", false: " failed"}[ok])
			},
			OnSequenceExhausted: func() {
				f.mu.Lock()
				defer f.mu.Unlock()
				f.exhausted++
			},
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.e.Close(ctx) })
	return f
}

func (f *tryFixture) start(t *testing.T) {
	t.Helper()
	if err := f.e.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
}

func (f *tryFixture) hooks() ([]string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.backwards...), f.exhausted
}

// TestTryNextRefusesWhereNextWaitsOrFails: in each state where Next would wait or fail,
// TryNext answers false without sleeping, issues nothing and calls no hook; the Next that
// follows then waits, fails and calls its hooks exactly as it would have without TryNext.
func TestTryNextRefusesWhereNextWaitsOrFails(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup brings the engine into the state and returns the last ID issued (0: none).
		setup func(t *testing.T, f *tryFixture) int64
		// What the Next after the refusal answers (nil: an ID above the last one) and the
		// hook calls it makes.
		nextErr   error
		backwards []string
		exhausted int
	}{
		{"engine not started", func(t *testing.T, f *tryFixture) int64 {
			return 0
		}, idgen.ErrUnavailable, nil, 0},
		{"engine closed", func(t *testing.T, f *tryFixture) int64 {
			f.start(t)
			last := mustNext(t, f.e)
			if err := f.e.Close(ctx); err != nil {
				t.Fatal(err)
			}
			return last
		}, idgen.ErrUnavailable, nil, 0},
		{"lease not held", func(t *testing.T, f *tryFixture) int64 {
			f.start(t)
			last := mustNext(t, f.e)
			f.src.Lease(0).fence()
			return last
		}, idgen.ErrWorkerNotHeld, nil, 0},
		{"clock behind the last ID, within the tolerance", func(t *testing.T, f *tryFixture) int64 {
			f.start(t)
			f.clock.Add(10 * time.Millisecond)
			last := mustNext(t, f.e)
			f.clock.Add(-3 * time.Millisecond)
			return last
		}, nil, []string{"3ms recovered"}, 0},
		{"clock behind the last ID, beyond the tolerance", func(t *testing.T, f *tryFixture) int64 {
			f.start(t)
			f.clock.Add(10 * time.Millisecond)
			last := mustNext(t, f.e)
			f.clock.Add(-6 * time.Millisecond)
			return last
		}, idgen.ErrClockBackwards, []string{"6ms failed"}, 0},
		{"sequence used up in this millisecond", func(t *testing.T, f *tryFixture) int64 {
			f.start(t)
			var last int64
			for range 4096 {
				id, ok := f.e.TryNext("")
				if !ok || id <= last {
					t.Fatalf("TryNext with the sequence not used up = %d, %v after %d", id, ok, last)
				}
				last = id
			}
			return last
		}, nil, nil, 1},
		{"time bits exhausted", func(t *testing.T, f *tryFixture) int64 {
			f.clock.Add(time.Duration(snowflake.DefaultEpochMillis+1<<41-1-t0) * time.Millisecond)
			f.start(t)
			last := mustNext(t, f.e)
			f.clock.Add(time.Millisecond)
			return last
		}, snowflake.ErrTimeOverflow, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newTryFixture(t)
			last := tc.setup(t, f)
			sleeps := len(f.clock.Sleeps())
			if id, ok := f.e.TryNext(""); ok {
				t.Fatalf("TryNext = %d, true; want false", id)
			}
			if s := f.clock.Sleeps()[sleeps:]; len(s) != 0 {
				t.Fatalf("TryNext slept %v", s)
			}
			if backwards, exhausted := f.hooks(); len(backwards) != 0 || exhausted != 0 {
				t.Fatalf("TryNext called hooks: clock backwards %v, sequence exhausted %d times", backwards, exhausted)
			}
			if in := f.e.Info(); last != 0 && in.LastMillis != f.e.Decompose(last).Millis {
				t.Fatalf("after the refusal the last millisecond is %d, want %d (the last ID's)", in.LastMillis, f.e.Decompose(last).Millis)
			}

			id, err := f.e.Next(ctx, "")
			if !errors.Is(err, tc.nextErr) || (err == nil) != (tc.nextErr == nil) {
				t.Fatalf("Next after the refusal = %d, %v; want %v", id, err, tc.nextErr)
			}
			if err == nil && id <= last {
				t.Fatalf("Next after the refusal = %d, not above %d", id, last)
			}
			backwards, exhausted := f.hooks()
			if fmt.Sprint(backwards) != fmt.Sprint(tc.backwards) || exhausted != tc.exhausted {
				t.Fatalf("Next's hooks: clock backwards %v, sequence exhausted %d; want %v, %d",
					backwards, exhausted, tc.backwards, tc.exhausted)
			}
		})
	}
}

// TestTryNextIssuesWhatNextIssues drives two engines through the same clock script, one
// with Next and one with TryNext: wherever TryNext issues, its IDs and recorded high-water
// marks are exactly Next's.
func TestTryNextIssuesWhatNextIssues(t *testing.T) {
	// Each step advances both clocks, then draws n IDs from each engine.
	steps := []struct {
		advance time.Duration
		n       int
	}{
		{0, 1}, {0, 3}, {time.Millisecond, 2}, {5 * time.Millisecond, 1}, {time.Second, 4000}, {time.Millisecond, 1},
	}
	type side struct {
		name  string
		clock *fakeClock
		src   *fakeSource
		e     *snowflake.Engine
		draw  func(e *snowflake.Engine) (int64, error)
		ids   []int64
		marks []int64
	}
	sides := []*side{
		{name: "Next", draw: func(e *snowflake.Engine) (int64, error) { return e.Next(ctx, "") }},
		{name: "TryNext", draw: func(e *snowflake.Engine) (int64, error) {
			if id, ok := e.TryNext("order"); ok {
				return id, nil
			}
			return 0, errors.New("TryNext refused with an ID at hand")
		}},
	}
	for _, s := range sides {
		s.clock, s.src = newFakeClock(t0), &fakeSource{id: 77}
		var calls int64
		s.e = startEngine(t, snowflake.Settings{Source: s.src, Clock: s.clock,
			Rand: func(n int64) int64 { calls++; return (calls * 37) % n }})
	}
	for i, st := range steps {
		for _, s := range sides {
			s.clock.Add(st.advance)
			for range st.n {
				id, err := s.draw(s.e)
				if err != nil {
					t.Fatalf("step %d, %s: %v", i, s.name, err)
				}
				s.ids = append(s.ids, id)
			}
			s.marks = append(s.marks, s.src.Lease(0).recorded.Load())
		}
	}
	want, got := sides[0], sides[1]
	for i := range want.ids {
		if got.ids[i] != want.ids[i] {
			t.Fatalf("ID #%d: TryNext issued %d (%+v), Next %d (%+v)", i, got.ids[i], got.e.Decompose(got.ids[i]), want.ids[i], want.e.Decompose(want.ids[i]))
		}
	}
	if fmt.Sprint(got.marks) != fmt.Sprint(want.marks) {
		t.Fatalf("recorded high-water marks: TryNext %v, Next %v", got.marks, want.marks)
	}
	if p := got.e.Decompose(got.ids[len(got.ids)-1]); p.Worker != 77 || p.Millis != t0+1007 {
		t.Fatalf("last ID decodes to %+v, want worker 77 at %d ms", p, t0+1007)
	}
}

// TestTryNextMixedWithNext draws with TryNext (falling back to Next, as the proxy does)
// and with Next from many goroutines on the real clock, so that TryNext meets the mutex
// held by a Next waiting for the next millisecond: the IDs must stay unique and increasing.
func TestTryNextMixedWithNext(t *testing.T) {
	e := startEngine(t, snowflake.Settings{Source: worker.Static{ID: 7}})
	const goroutines, each = 8, 10000
	results := make([][]int64, goroutines)
	hits := make([]int, goroutines)
	var wg sync.WaitGroup
	for g := range results {
		wg.Go(func() {
			ids := make([]int64, each)
			for i := range ids {
				id, ok := int64(0), false
				if g%2 == 0 || i%2 == 0 {
					id, ok = e.TryNext("")
				}
				if ok {
					hits[g]++
				} else {
					var err error
					if id, err = e.Next(ctx, ""); err != nil {
						t.Error(err)
						return
					}
				}
				ids[i] = id
			}
			results[g] = ids
		})
	}
	wg.Wait()
	checkConcurrentIDs(t, results, func(id int64) bool { return e.Decompose(id).Worker == 7 })
	total := 0
	for _, n := range hits {
		total += n
	}
	if total == 0 {
		t.Fatal("TryNext never issued an ID")
	}
	t.Logf("TryNext issued %d of %d IDs", total, goroutines*each)
}

// gatedClock is a fakeClock whose Sleep blocks until the test opens the gate, so that a
// Next can be caught holding the engine while it waits.
type gatedClock struct {
	*fakeClock
	sleeping chan struct{}
	gate     chan struct{}
}

func (c *gatedClock) Sleep(ctx context.Context, d time.Duration) error {
	c.sleeping <- struct{}{}
	<-c.gate
	return c.fakeClock.Sleep(ctx, d)
}

// TestTryNextDoesNotWaitForAWaitingNext: a Next waiting for the next millisecond or for
// the clock to catch up holds the engine; TryNext must answer false at once rather than
// queue behind it, and issue again once the Next is done.
func TestTryNextDoesNotWaitForAWaitingNext(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, e *snowflake.Engine, c *gatedClock)
	}{
		{"sequence used up", func(t *testing.T, e *snowflake.Engine, c *gatedClock) {
			for range 4096 {
				if _, ok := e.TryNext(""); !ok {
					t.Fatal("TryNext refused with the sequence not used up")
				}
			}
		}},
		{"clock behind", func(t *testing.T, e *snowflake.Engine, c *gatedClock) {
			c.Add(10 * time.Millisecond)
			mustNext(t, e)
			c.Add(-2 * time.Millisecond)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &gatedClock{fakeClock: newFakeClock(t0), sleeping: make(chan struct{}), gate: make(chan struct{})}
			e := startEngine(t, snowflake.Settings{Source: worker.Static{ID: 1}, Clock: c, RandomStart: snowflake.NoRandomStart})
			tc.setup(t, e, c)
			var last int64
			done := make(chan struct{})
			go func() {
				defer close(done)
				var err error
				if last, err = e.Next(ctx, ""); err != nil {
					t.Errorf("Next: %v", err)
				}
			}()
			<-c.sleeping // Next holds the engine and waits

			refused := make(chan bool, 1)
			go func() {
				_, ok := e.TryNext("")
				refused <- !ok
			}()
			select {
			case r := <-refused:
				if !r {
					t.Fatal("TryNext issued an ID while Next was waiting")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("TryNext waited for the Next holding the engine")
			}

			close(c.gate)
			<-done
			if id, ok := e.TryNext(""); !ok || id <= last {
				t.Fatalf("TryNext after the Next = %d, %v; want an ID above %d", id, ok, last)
			}
		})
	}
}
