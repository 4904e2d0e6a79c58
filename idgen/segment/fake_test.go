package segment_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/segment"
)

// fakeStore is an in-memory leaf_alloc a test can break, slow down and inspect.
type fakeStore struct {
	mu        sync.Mutex
	rows      map[string]*fakeRow
	err       error         // when set, every call fails with it
	gate      chan struct{} // when set, Allocate waits for it to close (or ctx)
	allocs    []fakeAlloc
	tagCalls  int
	giveBacks []fakeGiveBack
}

type fakeRow struct{ max, step int64 }

type fakeAlloc struct {
	tag       string
	requested int64
	lo, hi    int64 // the range (lo, hi]
}

type fakeGiveBack struct {
	tag           string
	expected, new int64
	ok            bool
}

var errStoreDown = errors.New("fake store: connection refused")

func newFakeStore() *fakeStore { return &fakeStore{rows: map[string]*fakeRow{}} }

func (f *fakeStore) addTag(tag string, step, maxID int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rows[tag] = &fakeRow{max: maxID, step: step}
}

func (f *fakeStore) removeTag(tag string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.rows, tag)
}

func (f *fakeStore) setErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

// block makes Allocate wait until the returned function is called.
func (f *fakeStore) block() (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := make(chan struct{})
	f.gate = g
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.gate = nil
			f.mu.Unlock()
			close(g)
		})
	}
}

func (f *fakeStore) maxID(tag string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rows[tag].max
}

func (f *fakeStore) allocations() []fakeAlloc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeAlloc(nil), f.allocs...)
}

func (f *fakeStore) tagsCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tagCalls
}

func (f *fakeStore) Tags(ctx context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tagCalls++
	if f.err != nil {
		return nil, f.err
	}
	var tags []string
	for t := range f.rows {
		tags = append(tags, t)
	}
	sort.Strings(tags)
	return tags, nil
}

func (f *fakeStore) Allocate(ctx context.Context, tag string, step int64) (segment.Allocation, error) {
	f.mu.Lock()
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return segment.Allocation{}, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return segment.Allocation{}, f.err
	}
	r := f.rows[tag]
	if r == nil {
		return segment.Allocation{}, fmt.Errorf("%w: %q", idgen.ErrUnknownTag, tag)
	}
	size := max(step, r.step)
	r.max += size
	f.allocs = append(f.allocs, fakeAlloc{tag: tag, requested: step, lo: r.max - size, hi: r.max})
	return segment.Allocation{Max: r.max, Size: size, MinStep: r.step}, nil
}

func (f *fakeStore) GiveBack(ctx context.Context, tag string, expected, newMax int64) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return false, f.err
	}
	r := f.rows[tag]
	ok := r != nil && r.max == expected
	if ok {
		r.max = newMax
	}
	f.giveBacks = append(f.giveBacks, fakeGiveBack{tag: tag, expected: expected, new: newMax, ok: ok})
	return ok, nil
}

// fakeClock is the engine's injected clock.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func quietLogger() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// startEngine builds and starts an engine over store, closing it when the test ends.
// Settings fields left zero get test-friendly values (fast retries, no stray refreshes).
func startEngine(t testing.TB, store segment.Store, s segment.Settings) *segment.Engine {
	t.Helper()
	s.Store = store
	if s.Logger == nil {
		s.Logger = quietLogger()
	}
	if s.RetryBackoff == 0 {
		s.RetryBackoff = 5 * time.Millisecond
	}
	if s.MaxRetryBackoff == 0 {
		s.MaxRetryBackoff = 20 * time.Millisecond
	}
	e, err := segment.New(s)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func snapshotOf(t testing.TB, e *segment.Engine, tag string) segment.TagSnapshot {
	t.Helper()
	for _, s := range e.Snapshot() {
		if s.Tag == tag {
			return s
		}
	}
	t.Fatalf("tag %q not in snapshot", tag)
	return segment.TagSnapshot{}
}

func mustNext(t testing.TB, e *segment.Engine, tag string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := e.Next(ctx, tag)
	if err != nil {
		t.Fatalf("Next(%q): %v", tag, err)
	}
	return id
}
