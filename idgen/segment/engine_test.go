package segment_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/segment"
)

func TestNewValidates(t *testing.T) {
	store := newFakeStore()
	for _, tc := range []struct {
		name string
		s    segment.Settings
		want error
	}{
		{"no store", segment.Settings{}, segment.ErrNoStore},
		{"threshold above 1", segment.Settings{Store: store, PreloadThreshold: 1.5}, segment.ErrBadSettings},
		{"negative threshold", segment.Settings{Store: store, PreloadThreshold: -0.1}, segment.ErrBadSettings},
		{"negative max step", segment.Settings{Store: store, MaxStep: -1}, segment.ErrBadSettings},
		{"huge max step", segment.Settings{Store: store, MaxStep: 1 << 50}, segment.ErrBadSettings},
		{"long below short", segment.Settings{Store: store, ShortSegment: time.Hour}, segment.ErrBadSettings},
		{"backoff above max", segment.Settings{Store: store, RetryBackoff: time.Minute}, segment.ErrBadSettings},
		{"negative refresh", segment.Settings{Store: store, RefreshInterval: -time.Second}, segment.ErrBadSettings},
		{"defaults", segment.Settings{Store: store}, nil},
		{"threshold 1", segment.Settings{Store: store, PreloadThreshold: 1}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := segment.New(tc.s)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("New: %v, want %v", err, tc.want)
			}
		})
	}
}

func TestStartTwiceAndAfterClose(t *testing.T) {
	store := newFakeStore()
	e := startEngine(t, store, segment.Settings{})
	ctx := context.Background()
	if err := e.Start(ctx); !errors.Is(err, segment.ErrStarted) {
		t.Fatalf("second Start: %v, want ErrStarted", err)
	}
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ctx); !errors.Is(err, segment.ErrClosed) {
		t.Fatalf("Start after Close: %v, want ErrClosed", err)
	}
}

