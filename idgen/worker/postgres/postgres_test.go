package postgres_test

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/idgen/worker"
	"github.com/leafproxy/leafproxy/idgen/worker/postgres"
	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/migrations"
)

var ctx = context.Background()

// leaseDB returns a migrated fresh database on the shared server.
func leaseDB(t *testing.T) string {
	t.Helper()
	dsn := testenv.NewDatabase(t)
	if err := migrations.Up(dsn); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	return dsn
}

func newPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func newSource(t *testing.T, pool *pgxpool.Pool, s postgres.Settings) *postgres.Source {
	t.Helper()
	s.Pool = pool
	if s.Logger == nil {
		s.Logger, _ = test.NewNullLogger()
	}
	src, err := postgres.New(s)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func acquire(t *testing.T, src worker.Source) worker.Lease {
	t.Helper()
	l, err := src.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	t.Cleanup(func() { l.Close(ctx) })
	return l
}

// waitUntil polls cond until it holds or the deadline passes.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type row struct {
	holder    *string
	expired   bool
	highWater int64
}

func readRow(t *testing.T, pool *pgxpool.Pool, id int64) row {
	t.Helper()
	var r row
	err := pool.QueryRow(ctx, `SELECT holder, expires_at <= now(), high_water_ms FROM leaf_worker_lease WHERE worker_id = $1`, id).
		Scan(&r.holder, &r.expired, &r.highWater)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestNewValidates(t *testing.T) {
	pool := &pgxpool.Pool{}
	for _, tc := range []struct {
		name string
		s    postgres.Settings
		ok   bool
	}{
		{"defaults", postgres.Settings{Pool: pool}, true},
		{"short ttl", postgres.Settings{Pool: pool, TTL: time.Second}, true},
		{"no pool", postgres.Settings{}, false},
		{"renew slower than ttl", postgres.Settings{Pool: pool, TTL: time.Second, RenewInterval: 2 * time.Second}, false},
		{"guard eats the ttl", postgres.Settings{Pool: pool, TTL: time.Second, FenceGuard: 900 * time.Millisecond}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := postgres.New(tc.s)
			if tc.ok != (err == nil) {
				t.Fatalf("New = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestSlotsExhausted(t *testing.T) {
	pool := newPool(t, leaseDB(t))
	src := newSource(t, pool, postgres.Settings{TTL: time.Hour, RenewInterval: 20 * time.Minute})
	ids := make([]int64, 0, worker.MaxID+1)
	for i := 0; i <= worker.MaxID; i++ {
		ids = append(ids, acquire(t, src).WorkerID())
	}
	for i, id := range ids {
		if id != int64(i) {
			t.Fatalf("lease #%d got worker %d, want the lowest free ID %d", i, id, i)
		}
	}
	_, err := src.Acquire(ctx)
	if !errors.Is(err, worker.ErrExhausted) {
		t.Fatalf("the 1,025th Acquire = %v, want ErrExhausted", err)
	}
	t.Logf("1,025th lease: %v", err)
}

func TestConcurrentAcquireGetsDistinctIDs(t *testing.T) {
	pool := newPool(t, leaseDB(t))
	const n = 16
	var wg sync.WaitGroup
	leases := make([]worker.Lease, n)
	errs := make([]error, n)
	for i := range leases {
		// A source per "process", all sharing the table.
		src := newSource(t, pool, postgres.Settings{Holder: "proc", TTL: time.Minute})
		wg.Add(1)
		go func() {
			defer wg.Done()
			leases[i], errs[i] = src.Acquire(ctx)
		}()
	}
	wg.Wait()
	var ids []int
	for i, l := range leases {
		if errs[i] != nil {
			t.Fatalf("Acquire: %v", errs[i])
		}
		defer l.Close(ctx)
		ids = append(ids, int(l.WorkerID()))
	}
	sort.Ints(ids)
	for i, id := range ids {
		if id != i {
			t.Fatalf("worker IDs %v, want 0..%d each once", ids, n-1)
		}
	}
}

func TestCloseReleasesAndKeepsHighWater(t *testing.T) {
	pool := newPool(t, leaseDB(t))
	src := newSource(t, pool, postgres.Settings{TTL: time.Minute})
	l := acquire(t, src)
	if l.WorkerID() != 0 || l.HighWater() != 0 || !time.Now().Before(l.ValidUntil()) {
		t.Fatalf("first lease: worker %d, high-water %d, valid until %v", l.WorkerID(), l.HighWater(), l.ValidUntil())
	}
	if r := readRow(t, pool, 0); r.holder == nil || r.expired {
		t.Fatalf("claimed row: %+v", r)
	}
	// A mark ahead of the release time: the next holder's high-water is the later of the
	// mark and the end of the lease.
	mark := time.Now().Add(time.Hour).UnixMilli()
	l.Record(mark)
	l.Record(mark - 5) // older marks never lower it
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if time.Now().Before(l.ValidUntil()) {
		t.Fatal("closed lease still valid")
	}
	if r := readRow(t, pool, 0); r.holder != nil || !r.expired || r.highWater != mark {
		t.Fatalf("released row: %+v, want free, expired, high-water %d", r, mark)
	}
	again := acquire(t, src)
	if again.WorkerID() != 0 || again.HighWater() != mark {
		t.Fatalf("re-acquired worker %d with high-water %d, want 0 with %d", again.WorkerID(), again.HighWater(), mark)
	}
}

func TestRenewalPersistsHighWater(t *testing.T) {
	pool := newPool(t, leaseDB(t))
	src := newSource(t, pool, postgres.Settings{TTL: 3 * time.Second, RenewInterval: 100 * time.Millisecond})
	l := acquire(t, src)
	mark := time.Now().UnixMilli()
	l.Record(mark)
	waitUntil(t, 5*time.Second, "the renewal to persist the high-water mark", func() bool {
		return readRow(t, pool, l.WorkerID()).highWater == mark
	})
}

// offsetClock is the system clock shifted by a fixed amount: a machine whose clock is
// ahead of the others.
type offsetClock struct{ offset time.Duration }

func (c offsetClock) Now() time.Time                  { return time.Now().Add(c.offset) }
func (c offsetClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c offsetClock) Sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A holder that crashes (stops renewing, never releases) keeps its worker ID until the
// row expires; then the ID is reclaimed, and the new holder issues IDs only after the
// crashed holder's high-water mark, even though that mark is ahead of the new holder's
// clock.
func TestCrashedHolderIsReclaimedAfterExpiry(t *testing.T) {
	dsn := leaseDB(t)
	// 4 s: the holder must keep its lease through the 1,000 IDs below while the machine
	// runs other tests (with 2 s, its renewals once lapsed for 1.8 s under load).
	const ttl = 4 * time.Second
	settings := postgres.Settings{TTL: ttl, RenewInterval: 100 * time.Millisecond}

	crashPool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer crashPool.Close()
	log, _ := test.NewNullLogger()
	// The crashed holder's clock runs far enough ahead that its mark is still ahead after
	// the setup's waits (for the mark in the row, up to 5 s, and for the row to expire,
	// up to 2 TTLs) on a slow machine; the new holder waits it out (MaxStartWait below).
	ahead := offsetClock{16 * time.Second}
	crashedSettings := settings
	crashedSettings.Now = ahead.Now // the lease's deadline is read on the engine's clock
	crashed, err := snowflake.New(snowflake.Settings{Source: newSource(t, crashPool, crashedSettings),
		Clock: ahead, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := crashed.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Stops the crashed holder's goroutines at the end; its pool is gone by then, so
	// the release cannot reach the row.
	defer crashed.Close(ctx)
	var lastCrashed int64
	for i := 0; i < 1000; i++ {
		if lastCrashed, err = crashed.Next(ctx, ""); err != nil {
			t.Fatal(err)
		}
	}
	lastMs := crashed.Decompose(lastCrashed).Millis
	pool := newPool(t, dsn)
	waitUntil(t, 5*time.Second, "the crashed holder's high-water mark in the row", func() bool {
		return readRow(t, pool, 0).highWater >= lastMs
	})
	crashPool.Close() // the crash: no more renewals, no release

	other := acquire(t, newSource(t, pool, settings))
	if other.WorkerID() != 1 {
		t.Fatalf("while the crashed lease is unexpired, Acquire got worker %d, want 1", other.WorkerID())
	}
	waitUntil(t, 2*ttl, "the crashed holder's row to expire", func() bool { return readRow(t, pool, 0).expired })

	started := time.Now()
	if ahead := lastMs - started.UnixMilli(); ahead <= 0 {
		t.Fatalf("setup: the crashed holder's mark is not ahead of this clock (%d ms)", ahead)
	}
	e := startEngine(t, snowflake.Settings{Source: newSource(t, pool, settings), Logger: log, MaxStartWait: 30 * time.Second})
	if in := e.Info(); in.WorkerID != 0 || in.HighWaterMillis < lastMs {
		t.Fatalf("new holder: %+v, want worker 0 with the crashed holder's mark %d", in, lastMs)
	}
	id, err := e.Next(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if p := e.Decompose(id); p.Millis <= lastMs || id <= lastCrashed {
		t.Fatalf("new holder's first ID at %d ms (%d), not after the crashed holder's last %d ms (%d)", p.Millis, id, lastMs, lastCrashed)
	}
	t.Logf("start waited %v for the high-water mark %v ahead", time.Since(started), time.Duration(lastMs-started.UnixMilli())*time.Millisecond)
}

func startEngine(t *testing.T, s snowflake.Settings) *snowflake.Engine {
	t.Helper()
	e, err := snowflake.New(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { e.Close(ctx) })
	return e
}

// A holder that cannot reach its database stops issuing before its row can expire, and
// resumes when a renewal succeeds again while nobody else took the row.
func TestHolderThatCannotRenewStopsIssuing(t *testing.T) {
	pg := testenv.NewPostgres(t)
	dsn := pg.NewDatabase(t)
	if err := migrations.Up(dsn); err != nil {
		t.Fatal(err)
	}
	pool := newPool(t, dsn)
	const ttl = 2 * time.Second
	var fenced, regained atomic.Int32
	src := newSource(t, pool, postgres.Settings{TTL: ttl, RenewInterval: 200 * time.Millisecond, FenceGuard: 500 * time.Millisecond, Hooks: worker.Hooks{
		OnFenced:   func(int64) { fenced.Add(1) },
		OnRegained: func(int64) { regained.Add(1) },
	}})
	log, _ := test.NewNullLogger()
	e := startEngine(t, snowflake.Settings{Source: src, Logger: log})
	before, err := e.Next(ctx, "")
	if err != nil {
		t.Fatal(err)
	}

	stopped := time.Now()
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 2*ttl, "the engine to refuse IDs", func() bool {
		_, err := e.Next(ctx, "")
		return errors.Is(err, idgen.ErrWorkerNotHeld)
	})
	if d := time.Since(stopped); d > ttl {
		t.Fatalf("issued IDs for %v after the database went away; the row expires after %v", d, ttl)
	}
	// The engine refuses by the deadline; the hook runs when the fence timer fires on
	// the renewal goroutine, so the refusal can be seen first.
	waitUntil(t, time.Second, "the fenced hook", func() bool { return fenced.Load() >= 1 })
	if fenced.Load() != 1 || e.Info().Held {
		t.Fatalf("fenced hook calls %d, Info().Held %v", fenced.Load(), e.Info().Held)
	}

	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var after int64
	waitUntil(t, 15*time.Second, "issue to resume after the database came back", func() bool {
		after, err = e.Next(ctx, "")
		return err == nil
	})
	// The renewal extends the deadline just before the regained hook runs on the renewal
	// goroutine.
	waitUntil(t, time.Second, "the regained hook", func() bool { return regained.Load() >= 1 })
	if after <= before || e.Decompose(after).Worker != e.Decompose(before).Worker || regained.Load() != 1 {
		t.Fatalf("after the outage: ID %d (before %d), regained %d", after, before, regained.Load())
	}
}

// When another process took the row over (it expired while we were cut off), the lease is
// lost for good: the engine refuses IDs and acquires another worker ID by itself.
func TestTakenOverLeaseIsReplaced(t *testing.T) {
	pool := newPool(t, leaseDB(t))
	var lost, acquired atomic.Int32
	src := newSource(t, pool, postgres.Settings{TTL: 2 * time.Second, RenewInterval: 100 * time.Millisecond})
	log, _ := test.NewNullLogger()
	e := startEngine(t, snowflake.Settings{Source: src, Logger: log, RetryBackoff: 50 * time.Millisecond,
		Hooks: snowflake.Hooks{
			OnWorkerLost:     func(int64) { lost.Add(1) },
			OnWorkerAcquired: func(int64) { acquired.Add(1) },
		}})
	before, err := e.Next(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	// What a claimer does with an expired row: it becomes someone else's.
	if _, err := pool.Exec(ctx, `UPDATE leaf_worker_lease SET holder = 'intruder', expires_at = now() + interval '1 hour' WHERE worker_id = 0`); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 5*time.Second, "the engine to take another worker ID", func() bool {
		return lost.Load() == 1 && acquired.Load() == 2 && e.Info().Held
	})
	after, err := e.Next(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if w := e.Decompose(after).Worker; w != 1 || after <= before {
		t.Fatalf("after the takeover: ID %d on worker %d, want worker 1", after, w)
	}
	if r := readRow(t, pool, 0); r.holder == nil || *r.holder != "intruder" {
		t.Fatalf("the intruder's row was touched: %+v", r)
	}
}
