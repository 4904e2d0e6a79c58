package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// leaseTTL is the lease TTL of the pause scenario: short, so that the test waits seconds.
const leaseTTL = 3 * time.Second

// pgLeases configures proxies to lease their worker IDs from PostgreSQL with leaseTTL.
func pgLeases(_ int, c *ProxyConfig) {
	c.WorkerSource = "postgres"
	c.Extra = append(c.Extra, "--worker-lease-ttl", leaseTTL.String())
}

// waitLeaseExpired waits until the lease row of worker has expired by the database's clock.
func waitLeaseExpired(t testing.TB, dsn string, worker int64, timeout time.Duration) time.Duration {
	t.Helper()
	began := time.Now()
	for {
		n := queryInt64s(t, dsn, "SELECT count(*) FROM leaf_worker_lease WHERE worker_id = $1 AND expires_at <= now()", worker)
		if len(n) == 1 && n[0] == 1 {
			return time.Since(began)
		}
		if time.Since(began) > timeout {
			t.Fatalf("the lease row of worker %d has not expired within %v: %s", worker, timeout, leaseState(t, dsn, worker))
		}
		<-time.After(50 * time.Millisecond)
	}
}

// leaseState describes the lease row of worker and the database's other sessions, for
// the message of a wait that failed.
func leaseState(t testing.TB, dsn string, worker int64) string {
	t.Helper()
	return queryText(t, dsn, `SELECT coalesce((SELECT format('holder %s, expires_at %s, update_time %s',
			holder, expires_at, update_time) FROM leaf_worker_lease WHERE worker_id = $1), 'no row')
		|| format(', now %s; sessions: ', now())
		|| coalesce((SELECT string_agg(format('%s (%s): %s', state, wait_event, left(query, 120)), '; ')
			FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()), 'none')`, worker)
}

// waitStopped waits until every thread of the process is stopped (state T): kill(SIGSTOP)
// returns before the threads running on other processors have stopped.
func waitStopped(t testing.TB, pid int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		if err != nil || len(tasks) == 0 {
			t.Fatalf("threads of pid %d: %v", pid, err)
		}
		stopped := true
		for _, task := range tasks {
			b, err := os.ReadFile(task)
			if err != nil {
				stopped = false // a thread that just ended: look again
				break
			}
			// pid (comm) state …: comm may hold spaces, so read after its last ')'.
			rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
			if f := strings.Fields(rest); len(f) == 0 || f[0] != "T" {
				stopped = false
				break
			}
		}
		if stopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d not stopped within %v of SIGSTOP", pid, timeout)
		}
		<-time.After(5 * time.Millisecond)
	}
}

type pausedAnswer struct {
	id  int64
	err error
}

