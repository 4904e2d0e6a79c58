package snowflake_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/idgen/worker"
)

// t0 is an arbitrary wall-clock time for fake clocks: 2026-01-01T00:00:00Z.
const t0 = 1767225600000

var ctx = context.Background()

func mustNext(t *testing.T, e *snowflake.Engine) int64 {
	t.Helper()
	id, err := e.Next(ctx, "")
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return id
}

func TestNewValidates(t *testing.T) {
	src := worker.Static{ID: 1}
	for _, tc := range []struct {
		name string
		s    snowflake.Settings
		want error // nil: valid
	}{
		{"defaults", snowflake.Settings{Source: src}, nil},
		{"explicit default layout", snowflake.Settings{Source: src, Layout: snowflake.Layout{TimeBits: 41, WorkerBits: 10, SequenceBits: 12}}, nil},
		{"sonyflake-like layout", snowflake.Settings{Source: src, Layout: snowflake.Layout{TimeBits: 39, WorkerBits: 16, SequenceBits: 8}}, nil},
		{"62 bits", snowflake.Settings{Source: src, Layout: snowflake.Layout{TimeBits: 40, WorkerBits: 10, SequenceBits: 12}}, snowflake.ErrBadLayout},
		{"64 bits", snowflake.Settings{Source: src, Layout: snowflake.Layout{TimeBits: 42, WorkerBits: 10, SequenceBits: 12}}, snowflake.ErrBadLayout},
		{"no worker bits", snowflake.Settings{Source: src, Layout: snowflake.Layout{TimeBits: 51, SequenceBits: 12}}, snowflake.ErrBadLayout},
		{"negative bits", snowflake.Settings{Source: src, Layout: snowflake.Layout{TimeBits: 65, WorkerBits: -14, SequenceBits: 12}}, snowflake.ErrBadLayout},
		{"random start beyond sequence", snowflake.Settings{Source: src, Layout: snowflake.Layout{TimeBits: 41, WorkerBits: 17, SequenceBits: 5}}, snowflake.ErrBadLayout},
		{"random start disabled with small sequence", snowflake.Settings{Source: src, RandomStart: snowflake.NoRandomStart, Layout: snowflake.Layout{TimeBits: 41, WorkerBits: 17, SequenceBits: 5}}, nil},
		{"epoch before 1970", snowflake.Settings{Source: src, Epoch: time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC)}, snowflake.ErrBadLayout},
		{"no source", snowflake.Settings{}, snowflake.ErrNoSource},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := snowflake.New(tc.s)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("New: %v, want %v", err, tc.want)
			}
		})
	}
}

func TestComposeDecompose(t *testing.T) {
	custom, err := snowflake.NewCodec(snowflake.Layout{TimeBits: 39, WorkerBits: 16, SequenceBits: 8}, time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		codec snowflake.Codec
		parts snowflake.Parts
	}{
		{"epoch", snowflake.DefaultCodec(), snowflake.Parts{Millis: snowflake.DefaultEpochMillis}},
		{"typical", snowflake.DefaultCodec(), snowflake.Parts{Millis: t0 + 123, Worker: 17, Sequence: 99}},
		{"all ones", snowflake.DefaultCodec(), snowflake.Parts{Millis: snowflake.DefaultEpochMillis + 1<<41 - 1, Worker: 1023, Sequence: 4095}},
		{"custom layout", custom, snowflake.Parts{Millis: t0 + 5, Worker: 65535, Sequence: 255}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := tc.codec.Compose(tc.parts)
			if err != nil {
				t.Fatalf("Compose: %v", err)
			}
			if id < 0 {
				t.Fatalf("Compose gave a negative ID %d", id)
			}
			got := tc.codec.Decompose(id)
			want := tc.parts
			want.Time = time.UnixMilli(want.Millis).UTC()
			if got != want {
				t.Fatalf("Decompose(Compose(%+v)) = %+v", want, got)
			}
		})
	}
	for _, p := range []snowflake.Parts{
		{Millis: snowflake.DefaultEpochMillis - 1},
		{Millis: snowflake.DefaultEpochMillis + 1<<41},
		{Millis: t0, Worker: 1024},
		{Millis: t0, Sequence: 4096},
		{Millis: t0, Worker: -1},
	} {
		if _, err := snowflake.DefaultCodec().Compose(p); !errors.Is(err, snowflake.ErrBadLayout) {
			t.Errorf("Compose(%+v) = %v, want ErrBadLayout", p, err)
		}
	}
	// The bit positions by hand: 1 ms after the epoch, worker 1, sequence 1.
	if id, err := snowflake.DefaultCodec().Compose(snowflake.Parts{Millis: snowflake.DefaultEpochMillis + 1, Worker: 1, Sequence: 1}); err != nil || id != 1<<22|1<<12|1 {
		t.Errorf("Compose = %d, %v; want %d", id, err, 1<<22|1<<12|1)
	}
}

