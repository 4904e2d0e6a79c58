package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

var (
	faultSeed     = flag.Uint64("fault-seed", 0, "seed of TestFaultSchedule's scheduler; 0: $LEAF_FAULT_SEED, else a new one (printed)")
	faultDuration = flag.Duration("fault-duration", 0, "how long TestFaultSchedule injects faults; 0: $LEAF_FAULT_DURATION, else 75s")
)

// faultLeaseTTL is the PostgreSQL lease TTL of the schedule's lease proxies: short, so that
// a pause past it takes seconds.
const faultLeaseTTL = 3 * time.Second

// zkReservedWorkers are the worker IDs the schedule keeps out of the PostgreSQL lease
// table (a holder that never expires), because the ZooKeeper proxy numbers its worker IDs
// from 0: the two sources share no table, and the test must not make them collide.
const zkReservedWorkers = 16

// faultKind is one kind of fault the scheduler injects.
type faultKind string

const (
	faultKill      faultKind = "kill -9 and restart a proxy"
	faultPause     faultKind = "SIGSTOP past the lease and SIGCONT"
	faultPostgres  faultKind = "PostgreSQL restart"
	faultZKLeader  faultKind = "ZooKeeper leader kill"
	faultClockStep faultKind = "clock step back"
)

// faultWeights is how often each kind is drawn, relative to the others.
var faultWeights = []struct {
	kind   faultKind
	weight int
}{
	{faultKill, 3}, {faultPause, 3}, {faultPostgres, 2}, {faultZKLeader, 2}, {faultClockStep, 3},
}

// scheduleSeed returns the seed of this run: -fault-seed, $LEAF_FAULT_SEED or a new one.
func scheduleSeed(t testing.TB) uint64 {
	t.Helper()
	if *faultSeed != 0 {
		return *faultSeed
	}
	if v := os.Getenv("LEAF_FAULT_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("LEAF_FAULT_SEED=%q: %v", v, err)
		}
		return seed
	}
	return uint64(time.Now().UnixNano())%1_000_000_000 + 1
}

// scheduleDuration returns how long faults are injected: -fault-duration,
// $LEAF_FAULT_DURATION or 75 s.
func scheduleDuration(t testing.TB) time.Duration {
	t.Helper()
	if *faultDuration > 0 {
		return *faultDuration
	}
	if v := os.Getenv("LEAF_FAULT_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("LEAF_FAULT_DURATION=%q: want a positive Go duration such as 10m", v)
		}
		return d
	}
	return 75 * time.Second
}

// faultRig is what the scheduler breaks: three proxies of the test-clock build, two leasing
// their worker IDs from PostgreSQL and one taking it from a ZooKeeper ensemble, a private
// PostgreSQL serving as upstream and store, and the load on the proxies.
type faultRig struct {
	t       *testing.T
	r       *rand.Rand
	began   time.Time
	pg      *testenv.Postgres
	ens     []*testenv.ZooKeeper
	proxies []*Proxy
	leased  []*Proxy // the proxies leasing from PostgreSQL
	load    *Load
	counts  map[faultKind]int
	faultAt time.Time // when the fault being injected began
}

// note logs what the fault being injected did, with its start since the schedule began.
func (g *faultRig) note(format string, args ...any) {
	g.t.Helper()
	g.t.Logf("fault at t+%5.1fs: %s", g.faultAt.Sub(g.began).Seconds(), fmt.Sprintf(format, args...))
}

// between draws a duration in [lo, hi) from the schedule's source.
func (g *faultRig) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(g.r.Int64N(int64(hi-lo)))
}

func (g *faultRig) pick() faultKind {
	total := 0
	for _, w := range faultWeights {
		total += w.weight
	}
	n := g.r.IntN(total)
	for _, w := range faultWeights {
		if n < w.weight {
			return w.kind
		}
		n -= w.weight
	}
	return faultWeights[0].kind
}

