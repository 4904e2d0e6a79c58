package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// clientsPerProxy is how many pgx clients each proxy serves in the load scenarios.
const clientsPerProxy = 16

// startProxies starts n proxies on the fixture; mutate adjusts each one's configuration.
func startProxies(t testing.TB, fx *fixture, n int, mutate func(i int, c *ProxyConfig)) []*Proxy {
	t.Helper()
	out := make([]*Proxy, n)
	for i := range out {
		cfg := fx.proxyConfig(t)
		if mutate != nil {
			mutate(i, &cfg)
		}
		out[i] = NewProxy(t, fmt.Sprintf("proxy%d", i+1), cfg)
	}
	for _, p := range out {
		took := p.Start()
		t.Logf("%s ready on %s (admin %s) in %v", p.Name, p.Addr(), p.HTTPURL(), took.Round(time.Millisecond))
	}
	return out
}

// zkName returns a ZooKeeper name (--zk-name) of the test's own, so that tests sharing a
// ZooKeeper never see each other's nodes.
func zkName(t testing.TB) string {
	return fmt.Sprintf("e2e-%s-%d", sanitize(t.Name()), time.Now().UnixNano())
}

// zkWorkers configures proxies to take worker IDs from ZooKeeper under name.
func zkWorkers(t testing.TB, servers []string, name string) func(int, *ProxyConfig) {
	t.Helper()
	requireServeFlags(t, "worker-source", "zk", "zk-name")
	return func(_ int, c *ProxyConfig) {
		c.WorkerSource = "zookeeper"
		c.ZK = servers
		c.Extra = append(c.Extra, "--zk-name", name)
	}
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	return string(b)
}

// hold lets the load run for d.
func hold(d time.Duration) { <-time.After(d) }

// TestThreeProxiesUnderLoad runs three proxies sharing one PostgreSQL and one ZooKeeper,
// 16 clients each, mixing segment and snowflake leaf_next calls with filled INSERTs:
// no statement may fail and no ID may repeat.
func TestThreeProxiesUnderLoad(t *testing.T) {
	requireServeFlags(t, "snowflake-tags", "fill")
	zk := testenv.ZooKeeperAddr(t)
	dsn := testenv.NewDatabase(t)
	fx := newFixture(t, dsn, 1000)
	proxies := startProxies(t, fx, 3, zkWorkers(t, []string{zk}, zkName(t)))
	requireRewriting(t, proxies[0], dsn, snowOrder)

	coll := NewCollector()
	d := loadDuration()
	load := StartLoad(t, coll, dsn, proxies, clientsPerProxy)
	hold(d)
	load.Stop()

	errs := load.Errors()
	reportErrors(t, "failed statement", errs, func(loadErr) bool { return true })
	requireNoDuplicates(t, coll)
	checkStoredUnique(t, fx, coll)

	workers := map[int64]string{}
	for _, p := range proxies {
		ws := coll.Workers(p.Name)
		if len(ws) != 1 {
			t.Errorf("%s issued snowflake IDs with worker IDs %v, want exactly one", p.Name, ws)
			continue
		}
		if other, taken := workers[ws[0]]; taken {
			t.Errorf("%s and %s share worker ID %d", other, p.Name, ws[0])
		}
		workers[ws[0]] = p.Name
	}
	checkDecode(t, coll, proxies)
	t.Logf("FIGURE load: %d proxies × %d clients for %v: %d statements (%.0f/s), %d IDs (%.0f/s), %d errors, workers %v",
		len(proxies), clientsPerProxy, d, load.Total(), float64(load.Total())/d.Seconds(),
		coll.Len(), float64(coll.Len())/d.Seconds(), len(errs), workers)
	t.Logf("per op:%s", load.OpCounts())
	t.Logf("per namespace:%s", coll.CountBy(func(r IDRow) string { return r.Namespace }))
}