func TestEngineIDsCarryWorkerAndTime(t *testing.T) {
	clock := newFakeClock(t0)
	e := startEngine(t, snowflake.Settings{Source: worker.Static{ID: 42}, Clock: clock,
		Rand: func(n int64) int64 { return n - 1 }})
	id := mustNext(t, e)
	p := e.Decompose(id)
	if p.Worker != 42 || p.Millis != t0 || p.Sequence != 99 {
		t.Fatalf("Decompose(first ID) = %+v, want worker 42, %d ms, sequence 99 (the random start)", p, t0)
	}
	back, err := e.Compose(p)
	if err != nil || back != id {
		t.Fatalf("Compose(Decompose(id)) = %d, %v; want %d", back, err, id)
	}
	if p2 := e.Decompose(mustNext(t, e)); p2.Sequence != 100 || p2.Millis != t0 {
		t.Fatalf("second ID in the same ms = %+v, want sequence 100", p2)
	}
	clock.Add(time.Millisecond)
	if p3 := e.Decompose(mustNext(t, e)); p3.Sequence != 99 || p3.Millis != t0+1 {
		t.Fatalf("first ID of the next ms = %+v, want a fresh random start", p3)
	}
	in := e.Info()
	if !in.Running || !in.Held || in.WorkerID != 42 || in.Source != "static" || in.LastMillis != t0+1 ||
		in.Layout != snowflake.DefaultLayout || in.Epoch.UnixMilli() != snowflake.DefaultEpochMillis {
		t.Fatalf("Info = %+v", in)
	}
}

func TestClockBackwards(t *testing.T) {
	for _, tc := range []struct {
		name      string
		back      time.Duration
		wantErr   bool
		wantSleep time.Duration
	}{
		{"4 ms is waited out", 4 * time.Millisecond, false, 8 * time.Millisecond},
		{"5 ms is waited out", 5 * time.Millisecond, false, 10 * time.Millisecond},
		{"6 ms fails", 6 * time.Millisecond, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock(t0)
			var mu sync.Mutex
			var events []string
			e := startEngine(t, snowflake.Settings{Source: worker.Static{ID: 1}, Clock: clock, RandomStart: snowflake.NoRandomStart,
				Hooks: snowflake.Hooks{OnClockBackwards: func(off time.Duration, ok bool) {
					mu.Lock()
					defer mu.Unlock()
					events = append(events, off.String()+map[bool]string{true: " recovered", false: " failed"}[ok])
				}}})
			clock.Add(10 * time.Millisecond)
			before := mustNext(t, e)
			sleepsBefore := len(clock.Sleeps())
			clock.Add(-tc.back)
			id, err := e.Next(ctx, "")
			mu.Lock()
			got := append([]string(nil), events...)
			mu.Unlock()
			if tc.wantErr {
				if !errors.Is(err, idgen.ErrClockBackwards) {
					t.Fatalf("Next after going back %v = %d, %v; want ErrClockBackwards", tc.back, id, err)
				}
				if len(got) != 1 || got[0] != tc.back.String()+" failed" {
					t.Fatalf("hook events %v", got)
				}
				// Once the clock is past the last ID again, issue resumes.
				clock.Add(tc.back + time.Millisecond)
				if id := mustNext(t, e); id <= before {
					t.Fatalf("ID after recovery %d <= %d", id, before)
				}
				return
			}
			if err != nil {
				t.Fatalf("Next after going back %v: %v", tc.back, err)
			}
			if id <= before {
				t.Fatalf("ID after waiting %d <= previous %d: duplicate or reordered", id, before)
			}
			if s := clock.Sleeps()[sleepsBefore:]; len(s) != 1 || s[0] != tc.wantSleep {
				t.Fatalf("slept %v, want [%v] (twice the offset)", s, tc.wantSleep)
			}
			if len(got) != 1 || got[0] != tc.back.String()+" recovered" {
				t.Fatalf("hook events %v", got)
			}
		})
	}
}

