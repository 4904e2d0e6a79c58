package snowflake_test

import (
	"errors"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/snowflake"
)

// The lease's deadline is a value, not a flag: after a pause the first reading of the
// clock past the deadline is refused, although nothing (no renewal goroutine, no timer)
// has run to tell the engine the lease ended.
func TestFenceRefusesAReadingPastValidUntil(t *testing.T) {
	clock := newFakeClock(t0)
	src := &fakeSource{id: 7}
	e := startEngine(t, snowflake.Settings{Source: src, Clock: clock})
	l := src.Lease(0)
	until := time.UnixMilli(t0 + 100)
	l.setValidUntil(until)

	clock.Add(99*time.Millisecond + 999*time.Microsecond) // the last nanosecond but one
	last := mustNext(t, e)
	if p := e.Decompose(last); p.Millis != t0+99 {
		t.Fatalf("ID just before valid-until stamped %d ms, want %d", p.Millis, t0+99)
	}

	// The pause: the clock jumps past the deadline and no goroutine of the source runs.
	for _, d := range []time.Duration{time.Microsecond, 38 * time.Second} {
		clock.Add(d)
		if id, err := e.Next(ctx, ""); !errors.Is(err, idgen.ErrWorkerNotHeld) {
			t.Fatalf("Next at valid-until +%v = %d, %v; want ErrWorkerNotHeld", clock.Now().Sub(until), id, err)
		}
		if id, ok := e.TryNext(""); ok {
			t.Fatalf("TryNext at valid-until +%v issued %d", clock.Now().Sub(until), id)
		}
		if e.Info().Held {
			t.Fatalf("Info().Held at valid-until +%v", clock.Now().Sub(until))
		}
	}
	if got := l.recorded.Load(); got != t0+99 {
		t.Fatalf("recorded high-water %d after the refusals, want %d: a refused ID must record nothing", got, t0+99)
	}

	// A renewal moves the deadline: IDs resume, above the last one.
	l.setValidUntil(clock.Now().Add(time.Second))
	if id := mustNext(t, e); id <= last {
		t.Fatalf("ID after the renewal %d is not above %d", id, last)
	}
}

// A deadline that passes while Next waits (for the next millisecond, or for a clock that
// went back) is checked against the reading after the wait, the one the ID would carry.
func TestFenceChecksTheReadingAfterAWait(t *testing.T) {
	t.Run("next millisecond", func(t *testing.T) {
		clock := newFakeClock(t0)
		src := &fakeSource{id: 3}
		e := startEngine(t, snowflake.Settings{Source: src, Clock: clock, RandomStart: snowflake.NoRandomStart})
		src.Lease(0).setValidUntil(time.UnixMilli(t0 + 1))
		for range 4096 {
			if p := e.Decompose(mustNext(t, e)); p.Millis != t0 {
				t.Fatalf("ID stamped %d ms, want %d", p.Millis, t0)
			}
		}
		// The sequence is used up: Next waits for t0+1 ms, which is the deadline.
		if id, err := e.Next(ctx, ""); !errors.Is(err, idgen.ErrWorkerNotHeld) {
			t.Fatalf("Next after waiting into the deadline = %+v, %v; want ErrWorkerNotHeld", e.Decompose(id), err)
		}
	})
	t.Run("clock backwards", func(t *testing.T) {
		clock := newFakeClock(t0)
		src := &fakeSource{id: 3}
		e := startEngine(t, snowflake.Settings{Source: src, Clock: clock})
		clock.Add(10 * time.Millisecond)
		mustNext(t, e)
		src.Lease(0).setValidUntil(time.UnixMilli(t0 + 12))
		clock.Add(-3 * time.Millisecond) // t0+7: Next waits 6 ms, to t0+13
		if id, err := e.Next(ctx, ""); !errors.Is(err, idgen.ErrWorkerNotHeld) {
			t.Fatalf("Next after waiting out the clock past the deadline = %+v, %v; want ErrWorkerNotHeld", e.Decompose(id), err)
		}
	})
}

// No ID ever carries a time at or after valid-until, whatever the steps of the clock.
func TestFenceNoStampAtOrAfterValidUntil(t *testing.T) {
	clock := newFakeClock(t0)
	src := &fakeSource{id: 1}
	e := startEngine(t, snowflake.Settings{Source: src, Clock: clock})
	until := time.UnixMilli(t0 + 50).Add(300 * time.Microsecond)
	src.Lease(0).setValidUntil(until)
	issued, refused := 0, 0
	for range 2000 {
		clock.Add(37 * time.Microsecond)
		id, err := e.Next(ctx, "")
		switch {
		case err == nil:
			issued++
			if at := time.UnixMilli(e.Decompose(id).Millis); !at.Before(until) {
				t.Fatalf("ID %d stamped %v, not before valid-until %v", id, at, until)
			}
		case errors.Is(err, idgen.ErrWorkerNotHeld):
			refused++
			if clock.Now().Before(until) {
				t.Fatalf("refused at %v, before valid-until %v", clock.Now(), until)
			}
		default:
			t.Fatal(err)
		}
	}
	if issued == 0 || refused == 0 {
		t.Fatalf("%d issued, %d refused: the test must cross the deadline", issued, refused)
	}
}
