package proxy

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// poolOf returns the figures of the pool of a database as routed, failing without one.
func poolOf(t *testing.T, s *Server, database string) pool.Stats {
	t.Helper()
	for _, st := range s.PoolStats() {
		if st.Database == database {
			return st
		}
	}
	t.Fatalf("no pool of %s in %+v", database, s.PoolStats())
	return pool.Stats{}
}

// createsTempTable reports whether a session may create a temporary table: session mode
// may, transaction mode refuses it with 0A000.
func createsTempTable(t *testing.T, conn *pgx.Conn) bool {
	t.Helper()
	_, err := conn.Exec(testContext(t), "CREATE TEMP TABLE IF NOT EXISTS scratch (x int)")
	if err == nil {
		return true
	}
	wantSQLState(t, err, "0A000")
	return false
}

// TestPoolModePerRoute: one server runs the sessions of one database in transaction mode
// and those of another in session mode at once. Six idle clients of the transaction-mode
// database hold no server connection of their own (pg_stat_activity shows at most the
// route's pool size of 2), while six of the session-mode database hold six. A user's
// override wins over the route for new sessions: its mode, and its pool size once
// ReloadPooling runs; sessions already started keep their mode.
func TestPoolModePerRoute(t *testing.T) {
	txDB, sessDB := testenv.NewDatabase(t), testenv.NewDatabase(t)
	txName, sessName := dbName(t, txDB), dbName(t, sessDB)
	u, err := url.Parse(txDB)
	if err != nil {
		t.Fatal(err)
	}
	user := u.User.Username()
	routes := NewRoutes(map[string]Route{
		"orders":  {Database: txName, PoolMode: PoolTransaction, Pool: pool.Limits{PoolSize: 2}},
		"reports": {Database: sessName},
	}, nil)
	p := startProxy(t, txDB, func(s *Server) {
		s.Pooling = pool.Settings{Limits: pool.Limits{PoolSize: 5, QueryWaitTimeout: 60 * time.Second}}
		s.SetRoutes(routes)
	})
	observer := connect(t, txDB)
	ctx := testContext(t)

	const clients = 6
	var txConns, sessConns []*pgx.Conn
	for i := range clients {
		for _, c := range []struct {
			name  string
			conns *[]*pgx.Conn
		}{{"orders", &txConns}, {"reports", &sessConns}} {
			conn := connect(t, p.url(withPath(t, txDB, c.name)))
			var got int
			if err := conn.QueryRow(ctx, "SELECT $1::int + 1", i).Scan(&got); err != nil || got != i+1 {
				t.Fatalf("%s client %d: %d, %v", c.name, i, got, err)
			}
			*c.conns = append(*c.conns, conn)
		}
	}
	if got := currentDatabase(t, txConns[0]); got != txName {
		t.Fatalf("orders is in %s, want %s", got, txName)
	}
	waitFor(t, 30*time.Second, "six session-mode clients holding six server connections", func() error {
		if n := backends(t, observer, sessName); n != clients {
			return fmt.Errorf("%d server connections of %s", n, sessName)
		}
		return nil
	})
	if n := backends(t, observer, txName); n > 2 || n < 1 {
		t.Fatalf("%d idle transaction-mode clients: %d server connections of %s, want 1 or 2 (the route's pool size)", clients, n, txName)
	}
	if st := poolOf(t, p.srv, txName); st.PoolSize != 2 || st.Dials > 2 {
		t.Fatalf("pool of %s: %+v; want the route's pool size 2", txName, st)
	}
	if len(p.srv.PoolStats()) != 1 {
		t.Fatalf("pools %+v: the session-mode database has none", p.srv.PoolStats())
	}
	if createsTempTable(t, txConns[0]) {
		t.Fatal("a temporary table in transaction mode")
	}
	if !createsTempTable(t, sessConns[0]) {
		t.Fatal("no temporary table in session mode")
	}

	// The user's override: session mode for orders, transaction mode and a pool of 3 for
	// reports.
	p.srv.SetRoutes(routes.WithUsers(map[string]UserPooling{
		user: {PoolMode: PoolSession},
	}))
	overridden := connect(t, p.url(withPath(t, txDB, "orders")))
	if !createsTempTable(t, overridden) {
		t.Fatal("the user's session mode did not win over the route's transaction mode")
	}
	if createsTempTable(t, txConns[1]) {
		t.Fatal("a session of before the change left transaction mode")
	}
	p.srv.SetRoutes(routes.WithUsers(map[string]UserPooling{
		user: {PoolMode: PoolTransaction, Pool: pool.Limits{PoolSize: 3}},
	}))
	if err := p.srv.ReloadPooling(p.srv.Pooling); err != nil {
		t.Fatal(err)
	}
	pooledReports := connect(t, p.url(withPath(t, txDB, "reports")))
	if createsTempTable(t, pooledReports) {
		t.Fatal("the user's transaction mode did not win over the route's session mode")
	}
	if st := poolOf(t, p.srv, sessName); st.PoolSize != 3 {
		t.Fatalf("pool of %s: %+v; want the user's pool size 3", sessName, st)
	}
	if st := poolOf(t, p.srv, txName); st.PoolSize != 3 {
		t.Fatalf("pool of %s after ReloadPooling: %+v; want the user's pool size 3 over the route's 2", txName, st)
	}
	for _, conn := range append(txConns, sessConns...) {
		if err := conn.Ping(ctx); err != nil {
			t.Fatalf("a session across the changes: %v", err)
		}
	}
}

// TestRouteOfPool: the pool limits of a pool key come from the route leading to its
// database; routes sharing a database take the one that sets limits.
func TestRouteOfPool(t *testing.T) {
	limited := Route{Database: "shop", Pool: pool.Limits{PoolSize: 7}, MaxDBConnections: 9}
	routes := NewRoutes(map[string]Route{
		"a_alias": {Database: "shop", PoolMode: PoolSession},
		"shop2":   limited,
		"remote":  {Upstream: "10.0.0.9:5432", Database: "far", Pool: pool.Limits{PoolSize: 4}},
		"plain":   {},
	}, &Route{Pool: pool.Limits{PoolSize: 11}})
	for _, tc := range []struct {
		key  string
		want Route
	}{
		{"shop", limited},
		{"far@10.0.0.9:5432", routes.named["remote"]},
		{"plain", Route{}},
		{"elsewhere", *routes.fallback},
		{"far", *routes.fallback}, // far at the Server's upstream is not remote's database
	} {
		if got, ok := routes.routeOfPool(tc.key, "127.0.0.1:5432"); !ok || got != tc.want {
			t.Errorf("routeOfPool(%s) = %+v, %v; want %+v", tc.key, got, ok, tc.want)
		}
	}
	s := &Server{Upstream: "127.0.0.1:5432"}
	s.SetRoutes(routes.WithUsers(map[string]UserPooling{"batch": {Pool: pool.Limits{PoolSize: 2}}}))
	if got := s.routedLimits(pool.Key{Database: "shop", User: "app"}); got != (pool.Limits{PoolSize: 7}) {
		t.Errorf("limits of shop/app: %+v", got)
	}
	if got := s.routedLimits(pool.Key{Database: "shop", User: "batch"}); got != (pool.Limits{PoolSize: 2}) {
		t.Errorf("limits of shop/batch: %+v, want the user's pool size", got)
	}
	if got := s.routedMaxDB("shop"); got != 9 {
		t.Errorf("max-db-connections of shop: %d", got)
	}
	if got := (&Server{}).routedLimits(pool.Key{Database: "x"}); got != (pool.Limits{}) {
		t.Errorf("without routes: %+v", got)
	}
}
