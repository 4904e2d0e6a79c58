package segment_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen/segment"
)

// call is one Next as a concurrent test saw it. start and end are ticks of one logical
// clock shared by every goroutine of the engine, taken right before Next is called and
// right after it returns, so end(a) < start(b) means a returned before b began.
type call struct {
	tag        string
	start, end int64
	id         int64
}

// recorder draws IDs from one engine on several goroutines and keeps every call.
type recorder struct {
	clock atomic.Int64
	// draw issues one ID; i counts the goroutine's calls. Nil means Engine.Next.
	draw  func(ctx context.Context, e *segment.Engine, tag string, i int) (int64, error)
	mu    sync.Mutex
	calls []call
}

// run has each of goroutines draw perGoroutine IDs, cycling through tags.
func (r *recorder) run(t testing.TB, e *segment.Engine, goroutines, perGoroutine int, tags []string) {
	t.Helper()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			mine := make([]call, 0, perGoroutine)
			for i := range perGoroutine {
				tag := tags[(g+i)%len(tags)]
				start := r.clock.Add(1)
				var id int64
				var err error
				if r.draw != nil {
					id, err = r.draw(ctx, e, tag, i)
				} else {
					id, err = e.Next(ctx, tag)
				}
				end := r.clock.Add(1)
				if err != nil {
					t.Errorf("Next(%q): %v", tag, err)
					return
				}
				mine = append(mine, call{tag: tag, start: start, end: end, id: id})
			}
			r.mu.Lock()
			r.calls = append(r.calls, mine...)
			r.mu.Unlock()
		})
	}
	wg.Wait()
}

// checkIncreasing verifies real-time order for one engine: for every tag, a call that began
// after another had returned got a larger ID. Checking each goroutine's own sequence is not
// enough (two goroutines could each see increasing IDs while the engine hands out an older
// ID after a newer one); this checks every ordered pair, in O(n log n): sweep calls by start,
// keeping the largest ID among calls that ended before it.
func checkIncreasing(calls []call) error {
	byTag := map[string][]call{}
	for _, c := range calls {
		byTag[c.tag] = append(byTag[c.tag], c)
	}
	for tag, cs := range byTag {
		byStart := slices.Clone(cs)
		slices.SortFunc(byStart, func(a, b call) int { return int(a.start - b.start) })
		byEnd := slices.Clone(cs)
		slices.SortFunc(byEnd, func(a, b call) int { return int(a.end - b.end) })
		var maxDone call
		j := 0
		for _, c := range byStart {
			for j < len(byEnd) && byEnd[j].end < c.start {
				if byEnd[j].id > maxDone.id {
					maxDone = byEnd[j]
				}
				j++
			}
			if c.id <= maxDone.id {
				return fmt.Errorf("tag %q: call [%d,%d] got %d, but call [%d,%d] that returned before it began got %d",
					tag, c.start, c.end, c.id, maxDone.start, maxDone.end, maxDone.id)
			}
		}
	}
	return nil
}

// checkUnique verifies that no (tag, ID) pair occurs twice across all the calls given.
func checkUnique(calls []call) error {
	seen := make(map[string]map[int64]bool)
	for _, c := range calls {
		if seen[c.tag] == nil {
			seen[c.tag] = make(map[int64]bool, len(calls))
		}
		if seen[c.tag][c.id] {
			return fmt.Errorf("tag %q: ID %d handed out twice", c.tag, c.id)
		}
		seen[c.tag][c.id] = true
	}
	return nil
}

func TestCheckIncreasingCatchesReordering(t *testing.T) {
	for _, tc := range []struct {
		name  string
		calls []call
		ok    bool
	}{
		{"sequential", []call{{"t", 1, 2, 10}, {"t", 3, 4, 11}}, true},
		{"overlapping may come in any order", []call{{"t", 1, 4, 11}, {"t", 2, 3, 10}}, true},
		{"older ID after a newer one returned", []call{{"t", 1, 2, 11}, {"t", 3, 4, 10}}, false},
		{"same ID twice", []call{{"t", 1, 2, 10}, {"t", 3, 4, 10}}, false},
		{"different goroutines, each increasing", []call{{"t", 1, 2, 5}, {"t", 3, 6, 7}, {"t", 4, 5, 4}}, false},
		{"tags are independent", []call{{"a", 1, 2, 11}, {"b", 3, 4, 10}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkIncreasing(tc.calls); (err == nil) != tc.ok {
				t.Fatalf("checkIncreasing = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestConcurrentNextIsUniqueAndIncreasing hammers tiny segments, so that many Next calls
// race with switches and loads.
func TestConcurrentNextIsUniqueAndIncreasing(t *testing.T) {
	store := newFakeStore()
	tags := []string{"a", "b", "c"}
	for _, tag := range tags {
		store.addTag(tag, 3, 0)
	}
	e := startEngine(t, store, segment.Settings{MaxStep: 40})
	var r recorder
	r.run(t, e, 8, 5000, tags)
	if err := checkUnique(r.calls); err != nil {
		t.Fatal(err)
	}
	if err := checkIncreasing(r.calls); err != nil {
		t.Fatal(err)
	}
	if n := len(store.allocations()); n < 100 {
		t.Fatalf("only %d loads: the test did not exercise switching", n)
	}
}