// TestPausedHolderIssuesNothingOnALostLease: proxy A, holding worker ID w by a PostgreSQL
// lease, is frozen (SIGSTOP) with client queries waiting in its sockets until its lease row
// expires; proxy B starts and takes w. When A resumes, the first thing its event loops do
// is answer the waiting queries, before any of its goroutines has noticed that the lease
// is gone: each must get SQLSTATE 55000 or an ID of another worker ID, never one of w, and
// A issues no ID of w while B holds it. No ID repeats.
func TestPausedHolderIssuesNothingOnALostLease(t *testing.T) {
	requireServeFlags(t, "worker-source", "snowflake-tags", "worker-lease-ttl")
	dsn := testenv.NewDatabase(t)
	fx := newFixture(t, dsn, 1000)
	coll := NewCollector()
	cfg := fx.proxyConfig(t)
	pgLeases(0, &cfg)
	a := NewProxy(t, "A", cfg)
	a.Start()
	requireRewriting(t, a, dsn, snowOrder)
	requireHTTPIDs(t, a, segA, snowOrder)
	w := snowflakeWorker(t, a, coll, "before the pause")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const clients = 32
	conns := make([]*pgx.Conn, clients)
	for i := range conns {
		c, err := pgx.Connect(ctx, a.URL(dsn, "postgres", ""))
		if err != nil {
			t.Fatalf("client %d: connect through A: %v", i, err)
		}
		defer c.Close(context.Background())
		var id int64
		if err := c.QueryRow(ctx, "SELECT leaf_next('"+snowOrder+"')").Scan(&id); err != nil {
			t.Fatalf("client %d before the pause: %v", i, err)
		}
		coll.Add(IDRow{Namespace: snowflakeNamespace, ID: id, Origin: "sql", Proxy: a.Name, Phase: "before the pause"})
		conns[i] = c
	}

	a.Signal(syscall.SIGSTOP)
	paused := time.Now()
	stopped := true
	defer func() {
		if stopped {
			a.Signal(syscall.SIGCONT)
		}
	}()
	waitStopped(t, a.Pid(), 10*time.Second)
	// The queries go out now and wait in A's sockets: A cannot read them.
	answers := make(chan pausedAnswer, clients)
	for _, c := range conns {
		go func(c *pgx.Conn) {
			var id int64
			err := c.QueryRow(ctx, "SELECT leaf_next('"+snowOrder+"')").Scan(&id)
			answers <- pausedAnswer{id, err}
		}(c)
	}
	waitLeaseExpired(t, dsn, w, 10*leaseTTL)

	b := NewProxy(t, "B", cfg)
	b.Start()
	if wb := snowflakeWorker(t, b, coll, "B while A is paused"); wb != w {
		t.Fatalf("setup: B took worker ID %d, not A's expired %d", wb, w)
	}
	pause := time.Since(paused)

	a.Signal(syscall.SIGCONT)
	stopped = false
	resumed := time.Now()
	refused, otherWorker := 0, 0
	for range clients {
		r := <-answers
		var pgErr *pgconn.PgError
		switch {
		case errors.As(r.err, &pgErr) && pgErr.Code == "55000":
			refused++
		case r.err != nil:
			t.Errorf("a query waiting in A: %v, want SQLSTATE 55000 or an ID", r.err)
		default:
			coll.Add(IDRow{Namespace: snowflakeNamespace, ID: r.id, Origin: "sql", Proxy: a.Name, Phase: "waiting in A"})
			if _, wid, _ := decodeSnowflake(r.id); wid == w {
				t.Errorf("A answered a waiting query with ID %d of worker ID %d, which B holds", r.id, w)
			} else {
				otherWorker++
			}
		}
	}

	// A goes on: refusals until it leases another worker ID, never an ID of w. B issues
	// IDs of w meanwhile.
	var newWorker int64 = -1
	laterRefusals := 0
	for newWorker < 0 {
		if time.Since(resumed) > 60*time.Second {
			t.Fatalf("A issued no ID within 60 s of the resume")
		}
		var id int64
		err := conns[0].QueryRow(ctx, "SELECT leaf_next('"+snowOrder+"')").Scan(&id)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "55000":
			laterRefusals++
			snowflakeWorker(t, b, coll, "B while A has no worker ID")
			<-time.After(20 * time.Millisecond)
		case err != nil:
			t.Fatalf("A after the resume: %v", err)
		default:
			coll.Add(IDRow{Namespace: snowflakeNamespace, ID: id, Origin: "sql", Proxy: a.Name, Phase: "after the resume"})
			_, newWorker, _ = decodeSnowflake(id)
			if newWorker == w {
				t.Fatalf("A issued ID %d of worker ID %d after the resume, while B holds it", id, w)
			}
		}
	}
	for _, c := range conns {
		var id int64
		if err := c.QueryRow(ctx, "SELECT leaf_next('"+snowOrder+"')").Scan(&id); err != nil {
			t.Fatalf("A with its new worker ID: %v", err)
		}
		coll.Add(IDRow{Namespace: snowflakeNamespace, ID: id, Origin: "sql", Proxy: a.Name, Phase: "A's new worker ID"})
		if _, wid, _ := decodeSnowflake(id); wid == w {
			t.Fatalf("A issued ID %d of worker ID %d, which B holds", id, w)
		}
	}
	if wb := snowflakeWorker(t, b, coll, "B after A's resume"); wb != w {
		t.Errorf("B's worker ID changed from %d to %d", w, wb)
	}
	for _, r := range coll.Select(func(r IDRow) bool { return r.Proxy == a.Name && r.Phase != "before the pause" }) {
		if _, wid, _ := decodeSnowflake(r.ID); wid == w {
			t.Errorf("A issued ID %d of B's worker ID %d in phase %q", r.ID, w, r.Phase)
		}
	}
	requireNoDuplicates(t, coll)
	if refused+otherWorker != clients {
		t.Errorf("%d refusals and %d IDs of another worker for %d waiting queries", refused, otherWorker, clients)
	}
	t.Logf("FIGURE pause: A paused %v (lease TTL %v), B took worker ID %d; the %d queries waiting in A got %d × 55000 and %d IDs of another worker ID; A refused %d more before it leased worker ID %d, %v after the resume; %d IDs, 0 duplicates",
		pause.Round(time.Millisecond), leaseTTL, w, clients, refused, otherWorker, laterRefusals, newWorker,
		time.Since(resumed).Round(time.Millisecond), coll.Len())
}