// inject applies one fault and undoes it, so that the next one starts from a whole system.
func (g *faultRig) inject(kind faultKind) {
	g.t.Helper()
	g.counts[kind]++
	g.faultAt = time.Now()
	switch kind {
	case faultKill:
		g.kill()
	case faultPause:
		g.pause()
	case faultPostgres:
		g.restartPostgres()
	case faultZKLeader:
		g.killZKLeader()
	case faultClockStep:
		g.stepClock()
	}
}

func (g *faultRig) kill() {
	g.t.Helper()
	p := g.proxies[g.r.IntN(len(g.proxies))]
	down := g.between(200*time.Millisecond, 3*time.Second)
	p.Kill()
	hold(down)
	took := p.Start()
	g.note("kill -9 %s, restarted after %v, ready in %v", p.Name, down.Round(time.Millisecond), took.Round(time.Millisecond))
}

// pause freezes a proxy with its clients' statements waiting in its sockets until its
// worker ID is no longer its own: for a lease proxy, until the lease row has expired and
// the other lease proxy, killed and restarted meanwhile, may have claimed that row (the
// lowest expired one); for the ZooKeeper proxy, past the session timeout. Then it resumes.
func (g *faultRig) pause() {
	g.t.Helper()
	p := g.proxies[g.r.IntN(len(g.proxies))]
	var other *Proxy // the other lease proxy, when p leases too
	if contains(g.leased, p) {
		for _, q := range g.leased {
			if q != p {
				other = q
			}
		}
	}
	extra := g.between(500*time.Millisecond, 2*time.Second)
	p.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	if other == nil {
		hold(zkSessionTimeout + extra)
		p.Signal(syscall.SIGCONT)
		g.note("SIGSTOP %s for %v (ZooKeeper session timeout %v), SIGCONT", p.Name, time.Since(stopped).Round(time.Millisecond), zkSessionTimeout)
		return
	}
	hold(faultLeaseTTL + extra)
	other.Kill()
	took := other.Start()
	// The restarted proxy issues before the frozen one resumes: were the frozen one to
	// answer its waiting clients with the worker ID the other may now hold, the two runs'
	// spans of that worker ID would overlap (Collector.WorkerOverlaps).
	if _, err := g.load.WaitSuccesses(other.Name, 20, 30*time.Second); err != nil {
		g.t.Errorf("%s after its restart, while %s is frozen: %v", other.Name, p.Name, err)
	}
	p.Signal(syscall.SIGCONT)
	g.note("SIGSTOP %s for %v (lease TTL %v); meanwhile kill -9 %s, ready again in %v; SIGCONT",
		p.Name, time.Since(stopped).Round(time.Millisecond), faultLeaseTTL, other.Name, took.Round(time.Millisecond))
}

