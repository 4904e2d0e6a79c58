//go:build leafproxy_testclock

// This file exists only in binaries built with -tags leafproxy_testclock, for end-to-end
// tests of a clock that moves backwards. Release builds cannot contain it.

package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/leafproxy/leafproxy/idgen/snowflake"
)

func init() { newTestClock = makeTestClock }

// offsetClock is the system clock shifted by an offset that a test changes at run time.
// time.Time.Add shifts the monotonic reading too, so the engine sees the step.
type offsetClock struct {
	offset atomic.Int64 // nanoseconds
}

func (c *offsetClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

func (c *offsetClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func (c *offsetClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	if d <= time.Millisecond { // as the system clock does: a timer would wake late
		for start := time.Now(); time.Since(start) < d; {
			runtime.Gosched()
		}
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// makeTestClock returns the clock (its offset starts at $LEAFPROXY_TEST_CLOCK_OFFSET, a
// Go duration) and POST /debug/clock?offset=-6ms, which sets the offset.
func makeTestClock() (snowflake.Clock, func() time.Time, map[string]http.Handler, error) {
	c := &offsetClock{}
	if v := os.Getenv("LEAFPROXY_TEST_CLOCK_OFFSET"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("LEAFPROXY_TEST_CLOCK_OFFSET: %w", err)
		}
		c.offset.Store(int64(d))
	}
	set := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("offset"))
		if err != nil {
			http.Error(w, "offset must be a Go duration such as -6ms", http.StatusBadRequest)
			return
		}
		c.offset.Store(int64(d))
		fmt.Fprintf(w, "clock offset %s\n", d)
	})
	return c, c.Now, map[string]http.Handler{"POST /debug/clock": set}, nil
}
