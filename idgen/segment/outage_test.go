package segment_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/segment"
)

// failFast is how long Next may take to report an outage the engine already knows of.
// The caller's deadline is far longer, so passing shows Next did not wait it out.
const failFast = 2 * time.Second

// nextWithin calls Next with a generous deadline and reports how long it took.
func nextWithin(e *segment.Engine, tag string) (int64, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	id, err := e.Next(ctx, tag)
	return id, time.Since(began), err
}

func TestStoreOutage(t *testing.T) {
	for _, tc := range []struct {
		name       string
		nextLoaded bool // the next segment was preloaded before the outage
	}{
		{"current segment only", false},
		{"both segments", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newFakeStore()
			store.addTag("t", 100, 0)
			var unavailable atomic.Int64
			e := startEngine(t, store, segment.Settings{
				MaxStep: 200,
				Hooks:   segment.Hooks{OnUnavailable: func(string) { unavailable.Add(1) }},
			})
			last := mustNext(t, e, "t")
			if tc.nextLoaded {
				for s := snapshotOf(t, e, "t"); !s.Loading && !s.NextReady; s = snapshotOf(t, e, "t") {
					last = mustNext(t, e, "t")
				}
				eventually(t, "the preload", func() bool { return snapshotOf(t, e, "t").NextReady })
			}
			store.setErr(errStoreDown)
			allocs := store.allocations()
			buffered := allocs[len(allocs)-1].hi
			if want := map[bool]int{false: 1, true: 2}[tc.nextLoaded]; len(allocs) != want {
				t.Fatalf("%d segments loaded before the outage, want %d: %v", len(allocs), want, allocs)
			}

			// Everything buffered keeps coming, in order.
			for last < buffered {
				id, _, err := nextWithin(e, "t")
				if err != nil {
					t.Fatalf("Next with %d buffered: %v", buffered-last, err)
				}
				if id != last+1 {
					t.Fatalf("Next = %d after %d", id, last)
				}
				last = id
			}
			// Then it fails fast, every time.
			for range 5 {
				_, took, err := nextWithin(e, "t")
				if !errors.Is(err, idgen.ErrUnavailable) || !errors.Is(err, errStoreDown) {
					t.Fatalf("Next with the buffers empty: %v, want ErrUnavailable wrapping the store error", err)
				}
				if took > failFast {
					t.Fatalf("Next took %v to report a known outage", took)
				}
			}
			if unavailable.Load() < 5 {
				t.Fatalf("OnUnavailable called %d times, want at least 5", unavailable.Load())
			}
			if s := snapshotOf(t, e, "t"); s.LastError == "" || !s.Loading {
				t.Fatalf("snapshot during the outage does not show the failing retry: %+v", s)
			}

			// The engine recovers by itself.
			store.setErr(nil)
			var id int64
			eventually(t, "recovery", func() bool {
				var err error
				id, _, err = nextWithin(e, "t")
				return err == nil
			})
			if id <= last {
				t.Fatalf("after recovery Next = %d, not above %d", id, last)
			}
			if s := snapshotOf(t, e, "t"); s.LastError != "" {
				t.Fatalf("snapshot after recovery still shows an error: %+v", s)
			}
		})
	}
}

func TestFirstLoadFailsThenRecovers(t *testing.T) {
	store := newFakeStore()
	store.addTag("t", 10, 0)
	var loads, failed atomic.Int64
	e := startEngine(t, store, segment.Settings{Hooks: segment.Hooks{OnLoad: func(tag string, size int64, took time.Duration, err error) {
		loads.Add(1)
		if err != nil {
			failed.Add(1)
		}
	}}})
	store.setErr(errStoreDown)
	_, took, err := nextWithin(e, "t")
	if !errors.Is(err, idgen.ErrUnavailable) {
		t.Fatalf("first Next with the store down: %v, want ErrUnavailable", err)
	}
	if took > failFast {
		t.Fatalf("first Next took %v to fail on a refused connection", took)
	}
	eventually(t, "retries in the background", func() bool { return failed.Load() >= 3 })
	store.setErr(nil)
	eventually(t, "recovery", func() bool { _, _, err := nextWithin(e, "t"); return err == nil })
	if loads.Load() <= failed.Load() {
		t.Fatalf("OnLoad saw %d loads, %d failed: no success recorded", loads.Load(), failed.Load())
	}
}

