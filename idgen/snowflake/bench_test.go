package snowflake_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/idgen/worker"
)

// reportRate reports the IDs issued per millisecond and that rate as a percentage of the
// layout's limit (4,096 per ms per worker for 12 sequence bits).
func reportRate(b *testing.B, e *snowflake.Engine, start time.Time) {
	ms := float64(time.Since(start)) / float64(time.Millisecond)
	rate := float64(b.N) / ms
	b.ReportMetric(rate, "ids/ms")
	b.ReportMetric(100*rate/float64(e.Codec().Layout().MaxSequence()+1), "%limit")
}

func benchEngine(b *testing.B) *snowflake.Engine {
	b.Helper()
	log, _ := quietLogger()
	e, err := snowflake.New(snowflake.Settings{Source: worker.Static{ID: 1}, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	if err := e.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close(ctx) })
	return e
}

// BenchmarkNext issues IDs from one goroutine as fast as the engine allows. The engine
// saturates the sequence (4,096 per ms minus the random start of each ms) and waits for
// the next millisecond, so ids/ms shows how close it comes to the layout's limit.
//
// ids/ms counts wall-clock milliseconds, so it also drops when other processes take the
// CPU; ids/active-ms divides by the milliseconds that appear in the IDs instead, which
// shows whether the engine fills each millisecond it runs in.
func BenchmarkNext(b *testing.B) {
	e := benchEngine(b)
	shift := e.Codec().Layout().WorkerBits + e.Codec().Layout().SequenceBits
	b.ReportAllocs()
	start := time.Now()
	var active, lastMs int64 = 0, -1
	for b.Loop() {
		id, err := e.Next(ctx, "")
		if err != nil {
			b.Fatal(err)
		}
		if ms := id >> shift; ms != lastMs {
			active, lastMs = active+1, ms
		}
	}
	reportRate(b, e, start)
	b.ReportMetric(float64(b.N)/float64(active), "ids/active-ms")
}

// BenchmarkTryNext is BenchmarkNext through TryNext, falling back to Next when it refuses,
// as the proxy's event loop does: a refusal comes once per millisecond, when the sequence
// runs out. refusals/op is the share of calls that went to Next.
func BenchmarkTryNext(b *testing.B) {
	e := benchEngine(b)
	b.ReportAllocs()
	start := time.Now()
	var refused int
	for b.Loop() {
		if _, ok := e.TryNext(""); !ok {
			refused++
			if _, err := e.Next(ctx, ""); err != nil {
				b.Fatal(err)
			}
		}
	}
	reportRate(b, e, start)
	b.ReportMetric(float64(refused)/float64(b.N), "refusals/op")
}

// BenchmarkTryNextParallel is BenchmarkTryNext with GOMAXPROCS goroutines sharing one
// engine: TryNext also refuses while another goroutine holds the engine.
func BenchmarkTryNextParallel(b *testing.B) {
	e := benchEngine(b)
	b.ReportAllocs()
	start := time.Now()
	var refused atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		var mine int64
		for pb.Next() {
			if _, ok := e.TryNext(""); !ok {
				mine++
				if _, err := e.Next(ctx, ""); err != nil {
					b.Error(err)
					return
				}
			}
		}
		refused.Add(mine)
	})
	reportRate(b, e, start)
	b.ReportMetric(float64(refused.Load())/float64(b.N), "refusals/op")
}

// BenchmarkNextParallel is BenchmarkNext with GOMAXPROCS goroutines sharing one engine.
func BenchmarkNextParallel(b *testing.B) {
	e := benchEngine(b)
	b.ReportAllocs()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := e.Next(ctx, ""); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportRate(b, e, start)
}

// costEngine is an engine whose layout has 20 sequence bits, so that at benchmark speed it
// never runs out of sequence within a millisecond.
func costEngine(b *testing.B) *snowflake.Engine {
	b.Helper()
	log, _ := quietLogger()
	e, err := snowflake.New(snowflake.Settings{Source: worker.Static{ID: 1}, Logger: log,
		Layout: snowflake.Layout{TimeBits: 41, WorkerBits: 2, SequenceBits: 20}})
	if err != nil {
		b.Fatal(err)
	}
	if err := e.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close(ctx) })
	return e
}

// BenchmarkNextCost measures one ID without the waits for the next millisecond: a layout
// with 20 sequence bits never runs out within a millisecond at this speed.
func BenchmarkNextCost(b *testing.B) {
	e := costEngine(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.Next(ctx, ""); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTryNextCost is BenchmarkNextCost through TryNext.
func BenchmarkTryNextCost(b *testing.B) {
	e := costEngine(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := e.TryNext(""); !ok {
			b.Fatal("TryNext refused with the sequence far from used up")
		}
	}
}
