package segment_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/leafproxy/leafproxy/idgen/segment"
)

// benchStore answers at once and never limits: every tag has a step of MaxStep, so the
// benchmarks measure Next, including the amortized preload and switch every million IDs.
type benchStore struct {
	maxID atomic.Int64
	tags  []string
}

func (s *benchStore) Tags(context.Context) ([]string, error) { return s.tags, nil }

func (s *benchStore) Allocate(_ context.Context, _ string, step int64) (segment.Allocation, error) {
	size := max(step, segment.DefaultMaxStep)
	return segment.Allocation{Max: s.maxID.Add(size), Size: size, MinStep: segment.DefaultMaxStep}, nil
}

func (s *benchStore) GiveBack(context.Context, string, int64, int64) (bool, error) { return false, nil }

func benchEngine(b *testing.B, tags ...string) *segment.Engine {
	b.Helper()
	e := startEngine(b, &benchStore{tags: tags}, segment.Settings{})
	for _, tag := range tags {
		mustNext(b, e, tag) // load the first segment outside the timed loop
	}
	return e
}

func BenchmarkNext(b *testing.B) {
	e := benchEngine(b, "order")
	ctx := context.Background()
	b.ReportAllocs()
	var last int64
	for b.Loop() {
		id, err := e.Next(ctx, "order")
		if err != nil || id <= last {
			b.Fatalf("Next = %d, %v after %d", id, err, last)
		}
		last = id
	}
}

// BenchmarkTryNext is BenchmarkNext through TryNext, the call an event loop makes.
func BenchmarkTryNext(b *testing.B) {
	e := benchEngine(b, "order")
	b.ReportAllocs()
	var last, refused int64
	for b.Loop() {
		id, ok := e.TryNext("order")
		if !ok {
			refused++
			// The store answers at once, but the preload runs on its own goroutine and
			// may not have landed when a segment runs out: what the proxy would hand
			// to Next.
			b.StopTimer()
			id = mustNext(b, e, "order")
			b.StartTimer()
		}
		if id <= last {
			b.Fatalf("TryNext = %d after %d", id, last)
		}
		last = id
	}
	b.ReportMetric(float64(refused), "refusals")
}

// BenchmarkTryNextParallel is BenchmarkNextParallel through TryNext.
func BenchmarkTryNextParallel(b *testing.B) {
	e := benchEngine(b, "order")
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, ok := e.TryNext("order"); !ok {
				if _, err := e.Next(ctx, "order"); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// BenchmarkNextParallel has every goroutine draw from the same tag: the worst case, all
// cores adding to one counter.
func BenchmarkNextParallel(b *testing.B) {
	e := benchEngine(b, "order")
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := e.Next(ctx, "order"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkNextParallelTags spreads goroutines over 16 tags, as a proxy serving several
// tables does.
func BenchmarkNextParallelTags(b *testing.B) {
	tags := make([]string, 16)
	for i := range tags {
		tags[i] = fmt.Sprintf("table_%02d", i)
	}
	e := benchEngine(b, tags...)
	ctx := context.Background()
	var goroutine atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		tag := tags[int(goroutine.Add(1))%len(tags)]
		for pb.Next() {
			if _, err := e.Next(ctx, tag); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestNextDoesNotAllocate keeps the hot paths, Next and TryNext, allocation-free without a
// benchmark run.
func TestNextDoesNotAllocate(t *testing.T) {
	store := &benchStore{tags: []string{"order"}}
	e := startEngine(t, store, segment.Settings{})
	ctx := context.Background()
	mustNext(t, e, "order")
	if n := testing.AllocsPerRun(10_000, func() {
		if _, err := e.Next(ctx, "order"); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("Next allocates %v times per call with IDs buffered, want 0", n)
	}
	if n := testing.AllocsPerRun(10_000, func() {
		if _, ok := e.TryNext("order"); !ok {
			t.Fatal("TryNext with IDs buffered refused")
		}
	}); n != 0 {
		t.Fatalf("TryNext allocates %v times per call with IDs buffered, want 0", n)
	}
}
