package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// snowflakeWorker returns the worker ID of the proxy's snowflake IDs, recording the IDs.
// It asks the HTTP API, which needs no SQL rewriting.
func snowflakeWorker(t testing.TB, p *Proxy, coll *Collector, phase string) int64 {
	t.Helper()
	var ids []int64
	for i := 0; i < 20; i++ {
		id, err := httpID(p, "/api/snowflake/get/"+snowOrder, nil)
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		ids = append(ids, id)
	}
	workers := map[int64]bool{}
	for _, id := range ids {
		_, w, _ := decodeSnowflake(id)
		workers[w] = true
		coll.Add(IDRow{Namespace: snowflakeNamespace, ID: id, Origin: originHTTP, Proxy: p.Name, Phase: phase})
	}
	if len(workers) != 1 {
		t.Fatalf("%s issued IDs of %d worker IDs", p.Name, len(workers))
	}
	for w := range workers {
		return w
	}
	return -1
}

// zkLeader returns the member of the ensemble that says it leads.
func zkLeader(t testing.TB, ens []*testenv.ZooKeeper) (*testenv.ZooKeeper, error) {
	t.Helper()
	for _, z := range ens {
		if m, err := z.Mode(); err == nil && m == "leader" {
			return z, nil
		}
	}
	return nil, fmt.Errorf("no member of the ensemble leads")
}

// waitLeader polls until some running member other than gone leads, returning how long.
func waitLeader(ens []*testenv.ZooKeeper, gone *testenv.ZooKeeper, timeout time.Duration) (time.Duration, error) {
	began := time.Now()
	for time.Since(began) < timeout {
		for _, z := range ens {
			if z == gone {
				continue
			}
			if m, err := z.Mode(); err == nil && m == "leader" {
				return time.Since(began), nil
			}
		}
		<-time.After(50 * time.Millisecond)
	}
	return time.Since(began), fmt.Errorf("no new leader within %v", timeout)
}

// zkSocketStates returns the TCP states (hex, as in /proc/net/tcp: 01 ESTABLISHED,
// 08 CLOSE_WAIT) of the process's sockets whose remote port is one of ports.
func zkSocketStates(pid int, ports map[int]bool) ([]string, error) {
	socks, err := procSockets(pid)
	if err != nil {
		return nil, err
	}
	var states []string
	for _, s := range socks {
		i := strings.LastIndexByte(s.remote, ':')
		port, err := strconv.ParseInt(s.remote[i+1:], 16, 32)
		if err == nil && ports[int(port)] {
			states = append(states, s.state)
		}
	}
	return states, nil
}

// zkSessionTimeout is the ZooKeeper session timeout leafproxy asks for.
const zkSessionTimeout = 6 * time.Second

// waitSessionDropped waits until none of the (stopped) proxy's connections to ZooKeeper is
// established any more: the server closes a connection when it expires its session.
func waitSessionDropped(t testing.TB, p *Proxy, ens []*testenv.ZooKeeper, timeout time.Duration) time.Duration {
	t.Helper()
	ports := map[int]bool{}
	for _, z := range ens {
		ports[z.Port] = true
	}
	began := time.Now()
	states, err := zkSocketStates(p.Pid(), ports)
	if err != nil || len(states) == 0 {
		t.Fatalf("%s has no connection to ZooKeeper to expire (%v, %v)", p.Name, states, err)
	}
	for time.Since(began) < timeout {
		states, err = zkSocketStates(p.Pid(), ports)
		if err != nil {
			t.Fatal(err)
		}
		established := false
		for _, s := range states {
			established = established || s == "01"
		}
		if !established {
			return time.Since(began)
		}
		<-time.After(100 * time.Millisecond)
	}
	t.Fatalf("ZooKeeper did not drop %s's session within %v (socket states %v)", p.Name, timeout, states)
	return 0
}

var metricLine = regexp.MustCompile(`(?m)^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+)$`)

// metricSum adds up the samples whose name and labels contain all the words
// (leafproxy_worker_events_total{event="session_expired"} matches "expir").
func metricSum(t testing.TB, p *Proxy, words ...string) (float64, bool) {
	t.Helper()
	status, body, err := p.HTTPGet("/metrics", nil)
	if err != nil || status != 200 {
		return 0, false
	}
	sum, found := 0.0, false
	for _, m := range metricLine.FindAllStringSubmatch(body, -1) {
		name := strings.ToLower(m[1] + m[2])
		ok := true
		for _, w := range words {
			ok = ok && strings.Contains(name, w)
		}
		if ok {
			v, _ := strconv.ParseFloat(m[3], 64)
			sum, found = sum+v, true
		}
	}
	return sum, found
}

