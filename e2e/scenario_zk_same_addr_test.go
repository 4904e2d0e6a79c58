package e2e

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// waitNotHeld waits until the proxy serves its admin API and /readyz says that its
// snowflake worker ID is not held.
func waitNotHeld(t testing.TB, p *Proxy, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var status int
	var body string
	var err error
	for time.Now().Before(deadline) {
		if gone, werr := p.exited(); gone {
			t.Fatalf("%s exited: %v\n%s", p.Name, werr, p.LogTail(30))
		}
		status, body, err = p.HTTPGet("/readyz", nil)
		if err == nil && status == http.StatusServiceUnavailable && strings.Contains(body, "not held") {
			return strings.TrimSpace(body)
		}
		<-time.After(50 * time.Millisecond)
	}
	t.Fatalf("%s: /readyz never said the worker ID is not held within %v (last: %d %q %v)", p.Name, timeout, status, body, err)
	return ""
}

// refusedSQL asks the proxy for a snowflake ID over SQL and requires SQLSTATE 55000.
func refusedSQL(t testing.TB, conn *pgx.Conn, who string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var id int64
	err := conn.QueryRow(ctx, "SELECT leaf_next('"+snowOrder+"')").Scan(&id)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55000" {
		t.Fatalf("%s answered leaf_next with %d, %v; want SQLSTATE 55000", who, id, err)
	}
}

// waitHolderLogged waits until the proxy's log names the process holding its worker ID.
func waitHolderLogged(t testing.TB, p *Proxy, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(p.Log(), "\n") {
			if strings.Contains(line, "another live process holds this worker ID") && strings.Contains(line, "pid") {
				return line
			}
		}
		<-time.After(50 * time.Millisecond)
	}
	t.Fatalf("%s logged no line naming the other holder of its worker ID within %v", p.Name, timeout)
	return ""
}

// lastMillis returns the newest millisecond of the IDs proxy issued.
func lastMillis(coll *Collector, proxy string) int64 {
	var last int64
	for _, r := range coll.Select(func(r IDRow) bool { return r.Proxy == proxy && r.Namespace == snowflakeNamespace }) {
		at, _, _ := decodeSnowflake(r.ID)
		last = max(last, at.UnixMilli())
	}
	return last
}

// TestZooKeeperSameAddress: two live proxies advertise the same ip:port to one ZooKeeper,
// so Leaf's node gives both the same worker ID. The second refuses to issue (55000 over
// SQL, an error over HTTP, readiness false, a log line naming the first) while the first
// lives; when the first stops it takes over, with IDs after the first's last timestamp.
// Then the roles swap, the holder crashing (kill -9) instead of stopping: the other takes
// over once the crashed one's claim is provably stale (a PID gone from this host) or
// ZooKeeper ends its session.
func TestZooKeeperSameAddress(t *testing.T) {
	requireServeFlags(t, "worker-source", "zk", "zk-name", "advertise", "snowflake-tags")
	servers := []string{testenv.ZooKeeperAddr(t)}
	dsn := testenv.NewDatabase(t)
	fx := newFixture(t, dsn, 1000)
	coll := NewCollector()
	name := zkName(t)
	sameAddr := func(_ int, c *ProxyConfig) {
		zkWorkers(t, servers, name)(0, c)
		c.Extra = append(c.Extra, "--advertise", "10.77.0.1:7001")
	}
	cfg := fx.proxyConfig(t)
	sameAddr(0, &cfg)
	a := NewProxy(t, "A", cfg)
	b := NewProxy(t, "B", cfg)
	a.Start()
	requireRewriting(t, a, dsn, snowOrder)
	requireHTTPIDs(t, a, segA, snowOrder)
	w := snowflakeWorker(t, a, coll, "A alone")

	// holdsAgainst checks, while holder lives, that waiting issues nothing with w and
	// that holder keeps issuing.
	holdsAgainst := func(holder, waiting *Proxy) {
		t.Helper()
		ready := waitNotHeld(t, waiting, 60*time.Second)
		line := waitHolderLogged(t, waiting, 30*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, waiting.URL(dsn, "postgres", ""))
		if err != nil {
			t.Fatalf("connect through %s: %v", waiting.Name, err)
		}
		defer conn.Close(context.Background())
		for range 20 {
			refusedSQL(t, conn, waiting.Name)
			if id, err := httpID(waiting, "/api/snowflake/get/"+snowOrder, nil); err == nil {
				t.Fatalf("%s issued %d over HTTP while %s holds worker ID %d", waiting.Name, id, holder.Name, w)
			}
			if hw := snowflakeWorker(t, holder, coll, holder.Name+" holding"); hw != w {
				t.Fatalf("%s's worker ID changed from %d to %d", holder.Name, w, hw)
			}
		}
		t.Logf("%s while %s holds worker ID %d: %s; log: %s", waiting.Name, holder.Name, w, ready, line)
	}

	b.Spawn()
	holdsAgainst(a, b)

	// A stops gracefully: B takes over after A's last timestamp.
	lastA := lastMillis(coll, a.Name)
	stopped := time.Now()
	if _, err := a.Terminate(30 * time.Second); err != nil {
		t.Logf("A exit after SIGTERM: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatalf("B did not take over after A stopped: %v\n%s", err, b.LogTail(30))
	}
	tookOver := time.Since(stopped)
	if wb := snowflakeWorker(t, b, coll, "B after A stopped"); wb != w {
		t.Fatalf("B took worker ID %d, want %d (the node of the shared ip:port)", wb, w)
	}
	for _, r := range coll.Select(func(r IDRow) bool { return r.Proxy == b.Name }) {
		if at, _, _ := decodeSnowflake(r.ID); at.UnixMilli() <= lastA {
			t.Errorf("B's ID %d is from %v, not after A's last ID (%v)", r.ID, at, time.UnixMilli(lastA))
		}
	}

	// A comes back while B holds the ID, then B crashes.
	a.Spawn()
	holdsAgainst(b, a)
	lastB := lastMillis(coll, b.Name)
	crashed := time.Now()
	b.Kill()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel2()
	if err := a.WaitReady(ctx2); err != nil {
		t.Fatalf("A did not take over after B crashed: %v\n%s", err, a.LogTail(30))
	}
	afterCrash := time.Since(crashed)
	if wa := snowflakeWorker(t, a, coll, "A after B crashed"); wa != w {
		t.Fatalf("A took worker ID %d, want %d", wa, w)
	}
	for _, r := range coll.Select(func(r IDRow) bool { return r.Proxy == a.Name && r.Phase == "A after B crashed" }) {
		if at, _, _ := decodeSnowflake(r.ID); at.UnixMilli() <= lastB {
			t.Errorf("A's ID %d is from %v, not after B's last ID (%v)", r.ID, at, time.UnixMilli(lastB))
		}
	}
	requireNoDuplicates(t, coll)
	t.Logf("FIGURE zk-same-addr: worker ID %d; the second proxy refused while the first lived; took over %v after a graceful stop and %v after a kill -9; %d IDs, 0 duplicates",
		w, tookOver.Round(time.Millisecond), afterCrash.Round(time.Millisecond), coll.Len())
}
