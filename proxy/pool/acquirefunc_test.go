package pool

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestAcquireFunc: a connection free at once is returned at once; otherwise the caller
// waits in the same FIFO queue as Acquire's waiters and done gets the connection, or the
// wait's error; a cancelled wait never hears of one.
func TestAcquireFunc(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 1, QueryWaitTimeout: 5 * time.Second}})
	held := mustAcquire(t, f.p, keyA)
	done := func(ch chan result) func(*Wait[*memConn], *Server[*memConn], error) {
		return func(_ *Wait[*memConn], s *Server[*memConn], err error) { ch <- result{s, err} }
	}

	// Queued behind an Acquire that waits already.
	first := goAcquire(context.Background(), f.p, keyA)
	waitWaiting(t, f.p, keyA, 1)
	second := make(chan result, 1)
	s, w, err := f.p.AcquireFunc(keyA, done(second))
	if s != nil || w == nil || err != nil {
		t.Fatalf("AcquireFunc with none free = %v, %v, %v; want a wait", s, w, err)
	}
	waitWaiting(t, f.p, keyA, 2)
	held.Release(Clean)
	held = receive(t, first).s
	pending(t, second)
	held.Release(Clean)
	r := receive(t, second)
	if r.err != nil || r.s == nil {
		t.Fatalf("done got %v, %v", r.s, r.err)
	}
	held = r.s

	// Cancelled: done is never called, and the next release goes to nobody.
	third := make(chan result, 1)
	_, w, _ = f.p.AcquireFunc(keyA, done(third))
	waitWaiting(t, f.p, keyA, 1)
	if !f.p.CancelWait(w) {
		t.Fatal("CancelWait of a pending wait = false")
	}
	if f.p.CancelWait(w) {
		t.Fatal("CancelWait twice = true")
	}
	held.Release(Clean)
	pending(t, third)

	// Free at once.
	s, w, err = f.p.AcquireFunc(keyA, done(third))
	if s == nil || w != nil || err != nil {
		t.Fatalf("AcquireFunc with one free = %v, %v, %v", s, w, err)
	}
	held = s

	// The wait times out like Acquire's, and a finished wait cannot be cancelled.
	fourth := make(chan result, 1)
	_, w, _ = f.p.AcquireFunc(keyA, done(fourth))
	waitWaiting(t, f.p, keyA, 1)
	f.clock.Advance(6 * time.Second)
	if r := receive(t, fourth); !errors.Is(r.err, ErrWaitTimeout) {
		t.Fatalf("timed-out wait: %v, %v", r.s, r.err)
	}
	if f.p.CancelWait(w) {
		t.Fatal("CancelWait of a finished wait = true")
	}
	held.Release(Clean)
	f.p.Close()
	if _, _, err := f.p.AcquireFunc(keyA, done(fourth)); !errors.Is(err, ErrClosed) {
		t.Fatalf("AcquireFunc after Close: %v", err)
	}
}

// TestAcquireFuncIn: one Wait serves one wait after another, a cancelled one included,
// and a wait in it allocates nothing.
func TestAcquireFuncIn(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 1}})
	held := mustAcquire(t, f.p, keyA)
	var got *Server[*memConn]
	var gotWait *Wait[*memConn]
	done := func(w *Wait[*memConn], s *Server[*memConn], err error) {
		if err != nil {
			t.Errorf("done: %v", err)
		}
		gotWait, got = w, s
	}
	var wt Wait[*memConn]
	for round := range 3 {
		s, w, err := f.p.AcquireFuncIn(keyA, &wt, done)
		if s != nil || w != &wt || err != nil {
			t.Fatalf("round %d: AcquireFuncIn with none free = %v, %v, %v; want a wait in wt", round, s, w, err)
		}
		if round == 1 {
			if !f.p.CancelWait(w) {
				t.Fatal("CancelWait of a pending wait = false")
			}
			continue
		}
		held.Release(Clean)
		if got == nil || gotWait != &wt {
			t.Fatalf("round %d: done got %v in %p, want a connection in %p", round, got, gotWait, &wt)
		}
		held, got = got, nil
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, _, err := f.p.AcquireFuncIn(keyA, &wt, done); err != nil {
			t.Fatal(err)
		}
		held.Release(Clean)
		held, got = got, nil
	})
	if allocs != 0 {
		t.Fatalf("a wait in a kept Wait allocates %v times", allocs)
	}
	held.Release(Clean)
}
