package postgres_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus/hooks/test"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/idgen/worker/postgres"
)

// stepClock is a clock the test moves by hand, shared by the engine and the lease.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func (c *stepClock) Sleep(ctx context.Context, d time.Duration) error {
	c.Add(d)
	return ctx.Err()
}

func (c *stepClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// The lease's deadline is the claim's send time plus TTL minus guard, read on the injected
// clock; once the clock passes it the engine refuses IDs at once, although the renewal
// goroutine has not run (its first renewal is minutes away) and no timer has fired.
func TestValidUntilIsEnforcedWithoutTheRenewalGoroutine(t *testing.T) {
	pool := newPool(t, leaseDB(t))
	clock := &stepClock{now: time.Now()}
	const ttl, guard = time.Hour, 6 * time.Minute
	src := newSource(t, pool, postgres.Settings{TTL: ttl, RenewInterval: 20 * time.Minute, FenceGuard: guard, Now: clock.Now})
	log, _ := test.NewNullLogger()
	sent := clock.Now()
	e, err := snowflake.New(snowflake.Settings{Source: src, Clock: clock, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)

	clock.Add(ttl - guard - time.Millisecond)
	id, err := e.Next(ctx, "")
	if err != nil {
		t.Fatalf("Next a millisecond before valid-until: %v", err)
	}
	if at := time.UnixMilli(e.Decompose(id).Millis); !at.Before(sent.Add(ttl - guard)) {
		t.Fatalf("ID stamped %v, not before valid-until %v", at, sent.Add(ttl-guard))
	}
	clock.Add(time.Millisecond) // a pause: now exactly at the deadline
	if _, err := e.Next(ctx, ""); !errors.Is(err, idgen.ErrWorkerNotHeld) {
		t.Fatalf("Next at valid-until: %v, want ErrWorkerNotHeld", err)
	}
	if _, ok := e.TryNext(""); ok {
		t.Fatal("TryNext issued an ID at valid-until")
	}
	if e.Info().Held {
		t.Fatal("Info().Held at valid-until")
	}
}

// A takeover waits out the end of the previous lease, not only its high-water mark: the
// previous holder may have issued IDs up to its deadline after its last renewal.
func TestTakeoverHighWaterCoversThePreviousLease(t *testing.T) {
	pool := newPool(t, leaseDB(t))
	var expires int64
	// A holder whose row just expired, with a mark recorded well before that.
	if err := pool.QueryRow(ctx, `UPDATE leaf_worker_lease SET holder = 'paused', high_water_ms = 1000,
		expires_at = now() - interval '1 millisecond' WHERE worker_id = 0
		RETURNING ceil(extract(epoch FROM expires_at) * 1000)::bigint`).Scan(&expires); err != nil {
		t.Fatal(err)
	}
	src := newSource(t, pool, postgres.Settings{TTL: time.Minute})
	l := acquire(t, src)
	if l.WorkerID() != 0 || l.HighWater() < expires {
		t.Fatalf("took over worker %d with high-water %d, want worker 0 and at least the lease's end %d",
			l.WorkerID(), l.HighWater(), expires)
	}
}