func TestSequenceExhaustionWaitsForNextMilli(t *testing.T) {
	for _, start := range []int64{0, 37} {
		clock := newFakeClock(t0)
		exhausted := 0
		s := snowflake.Settings{Source: worker.Static{ID: 3}, Clock: clock,
			Rand:  func(int64) int64 { return start },
			Hooks: snowflake.Hooks{OnSequenceExhausted: func() { exhausted++ }}}
		if start == 0 {
			s.RandomStart = snowflake.NoRandomStart
		}
		e := startEngine(t, s)
		perMilli := 4096 - start
		seen := make(map[int64]bool, perMilli)
		prev := int64(-1)
		for i := int64(0); i < perMilli; i++ {
			id := mustNext(t, e)
			if id <= prev || seen[id] {
				t.Fatalf("start %d: ID %d not increasing (previous %d)", start, id, prev)
			}
			seen[id], prev = true, id
			if p := e.Decompose(id); p.Millis != t0 || p.Sequence != start+i {
				t.Fatalf("start %d: ID #%d = %+v, want %d ms, sequence %d", start, i, p, t0, start+i)
			}
		}
		if exhausted != 0 || len(clock.Sleeps()) != 0 {
			t.Fatalf("start %d: waited before the millisecond ran out", start)
		}
		id := mustNext(t, e)
		if p := e.Decompose(id); id <= prev || p.Millis != t0+1 || p.Sequence != start {
			t.Fatalf("start %d: ID after exhaustion = %+v, want the next ms with sequence %d", start, p, start)
		}
		if exhausted != 1 || len(clock.Sleeps()) != 1 || clock.Sleeps()[0] != time.Millisecond {
			t.Fatalf("start %d: exhausted %d times, slept %v; want once, 1ms", start, exhausted, clock.Sleeps())
		}
	}
}

func TestStartWaitsForHighWater(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ahead   time.Duration // how far the recorded mark is ahead of the clock
		maxWait time.Duration
		wantErr error
	}{
		{"mark in the past", -time.Second, 0, nil},
		{"mark equals now", 0, 0, nil},
		{"small gap is waited out", 300 * time.Millisecond, 0, nil},
		{"gap beyond the bound fails", 6 * time.Second, 0, idgen.ErrClockBackwards},
		{"custom bound", 2 * time.Second, time.Second, idgen.ErrClockBackwards},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock(t0)
			hw := t0 + tc.ahead.Milliseconds()
			src := &fakeSource{id: 5, highWater: hw}
			log, _ := quietLogger()
			e, err := snowflake.New(snowflake.Settings{Source: src, Clock: clock, MaxStartWait: tc.maxWait, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close(ctx)
			err = e.Start(ctx)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Start = %v, want %v", err, tc.wantErr)
				}
				if !src.Lease(0).closed.Load() {
					t.Fatal("the lease was not released after the failed start")
				}
				if _, err := e.Next(ctx, ""); !errors.Is(err, idgen.ErrUnavailable) {
					t.Fatalf("Next after failed Start = %v, want ErrUnavailable", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			if p := e.Decompose(mustNext(t, e)); p.Millis <= hw {
				t.Fatalf("first ID at %d ms, not after the high-water mark %d", p.Millis, hw)
			}
			if got := e.Info().HighWaterMillis; got != hw {
				t.Fatalf("Info().HighWaterMillis = %d, want %d", got, hw)
			}
		})
	}
}

