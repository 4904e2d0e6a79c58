package zookeeper_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/idgen/worker"
	"github.com/leafproxy/leafproxy/idgen/worker/zookeeper"
	"github.com/leafproxy/leafproxy/internal/testenv"
)

var ctx = context.Background()

// uniqueName gives each test its own tree /snowflake/{name} on the server at addr, and
// removes the tree when the test ends.
func uniqueName(t *testing.T, addr string) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	name := "leaftest-" + hex.EncodeToString(b)
	t.Cleanup(func() {
		c, _, err := zk.Connect([]string{addr}, 4*time.Second, zk.WithLogInfo(false), zk.WithLogger(nopLogger{}))
		if err != nil {
			return
		}
		defer c.Close()
		deleteTree(c, "/snowflake/"+name)
	})
	return name
}

func deleteTree(c *zk.Conn, p string) {
	children, _, err := c.Children(p)
	if err != nil {
		return
	}
	for _, child := range children {
		deleteTree(c, p+"/"+child)
	}
	_ = c.Delete(p, -1)
}

func settings(t *testing.T, addr, name, port string) zookeeper.Settings {
	log, _ := test.NewNullLogger()
	return zookeeper.Settings{Servers: []string{addr}, Name: name, IP: "127.0.0.1", Port: port,
		CacheDir: t.TempDir(), ConnectTimeout: 15 * time.Second, SessionTimeout: 4 * time.Second, Logger: log}
}

