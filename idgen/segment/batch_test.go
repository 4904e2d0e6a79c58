package segment_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/segment"
	"github.com/leafproxy/leafproxy/internal/testenv"
)

func mustBatch(t testing.TB, e *segment.Engine, tag string, n int) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ids, err := e.NextBatch(ctx, tag, n, nil)
	if err != nil {
		t.Fatalf("NextBatch(%q, %d): %v", tag, n, err)
	}
	if len(ids) != n {
		t.Fatalf("NextBatch(%q, %d) returned %d IDs", tag, n, len(ids))
	}
	return ids
}

func wantRange(t *testing.T, ids []int64, first int64) {
	t.Helper()
	for i, id := range ids {
		if id != first+int64(i) {
			t.Fatalf("ID %d of the batch is %d, want %d (batch %v)", i, id, first+int64(i), ids)
		}
	}
}

// TestNextBatchOneReservation: a batch that fits in the current segment is one range of
// it, contiguous, and costs no extra load beyond the usual preload; one larger than the
// segment spills into the next segments and stays strictly increasing.
func TestNextBatchOneReservation(t *testing.T) {
	store := newFakeStore()
	store.addTag("order", 100, 0)
	e := startEngine(t, store, segment.Settings{MaxStep: 100})
	if id := mustNext(t, e, "order"); id != 1 {
		t.Fatalf("first ID %d", id)
	}
	wantRange(t, mustBatch(t, e, "order", 5), 2)
	// 7..100 are the rest of the first segment, 101..250 come from the next two.
	wantRange(t, mustBatch(t, e, "order", 244), 7)
	if id := mustNext(t, e, "order"); id != 251 {
		t.Fatalf("Next after the batches = %d, want 251", id)
	}
	if n := len(store.allocations()); n > 4 {
		t.Fatalf("%d loads for 251 IDs of step 100", n)
	}
}

// TestNextBatchConcurrent mixes batches and single IDs from many goroutines over tiny
// segments: every batch is strictly increasing, no ID is issued twice, and none is lost.
func TestNextBatchConcurrent(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) segment.Store
	}{
		{"fake store", func(t *testing.T) segment.Store {
			store := newFakeStore()
			store.addTag("a", 7, 0)
			return store
		}},
		{"postgres", func(t *testing.T) segment.Store {
			pool := newPool(t, testenv.NewDatabase(t))
			insertTag(t, pool, "a", 7, 0)
			return segment.NewPostgresStore(pool)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEngine(t, tc.store(t), segment.Settings{MaxStep: 40})
			const workers, rounds = 6, 200
			var mu sync.Mutex
			var all []int64
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					defer cancel()
					var mine []int64
					for i := range rounds {
						n := 1 + (w*rounds+i)%23
						if i%4 == 0 {
							id, err := e.Next(ctx, "a")
							if err != nil {
								errs <- err
								return
							}
							mine = append(mine, id)
							continue
						}
						ids, err := e.NextBatch(ctx, "a", n, nil)
						if err != nil {
							errs <- err
							return
						}
						if len(ids) != n {
							errs <- errors.New("short batch")
							return
						}
						for j := 1; j < len(ids); j++ {
							if ids[j] <= ids[j-1] {
								errs <- errors.New("batch not strictly increasing")
								return
							}
						}
						mine = append(mine, ids...)
					}
					mu.Lock()
					all = append(all, mine...)
					mu.Unlock()
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			slices.Sort(all)
			for i, id := range all {
				if id != int64(i)+1 {
					t.Fatalf("the %d-th smallest ID is %d: an ID was lost or duplicated", i+1, id)
				}
			}
		})
	}
}

// TestNextBatchErrors: a bad count and an unknown tag fail with their sentinels; with the
// store down the batch returns what it could draw and ErrUnavailable.
func TestNextBatchErrors(t *testing.T) {
	store := newFakeStore()
	store.addTag("order", 10, 0)
	e := startEngine(t, store, segment.Settings{MaxStep: 10})
	ctx := context.Background()
	if _, err := e.NextBatch(ctx, "order", 0, nil); !errors.Is(err, idgen.ErrBadArgument) {
		t.Fatalf("n=0: %v", err)
	}
	if _, err := e.NextBatch(ctx, "nope", 3, nil); !errors.Is(err, idgen.ErrUnknownTag) {
		t.Fatalf("unknown tag: %v", err)
	}
	mustNext(t, e, "order")
	store.setErr(errStoreDown) // the preload at the second ID fails
	t.Cleanup(func() { store.setErr(nil) })
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ids, err := e.NextBatch(ctx, "order", 50, nil)
	if !errors.Is(err, idgen.ErrUnavailable) {
		t.Fatalf("store down: %v", err)
	}
	wantRange(t, ids, 2) // the rest of the first segment was issued, nothing else
	if len(ids) != 9 {
		t.Fatalf("store down: %d IDs issued, want 9", len(ids))
	}
}