func TestStartWaitsForStore(t *testing.T) {
	store := newFakeStore()
	store.addTag("a", 10, 1)
	store.setErr(errStoreDown)
	e, err := segment.New(segment.Settings{Store: store, Logger: quietLogger(), RetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := e.Start(ctx); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errStoreDown) {
		t.Fatalf("Start with the store down: %v, want deadline exceeded and the store's error", err)
	}
	if _, err := e.Next(context.Background(), "a"); !errors.Is(err, idgen.ErrUnavailable) {
		t.Fatalf("Next on an engine that did not start: %v, want ErrUnavailable", err)
	}
	store.setErr(nil)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := e.Start(ctx2); err != nil {
		t.Fatalf("Start after the store came back: %v", err)
	}
	defer e.Close(ctx2)
	if id := mustNext(t, e, "a"); id != 2 {
		t.Fatalf("first ID %d, want 2", id)
	}
}

func TestNextHandsOutConsecutiveIDsAcrossSegments(t *testing.T) {
	store := newFakeStore()
	store.addTag("order", 10, 1000)
	e := startEngine(t, store, segment.Settings{})
	for want := int64(1001); want <= 1100; want++ {
		if got := mustNext(t, e, "order"); got != want {
			t.Fatalf("Next = %d, want %d", got, want)
		}
	}
	// Preloading keeps at most one segment ahead: 1100 lies in one of the last two.
	allocs := store.allocations()
	if n := len(allocs); n < 2 || allocs[n-2].lo >= 1100 {
		t.Fatalf("after handing out 1100 the reservations run more than one segment ahead: %v", allocs)
	}
	for i := 1; i < len(allocs); i++ {
		if allocs[i].lo != allocs[i-1].hi {
			t.Fatalf("allocations not contiguous: %v", allocs)
		}
	}
}

func TestUnknownTagAndBadArguments(t *testing.T) {
	store := newFakeStore()
	store.addTag("order", 10, 1)
	e := startEngine(t, store, segment.Settings{})
	ctx := context.Background()
	for _, tc := range []struct {
		tag  string
		want error
	}{
		{"nope", idgen.ErrUnknownTag},
		{"ORDER", idgen.ErrUnknownTag},
		{"", idgen.ErrBadArgument},
	} {
		if _, err := e.Next(ctx, tc.tag); !errors.Is(err, tc.want) {
			t.Errorf("Next(%q): %v, want %v", tc.tag, err, tc.want)
		}
	}
	if got := e.Tags(); len(got) != 1 || got[0] != "order" {
		t.Errorf("Tags() = %v, want [order]", got)
	}
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Next(ctx, "order"); !errors.Is(err, idgen.ErrUnavailable) {
		t.Errorf("Next after Close: %v, want ErrUnavailable", err)
	}
}

func TestRefreshAddsAndRemovesTags(t *testing.T) {
	store := newFakeStore()
	store.addTag("a", 10, 1)
	e := startEngine(t, store, segment.Settings{RefreshInterval: 10 * time.Millisecond, MissRefresh: -1})
	mustNext(t, e, "a")

	store.addTag("b", 10, 1)
	eventually(t, "tag b to appear", func() bool {
		_, err := e.Next(context.Background(), "b")
		return err == nil
	})
	store.removeTag("a")
	eventually(t, "tag a to go", func() bool {
		_, err := e.Next(context.Background(), "a")
		return errors.Is(err, idgen.ErrUnknownTag)
	})
	if got := e.Tags(); len(got) != 1 || got[0] != "b" {
		t.Fatalf("Tags() = %v, want [b]", got)
	}
}

func TestUnknownTagRefreshesOnDemandRateLimited(t *testing.T) {
	store := newFakeStore()
	e := startEngine(t, store, segment.Settings{MissRefresh: time.Hour})
	before := store.tagsCalls()

	store.addTag("new", 10, 1)
	if id := mustNext(t, e, "new"); id != 2 {
		t.Fatalf("a tag created after start: ID %d, want 2", id)
	}
	if calls := store.tagsCalls() - before; calls != 1 {
		t.Fatalf("the miss reloaded the tag list %d times, want once", calls)
	}
	// Within the window further misses answer from the list they have.
	for range 100 {
		if _, err := e.Next(context.Background(), "typo"); !errors.Is(err, idgen.ErrUnknownTag) {
			t.Fatalf("Next(typo): %v, want ErrUnknownTag", err)
		}
	}
	if calls := store.tagsCalls() - before; calls != 1 {
		t.Fatalf("100 misses reloaded the tag list %d times, want once in the window", calls)
	}
}

func TestUnknownTagWhileStoreDownIsUnavailable(t *testing.T) {
	store := newFakeStore()
	e := startEngine(t, store, segment.Settings{})
	store.setErr(errStoreDown)
	_, err := e.Next(context.Background(), "new")
	if !errors.Is(err, idgen.ErrUnavailable) || !errors.Is(err, errStoreDown) {
		t.Fatalf("Next with the tag list unreadable: %v, want ErrUnavailable wrapping the store's error", err)
	}
}

func TestRowDeletedBetweenRefreshes(t *testing.T) {
	store := newFakeStore()
	store.addTag("gone", 10, 1)
	e := startEngine(t, store, segment.Settings{MissRefresh: -1})
	store.removeTag("gone")
	if _, err := e.Next(context.Background(), "gone"); !errors.Is(err, idgen.ErrUnknownTag) {
		t.Fatalf("Next for a deleted row: %v, want ErrUnknownTag", err)
	}
	eventually(t, "the tag to be dropped", func() bool { return len(e.Tags()) == 0 })
}

func TestWaitForLoadIsBoundedByContext(t *testing.T) {
	store := newFakeStore()
	store.addTag("slow", 10, 1)
	e := startEngine(t, store, segment.Settings{})
	release := store.block()
	defer release()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err := e.Next(ctx, "slow")
	took := time.Since(began)
	if !errors.Is(err, idgen.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next with a slow store: %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	if took < 40*time.Millisecond || took > 2*time.Second {
		t.Fatalf("Next returned after %v, want about the 50ms deadline", took)
	}
	if s := snapshotOf(t, e, "slow"); !s.Loading || s.Initialized {
		t.Fatalf("snapshot while loading: %+v", s)
	}

	// The load keeps going without the caller; a caller with time to wait gets its ID.
	got := make(chan int64)
	go func() {
		id, err := e.Next(context.Background(), "slow")
		if err != nil {
			t.Errorf("Next: %v", err)
		}
		got <- id
	}()
	release()
	if id := <-got; id != 2 {
		t.Fatalf("ID after the load finished: %d, want 2", id)
	}
}

// TestWaitForLoadCancelledIsNotAnOutage: a caller that cancels its wait for a load (a
// client cancelling its statement) gets context.Canceled, not ErrUnavailable, and is not
// counted as unavailable; a deadline that passes still is.
func TestWaitForLoadCancelledIsNotAnOutage(t *testing.T) {
	store := newFakeStore()
	store.addTag("slow", 10, 1)
	var unavailable atomic.Int64
	e := startEngine(t, store, segment.Settings{Hooks: segment.Hooks{OnUnavailable: func(string) { unavailable.Add(1) }}})
	release := store.block()
	defer release()

	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := e.Next(ctx, "slow")
		got <- err
	}()
	eventually(t, "a load in flight", func() bool { return snapshotOf(t, e, "slow").Loading })
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) || errors.Is(err, idgen.ErrUnavailable) {
		t.Fatalf("Next cancelled while the segment loads: %v, want context.Canceled and not ErrUnavailable", err)
	}
	if n := unavailable.Load(); n != 0 {
		t.Fatalf("OnUnavailable called %d times for a cancelled wait", n)
	}

	dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer dcancel()
	if _, err := e.Next(dctx, "slow"); !errors.Is(err, idgen.ErrUnavailable) {
		t.Fatalf("Next past its deadline while the segment loads: %v, want ErrUnavailable", err)
	}
	if n := unavailable.Load(); n != 1 {
		t.Fatalf("OnUnavailable called %d times after a deadline passed, want 1", n)
	}
}

