package worker_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/leafproxy/leafproxy/idgen/worker"
)

func TestStatic(t *testing.T) {
	for _, tc := range []struct {
		id int64
		ok bool
	}{{0, true}, {1023, true}, {-1, false}} {
		src := worker.Static{ID: tc.id}
		l, err := src.Acquire(context.Background())
		if tc.ok != (err == nil) {
			t.Fatalf("Static{%d}.Acquire = %v", tc.id, err)
		}
		if err != nil {
			continue
		}
		if l.WorkerID() != tc.id || !l.ValidUntil().IsZero() || l.Done() != nil || l.HighWater() != 0 || src.Name() != "static" {
			t.Fatalf("Static{%d} lease: id %d valid until %v high-water %d", tc.id, l.WorkerID(), l.ValidUntil(), l.HighWater())
		}
		if err := l.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRecordMaxKeepsTheLargest(t *testing.T) {
	var v atomic.Int64
	var wg sync.WaitGroup
	for g := int64(0); g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int64(0); i < 1000; i++ {
				worker.RecordMax(&v, g*1000+i)
			}
		}()
	}
	wg.Wait()
	if got := v.Load(); got != 7999 {
		t.Fatalf("RecordMax kept %d, want 7999", got)
	}
	worker.RecordMax(&v, 5)
	if got := v.Load(); got != 7999 {
		t.Fatalf("a smaller value lowered the mark to %d", got)
	}
}
