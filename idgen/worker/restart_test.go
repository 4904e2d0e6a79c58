package worker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus/hooks/test"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/idgen/worker"
)

// stepClock is a wall clock the test sets by hand; Sleep moves it forward instead of
// waiting. Its readings carry no monotonic part, so the engine sees every step.
type stepClock struct {
	mu    sync.Mutex
	now   time.Time
	slept time.Duration
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func (c *stepClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d > 0 {
		c.now = c.now.Add(d)
		c.slept += d
	}
	return ctx.Err()
}

func (c *stepClock) Slept() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.slept
}

// TestStaticRestartWithClockBehind runs an engine on a static worker ID with a state
// directory, stops it, and starts it again with the wall clock stepped back: a step within
// the engine's start wait is waited out and the new IDs come after the old ones; a larger
// step refuses to start.
func TestStaticRestartWithClockBehind(t *testing.T) {
	const t0 = 1767225600000 // 2026-01-01T00:00:00Z in Unix ms
	const maxStartWait = 5 * time.Second
	for _, tc := range []struct {
		name   string
		back   time.Duration // how far the clock of the second run is behind the first run's last ID
		refuse bool
	}{
		{"small step is waited out", 2 * time.Second, false},
		{"large step refuses to start", time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			log, _ := test.NewNullLogger()
			src := worker.Static{ID: 9, StateDir: dir, ReportInterval: time.Hour, Logger: log}
			settings := func(c *stepClock) snowflake.Settings {
				return snowflake.Settings{Source: src, Clock: c, MaxStartWait: maxStartWait, Logger: log}
			}

			clock := &stepClock{now: time.UnixMilli(t0)}
			first, err := snowflake.New(settings(clock))
			if err != nil {
				t.Fatal(err)
			}
			if err := first.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			var last int64
			for i := 0; i < 5; i++ {
				clock.Sleep(context.Background(), 7*time.Millisecond)
				if last, err = first.Next(context.Background(), "x"); err != nil {
					t.Fatal(err)
				}
			}
			lastMillis := first.Codec().Decompose(last).Time.UnixMilli()
			if err := first.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if mark, _ := readMark(t, dir, "9"); mark < lastMillis {
				t.Fatalf("state file holds %d, below the last ID's millisecond %d", mark, lastMillis)
			}

			// The machine restarts with its clock behind the last ID.
			clock = &stepClock{now: time.UnixMilli(lastMillis).Add(-tc.back)}
			second, err := snowflake.New(settings(clock))
			if err != nil {
				t.Fatal(err)
			}
			defer second.Close(context.Background())
			err = second.Start(context.Background())
			if tc.refuse {
				if !errors.Is(err, idgen.ErrClockBackwards) {
					t.Fatalf("Start with the clock %v behind = %v, want ErrClockBackwards", tc.back, err)
				}
				if clock.Slept() != 0 {
					t.Fatalf("refused after waiting %v; should refuse at once", clock.Slept())
				}
				// The refused start released the worker ID for a later attempt.
				acquire(t, src)
				return
			}
			if err != nil {
				t.Fatalf("Start with the clock %v behind: %v", tc.back, err)
			}
			if clock.Slept() < tc.back {
				t.Fatalf("Start waited %v, want at least the %v step", clock.Slept(), tc.back)
			}
			id, err := second.Next(context.Background(), "x")
			if err != nil {
				t.Fatal(err)
			}
			if id <= last {
				t.Fatalf("first ID after the restart %d is not above the last one before it %d", id, last)
			}
		})
	}
}