func TestWaitingCallersShareOneLoad(t *testing.T) {
	store := newFakeStore()
	store.addTag("t", 1000, 0)
	e := startEngine(t, store, segment.Settings{})
	release := store.block()
	const callers = 16
	ids := make(chan int64, callers)
	for range callers {
		go func() {
			ids <- mustNext(t, e, "t")
		}()
	}
	eventually(t, "a load in flight", func() bool { return snapshotOf(t, e, "t").Loading })
	release()
	seen := map[int64]bool{}
	for range callers {
		id := <-ids
		if seen[id] || id < 1 || id > callers {
			t.Fatalf("ID %d duplicate or out of 1..%d", id, callers)
		}
		seen[id] = true
	}
	if n := len(store.allocations()); n > 2 {
		t.Fatalf("%d allocations for %d waiting callers, want one (plus at most one preload)", n, callers)
	}
}

func TestSnapshot(t *testing.T) {
	store := newFakeStore()
	store.addTag("a", 100, 1000)
	store.addTag("b", 10, 0)
	clock := newFakeClock()
	e := startEngine(t, store, segment.Settings{MaxStep: 150, Now: clock.Now})

	if got := e.Snapshot(); len(got) != 2 || got[0].Tag != "a" || got[1].Tag != "b" || got[0].Initialized {
		t.Fatalf("snapshot before any Next: %+v", got)
	}
	for range 10 {
		mustNext(t, e, "a") // 1001..1010: below the threshold (the 11th starts the preload)
	}
	s := snapshotOf(t, e, "a")
	want := segment.TagSnapshot{
		Tag: "a", Initialized: true, Pos: 0, Step: 100, MinStep: 100, Loads: 1, LastLoad: clock.Now(),
		Buffers: [2]segment.SegmentSnapshot{{Start: 1001, Max: 1100, Value: 1011, Step: 100, Idle: 90, LoadedAt: clock.Now()}},
	}
	if s != want {
		t.Fatalf("after 10 IDs:\n got %+v\nwant %+v", s, want)
	}

	clock.Advance(time.Minute)
	mustNext(t, e, "a") // 1011 starts the preload of a doubled step, capped at MaxStep
	eventually(t, "the preload", func() bool { return snapshotOf(t, e, "a").NextReady })
	for range 90 {
		mustNext(t, e, "a") // 1012..1100, then 1101 from the next buffer
	}
	s = snapshotOf(t, e, "a")
	want = segment.TagSnapshot{
		Tag: "a", Initialized: true, Pos: 1, Step: 150, MinStep: 100, Loads: 2, LastLoad: clock.Now(),
		Buffers: [2]segment.SegmentSnapshot{
			{Start: 1001, Max: 1100, Value: 1101, Step: 100, Idle: 0, LoadedAt: clock.Now().Add(-time.Minute)},
			{Start: 1101, Max: 1250, Value: 1102, Step: 150, Idle: 149, LoadedAt: clock.Now()},
		},
	}
	if s != want {
		t.Fatalf("after switching:\n got %+v\nwant %+v", s, want)
	}
}
