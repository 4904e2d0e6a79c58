package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// httpID asks a proxy's Leaf-compatible HTTP API for one ID.
func httpID(p *Proxy, path string, header http.Header) (int64, error) {
	status, body, err := p.HTTPGet(path, header)
	if err != nil {
		return 0, err
	}
	if status != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %d %s", path, status, strings.TrimSpace(body))
	}
	id, err := strconv.ParseInt(strings.TrimSpace(body), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("GET %s: body %q is not an ID", path, body)
	}
	return id, nil
}

// requireHTTPIDs skips the test (fails it under CI) when the binary's admin server has no
// Leaf-compatible ID endpoints (404), and fails it when they exist and fail.
func requireHTTPIDs(t testing.TB, p *Proxy, segTag, snowTag string) {
	t.Helper()
	for _, path := range []string{"/api/segment/get/" + segTag, "/api/snowflake/get/" + snowTag} {
		status, body, err := p.HTTPGet(path, nil)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		if status == http.StatusNotFound && strings.Contains(body, "404 page not found") {
			testenv.SkipOrFail(t, "the admin server answers 404 to %s: the HTTP ID API is not in the binary", path)
		}
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, status, body)
		}
	}
}

// TestDatabaseRestartUnderLoad stops a private PostgreSQL under load and starts it again.
// While it is down the proxies keep issuing buffered segment IDs and snowflake IDs (asked
// over the HTTP API: a new SQL session cannot authenticate without the database, though
// sessions opened before keep getting fast-path answers), and a client that tries to
// INSERT gets a connection error. After the restart everything works again
// without restarting the proxies, and no ID repeats.
func TestDatabaseRestartUnderLoad(t *testing.T) {
	requireServeFlags(t, "snowflake-tags", "fill", "worker-source", "worker-id")
	pg := testenv.NewPostgres(t)
	dsn := pg.NewDatabase(t)
	// A large step: the buffered segments must outlast the outage.
	fx := newFixture(t, dsn, 20000)
	proxies := startProxies(t, fx, 2, func(i int, c *ProxyConfig) {
		c.WorkerSource = "static"
		c.WorkerID = 100 + i
	})
	requireHTTPIDs(t, proxies[0], segA, snowOrder)
	requireRewriting(t, proxies[0], dsn, snowOrder)
	pids := []int{proxies[0].Pid(), proxies[1].Pid()}

	coll := NewCollector()
	phase := loadDuration() / 3
	load := StartLoad(t, coll, dsn, proxies, 8)
	hold(phase)

	load.SetPhase("down")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stoppedAt := time.Now()
	if err := pg.Stop(ctx); err != nil {
		t.Fatalf("stop PostgreSQL: %v", err)
	}
	stopTook := time.Since(stoppedAt)
	sqlDuringOutage := load.Successes(proxies[0].Name) + load.Successes(proxies[1].Name)

	// A new session through the proxy must fail with a connection error, not hang or lie.
	for _, p := range proxies {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := pgx.Connect(cctx, p.URL(dsn, "postgres", ""))
		ccancel()
		if err == nil {
			_, err = conn.Exec(ctx, "INSERT INTO orders (item, client) VALUES ('outage', 'probe')")
			conn.Close(ctx)
		}
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			t.Errorf("%s: an INSERT succeeded while PostgreSQL was down", p.Name)
		case errors.As(err, &pgErr) && !strings.HasPrefix(pgErr.Code, "08"):
			t.Errorf("%s: a client connecting while PostgreSQL is down got SQLSTATE %s, want class 08: %v", p.Name, pgErr.Code, err)
		case !isConnError(err):
			t.Errorf("%s: a client connecting while PostgreSQL is down got %v, want a connection error", p.Name, err)
		default:
			t.Logf("%s while PostgreSQL is down: %v", p.Name, err)
		}
	}

	// The proxies say whether they can still issue: buffered IDs keep them ready.
	readyz := make([]string, len(proxies))
	for i, p := range proxies {
		status, body, err := p.HTTPGet("/readyz", nil)
		readyz[i] = fmt.Sprintf("%d %s %v", status, strings.TrimSpace(body), err)
	}

	// The engines keep issuing from their buffers.
	const perEndpoint = 500
	var wg sync.WaitGroup
	var mu sync.Mutex
	var outageErrs []string
	issued := 0
	outageBegan := time.Now()
	for _, p := range proxies {
		for _, ep := range []struct{ path, ns string }{
			{"/api/segment/get/" + segA, segA},
			{"/api/snowflake/get/" + snowOrder, snowflakeNamespace},
		} {
			wg.Add(1)
			go func(p *Proxy, path, ns string) {
				defer wg.Done()
				for i := 0; i < perEndpoint; i++ {
					id, err := httpID(p, path, nil)
					mu.Lock()
					if err != nil {
						outageErrs = append(outageErrs, fmt.Sprintf("%s %s: %v", p.Name, path, err))
					} else {
						issued++
					}
					mu.Unlock()
					if err != nil {
						return
					}
					coll.Add(IDRow{Namespace: ns, ID: id, Origin: originHTTP, Proxy: p.Name, Phase: "down"})
				}
			}(p, ep.path, ep.ns)
		}
	}
	wg.Wait()
	outageIssue := time.Since(outageBegan)
	for _, e := range outageErrs {
		t.Errorf("while PostgreSQL was down: %s", e)
	}

	startedAt := time.Now()
	if err := pg.Start(ctx); err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	downFor := time.Since(stoppedAt)
	sqlDuringOutage = load.Successes(proxies[0].Name) + load.Successes(proxies[1].Name) - sqlDuringOutage
	load.SetPhase("after")
	var recoveries []time.Duration
	for _, p := range proxies {
		if _, err := load.WaitSuccesses(p.Name, 50, 60*time.Second); err != nil {
			t.Errorf("after PostgreSQL came back: %v", err)
		}
		recoveries = append(recoveries, time.Since(startedAt))
	}
	hold(phase)
	load.Stop()

	for i, p := range proxies {
		if p.Pid() != pids[i] {
			t.Errorf("%s was restarted (pid %d, was %d)", p.Name, p.Pid(), pids[i])
		}
		if gone, err := p.exited(); gone {
			t.Errorf("%s exited: %v", p.Name, err)
		}
	}
	errs := load.Errors()
	reportErrors(t, "not a connection error", errs, func(e loadErr) bool { return !e.Conn })
	reportErrors(t, "connection error outside the outage", errs, func(e loadErr) bool {
		return e.Conn && (e.At.Before(stoppedAt) || e.At.After(startedAt.Add(recoveries[len(recoveries)-1])))
	})
	afterInserts := len(coll.Select(func(r IDRow) bool { return r.Phase == "after" && r.Origin != originLeafNext }))
	if afterInserts == 0 {
		t.Errorf("no INSERT succeeded after PostgreSQL came back")
	}
	requireNoDuplicates(t, coll)
	checkStoredUnique(t, fx, coll)
	t.Logf("/readyz while PostgreSQL was down: %q", readyz)
	t.Logf("FIGURE pg-restart: stop took %v, database down %v; %d IDs issued over HTTP in %v while down (%.0f/s), "+
		"%d SQL statements completed during the outage window; load back on both proxies %v after the start; %d connection errors in all",
		stopTook.Round(time.Millisecond), downFor.Round(time.Millisecond), issued, outageIssue.Round(time.Millisecond),
		float64(issued)/outageIssue.Seconds(),
		sqlDuringOutage, recoveries, len(errs))
}
