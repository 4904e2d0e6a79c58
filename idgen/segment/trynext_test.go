package segment_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/segment"
	"github.com/leafproxy/leafproxy/internal/testenv"
)

// tryNextWithin calls TryNext and fails the test if it does not return within a few
// seconds: TryNext must never wait, not even for a load that never ends.
func tryNextWithin(t *testing.T, e *segment.Engine, tag string) (int64, bool) {
	t.Helper()
	type result struct {
		id int64
		ok bool
	}
	done := make(chan result, 1)
	go func() {
		id, ok := e.TryNext(tag)
		done <- result{id, ok}
	}()
	select {
	case r := <-done:
		return r.id, r.ok
	case <-time.After(5 * time.Second):
		t.Fatalf("TryNext(%q) blocked", tag)
		return 0, false
	}
}

// checkNoGaps verifies that the IDs of each tag are exactly first, first+1, … up to the
// highest one: with one engine reserving contiguous ranges, every segment below the one in
// use was used up entirely, so any hole is an ID lost by a caller.
func checkNoGaps(calls []call, first int64) error {
	byTag := map[string][]int64{}
	for _, c := range calls {
		byTag[c.tag] = append(byTag[c.tag], c.id)
	}
	for tag, ids := range byTag {
		slices.Sort(ids)
		for i, id := range ids {
			if want := first + int64(i); id != want {
				return fmt.Errorf("tag %q: the %d-th smallest ID is %d, want %d: an ID was lost or duplicated", tag, i+1, id, want)
			}
		}
	}
	return nil
}

// TestTryNextMixedWithNext draws with TryNext (falling back to Next, as the proxy does)
// and with Next from many goroutines over tiny segments, so that TryNext races with
// switches, preloads and waiting Next calls. The IDs must be unique, increasing in real
// time and without holes, on the fake store and on leaf_alloc.
func TestTryNextMixedWithNext(t *testing.T) {
	tags := []string{"a", "b", "c"}
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) segment.Store
	}{
		{"fake store", func(t *testing.T) segment.Store {
			store := newFakeStore()
			for _, tag := range tags {
				store.addTag(tag, 3, 0)
			}
			return store
		}},
		{"postgres", func(t *testing.T) segment.Store {
			pool := newPool(t, testenv.NewDatabase(t))
			for _, tag := range tags {
				insertTag(t, pool, tag, 3, 0)
			}
			return segment.NewPostgresStore(pool)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEngine(t, tc.store(t), segment.Settings{MaxStep: 12})
			var tries, hits atomic.Int64
			r := recorder{draw: func(ctx context.Context, e *segment.Engine, tag string, i int) (int64, error) {
				if i%3 == 0 {
					return e.Next(ctx, tag)
				}
				tries.Add(1)
				if id, ok := e.TryNext(tag); ok {
					hits.Add(1)
					return id, nil
				}
				return e.Next(ctx, tag)
			}}
			r.run(t, e, 8, 3000, tags)
			if len(r.calls) != 8*3000 {
				t.Fatalf("%d calls recorded, want %d", len(r.calls), 8*3000)
			}
			for _, check := range []func([]call) error{checkUnique, checkIncreasing, func(c []call) error { return checkNoGaps(c, 1) }} {
				if err := check(r.calls); err != nil {
					t.Fatal(err)
				}
			}
			if hits.Load() == 0 {
				t.Fatalf("TryNext never issued an ID in %d tries", tries.Load())
			}
			t.Logf("TryNext issued %d of %d tries; the rest fell back to Next", hits.Load(), tries.Load())
		})
	}
}

// TestTryNextRefusesWithoutCounting: wherever Next would refresh, wait or fail, TryNext
// answers false at once, issues nothing, runs no query and counts no unavailability; the
// Next that follows does what it always does.
func TestTryNextRefusesWithoutCounting(t *testing.T) {
	started := func(t *testing.T, store *fakeStore, s segment.Settings) *segment.Engine {
		t.Helper()
		store.addTag("order", 10, 0)
		return startEngine(t, store, s)
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, store *fakeStore, s segment.Settings) (*segment.Engine, string)
		// What the Next after the refusal answers (nil: an ID), and how many times it
		// counts the tag unavailable.
		nextErr     error
		unavailable int64
	}{
		{"unknown tag", func(t *testing.T, store *fakeStore, s segment.Settings) (*segment.Engine, string) {
			return started(t, store, s), "nope"
		}, idgen.ErrUnknownTag, 0},
		{"empty tag", func(t *testing.T, store *fakeStore, s segment.Settings) (*segment.Engine, string) {
			return started(t, store, s), ""
		}, idgen.ErrBadArgument, 0},
		{"tag created after the last refresh", func(t *testing.T, store *fakeStore, s segment.Settings) (*segment.Engine, string) {
			e := started(t, store, s)
			store.addTag("late", 10, 0) // Next reloads the list for it; TryNext must not
			return e, "late"
		}, nil, 0},
		{"row deleted and list refreshed", func(t *testing.T, store *fakeStore, s segment.Settings) (*segment.Engine, string) {
			e := started(t, store, s)
			mustNext(t, e, "order")
			store.removeTag("order")
			if err := e.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			return e, "order"
		}, idgen.ErrUnknownTag, 0},
		{"engine not started", func(t *testing.T, store *fakeStore, s segment.Settings) (*segment.Engine, string) {
			store.addTag("order", 10, 0)
			s.Store = store
			e, err := segment.New(s)
			if err != nil {
				t.Fatal(err)
			}
			return e, "order"
		}, idgen.ErrUnavailable, 0},
		{"engine closed", func(t *testing.T, store *fakeStore, s segment.Settings) (*segment.Engine, string) {
			e := started(t, store, s)
			mustNext(t, e, "order")
			if err := e.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			return e, "order"
		}, idgen.ErrUnavailable, 0},
		{"store down and both buffers used up", func(t *testing.T, store *fakeStore, s segment.Settings) (*segment.Engine, string) {
			e := started(t, store, s)
			mustNext(t, e, "order")
			store.setErr(errStoreDown) // the preload at the second ID fails
			for n := 1; ; n++ {
				if _, ok := tryNextWithin(t, e, "order"); !ok {
					break
				}
				if n > 9 {
					t.Fatal("TryNext issued more than the segment held")
				}
			}
			eventually(t, "the failed preload", func() bool { return snapshotOf(t, e, "order").LastError != "" })
			return e, "order"
		}, idgen.ErrUnavailable, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newFakeStore()
			var unavailable atomic.Int64
			e, tag := tc.setup(t, store, segment.Settings{
				Logger: quietLogger(),
				Hooks:  segment.Hooks{OnUnavailable: func(string) { unavailable.Add(1) }},
			})
			tagCalls, allocs := store.tagsCalls(), len(store.allocations())
			if id, ok := tryNextWithin(t, e, tag); ok {
				t.Fatalf("TryNext(%q) = %d, true; want false", tag, id)
			}
			if n := unavailable.Load(); n != 0 {
				t.Fatalf("TryNext counted the tag unavailable %d times", n)
			}
			if n := store.tagsCalls() - tagCalls; n != 0 {
				t.Fatalf("TryNext reloaded the tag list %d times", n)
			}
			if n := len(store.allocations()) - allocs; n != 0 {
				t.Fatalf("TryNext reserved %d segments", n)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := e.Next(ctx, tag)
			if !errors.Is(err, tc.nextErr) || (err == nil) != (tc.nextErr == nil) {
				t.Fatalf("Next after the refusal: %v, want %v", err, tc.nextErr)
			}
			if n := unavailable.Load(); n != tc.unavailable {
				t.Fatalf("Next counted the tag unavailable %d times, want %d", n, tc.unavailable)
			}
		})
	}
}