func (g *faultRig) restartPostgres() {
	g.t.Helper()
	crash := g.r.IntN(2) == 0
	down := g.between(500*time.Millisecond, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	how := "fast shutdown"
	stop := g.pg.Stop
	if crash {
		how, stop = "crash (immediate shutdown)", g.pg.Kill
	}
	if err := stop(ctx); err != nil {
		g.t.Fatalf("stop PostgreSQL: %v", err)
	}
	hold(down)
	began := time.Now()
	if err := g.pg.Start(ctx); err != nil {
		g.t.Fatalf("start PostgreSQL: %v", err)
	}
	g.note("PostgreSQL %s, down %v, started in %v", how, down.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

func (g *faultRig) killZKLeader() {
	g.t.Helper()
	// The ensemble may still be settling from an earlier fault: wait for a leader first.
	if _, err := waitLeader(g.ens, nil, time.Minute); err != nil {
		g.t.Fatal(err)
	}
	leader, err := zkLeader(g.t, g.ens)
	if err != nil {
		g.t.Fatal(err)
	}
	down := g.between(500*time.Millisecond, 5*time.Second)
	leader.Stop()
	elected, err := waitLeader(g.ens, leader, time.Minute)
	if err != nil {
		g.t.Fatal(err)
	}
	hold(down)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := leader.Start(ctx); err != nil {
		g.t.Fatalf("restart the old ZooKeeper leader: %v", err)
	}
	g.note("kill ZooKeeper leader on port %d, new leader in %v, old one back after %v", leader.Port,
		elected.Round(time.Millisecond), down.Round(time.Millisecond))
}

// stepClock moves one proxy's clock back, within the tolerance the engine waits out or
// beyond it, holds it there, and puts it right again (a step forward).
func (g *faultRig) stepClock() {
	g.t.Helper()
	p := g.proxies[g.r.IntN(len(g.proxies))]
	back := g.between(time.Millisecond, 1500*time.Millisecond)
	if g.r.IntN(2) == 0 {
		back = g.between(time.Millisecond, 5*time.Millisecond) // within --clock-max-backwards
	}
	behind := g.between(500*time.Millisecond, 4*time.Second)
	setClockOffset(g.t, p, (-back).String())
	hold(behind)
	setClockOffset(g.t, p, "0s")
	g.note("clock of %s stepped back %v for %v, then forward again", p.Name, back.Round(time.Microsecond), behind.Round(time.Millisecond))
}

func contains(ps []*Proxy, p *Proxy) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// faultTolerated reports whether a failed statement is one a client may see while faults
// are injected: a broken or refused connection, a statement that timed out on a frozen
// proxy, or an ID source saying it cannot issue now (55000). Wrong data, another SQLSTATE
// or a protocol error is never tolerated.
func faultTolerated(e loadErr) bool {
	if e.Conn {
		return true
	}
	if strings.HasPrefix(e.Err.Error(), "wrong data") {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(e.Err, &pgErr) {
		switch pgErr.Code {
		case "55000", // object not in prerequisite state: no valid worker ID, clock behind, store down
			"57014", // query canceled: a statement timeout on the client's side
			"53300": // too many connections while a restarted proxy's clients reconnect
			return true
		}
		return false
	}
	var netErr net.Error
	return errors.Is(e.Err, context.DeadlineExceeded) || (errors.As(e.Err, &netErr) && netErr.Timeout())
}

// errorClass names the kind of a failed statement, for the summary.
func errorClass(e loadErr) string {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(e.Err, &pgErr):
		return pgErr.Code
	case e.Conn:
		return "connection"
	case errors.Is(e.Err, context.DeadlineExceeded):
		return "timeout"
	default:
		return "other"
	}
}

// TestFaultSchedule runs three proxies under mixed load (segment and snowflake leaf_next,
// filled INSERTs) while a scheduler injects faults drawn at random from a printed seed:
// kill -9 and restart of a proxy; SIGSTOP of a proxy past its lease TTL (while the other
// lease proxy restarts and may claim the expired worker ID) or past its ZooKeeper session,
// then SIGCONT; a PostgreSQL restart, clean or a crash; the ZooKeeper leader killed; a
// proxy's clock stepped back, within the tolerance or beyond it. Clients may see
// connection errors, timeouts and 55000 while it happens; afterwards every proxy serves
// again, and across everything no ID was handed out twice, none is malformed, and every
// filled INSERT's row holds the ID its client was told.
//
// 75 s of faults by default; -fault-duration or LEAF_FAULT_DURATION (make soak SOAK=10m)
// sets it; -fault-seed or LEAF_FAULT_SEED replays a schedule.
func TestFaultSchedule(t *testing.T) {
	requireServeFlags(t, "snowflake-tags", "fill", "worker-source", "worker-lease-ttl", "zk", "zk-name")
	seed, duration := scheduleSeed(t), scheduleDuration(t)
	t.Logf("fault schedule: seed %d, %v of faults (replay: LEAF_FAULT_SEED=%d)", seed, duration, seed)
	bin := clockBin(t)
	pg := testenv.NewPostgres(t)
	// The test servers commit asynchronously for speed; a crash of this one must not lose
	// a commit a client was told of, or the check of the filled tables would blame the proxy.
	execSQL(t, pg.URL("postgres"), "ALTER SYSTEM SET synchronous_commit = on")
	execSQL(t, pg.URL("postgres"), "SELECT pg_reload_conf()")
	ens := testenv.NewEnsemble(t, 3)
	dsn := pg.NewDatabase(t)
	fx := newFixture(t, dsn, 1000)
	execSQL(t, dsn, `UPDATE leaf_worker_lease SET holder = 'e2e: ZooKeeper range', expires_at = 'infinity'
		WHERE worker_id < $1`, zkReservedWorkers)
	servers := make([]string, len(ens))
	for i, z := range ens {
		servers[i] = z.Addr()
	}
	withZK := zkWorkers(t, servers, zkName(t))
	proxies := startProxies(t, fx, 3, func(i int, c *ProxyConfig) {
		c.Binary = bin
		if i == 2 {
			withZK(i, c)
			return
		}
		c.WorkerSource = "postgres"
		c.Extra = append(c.Extra, "--worker-lease-ttl", faultLeaseTTL.String())
	})
	requireRewriting(t, proxies[0], dsn, snowOrder)

	g := &faultRig{t: t, r: rand.New(rand.NewPCG(seed, 0x1eaf)), pg: pg, ens: ens, proxies: proxies,
		leased: proxies[:2], counts: map[faultKind]int{}}
	coll := NewCollector()
	g.load = StartLoad(t, coll, dsn, proxies, 8)
	began := time.Now()
	g.began = began
	for time.Since(began) < duration {
		hold(g.between(time.Second, 3*time.Second))
		kind := g.pick()
		g.load.SetPhase(fmt.Sprintf("fault %d", sumCounts(g.counts)+1))
		g.inject(kind)
	}
	faulted := time.Since(began)

	// Whole again: every proxy runs and serves.
	g.load.SetPhase("after")
	for _, p := range proxies {
		if gone, err := p.exited(); gone {
			t.Errorf("%s exited: %v\n%s", p.Name, err, p.LogTail(20))
			continue
		}
		if _, err := g.load.WaitSuccesses(p.Name, 50, 60*time.Second); err != nil {
			t.Errorf("after the schedule: %v", err)
		}
	}
	g.load.Stop()
	total := time.Since(began)

	errs := g.load.Errors()
	reportErrors(t, "a failure no fault explains", errs, func(e loadErr) bool { return !faultTolerated(e) })
	requireNoDuplicates(t, coll)
	overlaps := coll.WorkerOverlaps()
	for _, o := range overlaps {
		t.Errorf("two processes issued one worker ID at once: %s", o)
	}
	checkStoredUnique(t, fx, coll)
	for _, p := range proxies {
		for _, w := range coll.Workers(p.Name) {
			if zk := p == proxies[2]; zk != (w < zkReservedWorkers) {
				t.Errorf("%s issued snowflake IDs of worker ID %d, outside its source's range (ZooKeeper below %d, leases from it)",
					p.Name, w, zkReservedWorkers)
			}
		}
	}
	if t.Failed() {
		t.Logf("replay this schedule with LEAF_FAULT_SEED=%d LEAF_FAULT_DURATION=%v", seed, duration)
	}

	byClass := map[string]int{}
	for _, e := range errs {
		byClass[errorClass(e)]++
	}
	t.Logf("FIGURE faults: seed %d; %v of faults, %v in all; %d statements (%.0f/s), %d IDs; faults:%s; failed statements %d:%s; duplicates %d; worker-ID overlaps %d",
		seed, faulted.Round(time.Second), total.Round(time.Second), g.load.Total(), float64(g.load.Total())/total.Seconds(),
		coll.Len(), renderCounts(g.counts), len(errs), renderCounts(byClass), len(coll.Duplicates()), len(overlaps))
	t.Logf("per op:%s", g.load.OpCounts())
	t.Logf("per namespace:%s", coll.CountBy(func(r IDRow) string { return r.Namespace }))
	t.Logf("snowflake worker IDs: %s %v, %s %v, %s %v", proxies[0].Name, coll.Workers(proxies[0].Name),
		proxies[1].Name, coll.Workers(proxies[1].Name), proxies[2].Name, coll.Workers(proxies[2].Name))
}

func sumCounts[K comparable](m map[K]int) int {
	n := 0
	for _, c := range m {
		n += c
	}
	return n
}

// renderCounts renders a count per key, sorted by key: " [a]=1 [b]=2".
func renderCounts[K ~string](m map[K]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, string(k))
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " [%s]=%d", k, m[K(k)])
	}
	return b.String()
}
