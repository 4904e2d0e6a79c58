package e2e

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// TestPostgresLeaseWorkers runs the binary's default worker source, the PostgreSQL lease:
// proxies sharing a store hold distinct worker IDs, a crashed proxy comes back with a
// worker ID that repeats none of the earlier IDs, and a graceful shutdown releases the
// lease with a high-water mark covering every ID the proxy issued.
func TestPostgresLeaseWorkers(t *testing.T) {
	requireServeFlags(t, "worker-source", "snowflake-tags")
	dsn := testenv.NewDatabase(t)
	migrateUp(t, dsn)
	addTag(t, dsn, segA, 100)
	cfg := ProxyConfig{Upstream: hostPort(t, dsn), Store: dsn, WorkerSource: "postgres", SnowflakeTags: []string{snowOrder}}
	proxies := make([]*Proxy, 3)
	for i := range proxies {
		proxies[i] = NewProxy(t, "lease"+string(rune('1'+i)), cfg)
		proxies[i].Start()
	}
	requireHTTPIDs(t, proxies[0], segA, snowOrder)
	coll := NewCollector()
	held := map[int64]string{}
	for _, p := range proxies {
		w := snowflakeWorker(t, p, coll, "start")
		if other, dup := held[w]; dup {
			t.Errorf("%s and %s both hold worker ID %d", other, p.Name, w)
		}
		held[w] = p.Name
	}
	var want []int64
	for w := range held {
		want = append(want, w)
	}
	sort.Slice(want, func(i, j int) bool { return want[i] < want[j] })
	rows := queryInt64s(t, dsn, "SELECT worker_id::bigint FROM leaf_worker_lease WHERE expires_at > now() ORDER BY 1")
	if len(rows) != len(want) {
		t.Errorf("live lease rows %v, want the workers in use %v", rows, want)
	} else {
		for i := range rows {
			if rows[i] != want[i] {
				t.Errorf("live lease rows %v, want the workers in use %v", rows, want)
				break
			}
		}
	}

	// kill -9: the lease stays held until it expires, so the restarted proxy must either
	// take another ID or wait out the old one's high-water mark; either way no ID repeats.
	victim := proxies[0]
	before := snowflakeWorker(t, victim, coll, "before crash")
	victim.Kill()
	took := victim.Start()
	after := snowflakeWorker(t, victim, coll, "after crash")
	t.Logf("FIGURE lease: %s restarted after kill -9 in %v with worker ID %d (had %d)", victim.Name, took.Round(time.Millisecond), after, before)

	// Graceful shutdown releases the lease and records how far the clock got.
	leaver := proxies[1]
	w := snowflakeWorker(t, leaver, coll, "before shutdown")
	var lastMS int64
	for _, r := range coll.Select(func(r IDRow) bool { return r.Proxy == leaver.Name }) {
		at, _, _ := decodeSnowflake(r.ID)
		lastMS = max(lastMS, at.UnixMilli())
	}
	if _, err := leaver.Terminate(30 * time.Second); err != nil {
		t.Errorf("%s exit after SIGTERM: %v", leaver.Name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var live bool
	var highWater int64
	if err := conn.QueryRow(ctx, "SELECT expires_at > now(), high_water_ms FROM leaf_worker_lease WHERE worker_id = $1", w).Scan(&live, &highWater); err != nil {
		t.Fatal(err)
	}
	if live {
		t.Errorf("worker ID %d is still leased after %s shut down gracefully", w, leaver.Name)
	}
	if highWater < lastMS {
		t.Errorf("lease high-water mark %d is before the last ID's millisecond %d", highWater, lastMS)
	}
	requireNoDuplicates(t, coll)
}