func newSource(t *testing.T, s zookeeper.Settings) *zookeeper.Source {
	t.Helper()
	src, err := zookeeper.New(s)
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

// rawConn is a plain client for looking at and preparing the tree.
func rawConn(t *testing.T, addr string) *zk.Conn {
	t.Helper()
	c, _, err := zk.Connect([]string{addr}, 4*time.Second, zk.WithLogInfo(false), zk.WithLogger(nopLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

type nopLogger struct{}

func (nopLogger) Printf(string, ...any) {}

func forever(name string) string { return "/snowflake/" + name + "/forever" }

// addNode creates a Leaf node for ip:port the way Leaf does, with the given timestamp.
func addNode(t *testing.T, c *zk.Conn, name, key string, ts int64) string {
	t.Helper()
	p := ""
	for _, part := range strings.Split(strings.TrimPrefix(forever(name), "/"), "/") {
		p += "/" + part
		if _, err := c.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
	}
	ip, port, _ := strings.Cut(key, ":")
	data := fmt.Sprintf(`{"ip":%q,"port":%q,"timestamp":%d}`, ip, port, ts)
	created, err := c.Create(forever(name)+"/"+key+"-", []byte(data), zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	return created
}

type leafData struct {
	IP        string `json:"ip"`
	Port      string `json:"port"`
	Timestamp int64  `json:"timestamp"`
}

func readNode(t *testing.T, c *zk.Conn, p string) leafData {
	t.Helper()
	b, _, err := c.Get(p)
	if err != nil {
		t.Fatalf("get %s: %v", p, err)
	}
	var d leafData
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("node %s holds %q: %v", p, b, err)
	}
	return d
}

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

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    zookeeper.Settings
	}{
		{"no servers", zookeeper.Settings{Name: "a", Port: "1"}},
		{"no name", zookeeper.Settings{Servers: []string{"x:1"}, Port: "1"}},
		{"slash in name", zookeeper.Settings{Servers: []string{"x:1"}, Name: "a/b", Port: "1"}},
		{"no port", zookeeper.Settings{Servers: []string{"x:1"}, Name: "a"}},
	} {
		if _, err := zookeeper.New(tc.s); err == nil {
			t.Errorf("%s: New succeeded", tc.name)
		}
	}
}

func TestDifferentPortsGetDifferentIDs(t *testing.T) {
	addr := testenv.ZooKeeperAddr(t)
	name := uniqueName(t, addr)
	a := acquire(t, newSource(t, settings(t, addr, name, "7001")))
	b := acquire(t, newSource(t, settings(t, addr, name, "7002")))
	if a.WorkerID() == b.WorkerID() {
		t.Fatalf("both ports got worker %d", a.WorkerID())
	}
	children, _, err := rawConn(t, addr).Children(forever(name))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(children)
	want := []string{fmt.Sprintf("127.0.0.1:7001-%010d", a.WorkerID()), fmt.Sprintf("127.0.0.1:7002-%010d", b.WorkerID())}
	sort.Strings(want)
	if strings.Join(children, ",") != strings.Join(want, ",") {
		t.Fatalf("nodes %v, want %v", children, want)
	}
}

func TestRestartReusesNodeAndRecordsTimestamp(t *testing.T) {
	addr := testenv.ZooKeeperAddr(t)
	name := uniqueName(t, addr)
	s := settings(t, addr, name, "7001")
	s.ReportInterval = 50 * time.Millisecond
	raw := rawConn(t, addr)
	addNode(t, raw, name, "127.0.0.1:6999", 0) // someone else first

	first, err := newSource(t, s).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := fmt.Sprintf("%s/127.0.0.1:7001-%010d", forever(name), first.WorkerID())
	mark := readNode(t, raw, node).Timestamp + 1 // reports only ever raise the node's timestamp
	first.Record(mark)
	waitUntil(t, 5*time.Second, "the periodic report", func() bool { return readNode(t, raw, node).Timestamp == mark })
	if d := readNode(t, raw, node); d.IP != "127.0.0.1" || d.Port != "7001" {
		t.Fatalf("node data %+v, want Leaf's ip/port/timestamp", d)
	}
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}

	again := acquire(t, newSource(t, s))
	if again.WorkerID() != first.WorkerID() || again.HighWater() != mark {
		t.Fatalf("restart: worker %d high-water %d, want %d and %d", again.WorkerID(), again.HighWater(), first.WorkerID(), mark)
	}
	if children, _, _ := raw.Children(forever(name)); len(children) != 2 {
		t.Fatalf("restart created a node: %v", children)
	}
}

func TestStoredTimestampInTheFutureFailsStart(t *testing.T) {
	addr := testenv.ZooKeeperAddr(t)
	name := uniqueName(t, addr)
	addNode(t, rawConn(t, addr), name, "127.0.0.1:7001", time.Now().Add(time.Hour).UnixMilli())
	_, err := newSource(t, settings(t, addr, name, "7001")).Acquire(ctx)
	if !errors.Is(err, worker.ErrClockBehind) {
		t.Fatalf("Acquire = %v, want ErrClockBehind", err)
	}
}

func TestFirstStartTakesTheSequenceNumber(t *testing.T) {
	addr := testenv.ZooKeeperAddr(t)
	name := uniqueName(t, addr)
	raw := rawConn(t, addr)
	for i := 0; i < 3; i++ {
		addNode(t, raw, name, fmt.Sprintf("10.0.0.%d:8080", i+1), 0)
	}
	l := acquire(t, newSource(t, settings(t, addr, name, "7001")))
	if l.WorkerID() != 3 {
		t.Fatalf("first start got worker %d, want its sequence number 3 (Leaf's bug gives 0)", l.WorkerID())
	}
	if _, _, err := raw.Get(fmt.Sprintf("%s/127.0.0.1:7001-%010d", forever(name), 3)); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentStartsOnAFreshTree(t *testing.T) {
	addr := testenv.ZooKeeperAddr(t)
	name := uniqueName(t, addr)
	const n = 8
	ids := make([]int, n)
	errs := make([]error, n)
	sources := make([]*zookeeper.Source, n)
	for i := range sources {
		sources[i] = newSource(t, settings(t, addr, name, fmt.Sprint(7100+i)))
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, src := range sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			l, err := src.Acquire(ctx)
			if err != nil {
				errs[i] = err
				return
			}
			ids[i] = int(l.WorkerID())
			l.Close(ctx)
		}()
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	sort.Ints(ids)
	for i, id := range ids {
		if id != i {
			t.Fatalf("worker IDs %v, want 0..%d each exactly once", ids, n-1)
		}
	}
}

func TestSequenceBeyondTheLastWorkerIDFails(t *testing.T) {
	addr := testenv.ZooKeeperAddr(t)
	name := uniqueName(t, addr)
	raw := rawConn(t, addr)
	for i := 0; i < 4; i++ {
		addNode(t, raw, name, fmt.Sprintf("10.0.0.%d:8080", i+1), 0)
	}
	s := settings(t, addr, name, "7001")
	s.MaxWorkerID = 3 // as with 2 worker bits; 1023 behaves the same with 1,024 nodes
	_, err := newSource(t, s).Acquire(ctx)
	if !errors.Is(err, worker.ErrExhausted) {
		t.Fatalf("Acquire with sequence 4 > 3 = %v, want ErrExhausted", err)
	}
	t.Logf("error: %v", err)
	if children, _, _ := raw.Children(forever(name)); len(children) != 4 {
		t.Fatalf("the useless node was left behind: %v", children)
	}
}

func TestCacheFileWhenZooKeeperIsDown(t *testing.T) {
	z := testenv.NewZooKeeper(t)
	name := uniqueName(t, z.Addr())
	s := settings(t, z.Addr(), name, "7001")
	s.ConnectTimeout = time.Second
	s.ReportInterval = 50 * time.Millisecond
	first := acquire(t, newSource(t, s))
	mark := time.Now().UnixMilli() - 5
	first.Record(mark)
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(s.CacheDir, name, "leafconf", "7001", "workerID.properties")
	if b, err := os.ReadFile(cache); err != nil || string(b) != fmt.Sprintf("workerID=%d\ntimestamp=%d\n", first.WorkerID(), mark) {
		t.Fatalf("cache file %q, %v", b, err)
	}
	z.Stop()

	other := s
	other.Port = "7002"
	if _, err := newSource(t, other).Acquire(ctx); !errors.Is(err, worker.ErrUnreachable) {
		t.Fatalf("without ZooKeeper and cache file: %v, want ErrUnreachable", err)
	}

	future := s
	future.CacheDir = t.TempDir()
	futureFile := filepath.Join(future.CacheDir, name, "leafconf", "7001", "workerID.properties")
	os.MkdirAll(filepath.Dir(futureFile), 0o755)
	os.WriteFile(futureFile, []byte(fmt.Sprintf("workerID=5\ntimestamp=%d\n", time.Now().Add(time.Hour).UnixMilli())), 0o644)
	if _, err := newSource(t, future).Acquire(ctx); !errors.Is(err, worker.ErrClockBehind) {
		t.Fatalf("cache file with a future timestamp: %v, want ErrClockBehind", err)
	}

	cached := acquire(t, newSource(t, s))
	if cached.WorkerID() != first.WorkerID() || cached.HighWater() != mark {
		t.Fatalf("from the cache file: worker %d high-water %d, want %d and %d", cached.WorkerID(), cached.HighWater(), first.WorkerID(), mark)
	}
	// Without ZooKeeper nothing proves that no other live process uses the worker ID.
	if !cached.ValidUntil().Before(time.Now()) {
		t.Fatalf("a lease from the cache file is valid until %v while ZooKeeper is down", cached.ValidUntil())
	}

	// When ZooKeeper comes back, the lease ends, and a new one claims the worker ID.
	if err := z.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cached.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the lease from the cache file did not end within 30 s of ZooKeeper's return")
	}
	again := acquire(t, newSource(t, s))
	if again.WorkerID() != first.WorkerID() || again.HighWater() < mark || !time.Now().Before(again.ValidUntil()) {
		t.Fatalf("after ZooKeeper came back: worker %d high-water %d valid until %v, want worker %d, high-water >= %d, valid",
			again.WorkerID(), again.HighWater(), again.ValidUntil(), first.WorkerID(), mark)
	}
}

// An outage long enough to expire the session: the engine refuses IDs before the server
// can end the session (two thirds of the session timeout after the last answered check),
// so the claim never passes to another process while IDs are issued here; once the link is
// back, the worker ID is claimed again through a new session and issue resumes.
func TestSessionLossFencesUntilTheIDIsClaimedAgain(t *testing.T) {
	addr := testenv.ZooKeeperAddr(t)
	name := uniqueName(t, addr)
	proxy := newCutProxy(t, addr)
	s := settings(t, proxy.Addr(), name, "7001")
	s.SessionTimeout = 3 * time.Second
	s.ReportInterval = 100 * time.Millisecond
	var expired atomic.Int32
	s.Hooks = worker.Hooks{OnSessionExpired: func(int64) { expired.Add(1) }}
	log, _ := test.NewNullLogger()
	e, err := snowflake.New(snowflake.Settings{Source: newSource(t, s), Logger: log, RetryBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	before, err := e.Next(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	claim := fmt.Sprintf("/snowflake/%s/live/%d", name, e.Info().WorkerID)
	raw := rawConn(t, addr)
	if ok, _, err := raw.Exists(claim); !ok || err != nil {
		t.Fatalf("no liveness claim %s (%v)", claim, err)
	}

	proxy.setCut(true)
	cut := time.Now()
	var lastDuring int64
	waitUntil(t, 2*s.SessionTimeout, "the engine to refuse IDs", func() bool {
		id, err := e.Next(ctx, "")
		if err == nil {
			lastDuring = id
		}
		return errors.Is(err, idgen.ErrWorkerNotHeld)
	})
	refusedAfter := time.Since(cut)
	// The server ends the session a session timeout after it last heard from us, which
	// was before the cut: IDs must stop before that.
	if refusedAfter >= s.SessionTimeout {
		t.Fatalf("issued IDs for %v after the cut; the session can end %v after it", refusedAfter, s.SessionTimeout)
	}
	if lastDuring != 0 {
		if at := time.UnixMilli(e.Decompose(lastDuring).Millis); !at.Before(cut.Add(s.SessionTimeout)) {
			t.Fatalf("an ID of %v, after the session could have ended", at)
		}
	}
	waitUntil(t, 4*s.SessionTimeout, "the server to end the session and its claim", func() bool {
		ok, _, err := raw.Exists(claim)
		return err == nil && !ok
	})

	proxy.setCut(false)
	var after int64
	waitUntil(t, 30*time.Second, "issue to resume with the worker ID claimed again", func() bool {
		after, err = e.Next(ctx, "")
		return err == nil
	})
	if e.Decompose(after).Worker != e.Decompose(before).Worker || after <= before || expired.Load() == 0 {
		t.Fatalf("after the outage: ID %d (before %d), session expiries counted %d", after, before, expired.Load())
	}
	if ok, _, err := raw.Exists(claim); !ok || err != nil {
		t.Fatalf("the worker ID was not claimed again: %v", err)
	}
	t.Logf("IDs refused %v after the cut (session timeout %v)", refusedAfter.Round(time.Millisecond), s.SessionTimeout)
	node := fmt.Sprintf("%s/127.0.0.1:7001-%010d", forever(name), e.Info().WorkerID)
	last := e.Decompose(after).Millis
	waitUntil(t, 10*time.Second, "reports to resume", func() bool { return readNode(t, raw, node).Timestamp >= last })
}
