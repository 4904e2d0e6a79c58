package segment_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/segment"
	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/migrations"
)

// newPool migrates the database at dsn and returns a pool on it, closed when the test ends.
func newPool(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	if err := migrations.Up(dsn); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = 15 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func insertTag(t testing.TB, pool *pgxpool.Pool, tag string, step, maxID int64) {
	t.Helper()
	_, err := pool.Exec(context.Background(),
		`INSERT INTO leaf_alloc (biz_tag, max_id, step, description) VALUES ($1, $2, $3, 'test')`, tag, maxID, step)
	if err != nil {
		t.Fatalf("insert tag %q: %v", tag, err)
	}
}

func maxIDOf(t testing.TB, pool *pgxpool.Pool, tag string) int64 {
	t.Helper()
	var m int64
	if err := pool.QueryRow(context.Background(), `SELECT max_id FROM leaf_alloc WHERE biz_tag = $1`, tag).Scan(&m); err != nil {
		t.Fatalf("max_id of %q: %v", tag, err)
	}
	return m
}

func TestPostgresStore(t *testing.T) {
	pool := newPool(t, testenv.NewDatabase(t))
	store := segment.NewPostgresStore(pool)
	ctx := context.Background()

	if tags, err := store.Tags(ctx); err != nil || len(tags) != 0 {
		t.Fatalf("Tags on an empty table = %v, %v", tags, err)
	}
	insertTag(t, pool, "b", 5, 100)
	if _, err := pool.Exec(ctx, `INSERT INTO leaf_alloc (biz_tag, step) VALUES ('a', 10)`); err != nil {
		t.Fatal(err)
	}
	if tags, err := store.Tags(ctx); err != nil || !slices.Equal(tags, []string{"a", "b"}) {
		t.Fatalf("Tags = %v, %v; want [a b]", tags, err)
	}

	for _, tc := range []struct {
		name string
		tag  string
		step int64
		want segment.Allocation
		err  error
	}{
		{"step 0 reserves the column's step from the default max_id 1", "a", 0, segment.Allocation{Max: 11, Size: 10, MinStep: 10}, nil},
		{"a larger step", "a", 25, segment.Allocation{Max: 36, Size: 25, MinStep: 10}, nil},
		{"a smaller step gets the column's", "a", 3, segment.Allocation{Max: 46, Size: 10, MinStep: 10}, nil},
		{"another tag is independent", "b", 0, segment.Allocation{Max: 105, Size: 5, MinStep: 5}, nil},
		{"unknown tag", "nope", 0, segment.Allocation{}, idgen.ErrUnknownTag},
		{"negative step", "a", -1, segment.Allocation{}, idgen.ErrBadArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := store.Allocate(ctx, tc.tag, tc.step)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("Allocate: %v, want %v", err, tc.err)
			}
			if got != tc.want {
				t.Fatalf("Allocate = %+v, want %+v", got, tc.want)
			}
		})
	}

	for _, tc := range []struct {
		name             string
		expected, newMax int64
		ok               bool
		err              error
		maxIDAfterwards  int64
	}{
		{"stale expectation changes nothing", 36, 30, false, nil, 46},
		{"matching expectation gives back", 46, 40, true, nil, 40},
		{"not below the expectation", 40, 41, false, idgen.ErrBadArgument, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, err := store.GiveBack(ctx, "a", tc.expected, tc.newMax)
			if ok != tc.ok || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("GiveBack = %v, %v; want %v, %v", ok, err, tc.ok, tc.err)
			}
			if got := maxIDOf(t, pool, "a"); got != tc.maxIDAfterwards {
				t.Fatalf("max_id = %d, want %d", got, tc.maxIDAfterwards)
			}
		})
	}
}

