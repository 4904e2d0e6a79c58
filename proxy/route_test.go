package proxy

import (
	"context"
	"net"
	"net/url"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// dbName is the database of a connection URL.
func dbName(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

// withPath returns dbURL asking for another database; "" asks for none.
func withPath(t *testing.T, dbURL, database string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + database
	if database == "" {
		u.Path = ""
	}
	return u.String()
}

func currentDatabase(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var name string
	if err := conn.QueryRow(testContext(t), "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

// countingListener accepts connections and counts them, answering nothing: an upstream
// that must never be dialled.
func countingListener(t *testing.T) (addr string, accepted *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = new(atomic.Int64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return l.Addr().String(), accepted
}

// TestRoutesPickTheDatabase routes three names to three databases of one PostgreSQL, one
// of them through a second address (a relay counting cancel requests): pgx and psql land
// in the database of the name they ask for, a name not listed goes to the fallback with
// its own name, a client naming no database is routed by its user name, and a cancel
// request reaches the upstream of the session it cancels.
func TestRoutesPickTheDatabase(t *testing.T) {
	dbA, dbB, dbC := testenv.NewDatabase(t), testenv.NewDatabase(t), testenv.NewDatabase(t)
	nameA, nameB, nameC := dbName(t, dbA), dbName(t, dbB), dbName(t, dbC)
	relay := startCancelCounter(t, dbA)
	direct, _ := url.Parse(dbA)
	user := direct.User.Username()
	watcher := connect(t, dbA)
	routes := NewRoutes(map[string]Route{
		"app":     {Upstream: direct.Host, Database: nameA},
		"reports": {Upstream: relay.addr(), Database: nameB},
		user:      {Database: nameC}, // the Server's Upstream
	}, &Route{Upstream: direct.Host})
	p := startProxy(t, dbA, func(s *Server) { s.SetRoutes(routes) })

	for _, tc := range []struct{ ask, want string }{
		{"app", nameA}, {"reports", nameB}, {nameC, nameC}, {nameB, nameB}, {"", nameC},
	} {
		conn := connect(t, withPath(t, p.url(dbA), tc.ask))
		if got := currentDatabase(t, conn); got != tc.want {
			t.Errorf("pgx asking for %q is in %q, want %q", tc.ask, got, tc.want)
		}
		conn.Close(context.Background())
	}
	out, err := runTool(t, "psql", "-X", "-At", "-d", withPath(t, p.url(dbA), "reports"), "-c", "SELECT current_database()")
	if err != nil || strings.TrimSpace(out) != nameB {
		t.Errorf("psql asking for reports: %q, %v; want %s", out, err, nameB)
	}

	// A cancel goes to the upstream of its session: through the relay for reports,
	// directly for app.
	for _, tc := range []struct {
		ask  string
		want int64
	}{{"reports", 1}, {"app", 1}} {
		conn := connectCancelling(t, withPath(t, p.url(dbA), tc.ask))
		sql := "SELECT pg_sleep(60) /* route " + tc.ask + " */"
		done, cancel := goStatement(t, func(ctx context.Context) error { _, err := conn.Exec(ctx, sql); return err })
		waitRunning(t, watcher, sql)
		cancel()
		wantSQLState(t, result(t, done, "the cancelled statement"), "57014")
		if got := relay.cancels.Load(); got != tc.want {
			t.Errorf("after cancelling a session of %s the relay saw %d cancel requests, want %d", tc.ask, got, tc.want)
		}
	}
}

// TestRouteUnknownDatabase: without a fallback, a database not listed is refused with
// PostgreSQL's 3D000 and no upstream is dialled.
func TestRouteUnknownDatabase(t *testing.T) {
	db := testenv.NewDatabase(t)
	never, accepted := countingListener(t)
	p := startProxy(t, db, func(s *Server) {
		s.Upstream = never
		s.SetRoutes(NewRoutes(map[string]Route{"app": {Upstream: never}}, nil))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := pgx.Connect(ctx, withPath(t, p.url(db), "nosuch"))
	pgErr := wantSQLState(t, err, "3D000")
	if pgErr.Message != `database "nosuch" does not exist` || pgErr.Severity != "FATAL" {
		t.Errorf("refusal: %s %q", pgErr.Severity, pgErr.Message)
	}
	out, err := runTool(t, "psql", "-X", "-d", withPath(t, p.url(db), "other"), "-c", "SELECT 1")
	if err == nil || !strings.Contains(out, `database "other" does not exist`) {
		t.Errorf("psql: %v\n%s", err, out)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the upstream was dialled %d times for unknown databases", n)
	}
	if !waitIdle(p.srv, 10*time.Second) {
		t.Error("refused connections still tracked")
	}
}

// TestSetRoutesKeepsSessions: a new routing table applies to sessions that start
// afterwards; a session in progress stays with its database, and nil restores routing
// everything to Upstream.
func TestSetRoutesKeepsSessions(t *testing.T) {
	dbA, dbB := testenv.NewDatabase(t), testenv.NewDatabase(t)
	nameA, nameB := dbName(t, dbA), dbName(t, dbB)
	p := startProxy(t, dbA, func(s *Server) {
		s.SetRoutes(NewRoutes(map[string]Route{"app": {Database: nameA}}, nil))
	})
	old := connect(t, withPath(t, p.url(dbA), "app"))
	if got := currentDatabase(t, old); got != nameA {
		t.Fatalf("before: %s", got)
	}
	p.srv.SetRoutes(NewRoutes(map[string]Route{"app": {Database: nameB}}, nil))
	if got := currentDatabase(t, connect(t, withPath(t, p.url(dbA), "app"))); got != nameB {
		t.Errorf("a new session after SetRoutes is in %s, want %s", got, nameB)
	}
	if got := currentDatabase(t, old); got != nameA {
		t.Errorf("the session in progress moved to %s", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := pgx.Connect(ctx, withPath(t, p.url(dbA), nameA))
	wantSQLState(t, err, "3D000")
	p.srv.SetRoutes(nil)
	if got := currentDatabase(t, connect(t, withPath(t, p.url(dbA), nameA))); got != nameA {
		t.Errorf("without routes: %s", got)
	}
}

func TestWithDatabase(t *testing.T) {
	packet := func(pairs ...string) []byte {
		b := []byte{0, 0, 0, 0, 0, 3, 0, 0}
		for _, p := range pairs {
			b = append(append(b, p...), 0)
		}
		b = append(b, 0)
		b[3] = byte(len(b))
		return b
	}
	for _, tc := range []struct{ in, want []byte }{
		{packet("user", "u", "database", "app", "application_name", "x"), packet("user", "u", "database", "app_prod", "application_name", "x")},
		{packet("user", "u"), packet("user", "u", "database", "app_prod")},
		{packet("database", "", "user", "u"), packet("database", "app_prod", "user", "u")},
	} {
		got := withDatabase(tc.in, "app_prod")
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("withDatabase(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if !reflect.DeepEqual(startupParams(got)["database"], "app_prod") {
			t.Errorf("params of %q: %v", got, startupParams(got))
		}
	}
}