func TestTimeBitsOverflow(t *testing.T) {
	last := snowflake.DefaultEpochMillis + 1<<41 - 1
	clock := newFakeClock(last)
	e := startEngine(t, snowflake.Settings{Source: worker.Static{ID: 1}, Clock: clock})
	id := mustNext(t, e)
	if id < 0 || e.Decompose(id).Millis != last {
		t.Fatalf("last representable ms gave %d (%+v)", id, e.Decompose(id))
	}
	clock.Add(time.Millisecond)
	for i := 0; i < 2; i++ {
		if id, err := e.Next(ctx, ""); !errors.Is(err, snowflake.ErrTimeOverflow) || !errors.Is(err, idgen.ErrUnavailable) {
			t.Fatalf("Next after the time bits ran out = %d, %v; want ErrTimeOverflow", id, err)
		}
	}

	late, err := snowflake.New(snowflake.Settings{Source: worker.Static{ID: 1}, Clock: newFakeClock(last + 1)})
	if err != nil {
		t.Fatal(err)
	}
	if err := late.Start(ctx); !errors.Is(err, snowflake.ErrTimeOverflow) {
		t.Fatalf("Start after the time bits ran out = %v, want ErrTimeOverflow", err)
	}
}

func TestWorkerIDMustFitLayout(t *testing.T) {
	for _, tc := range []struct {
		id     int64
		layout snowflake.Layout
		ok     bool
	}{
		{1023, snowflake.Layout{}, true},
		{1024, snowflake.Layout{}, false},
		{-1, snowflake.Layout{}, false},
		{31, snowflake.Layout{TimeBits: 41, WorkerBits: 5, SequenceBits: 17}, true},
		{32, snowflake.Layout{TimeBits: 41, WorkerBits: 5, SequenceBits: 17}, false},
	} {
		src := &fakeSource{id: tc.id}
		log, _ := quietLogger()
		e, err := snowflake.New(snowflake.Settings{Source: src, Layout: tc.layout, Clock: newFakeClock(t0), Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		err = e.Start(ctx)
		if tc.ok != (err == nil) || !tc.ok && !errors.Is(err, worker.ErrExhausted) {
			t.Errorf("worker %d, layout %v: Start = %v", tc.id, tc.layout, err)
		}
		e.Close(ctx)
	}
}

func TestFencedLeaseRefusesIDs(t *testing.T) {
	clock := newFakeClock(t0)
	src := &fakeSource{id: 9}
	e := startEngine(t, snowflake.Settings{Source: src, Clock: clock})
	mustNext(t, e)
	l := src.Lease(0)
	l.fence()
	if _, err := e.Next(ctx, ""); !errors.Is(err, idgen.ErrWorkerNotHeld) {
		t.Fatalf("Next on a fenced lease = %v, want ErrWorkerNotHeld", err)
	}
	if e.Info().Held {
		t.Fatal("Info().Held on a fenced lease")
	}
	l.regain()
	mustNext(t, e)
}

func TestLostLeaseIsReplaced(t *testing.T) {
	for _, tc := range []struct {
		name          string
		newID, newHW  int64
		wantAfterMark int64
	}{
		// The new ID was used until 50 ms ahead of us: wait for its mark.
		{"larger worker with a mark ahead", 10, t0 + 50, t0 + 50},
		// A smaller worker ID in the same millisecond would make a smaller ID.
		{"smaller worker, no mark", 3, 0, t0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock(t0)
			src := &fakeSource{id: 9, highWater: t0 - 1}
			var mu sync.Mutex
			var lost, acquired []int64
			e := startEngine(t, snowflake.Settings{Source: src, Clock: clock, Hooks: snowflake.Hooks{
				OnWorkerLost:     func(id int64) { mu.Lock(); lost = append(lost, id); mu.Unlock() },
				OnWorkerAcquired: func(id int64) { mu.Lock(); acquired = append(acquired, id); mu.Unlock() },
			}})
			first := mustNext(t, e)
			// The replacement waits for the gate, so that Next certainly runs in
			// between the loss and the new lease.
			gate := make(chan struct{})
			src.mu.Lock()
			src.id, src.highWater, src.gate = tc.newID, tc.newHW, gate
			src.mu.Unlock()
			src.Lease(0).lose()
			if _, err := e.Next(ctx, ""); !errors.Is(err, idgen.ErrWorkerNotHeld) {
				t.Fatalf("Next right after the loss = %v, want ErrWorkerNotHeld", err)
			}
			close(gate)
			var id int64
			waitUntil(t, 5*time.Second, "a new worker ID", func() bool {
				var err error
				id, err = e.Next(ctx, "")
				return err == nil
			})
			if p := e.Decompose(id); p.Worker != tc.newID || p.Millis <= tc.wantAfterMark || id <= first {
				t.Fatalf("ID after re-acquiring = %+v (%d, first %d), want worker %d after %d ms", p, id, first, tc.newID, tc.wantAfterMark)
			}
			if !src.Lease(0).closed.Load() {
				t.Fatal("lost lease not closed")
			}
			mu.Lock()
			defer mu.Unlock()
			if len(lost) != 1 || lost[0] != 9 || len(acquired) != 2 || acquired[1] != tc.newID {
				t.Fatalf("hooks: lost %v, acquired %v", lost, acquired)
			}
		})
	}
}

func TestRecordsHighWater(t *testing.T) {
	clock := newFakeClock(t0)
	src := &fakeSource{id: 2}
	e := startEngine(t, snowflake.Settings{Source: src, Clock: clock})
	for i := 0; i < 5; i++ {
		id := mustNext(t, e)
		if got, want := src.Lease(0).recorded.Load(), e.Decompose(id).Millis; got != want {
			t.Fatalf("recorded %d, want %d", got, want)
		}
		clock.Add(3 * time.Millisecond)
	}
}

func TestLifecycle(t *testing.T) {
	src := &fakeSource{id: 4}
	log, _ := quietLogger()
	e, err := snowflake.New(snowflake.Settings{Source: src, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Next(ctx, ""); !errors.Is(err, idgen.ErrUnavailable) {
		t.Fatalf("Next before Start = %v", err)
	}
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ctx); err == nil {
		t.Fatal("second Start succeeded")
	}
	mustNext(t, e)
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !src.Lease(0).closed.Load() {
		t.Fatal("Close did not release the lease")
	}
	if _, err := e.Next(ctx, ""); !errors.Is(err, idgen.ErrUnavailable) {
		t.Fatalf("Next after Close = %v", err)
	}
	if err := e.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	failing := &fakeSource{fail: worker.ErrExhausted}
	e2, _ := snowflake.New(snowflake.Settings{Source: failing, Logger: log})
	if err := e2.Start(ctx); !errors.Is(err, worker.ErrExhausted) {
		t.Fatalf("Start with a failing source = %v", err)
	}
}

func TestConcurrentIDsAreUniqueAndIncreasing(t *testing.T) {
	e := startEngine(t, snowflake.Settings{Source: worker.Static{ID: 7}})
	const goroutines, each = 8, 20000
	results := make([][]int64, goroutines)
	var wg sync.WaitGroup
	for g := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]int64, each)
			for i := range ids {
				id, err := e.Next(ctx, "")
				if err != nil {
					t.Error(err)
					return
				}
				ids[i] = id
			}
			results[g] = ids
		}()
	}
	wg.Wait()
	checkConcurrentIDs(t, results, func(id int64) bool {
		p := e.Decompose(id)
		return p.Worker == 7 && time.Since(p.Time) <= time.Minute && time.Until(p.Time) <= time.Second
	})
}

// checkConcurrentIDs checks IDs that goroutines drew at the same time, one slice per
// goroutine: no duplicates, each goroutine's increasing, and each one valid.
func checkConcurrentIDs(t *testing.T, results [][]int64, valid func(int64) bool) {
	t.Helper()
	seen := make(map[int64]bool)
	for _, ids := range results {
		for i, id := range ids {
			if seen[id] {
				t.Fatalf("duplicate ID %d", id)
			}
			seen[id] = true
			if i > 0 && id <= ids[i-1] {
				t.Fatalf("IDs of one goroutine not increasing: %d after %d", id, ids[i-1])
			}
			if !valid(id) {
				t.Fatalf("ID %d is not valid", id)
			}
		}
	}
}