// TestTryNextDoesNotWaitForLoad: with the segment in use (or the first one) still loading,
// TryNext answers false without waiting, having started the load Next needs; the Next that
// follows waits for that same load and gets the next ID.
func TestTryNextDoesNotWaitForLoad(t *testing.T) {
	for _, tc := range []struct {
		name   string
		drawn  int   // IDs drawn with TryNext before the refusal
		want   int64 // the ID Next gets once the load ends
		allocs int   // reservations in all: TryNext's load is the one Next waits for
	}{
		{"first segment", 0, 1, 1},
		{"current segment used up, next one loading", 10, 11, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newFakeStore()
			store.addTag("t", 10, 0)
			e := startEngine(t, store, segment.Settings{})
			if tc.drawn > 0 {
				if id := mustNext(t, e, "t"); id != 1 { // below the preload point
					t.Fatalf("first ID %d, want 1", id)
				}
			}
			release := store.block()
			defer release()
			for want := int64(2); want <= int64(tc.drawn); want++ {
				if id, ok := tryNextWithin(t, e, "t"); !ok || id != want {
					t.Fatalf("TryNext = %d, %v; want %d, true", id, ok, want)
				}
			}
			if id, ok := tryNextWithin(t, e, "t"); ok {
				t.Fatalf("TryNext with nothing loaded = %d, true; want false", id)
			}
			if s := snapshotOf(t, e, "t"); !s.Loading || s.NextReady {
				t.Fatalf("after TryNext's refusal the load does not run: %+v", s)
			}

			got := make(chan int64, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				id, err := e.Next(ctx, "t")
				if err != nil {
					t.Errorf("Next: %v", err)
				}
				got <- id
			}()
			release()
			if id := <-got; id != tc.want {
				t.Fatalf("Next after the load = %d, want %d", id, tc.want)
			}
			if n := len(store.allocations()); n != tc.allocs {
				t.Fatalf("%d reservations, want %d: %v", n, tc.allocs, store.allocations())
			}
		})
	}
}

// TestTryNextAloneKeepsTheDoubleBuffer draws only with TryNext: it starts each preload at
// the preload point and switches to the loaded segment itself, so a caller that polls
// TryNext gets every ID in order without ever calling Next.
func TestTryNextAloneKeepsTheDoubleBuffer(t *testing.T) {
	store := newFakeStore()
	store.addTag("t", 10, 0)
	var loads atomic.Int64
	e := startEngine(t, store, segment.Settings{MaxStep: 10, Hooks: segment.Hooks{
		OnLoad: func(_ string, size int64, _ time.Duration, err error) {
			if err == nil && size > 0 {
				loads.Add(1)
			}
		},
	}})
	for want := int64(1); want <= 100; want++ {
		id, ok := tryNextWithin(t, e, "t")
		if want == 1 {
			// The first TryNext starts the first load and cannot wait for it.
			if ok {
				t.Fatalf("TryNext before any load = %d, true", id)
			}
			eventually(t, "the first segment", func() bool {
				id, ok = tryNextWithin(t, e, "t")
				return ok
			})
		}
		if !ok || id != want {
			t.Fatalf("TryNext = %d, %v; want %d, true", id, ok, want)
		}
		if want%10 == 2 {
			// The second ID of a segment is its preload point: TryNext has started the
			// load. Once it has landed, the TryNext after the segment's last ID must
			// switch to it by itself.
			eventually(t, "the preload", func() bool { return snapshotOf(t, e, "t").NextReady })
		}
	}
	if s := snapshotOf(t, e, "t"); s.Loads != loads.Load() || s.Loads != 11 {
		t.Fatalf("%d loads (OnLoad saw %d), want 11: ten segments used and one preloaded", s.Loads, loads.Load())
	}
}
