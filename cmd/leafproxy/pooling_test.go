package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/proxy"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// TestTransactionPoolWiring: serve --pool-mode transaction lends 20 clients 3 server
// connections, and /pools and /metrics show the pool.
func TestTransactionPoolWiring(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := startServe(t, nil, serveArgs(t, dsn, 13, "--pool-mode", "transaction", "--pool-size", "3", "--auth-type", "trust")...)
	waitReady(s)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, proxyURL(t, dsn, s.listen))
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(context.Background())
			for j := range 5 {
				var got int
				if err := conn.QueryRow(ctx, "SELECT $1::int * 2", i+j).Scan(&got); err != nil || got != 2*(i+j) {
					errs <- fmt.Errorf("got %d, %v", got, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	code, body := s.get("/pools", "")
	var pools struct{ Pools []pool.Stats }
	if err := json.Unmarshal([]byte(body), &pools); code != 200 || err != nil || len(pools.Pools) == 0 {
		t.Fatalf("/pools: %d %v\n%s", code, err, body)
	}
	st := pools.Pools[0]
	if st.Mode != "transaction" || st.PoolSize != 3 || st.Acquires < 100 || st.Dials > 3 {
		t.Fatalf("/pools: %+v; want transaction mode, pool-size 3, every transaction lent, at most 3 dials", st)
	}
	if _, page := s.get("/", ""); !strings.Contains(page, fmt.Sprintf(`<tr class="pool"><td>%s</td><td>%s</td><td>transaction</td>`, st.Database, st.User)) {
		t.Fatalf("the status page has no row of the pool:\n%s", page)
	}
	_, body = s.get("/metrics", "")
	series := fmt.Sprintf(`leafproxy_pool_size{database=%q,user=%q}`, st.Database, st.User)
	if v := metricValue(t, body, series); v != 3 {
		t.Fatalf("%s = %v, want 3", series, v)
	}
}

// TestMaxPreparedStatementsWiring: serve --max-prepared-statements 3 keeps at most 3 of
// a pgx client's cached statements on the one server connection of a pool of one.
func TestMaxPreparedStatementsWiring(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := startServe(t, nil, serveArgs(t, dsn, 14, "--pool-mode", "transaction", "--pool-size", "1", "--auth-type", "trust",
		"--max-prepared-statements", "3")...)
	waitReady(s)
	conn, err := pgx.Connect(ctx, proxyURL(t, dsn, s.listen))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for k := range 8 {
		var got int
		if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT $1::int + %d", k), 1).Scan(&got); err != nil || got != k+1 {
			t.Fatalf("statement %d: %d, %v", k, got, err)
		}
	}
	var held int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements", pgx.QueryExecModeSimpleProtocol).Scan(&held); err != nil || held != 3 {
		t.Fatalf("%d statements on the server connection (%v), want 3", held, err)
	}
}

