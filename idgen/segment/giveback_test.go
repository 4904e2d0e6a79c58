package segment_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen/segment"
)

// TestCloseGivesBackTail covers what Close may hand back: only IDs never handed out, and
// only when the store's max_id is still our newest reservation.
func TestCloseGivesBackTail(t *testing.T) {
	for _, tc := range []struct {
		name string
		// run hands out IDs (and may reserve for another process through other); it
		// returns the max_id expected after Close and whether a restart continues from it.
		run func(t *testing.T, e *segment.Engine, store *fakeStore, other func()) (want int64, noGap bool)
	}{
		{"nothing loaded", func(t *testing.T, e *segment.Engine, store *fakeStore, other func()) (int64, bool) {
			return 0, true
		}},
		{"current segment only", func(t *testing.T, e *segment.Engine, store *fakeStore, other func()) (int64, bool) {
			return drawN(t, e, 5), true
		}},
		{"next segment loaded right after the current one", func(t *testing.T, e *segment.Engine, store *fakeStore, other func()) (int64, bool) {
			last := drawUntilNextReady(t, e)
			return last, true
		}},
		{"current used up, next loaded", func(t *testing.T, e *segment.Engine, store *fakeStore, other func()) (int64, bool) {
			drawUntilNextReady(t, e)
			cur := snapshotOf(t, e, "t")
			last := drawN(t, e, int(cur.Buffers[cur.Pos].Idle))
			if s := snapshotOf(t, e, "t"); !s.NextReady || s.Buffers[s.Pos].Idle != 0 {
				t.Fatalf("setup: %+v", s)
			}
			return last, true
		}},
		{"another process reserved between our two segments", func(t *testing.T, e *segment.Engine, store *fakeStore, other func()) (int64, bool) {
			drawN(t, e, 1)
			other()
			drawUntilNextReady(t, e)
			a := store.allocations()
			return a[len(a)-1].lo, false // only our whole next segment goes back
		}},
		{"another process reserved after us", func(t *testing.T, e *segment.Engine, store *fakeStore, other func()) (int64, bool) {
			drawN(t, e, 5)
			other()
			a := store.allocations()
			return a[len(a)-1].hi, false
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newFakeStore()
			store.addTag("t", 100, 0)
			e := startEngine(t, store, segment.Settings{})
			other := func() {
				if _, err := store.Allocate(context.Background(), "t", 0); err != nil {
					t.Fatal(err)
				}
			}
			want, noGap := tc.run(t, e, store, other)
			maxHandedOut := lastHandedOut(e)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := e.Close(ctx); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if got := store.maxID("t"); got != want {
				t.Fatalf("max_id after Close = %d, want %d (allocations %v)", got, want, store.allocations())
			}
			// A clean restart continues right after the last ID handed out, or at least
			// never at or below it.
			e2 := startEngine(t, store, segment.Settings{})
			first := mustNext(t, e2, "t")
			if first <= maxHandedOut {
				t.Fatalf("restart handed out %d, at or below %d handed out before", first, maxHandedOut)
			}
			if noGap && first != maxHandedOut+1 {
				t.Fatalf("restart handed out %d, want %d (no gap)", first, maxHandedOut+1)
			}
		})
	}
}

// drawN hands out n IDs of tag "t" and returns the last (0 when n is 0).
func drawN(t *testing.T, e *segment.Engine, n int) int64 {
	t.Helper()
	var last int64
	for range n {
		last = mustNext(t, e, "t")
	}
	return last
}

// drawUntilNextReady hands out IDs until the next segment is loaded, returning the last.
func drawUntilNextReady(t *testing.T, e *segment.Engine) int64 {
	t.Helper()
	var last int64
	for s := snapshotOf(t, e, "t"); !s.Loading && !s.NextReady; s = snapshotOf(t, e, "t") {
		last = mustNext(t, e, "t")
	}
	eventually(t, "the preload", func() bool { return snapshotOf(t, e, "t").NextReady })
	return last
}

// lastHandedOut reads the highest ID handed out for tag "t" from the snapshot.
func lastHandedOut(e *segment.Engine) int64 {
	var last int64
	for _, s := range e.Snapshot() {
		for _, b := range s.Buffers {
			if b.Step > 0 && b.Value-1 >= b.Start {
				last = max(last, b.Value-1)
			}
		}
	}
	return last
}

// TestCloseUnderLoadGivesBackNothingHandedOut closes the engine while goroutines keep
// calling Next: whatever they got before Close stopped them must stay below the max_id
// Close leaves, so a restart cannot hand it out again.
func TestCloseUnderLoadGivesBackNothingHandedOut(t *testing.T) {
	for round := range 20 {
		store := newFakeStore()
		store.addTag("t", 1000, 0)
		e := startEngine(t, store, segment.Settings{})
		mustNext(t, e, "t")
		var wg sync.WaitGroup
		highest := make([]int64, 4)
		var started sync.WaitGroup
		started.Add(len(highest))
		for g := range highest {
			wg.Go(func() {
				started.Done()
				for {
					id, err := e.Next(context.Background(), "t")
					if err != nil {
						return
					}
					highest[g] = id
				}
			})
		}
		started.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := e.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		cancel()
		wg.Wait()
		top := store.maxID("t")
		for _, h := range highest {
			if h > top {
				t.Fatalf("round %d: ID %d was handed out but max_id is %d after Close", round, h, top)
			}
		}
	}
}