func TestCloseCancelsLoadAfterDeadline(t *testing.T) {
	store := newFakeStore()
	store.addTag("t", 10, 0)
	e := startEngine(t, store, segment.Settings{})
	release := store.block()
	defer release()
	errc := make(chan error, 1)
	go func() {
		_, err := e.Next(context.Background(), "t")
		errc <- err
	}()
	eventually(t, "a load in flight", func() bool { return snapshotOf(t, e, "t").Loading })

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := e.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-errc; !errors.Is(err, idgen.ErrUnavailable) {
		t.Fatalf("Next waiting while the engine closed: %v, want ErrUnavailable", err)
	}
	if got := store.maxID("t"); got != 0 {
		t.Fatalf("max_id %d after a canceled load, want 0", got)
	}
}

func TestCloseGivesBackSegmentLoadedWhileClosing(t *testing.T) {
	store := newFakeStore()
	store.addTag("t", 10, 0)
	e := startEngine(t, store, segment.Settings{})
	mustNext(t, e, "t")
	release := store.block()
	var last int64
	for !snapshotOf(t, e, "t").Loading {
		last = mustNext(t, e, "t")
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- e.Close(ctx)
	}()
	// Close waits for the load; once it lands, it goes back along with the tail.
	eventually(t, "Close to begin", func() bool { return len(e.Tags()) == 0 })
	if _, err := e.Next(context.Background(), "t"); !errors.Is(err, idgen.ErrUnavailable) {
		t.Fatalf("Next while closing: %v, want ErrUnavailable", err)
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := store.maxID("t"); got != last {
		t.Fatalf("max_id %d after Close, want %d (the last ID handed out)", got, last)
	}
	if n := len(store.allocations()); n != 2 {
		t.Fatalf("%d allocations, want 2 (the first segment and the preload)", n)
	}
}

func TestCloseDuringOutageIsPrompt(t *testing.T) {
	store := newFakeStore()
	store.addTag("t", 10, 0)
	e := startEngine(t, store, segment.Settings{RetryBackoff: time.Hour, MaxRetryBackoff: time.Hour})
	mustNext(t, e, "t")
	store.setErr(errStoreDown)
	for {
		if _, _, err := nextWithin(e, "t"); err != nil {
			break // the preload failed and the buffer ran out: the loader now waits an hour
		}
	}
	// Another attempt now would hang until Close's deadline.
	release := store.block()
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	began := time.Now()
	if err := e.Close(ctx); err != nil { // the segment is used up: nothing to give back
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(began); took > failFast {
		t.Fatalf("Close took %v with a loader waiting to retry", took)
	}
	calls := len(store.allocations())
	if calls != 1 {
		t.Fatalf("%d successful allocations, want 1", calls)
	}
}

// TestMaxIDMovedBackwardsIsRefused: someone lowers max_id by hand under a running engine.
// The engine must not hand out the overlapping range again; it reports the store as
// unavailable until max_id is past what it reserved.
func TestMaxIDMovedBackwardsIsRefused(t *testing.T) {
	store := newFakeStore()
	store.addTag("t", 10, 1000)
	e := startEngine(t, store, segment.Settings{MaxStep: 10})
	seen := map[int64]bool{}
	for range 5 {
		seen[mustNext(t, e, "t")] = true // the preload of (1010, 1020] runs meanwhile
	}
	eventually(t, "the preload", func() bool { return snapshotOf(t, e, "t").NextReady })
	// Back to 0: the engine's retries would need a hundred refused reservations to get
	// past 1020 by themselves, far longer than the loop below takes.
	store.mu.Lock()
	store.rows["t"].max = 0
	store.mu.Unlock()

	var err error
	for range 100 {
		var id int64
		if id, _, err = nextWithin(e, "t"); err != nil {
			break
		}
		if seen[id] {
			t.Fatalf("ID %d handed out twice after max_id moved backwards", id)
		}
		seen[id] = true
	}
	if !errors.Is(err, idgen.ErrUnavailable) {
		t.Fatalf("Next after max_id moved backwards: %v, want ErrUnavailable", err)
	}
	if s := snapshotOf(t, e, "t"); !strings.Contains(s.LastError, "moved backwards") {
		t.Fatalf("snapshot error %q does not say max_id moved backwards", s.LastError)
	}
	// Once max_id is past our reservations again, the engine carries on by itself.
	store.mu.Lock()
	store.rows["t"].max = 5000
	store.mu.Unlock()
	var id int64
	eventually(t, "recovery", func() bool {
		id, _, err = nextWithin(e, "t")
		return err == nil
	})
	if id <= 5000 || seen[id] {
		t.Fatalf("after recovery Next = %d, want a fresh ID above 5000", id)
	}
}
