package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// clockBinary is leafproxy built with -tags leafproxy_testclock, whose admin server has
// POST /debug/clock?offset=D to shift the snowflake and worker-source clock.
var clockBinary struct {
	once sync.Once
	path string
	err  error
}

// clockBin builds the test-clock binary once. It skips (fails under CI) when the tree has
// no such hook (cmd/leafproxy/testclock.go) and fails when the hook does not build.
func clockBin(t testing.TB) string {
	t.Helper()
	leafproxyBin(t)
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if !fileExists(filepath.Join(root, "cmd", "leafproxy", "testclock.go")) {
		testenv.SkipOrFail(t, "cmd/leafproxy/testclock.go (the -tags leafproxy_testclock hook) is not in the tree")
	}
	clockBinary.once.Do(func() {
		dir, err := os.MkdirTemp("", "leafproxy-e2e-clock-")
		if err != nil {
			clockBinary.err = err
			return
		}
		out := filepath.Join(dir, "leafproxy-testclock")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, goTool(), "build", "-tags", "leafproxy_testclock", "-o", out, "./cmd/leafproxy")
		cmd.Dir = root
		if msg, err := cmd.CombinedOutput(); err != nil {
			clockBinary.err = fmt.Errorf("go build -tags leafproxy_testclock ./cmd/leafproxy: %w\n%s", err, msg)
			return
		}
		clockBinary.path = out
	})
	if clockBinary.err != nil {
		t.Fatal(clockBinary.err)
	}
	return clockBinary.path
}

// setClockOffset shifts the proxy's clock to real time + offset.
func setClockOffset(t testing.TB, p *Proxy, offset string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, p.HTTPURL()+"/debug/clock?offset="+offset, nil)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 15 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("set clock offset %s: %v", offset, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("set clock offset %s: %s", offset, resp.Status)
	}
}

// TestClockBackwards moves the proxy's clock back through the test-clock hook, with the
// default 5 ms tolerance and the PostgreSQL worker lease:
//   - a 3 ms step under load is waited out: no statement fails;
//   - a 1 s step makes snowflake leaf_next fail with SQLSTATE 55000 while segment tags and
//     the session keep working, and issue resumes by itself once the clock has caught up;
//   - a restart with the clock 3 s behind the lease's high-water mark issues no snowflake
//     ID until the clock has passed it.
//
// Throughout, no ID repeats and no snowflake ID is older than one issued before it.
func TestClockBackwards(t *testing.T) {
	requireServeFlags(t, "snowflake-tags", "fill", "worker-source")
	bin := clockBin(t)
	dsn := testenv.NewDatabase(t)
	fx := newFixture(t, dsn, 1000)
	cfg := fx.proxyConfig(t)
	cfg.Binary = bin
	cfg.WorkerSource = "postgres"
	p := NewProxy(t, "clock", cfg)
	p.Start()
	requireRewriting(t, p, dsn, snowOrder)
	coll := NewCollector()

	// A step within the tolerance, under load.
	load := StartLoad(t, coll, dsn, []*Proxy{p}, 8)
	hold(2 * time.Second)
	setClockOffset(t, p, "-3ms")
	if _, err := load.WaitSuccesses(p.Name, 500, 30*time.Second); err != nil {
		t.Errorf("after a 3 ms step back: %v", err)
	}
	load.Stop()
	reportErrors(t, "failed statement around a 3 ms step back", load.Errors(), func(loadErr) bool { return true })
	waited, _ := metricSum(t, p, "clock_backwards", "waited")

	// A step beyond the tolerance.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL(dsn, "postgres", ""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	next := func(tag string) (int64, error) {
		var id int64
		err := conn.QueryRow(ctx, "SELECT leaf_next('"+tag+"')").Scan(&id)
		return id, err
	}
	if id, err := next(snowOrder); err != nil {
		t.Fatalf("before the step: %v", err)
	} else {
		coll.Add(IDRow{Namespace: snowflakeNamespace, ID: id, Origin: originLeafNext, Proxy: p.Name, Phase: "before step"})
	}
	setClockOffset(t, p, "-1s")
	stepped := time.Now()
	_, err = next(snowOrder)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55000" {
		t.Errorf("leaf_next('%s') right after a 1 s step back: %v, want SQLSTATE 55000", snowOrder, err)
	}
	if id, err := next(segA); err != nil {
		t.Errorf("segment tag while the snowflake clock is behind: %v", err)
	} else {
		coll.Add(IDRow{Namespace: segA, ID: id, Origin: originLeafNext, Proxy: p.Name, Phase: "clock behind"})
	}
	var resumed time.Duration
	for {
		id, err := next(snowOrder)
		if err == nil {
			resumed = time.Since(stepped)
			coll.Add(IDRow{Namespace: snowflakeNamespace, ID: id, Origin: originLeafNext, Proxy: p.Name, Phase: "after step"})
			break
		}
		if !errors.As(err, &pgErr) || pgErr.Code != "55000" || time.Since(stepped) > 10*time.Second {
			t.Fatalf("waiting for issue to resume after a 1 s step back: %v after %v", err, time.Since(stepped))
		}
		<-time.After(20 * time.Millisecond)
	}
	refused, found := metricSum(t, p, "clock_backwards", "refused")
	if !found || refused < 1 {
		t.Errorf("no refused backwards step counted in /metrics (%v, %v)", refused, found)
	}

	// A restart with the clock behind the lease's high-water mark.
	if _, err := p.Terminate(30 * time.Second); err != nil {
		t.Logf("exit after SIGTERM: %v", err)
	}
	var newest time.Time
	for _, r := range coll.Select(func(r IDRow) bool { return r.Namespace == snowflakeNamespace }) {
		if at, _, _ := decodeSnowflake(r.ID); at.After(newest) {
			newest = at
		}
	}
	p.cfg.Env = append(p.cfg.Env, "LEAFPROXY_TEST_CLOCK_OFFSET=-3s")
	restarted := time.Now()
	p.Spawn()
	var firstAfter time.Duration
	for {
		id, err := httpID(p, "/api/snowflake/get/"+snowOrder, nil)
		if err == nil {
			firstAfter = time.Since(restarted)
			coll.Add(IDRow{Namespace: snowflakeNamespace, ID: id, Origin: originHTTP, Proxy: p.Name, Phase: "restart behind"})
			if at, _, _ := decodeSnowflake(id); !at.After(newest) {
				t.Errorf("after a restart 3 s behind, snowflake ID %d is from %v, not after the newest earlier ID (%v)", id, at, newest)
			}
			break
		}
		if gone, werr := p.exited(); gone {
			// Refusing to start is the other acceptable answer; say which one it was.
			t.Logf("the proxy refused to start 3 s behind its high-water mark: %v\n%s", werr, p.LogTail(5))
			break
		}
		if time.Since(restarted) > 30*time.Second {
			t.Fatalf("no snowflake ID within 30 s of a restart 3 s behind: %v", err)
		}
		<-time.After(50 * time.Millisecond)
	}
	requireNoDuplicates(t, coll)
	checkStoredUnique(t, fx, coll)
	t.Logf("FIGURE clock: 3 ms step under load waited out (%v waits counted); 1 s step refused with 55000 (%v refusals counted), issue back %v after the step; first ID %v after a restart 3 s behind",
		waited, refused, resumed.Round(time.Millisecond), firstAfter.Round(time.Millisecond))
	if strings.Contains(p.Log(), "panic") {
		t.Errorf("the proxy panicked:\n%s", p.LogTail(40))
	}
}