// TestPoolSettingsReloadOnSIGHUP: a changed pool-size applies to the running pools on
// SIGHUP.
func TestPoolSettingsReloadOnSIGHUP(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	file := filepath.Join(t.TempDir(), "leafproxy.yaml")
	write := func(size int) {
		t.Helper()
		text := fmt.Sprintf("pool-mode: transaction\nauth-type: trust\npool-size: %d\n", size)
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(3)
	s := startServe(t, nil, serveArgs(t, dsn, 14, "--config", file)...)
	waitReady(s)
	conn, err := pgx.Connect(ctx, proxyURL(t, dsn, s.listen))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	poolSize := func() int {
		_, body := s.get("/pools", "")
		var pools struct{ Pools []pool.Stats }
		if err := json.Unmarshal([]byte(body), &pools); err != nil || len(pools.Pools) != 1 {
			t.Fatalf("/pools: %v\n%s", err, body)
		}
		return pools.Pools[0].PoolSize
	}
	if n := poolSize(); n != 3 {
		t.Fatalf("pool_size %d, want 3", n)
	}
	write(1)
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	s.waitFor("the pool settings to be reloaded", func() bool {
		return strings.Contains(s.log.String(), "pool settings reloaded")
	})
	if n := poolSize(); n != 1 {
		t.Fatalf("pool_size %d after the reload, want 1", n)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("a session across the reload: %v", err)
	}
}

// tempTableAllowed reports whether a session may create a temporary table: a session in
// session mode may, one in transaction mode is refused with 0A000.
func tempTableAllowed(t *testing.T, conn *pgx.Conn) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := conn.Exec(ctx, "CREATE TEMP TABLE IF NOT EXISTS scratch (x int)")
	if err == nil {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "0A000" {
		t.Fatalf("CREATE TEMP TABLE: %v, want success or 0A000", err)
	}
	return false
}

// poolSizes returns the pool size of every pool on /pools, by database and user.
func poolSizes(t *testing.T, s *server) map[string]int {
	t.Helper()
	_, body := s.get("/pools", "")
	var pools struct{ Pools []pool.Stats }
	if err := json.Unmarshal([]byte(body), &pools); err != nil {
		t.Fatalf("/pools: %v\n%s", err, body)
	}
	out := map[string]int{}
	for _, st := range pools.Pools {
		out[st.Database+"/"+st.User] = st.PoolSize
	}
	return out
}

// TestPoolModePerDatabaseAndUser: serve runs the sessions of one databases entry in
// transaction mode and those of another in session mode, with the entry's pool_size. A
// SIGHUP that adds a users entry in session mode and changes the entry's pool_size
// applies the mode to new sessions, the size to the running pool, and leaves the
// sessions in progress in their mode.
func TestPoolModePerDatabaseAndUser(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	name := databaseOf(store)
	u, err := url.Parse(store)
	if err != nil {
		t.Fatal(err)
	}
	user := u.User.Username()
	file := filepath.Join(t.TempDir(), "leafproxy.yaml")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(fmt.Sprintf("auth-type: trust\ndatabases:\n  orders: dbname=%s pool_mode=transaction pool_size=2\n  reports: dbname=%s\n", name, name))
	s := startServe(t, nil, serveArgs(t, store, 15, "--config", file)...)
	waitReady(s)

	orders := connectDB(t, proxyDB(t, store, s.listen, "orders"))
	reports := connectDB(t, proxyDB(t, store, s.listen, "reports"))
	if tempTableAllowed(t, orders) {
		t.Fatal("orders (pool_mode=transaction) let a session create a temporary table")
	}
	if !tempTableAllowed(t, reports) {
		t.Fatal("reports (session mode) refused a temporary table")
	}
	key := name + "/" + user
	if got := poolSizes(t, s); len(got) != 1 || got[key] != 2 {
		t.Fatalf("/pools: %v; want one pool %s of size 2", got, key)
	}

	reloads := func() int { return strings.Count(s.log.String(), "databases reloaded for new sessions") }
	write(fmt.Sprintf("auth-type: trust\ndatabases:\n  orders: dbname=%s pool_mode=transaction pool_size=4\n  reports: dbname=%s\nusers:\n  %s: pool_mode=session\n",
		name, name, user))
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	s.waitFor("the reload", func() bool { return reloads() == 1 })
	if !tempTableAllowed(t, connectDB(t, proxyDB(t, store, s.listen, "orders"))) {
		t.Error("a new orders session after the reload is not in the user's session mode")
	}
	if tempTableAllowed(t, orders) {
		t.Error("the orders session of before the reload left transaction mode")
	}
	if got := poolSizes(t, s); got[key] != 4 {
		t.Errorf("/pools after the reload: %v; want %s of size 4", got, key)
	}
	if log := s.log.String(); strings.Contains(log, "need a restart") {
		t.Errorf("the reload says pool settings need a restart:\n%s", log)
	}
	s.stop()
}

// TestTransactionModeReloadNeedsProxyAuth: a proxy started with auth-type passthrough
// keeps its routes when a SIGHUP brings transaction mode with another auth-type, since
// auth-type needs a restart.
func TestTransactionModeReloadNeedsProxyAuth(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	name := databaseOf(store)
	file := filepath.Join(t.TempDir(), "leafproxy.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf("databases:\n  orders: dbname=%s\n", name)), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, nil, serveArgs(t, store, 16, "--config", file)...)
	waitReady(s)
	text := fmt.Sprintf("auth-type: trust\ndatabases:\n  orders: dbname=%s pool_mode=transaction\n", name)
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	s.waitFor("the refused reload", func() bool {
		return strings.Contains(s.log.String(), "transaction mode with a new auth-type needs a restart")
	})
	if !tempTableAllowed(t, connectDB(t, proxyDB(t, store, s.listen, "orders"))) {
		t.Error("orders left session mode")
	}
	s.stop()
}

// TestRoutesOfPoolSettings: routesOf gives each route its entry's pool mode (else
// pool-mode) and sizes, and the table the users' overrides.
func TestRoutesOfPoolSettings(t *testing.T) {
	cfg := &config.Config{Upstream: "10.0.0.1:5432", Pooling: config.Pooling{PoolMode: config.PoolModeTransaction},
		Databases: config.Databases{
			{Name: "shop", DBName: "shop", PoolMode: config.PoolModeSession, PoolSize: 30, MinPoolSize: 2, MaxDBConnections: 40, ServerLifetime: time.Hour},
			{Name: "*"},
		},
		Users: config.Users{{Name: "alice", PoolMode: config.PoolModeSession, PoolSize: 3}},
	}
	routes := routesOf(cfg)
	want := proxy.Route{Upstream: "10.0.0.1:5432", Database: "shop", PoolMode: proxy.PoolSession,
		Pool: pool.Limits{PoolSize: 30, MinPoolSize: 2, ServerLifetime: time.Hour}, MaxDBConnections: 40}
	if got, _ := routes.Lookup("shop"); got != want {
		t.Errorf("shop: %+v, want %+v", got, want)
	}
	if got, _ := routes.Lookup("other"); got.PoolMode != proxy.PoolTransaction {
		t.Errorf("other: %+v, want the global transaction mode", got)
	}
	if got, _ := routesOf(&config.Config{Upstream: "h:1", Pooling: config.Pooling{PoolMode: config.PoolModeTransaction}}).Lookup("any"); got.PoolMode != proxy.PoolTransaction {
		t.Errorf("without databases: %+v, want the global transaction mode", got)
	}
}

// TestSessionReuseWiring: serve in session mode with auth-type trust gives a server
// connection its client left to the next session (session-reuse is on by default), and
// /metrics counts it; --session-reuse=false closes it with its session; --pool-size
// bounds the server connections of the sessions.
func TestSessionReuseWiring(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	// sessions runs 5 sessions one after another, each once the one before has ended as
	// series says, and returns their backends.
	sessions := func(s *server, series string, after float64) map[uint32]bool {
		seen := map[uint32]bool{}
		for range 5 {
			conn := connectDB(t, proxyURL(t, dsn, s.listen))
			var pid uint32
			if err := conn.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			seen[pid] = true
			conn.Close(context.Background())
			s.waitFor("the session's end: "+series, func() bool {
				_, body := s.get("/metrics", "")
				return metricValue(t, body, series) == after
			})
		}
		return seen
	}

	s := startServe(t, nil, serveArgs(t, dsn, 16, "--auth-type", "trust")...)
	waitReady(s)
	if got := sessions(s, "leafproxy_session_servers_idle", 1); len(got) != 1 {
		t.Fatalf("5 sessions one after another had backends %v, want one", got)
	}
	_, body := s.get("/metrics", "")
	if got := metricValue(t, body, "leafproxy_session_servers_reused_total"); got != 4 {
		t.Fatalf("leafproxy_session_servers_reused_total = %v, want 4", got)
	}
	s.stop()

	s = startServe(t, nil, serveArgs(t, dsn, 17, "--auth-type", "trust", "--session-reuse=false")...)
	waitReady(s)
	if got := sessions(s, "leafproxy_client_connections", 0); len(got) != 5 {
		t.Fatalf("5 sessions with --session-reuse=false had backends %v, want five", got)
	}
	s.stop()

	// --pool-size bounds the sessions' server connections: a second session waits
	// --query-wait-timeout, then gets 53300, and the first goes on.
	s = startServe(t, nil, serveArgs(t, dsn, 18, "--auth-type", "trust", "--pool-size", "1", "--query-wait-timeout", "300ms")...)
	waitReady(s)
	first := connectDB(t, proxyURL(t, dsn, s.listen))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := pgx.Connect(ctx, proxyURL(t, dsn, s.listen))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "53300" {
		t.Fatalf("a session beyond --pool-size 1: %v, want 53300", err)
	}
	if _, err := first.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("the first session: %v", err)
	}
	_, body = s.get("/metrics", "")
	if open, waiting := metricValue(t, body, "leafproxy_session_servers"), metricValue(t, body, "leafproxy_session_clients_waiting"); open != 1 || waiting != 0 {
		t.Fatalf("leafproxy_session_servers = %v, leafproxy_session_clients_waiting = %v; want 1 and 0", open, waiting)
	}
	_, body = s.get("/pools", "")
	var pools struct{ Pools []pool.Stats }
	if err := json.Unmarshal([]byte(body), &pools); err != nil || len(pools.Pools) != 1 {
		t.Fatalf("/pools: %v\n%s", err, body)
	}
	st := pools.Pools[0]
	if st.Mode != "session" || st.PoolSize != 1 || st.ServersActive != 1 || st.ClientsWaiting != 0 || st.WaitTimeouts != 1 {
		t.Fatalf("/pools: %+v; want session mode, pool-size 1, one connection in a session, one wait timed out", st)
	}
	_, body = s.get("/metrics", "")
	for name, want := range map[string]float64{"size": 1, "servers_active": 1, "clients_waiting": 0, "wait_timeouts_total": 1} {
		series := fmt.Sprintf(`leafproxy_session_pool_%s{database=%q,user=%q}`, name, st.Database, st.User)
		if v := metricValue(t, body, series); v != want {
			t.Errorf("%s = %v, want %v", series, v, want)
		}
	}
	if _, page := s.get("/", ""); !strings.Contains(page, `<td>session</td><td class="num">1</td>`) {
		t.Fatalf("the status page has no row of the session pool:\n%s", page)
	}
	first.Close(ctx)
	s.stop()
}