// TestZooKeeper runs the ZooKeeper worker source against a private three-node ensemble:
// losing the leader under load, a session expiry, and a proxy that starts while the whole
// ensemble is down.
func TestZooKeeper(t *testing.T) {
	requireServeFlags(t, "snowflake-tags", "fill", "worker-source", "zk")
	ens := testenv.NewEnsemble(t, 3)
	servers := make([]string, len(ens))
	for i, z := range ens {
		servers[i] = z.Addr()
	}
	dsn := testenv.NewDatabase(t)
	fx := newFixture(t, dsn, 1000)
	coll := NewCollector()
	name := zkName(t)
	withZK := zkWorkers(t, servers, name)

	t.Run("LeaderLossUnderLoad", func(t *testing.T) {
		proxies := startProxies(t, fx, 2, withZK)
		requireRewriting(t, proxies[0], dsn, snowOrder)
		load := StartLoad(t, coll, dsn, proxies, 8)
		phase := loadDuration() / 3
		hold(phase)
		leader, err := zkLeader(t, ens)
		if err != nil {
			t.Fatal(err)
		}
		load.SetPhase("leader down")
		leaderStopped := time.Now()
		leader.Stop()
		election, err := waitLeader(ens, leader, 60*time.Second)
		if err != nil {
			t.Error(err)
		}
		var flows []time.Duration
		for _, p := range proxies {
			took, err := load.WaitSuccesses(p.Name, 200, 30*time.Second)
			if err != nil {
				t.Errorf("after the leader stopped: %v", err)
			}
			flows = append(flows, took)
		}
		hold(phase)
		for _, p := range proxies {
			if _, err := waitReported(servers, name, p, leaderStopped, 15*time.Second); err != nil {
				t.Errorf("after the leader stopped: %v", err)
			}
		}
		load.SetPhase("after")
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		if err := leader.Start(ctx); err != nil {
			t.Fatalf("restart the old leader: %v", err)
		}
		load.Stop()
		reportErrors(t, "failed statement", load.Errors(), func(loadErr) bool { return true })
		requireNoDuplicates(t, coll)
		t.Logf("FIGURE zk-leader: new leader elected in %v; 200 statements per proxy right after the stop took %v; %d statements, %d errors",
			election.Round(time.Millisecond), flows, load.Total(), len(load.Errors()))
		for _, p := range proxies {
			p.Terminate(30 * time.Second)
		}
	})

	t.Run("SessionExpiry", func(t *testing.T) {
		p := startProxies(t, fx, 1, withZK)[0]
		before := snowflakeWorker(t, p, coll, "before expiry")
		p.Signal(syscall.SIGSTOP)
		stopped := true
		defer func() {
			if stopped {
				p.Signal(syscall.SIGCONT)
			}
		}()
		expiry := waitSessionDropped(t, p, ens, 90*time.Second)
		// The server may close an idle connection a little before it ends the session; a
		// client resumed in that window gets its old session back and sees no expiry. One
		// more session timeout (the worker source's default, 6 s) makes sure it ended.
		<-time.After(zkSessionTimeout)
		p.Signal(syscall.SIGCONT)
		stopped = false
		resumed := time.Now()
		// Issue must go on: poll until a fresh session gets an ID, then keep asking.
		var worker int64 = -1
		var last error
		for time.Since(resumed) < 30*time.Second {
			id, err := httpID(p, "/api/snowflake/get/"+snowOrder, nil)
			if err == nil {
				_, worker, _ = decodeSnowflake(id)
				coll.Add(IDRow{Namespace: snowflakeNamespace, ID: id, Origin: originHTTP, Proxy: p.Name, Phase: "after expiry"})
				break
			}
			last = err
			<-time.After(50 * time.Millisecond)
		}
		if worker < 0 {
			t.Fatalf("no snowflake ID within 30 s of the expired session: %v", last)
		}
		firstID := time.Since(resumed)
		reported, err := waitReported(servers, name, p, resumed, 15*time.Second)
		if err != nil {
			t.Errorf("after the session expired: %v", err)
		}
		if after := snowflakeWorker(t, p, coll, "after expiry"); after != before || worker != before {
			t.Errorf("worker ID %d before the session expired, %d/%d after: the persistent node keeps it", before, worker, after)
		}
		// The source must notice the expiry (log it, count it) and make a new session.
		deadline := time.Now().Add(30 * time.Second)
		var counted float64
		var hasMetric bool
		for time.Now().Before(deadline) {
			if counted, hasMetric = metricSum(t, p, "expir"); counted > 0 {
				break
			}
			<-time.After(100 * time.Millisecond)
		}
		switch {
		case !hasMetric:
			t.Errorf("/metrics has no metric counting ZooKeeper session expiries (DESIGN.md §2: count it in a metric)")
		case counted == 0:
			t.Errorf("the session-expiry metric stayed 0 after the session expired")
		}
		if !regexp.MustCompile(`(?i)expir`).MatchString(p.Log()) {
			t.Errorf("the proxy logged nothing about the expired session")
		}
		requireNoDuplicates(t, coll)
		t.Logf("FIGURE zk-expiry: session dropped %v after SIGSTOP; first ID %v after SIGCONT; worker %d kept; expiry metric %v; node timestamp reported again %v after SIGCONT",
			expiry.Round(time.Millisecond), firstID.Round(time.Millisecond), before, counted, reported.Round(time.Millisecond))
		p.Terminate(30 * time.Second)
	})

	t.Run("StartWhileDownWaitsForTheClaim", func(t *testing.T) {
		p := startProxies(t, fx, 1, withZK)[0]
		before := snowflakeWorker(t, p, coll, "zk up")
		caches, _ := filepath.Glob(filepath.Join(p.TempDir(), "*", "leafconf", "*", "workerID.properties"))
		if len(caches) != 1 {
			t.Errorf("worker-ID cache files under the proxy's TMPDIR: %v, want one {name}/leafconf/{port}/workerID.properties", caches)
		} else if b, err := os.ReadFile(caches[0]); err != nil || !strings.Contains(string(b), fmt.Sprintf("workerID=%d", before)) {
			t.Errorf("%s holds %q (%v), want workerID=%d", caches[0], b, err, before)
		}
		if _, err := p.Terminate(30 * time.Second); err != nil {
			t.Logf("%s exit after SIGTERM: %v", p.Name, err)
		}
		for _, z := range ens {
			z.Stop()
		}
		// It starts with the cached worker ID but issues no snowflake ID: without
		// ZooKeeper nothing proves that no other live process uses that worker ID.
		began := time.Now()
		p.Spawn()
		notReady := waitNotHeld(t, p, 60*time.Second)
		if !strings.Contains(notReady, fmt.Sprintf("worker ID %d ", before)) {
			t.Errorf("/readyz while ZooKeeper is down: %q, want the cached worker ID %d", notReady, before)
		}
		if id, err := httpID(p, "/api/snowflake/get/"+snowOrder, nil); err == nil {
			t.Fatalf("issued snowflake ID %d while ZooKeeper is down", id)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// Members wait for a quorum before they serve: start them all at once.
		errc := make(chan error, len(ens))
		for _, z := range ens {
			go func(z *testenv.ZooKeeper) { errc <- z.Start(ctx) }(z)
		}
		for range ens {
			if err := <-errc; err != nil {
				t.Fatalf("restart ZooKeeper: %v", err)
			}
		}
		zkBack := time.Now()
		if err := p.WaitReady(ctx); err != nil {
			t.Fatalf("not ready after ZooKeeper came back: %v", err)
		}
		took := time.Since(zkBack)
		if after := snowflakeWorker(t, p, coll, "zk back"); after != before {
			t.Errorf("worker ID %d after ZooKeeper came back, %d before", after, before)
		}
		if _, err := waitReported(servers, name, p, zkBack, 30*time.Second); err != nil {
			t.Errorf("after ZooKeeper came back: %v", err)
		}
		requireNoDuplicates(t, coll)
		t.Logf("FIGURE zk-cache: started %v before ZooKeeper came back with worker %d from the cache, refusing; ready %v after ZooKeeper answered",
			zkBack.Sub(began).Round(time.Millisecond), before, took.Round(time.Millisecond))
	})

	t.Run("RestartBehindNodeTimestamp", func(t *testing.T) {
		// The same ip:port reuses its node; the node's timestamp is ahead of a clock that
		// went back, so the proxy must not issue until its clock has passed it (or refuse
		// to start).
		bin := clockBin(t)
		p := startProxies(t, fx, 1, withZK)[0]
		issuing := time.Now()
		worker := snowflakeWorker(t, p, coll, "before")
		if _, err := waitReported(servers, name, p, issuing, 15*time.Second); err != nil {
			t.Fatal(err)
		}
		var newest time.Time
		for _, r := range coll.Select(func(r IDRow) bool { return r.Proxy == p.Name }) {
			if at, _, _ := decodeSnowflake(r.ID); at.After(newest) {
				newest = at
			}
		}
		p.Kill()
		p.cfg.Binary = bin
		p.cfg.Env = append(p.cfg.Env, "LEAFPROXY_TEST_CLOCK_OFFSET=-5s")
		restarted := time.Now()
		p.Spawn()
		for {
			id, err := httpID(p, "/api/snowflake/get/"+snowOrder, nil)
			if err == nil {
				at, w, _ := decodeSnowflake(id)
				coll.Add(IDRow{Namespace: snowflakeNamespace, ID: id, Origin: originHTTP, Proxy: p.Name, Phase: "restart behind"})
				if !at.After(newest) {
					t.Errorf("restarted 5 s behind its node's timestamp, it issued ID %d from %v, not after the newest earlier ID (%v)", id, at, newest)
				}
				if w != worker {
					t.Errorf("worker ID %d after the restart, %d before: the same ip:port keeps its node", w, worker)
				}
				t.Logf("FIGURE zk-clock: first ID %v after a restart 5 s behind the node's timestamp", time.Since(restarted).Round(time.Millisecond))
				break
			}
			if gone, werr := p.exited(); gone {
				t.Logf("FIGURE zk-clock: refused to start 5 s behind the node's timestamp (%v): %s", werr, p.LogTail(1))
				if !strings.Contains(strings.ToLower(p.LogTail(5)), "clock") {
					t.Errorf("the proxy exited, but not because of the clock:\n%s", p.LogTail(5))
				}
				break
			}
			if time.Since(restarted) > 30*time.Second {
				t.Fatalf("no snowflake ID and no exit within 30 s of a restart 5 s behind: %v", err)
			}
			<-time.After(50 * time.Millisecond)
		}
		requireNoDuplicates(t, coll)
	})
}

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// zkReportedAt reads the timestamp the proxy last wrote into its worker node
// /snowflake/{name}/forever/{ip}:{port}-{seq} (Leaf's 3 s report).
func zkReportedAt(servers []string, name string, p *Proxy) (int64, error) {
	conn, _, err := zk.Connect(servers, 5*time.Second, zk.WithLogger(quietLogger{}))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	dir := "/snowflake/" + name + "/forever"
	kids, _, err := conn.Children(dir)
	if err != nil {
		return 0, fmt.Errorf("children of %s: %w", dir, err)
	}
	// The proxy names itself by the host's address, not the loopback it listens on, so
	// match the node by port (unique among the test's proxies).
	for _, k := range kids {
		i := strings.LastIndexByte(k, '-')
		if i < 0 || !strings.HasSuffix(k[:i], fmt.Sprintf(":%d", p.ListenPort)) {
			continue
		}
		data, _, err := conn.Get(dir + "/" + k)
		if err != nil {
			return 0, err
		}
		var node struct {
			Timestamp int64 `json:"timestamp"`
		}
		if err := json.Unmarshal(data, &node); err != nil {
			return 0, fmt.Errorf("node %s holds %q: %w", k, data, err)
		}
		return node.Timestamp, nil
	}
	return 0, fmt.Errorf("no node for port %d among %v", p.ListenPort, kids)
}

// waitReported waits until the proxy's worker node carries a timestamp at or after since.
// The node holds the high-water mark (the last millisecond used), so this holds once an ID
// was issued at or after since and the periodic report wrote it; the first ID after a
// resume may fall in the very millisecond of since. It returns how long after since that
// was seen.
func waitReported(servers []string, name string, p *Proxy, since time.Time, timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	var last int64
	var err error
	for time.Now().Before(deadline) {
		if last, err = zkReportedAt(servers, name, p); err == nil && last >= since.UnixMilli() {
			return time.Since(since), nil
		}
		<-time.After(200 * time.Millisecond)
	}
	return time.Since(since), fmt.Errorf("%s's ZooKeeper node timestamp is %d (%v), not at or after %v: the 3 s reports stopped",
		p.Name, last, err, since.Format("15:04:05.000"))
}