// TestCrashRestartUnderLoad kills one of three loaded proxies with SIGKILL and restarts it:
// its clients see connection errors only, the other proxies' clients see none, and no ID
// handed out after the restart equals one handed out before, by either engine.
func TestCrashRestartUnderLoad(t *testing.T) {
	requireServeFlags(t, "snowflake-tags", "fill")
	zk := testenv.ZooKeeperAddr(t)
	dsn := testenv.NewDatabase(t)
	fx := newFixture(t, dsn, 1000)
	proxies := startProxies(t, fx, 3, zkWorkers(t, []string{zk}, zkName(t)))
	requireRewriting(t, proxies[0], dsn, snowOrder)
	victim := proxies[1]

	coll := NewCollector()
	phase := loadDuration() / 3
	load := StartLoad(t, coll, dsn, proxies, clientsPerProxy)
	hold(phase)
	workersBefore := coll.Workers(victim.Name)

	load.SetPhase("down")
	killedAt := time.Now()
	victim.Kill()
	// Let the victim's clients run into the dead socket and the refused reconnects.
	if _, err := load.WaitSuccesses(proxies[0].Name, 100, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	load.SetPhase("after")
	restart := victim.Start()
	readyAt := time.Now()
	recovery, err := load.WaitSuccesses(victim.Name, 50, 30*time.Second)
	if err != nil {
		t.Errorf("after the restart: %v", err)
	}
	hold(phase)
	load.Stop()

	errs := load.Errors()
	reportErrors(t, "failed statement on a proxy that was not killed", errs, func(e loadErr) bool {
		return e.Proxy != victim.Name
	})
	reportErrors(t, "the killed proxy's client got something else than a connection error", errs, func(e loadErr) bool {
		return e.Proxy == victim.Name && !e.Conn
	})
	reportErrors(t, "connection error outside the outage", errs, func(e loadErr) bool {
		return e.Proxy == victim.Name && e.Conn && (e.At.Before(killedAt) || e.At.After(readyAt.Add(2*time.Second)))
	})
	requireNoDuplicates(t, coll)
	checkStoredUnique(t, fx, coll)

	// Global uniqueness implies this; it is checked on its own because it is the claim.
	before := map[string]map[int64]bool{}
	for _, r := range coll.Select(func(r IDRow) bool { return r.Phase == "before" }) {
		if before[r.Namespace] == nil {
			before[r.Namespace] = map[int64]bool{}
		}
		before[r.Namespace][r.ID] = true
	}
	after := coll.Select(func(r IDRow) bool { return r.Proxy == victim.Name && r.Phase == "after" })
	if len(after) == 0 {
		t.Errorf("the restarted proxy handed out no ID")
	}
	for _, r := range after {
		if before[r.Namespace][r.ID] {
			t.Errorf("after the restart %s handed out %s ID %d again", victim.Name, r.Namespace, r.ID)
		}
	}
	workersAfter := coll.Workers(victim.Name)
	if len(workersBefore) != 1 || len(workersAfter) != 1 || workersBefore[0] != workersAfter[0] {
		t.Errorf("worker ID of %s: %v before the crash, %v over the whole run; the same ip:port must keep its ZooKeeper node",
			victim.Name, workersBefore, workersAfter)
	}
	connErrs := 0
	for _, e := range errs {
		if e.Proxy == victim.Name {
			connErrs++
		}
	}
	if connErrs == 0 {
		t.Errorf("no client of %s noticed the kill: the load did not reach it", victim.Name)
	}
	t.Logf("FIGURE crash: restart to ready %v, first 50 statements after ready in %v, %d connection errors on the killed proxy's clients, %d IDs after restart checked against %d before",
		restart.Round(time.Millisecond), recovery.Round(time.Millisecond), connErrs, len(after), coll.Len()-len(after))
}

// checkDecode asks `leafproxy decode` about one snowflake ID of each proxy: the command
// must split it the way the layout says.
func checkDecode(t testing.TB, coll *Collector, proxies []*Proxy) {
	t.Helper()
	args := []string{"decode"}
	var ids []int64
	for _, p := range proxies {
		rows := coll.Select(func(r IDRow) bool { return r.Proxy == p.Name && r.Namespace == snowflakeNamespace })
		if len(rows) > 0 {
			ids = append(ids, rows[len(rows)/2].ID)
			args = append(args, strconv.FormatInt(rows[len(rows)/2].ID, 10))
		}
	}
	if len(ids) == 0 {
		return
	}
	out, err := runLeafproxy(t, args...)
	if err != nil {
		t.Errorf("leafproxy %s: %v\n%s", strings.Join(args, " "), err, out)
		return
	}
	dec := json.NewDecoder(strings.NewReader(out))
	for _, id := range ids {
		var got struct {
			Timestamp int64 `json:"timestamp"`
			Worker    int64 `json:"worker"`
			Sequence  int64 `json:"sequence"`
		}
		if err := dec.Decode(&got); err != nil {
			t.Errorf("leafproxy decode output %q: %v", out, err)
			return
		}
		at, w, seq := decodeSnowflake(id)
		if got.Timestamp != at.UnixMilli() || got.Worker != w || got.Sequence != seq {
			t.Errorf("leafproxy decode %d = %+v, want timestamp %d worker %d sequence %d", id, got, at.UnixMilli(), w, seq)
		}
	}
}