// TestPostgresEnginesShareLeafAlloc runs three engines, as three proxies would, on one
// leaf_alloc, eight goroutines each, 300,000 IDs over four tags.
func TestPostgresEnginesShareLeafAlloc(t *testing.T) {
	pool := newPool(t, testenv.NewDatabase(t))
	tags := []string{"order", "pay", "user", "audit"}
	for _, tag := range tags {
		insertTag(t, pool, tag, 50, 1)
	}
	const engines, goroutines, perGoroutine = 3, 8, 12_500
	recs := make([]*recorder, engines)
	errs := make(chan error, engines)
	for i := range engines {
		// Each engine has its own pool, as separate processes would.
		e := startEngine(t, segment.NewPostgresStore(newPool(t, pool.Config().ConnString())), segment.Settings{MaxStep: 2000})
		recs[i] = &recorder{}
		go func() {
			recs[i].run(t, e, goroutines, perGoroutine, tags)
			errs <- checkIncreasing(recs[i].calls)
		}()
	}
	var all []call
	for range engines {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	for _, r := range recs {
		all = append(all, r.calls...)
	}
	if len(all) != engines*goroutines*perGoroutine {
		t.Fatalf("%d IDs drawn, want %d", len(all), engines*goroutines*perGoroutine)
	}
	if err := checkUnique(all); err != nil {
		t.Fatal(err)
	}
	for _, tag := range tags {
		top := maxIDOf(t, pool, tag)
		for _, c := range all {
			if c.tag == tag && (c.id > top || c.id <= 1) {
				t.Fatalf("tag %q: ID %d outside (1, max_id=%d]", tag, c.id, top)
			}
		}
	}
}

// TestPostgresRestart: a restarted engine never hands out an ID at or below one handed out
// before; a graceful Close gives back the tail so a clean restart has no gap, unless
// another engine reserved after us.
func TestPostgresRestart(t *testing.T) {
	pool := newPool(t, testenv.NewDatabase(t))
	store := segment.NewPostgresStore(pool)
	ctx := context.Background()
	closeNow := func(t *testing.T, e *segment.Engine) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := e.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	draw := func(t *testing.T, e *segment.Engine, tag string, n int) (last int64) {
		t.Helper()
		for range n {
			id := mustNext(t, e, tag)
			if id <= last {
				t.Fatalf("Next = %d after %d", id, last)
			}
			last = id
		}
		return last
	}

	t.Run("crash", func(t *testing.T) {
		insertTag(t, pool, "crash", 100, 0)
		a := startEngine(t, store, segment.Settings{})
		lastA := draw(t, a, "crash", 150) // one segment used up, the next in use
		// a is abandoned without Close, as a killed process would be.
		b := startEngine(t, store, segment.Settings{})
		if first := draw(t, b, "crash", 1); first <= lastA {
			t.Fatalf("after a crash the new engine handed out %d, at or below %d", first, lastA)
		}
	})

	t.Run("graceful close leaves no gap", func(t *testing.T) {
		insertTag(t, pool, "clean", 100, 0)
		a := startEngine(t, store, segment.Settings{})
		lastA := draw(t, a, "clean", 30) // past the threshold: the next segment is loaded too
		eventually(t, "the preload", func() bool { return snapshotOf(t, a, "clean").NextReady })
		closeNow(t, a)
		if got := maxIDOf(t, pool, "clean"); got != lastA {
			t.Fatalf("max_id after Close = %d, want %d", got, lastA)
		}
		b := startEngine(t, store, segment.Settings{})
		if first := draw(t, b, "clean", 1); first != lastA+1 {
			t.Fatalf("clean restart handed out %d, want %d", first, lastA+1)
		}
	})

	t.Run("no give back after another engine reserved", func(t *testing.T) {
		insertTag(t, pool, "shared", 100, 0)
		a := startEngine(t, store, segment.Settings{})
		other := startEngine(t, store, segment.Settings{})
		lastA := draw(t, a, "shared", 5)
		lastOther := draw(t, other, "shared", 5)
		before := maxIDOf(t, pool, "shared")
		closeNow(t, a)
		if got := maxIDOf(t, pool, "shared"); got != before {
			t.Fatalf("max_id moved from %d to %d although another engine reserved after us", before, got)
		}
		a2 := startEngine(t, store, segment.Settings{})
		first := draw(t, a2, "shared", 1)
		if first <= lastA || first <= lastOther {
			t.Fatalf("restart handed out %d, at or below %d (ours) or %d (the other engine's)", first, lastA, lastOther)
		}
		// The other engine keeps going in its own segment without colliding.
		seen := map[int64]bool{first: true}
		for range 300 {
			for _, e := range []*segment.Engine{a2, other} {
				id := mustNext(t, e, "shared")
				if seen[id] {
					t.Fatalf("ID %d handed out twice", id)
				}
				seen[id] = true
			}
		}
	})

	t.Run("tag added while running", func(t *testing.T) {
		e := startEngine(t, store, segment.Settings{})
		if _, err := e.Next(ctx, "late"); !errors.Is(err, idgen.ErrUnknownTag) {
			t.Fatalf("Next before the row exists: %v, want ErrUnknownTag", err)
		}
		insertTag(t, pool, "late", 10, 1000)
		eventually(t, "the new tag", func() bool {
			id, err := e.Next(ctx, "late")
			if err != nil && !errors.Is(err, idgen.ErrUnknownTag) {
				t.Fatalf("Next: %v", err)
			}
			return err == nil && id == 1001
		})
		if _, err := pool.Exec(ctx, `DELETE FROM leaf_alloc WHERE biz_tag = 'late'`); err != nil {
			t.Fatal(err)
		}
		if err := e.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Next(ctx, "late"); !errors.Is(err, idgen.ErrUnknownTag) {
			t.Fatalf("Next after the row was deleted: %v, want ErrUnknownTag", err)
		}
	})
}

// TestPostgresOutage stops a private server under a running engine: buffered IDs keep
// coming, then Next fails fast with ErrUnavailable, and the same engine recovers once the
// server is back.
func TestPostgresOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private PostgreSQL")
	}
	srv := testenv.NewPostgres(t)
	pool := newPool(t, srv.NewDatabase(t))
	insertTag(t, pool, "t", 100, 0)
	e := startEngine(t, segment.NewPostgresStore(pool), segment.Settings{
		LoadTimeout:     2 * time.Second,
		RetryBackoff:    20 * time.Millisecond,
		MaxRetryBackoff: 200 * time.Millisecond,
	})
	last := mustNext(t, e, "t")
	for s := snapshotOf(t, e, "t"); !s.Loading && !s.NextReady; s = snapshotOf(t, e, "t") {
		last = mustNext(t, e, "t")
	}
	eventually(t, "the preload", func() bool { return snapshotOf(t, e, "t").NextReady })
	s := snapshotOf(t, e, "t")
	buffered := max(s.Buffers[0].Max, s.Buffers[1].Max)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.Stop(ctx); err != nil {
		t.Fatalf("stop PostgreSQL: %v", err)
	}

	for last < buffered {
		id, _, err := nextWithin(e, "t")
		if err != nil {
			t.Fatalf("Next with %d IDs buffered: %v", buffered-last, err)
		}
		if id != last+1 {
			t.Fatalf("Next = %d after %d", id, last)
		}
		last = id
	}
	for i := range 3 {
		_, took, err := nextWithin(e, "t")
		if !errors.Is(err, idgen.ErrUnavailable) {
			t.Fatalf("Next %d with the buffers empty and the server down: %v, want ErrUnavailable", i, err)
		}
		if took > failFast {
			t.Fatalf("Next took %v to report the outage (deadline 30s)", took)
		}
	}

	if err := srv.Start(ctx); err != nil {
		t.Fatalf("start PostgreSQL again: %v", err)
	}
	var id int64
	eventually(t, "recovery", func() bool {
		var err error
		id, _, err = nextWithin(e, "t")
		return err == nil
	})
	if id <= last {
		t.Fatalf("after recovery Next = %d, not above %d", id, last)
	}
	if got := maxIDOf(t, pool, "t"); id > got {
		t.Fatalf("ID %d above max_id %d", id, got)
	}
}
