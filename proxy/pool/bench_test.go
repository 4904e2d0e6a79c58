package pool

import (
	"context"
	"runtime"
	"testing"
)

// BenchmarkAcquireRelease measures one borrow and give-back of an idle connection, the
// cost transaction pooling adds to every transaction.
func BenchmarkAcquireRelease(b *testing.B) {
	p, err := New[*memConn](newMemConnector(), Settings{Limits: Limits{PoolSize: 4}})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	mustAcquire(b, p, keyA).Release(Clean)
	b.ReportAllocs()
	for b.Loop() {
		s, err := p.Acquire(ctx, keyA)
		if err != nil {
			b.Fatal(err)
		}
		s.Release(Clean)
	}
}

// BenchmarkAcquireReleaseParallel is the same under contention: GOMAXPROCS borrowers
// over a pool of 4, so that some wait for a connection to come back.
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	p, err := New[*memConn](newMemConnector(), Settings{Limits: Limits{PoolSize: 4}})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s, err := p.Acquire(ctx, keyA)
			if err != nil {
				b.Error(err)
				return
			}
			s.CountTransaction(1)
			s.Release(Clean)
		}
	})
}

// BenchmarkAcquireReleaseWaiting is transaction pooling's shape: ten times more
// borrowers than connections (200 over 20 on two processors), each yielding while it
// holds one, so that most Acquires queue and are handed a connection by a Release.
func BenchmarkAcquireReleaseWaiting(b *testing.B) {
	p, err := New[*memConn](newMemConnector(), Settings{Limits: Limits{PoolSize: 20}})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	b.SetParallelism(200 / max(runtime.GOMAXPROCS(0), 1))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s, err := p.Acquire(ctx, keyA)
			if err != nil {
				b.Error(err)
				return
			}
			runtime.Gosched()
			s.CountTransaction(1)
			s.Release(Clean)
		}
	})
}
