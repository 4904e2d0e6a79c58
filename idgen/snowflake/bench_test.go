package snowflake_test

import (
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

// BenchmarkNextCost measures one ID without the waits for the next millisecond: a layout
// with 20 sequence bits never runs out within a millisecond at this speed.
func BenchmarkNextCost(b *testing.B) {
	log, _ := quietLogger()
	e, err := snowflake.New(snowflake.Settings{Source: worker.Static{ID: 1}, Logger: log,
		Layout: snowflake.Layout{TimeBits: 41, WorkerBits: 2, SequenceBits: 20}})
	if err != nil {
		b.Fatal(err)
	}
	if err := e.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer e.Close(ctx)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.Next(ctx, ""); err != nil {
			b.Fatal(err)
		}
	}
}
