package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/proxy"
	"github.com/leafproxy/leafproxy/rewrite"
)

// databaseOf is the database name of a PostgreSQL URL.
func databaseOf(dsn string) string {
	rest := dsn[strings.Index(dsn, "@")+1:]
	rest = rest[strings.Index(rest, "/")+1:]
	if i := strings.Index(rest, "?"); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// proxyDB is the URL of database name through the proxy at listen.
func proxyDB(t *testing.T, dsn, listen, name string) string {
	t.Helper()
	u := proxyURL(t, dsn, listen)
	return strings.Replace(u, "/"+databaseOf(dsn), "/"+name, 1)
}

func connectDB(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func inDatabase(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var name string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

// TestDatabasesReloadOnSIGHUP runs serve with a databases map in its file: clients land
// in the database of the name they ask for, and every database takes IDs from the one
// engine set. A SIGHUP after the file changed routes new sessions by the new map while a
// session in progress keeps its database; /readyz names an upstream that is down; a
// file that no longer validates keeps the map in use and the log names the bad key.
func TestDatabasesReloadOnSIGHUP(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	dbA, dbB := testenv.NewDatabase(t), testenv.NewDatabase(t)
	nameA, nameB := databaseOf(dbA), databaseOf(dbB)
	down := freeAddr(t) // nothing listens there
	file := filepath.Join(t.TempDir(), "leafproxy.yaml")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(fmt.Sprintf("databases:\n  app: dbname=%s\n  reports: {dbname: %s}\n  \"*\": {upstream: %q}\n",
		nameA, nameB, upstreamOf(t, store)))
	s := startServe(t, nil, serveArgs(t, store, 31, "--config", file)...)
	waitReady(s)

	app := connectDB(t, proxyDB(t, store, s.listen, "app"))
	reports := connectDB(t, proxyDB(t, store, s.listen, "reports"))
	other := connectDB(t, proxyDB(t, store, s.listen, databaseOf(store)))
	for _, tc := range []struct {
		conn *pgx.Conn
		want string
	}{{app, nameA}, {reports, nameB}, {other, databaseOf(store)}} {
		if got := inDatabase(t, tc.conn); got != tc.want {
			t.Errorf("in %s, want %s", got, tc.want)
		}
	}
	// One engine set: the segment tag's IDs keep increasing across databases.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var last int64
	for i, conn := range []*pgx.Conn{app, reports, other, app} {
		var id int64
		if err := conn.QueryRow(ctx, "SELECT leaf_next('audit')").Scan(&id); err != nil || id <= last {
			t.Fatalf("leaf_next('audit') #%d = %d, %v after %d", i, id, err, last)
		}
		last = id
	}

	reloads := func() int { return strings.Count(s.log.String(), "databases reloaded for new sessions") }
	write(fmt.Sprintf("databases:\n  app: dbname=%s\n  gone: {upstream: %q}\n", nameB, down))
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	s.waitFor("the reload", func() bool { return reloads() == 1 })
	if got := inDatabase(t, connectDB(t, proxyDB(t, store, s.listen, "app"))); got != nameB {
		t.Errorf("a new app session after the reload is in %s, want %s", got, nameB)
	}
	if got := inDatabase(t, app); got != nameA {
		t.Errorf("the app session of before the reload is in %s, want %s", got, nameA)
	}
	_, err := pgx.Connect(ctx, proxyDB(t, store, s.listen, "reports"))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" || pgErr.Message != `database "reports" does not exist` {
		t.Errorf("reports after it left the map: %v, want 3D000", err)
	}
	s.waitFor("/readyz to name the upstream that is down", func() bool {
		code, body := s.get("/readyz", "")
		return code == http.StatusServiceUnavailable && strings.Contains(body, down) && strings.Contains(body, "database gone")
	})

	write("databases:\n  app: host=127.0.0.1 pool_mode=txn\n")
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	s.waitFor("the refused reload", func() bool {
		return strings.Contains(s.log.String(), "configuration not reloaded: keeping the databases in use")
	})
	if log := s.log.String(); !strings.Contains(log, `pool_mode \"txn\" is not one of session, transaction`) {
		t.Errorf("the log does not name the key:\n%s", log)
	}
	if got := inDatabase(t, connectDB(t, proxyDB(t, store, s.listen, "app"))); got != nameB || reloads() != 1 {
		t.Errorf("after a refused reload app is in %s (want %s), reloads %d", got, nameB, reloads())
	}
	s.stop()
}

// TestDatabasesConfigErrors: serve refuses a databases setting it cannot honour, naming
// the setting and the key.
func TestDatabasesConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		env  []string
		want []string
	}{
		{args: []string{"--database", "app=host=10.0.0.5 pool_size=0"}, want: []string{"-database", `database "app"`, "pool_size 0 must be at least 1"}},
		{args: []string{"--database", "app=host=10.0.0.5 pool_mode=transaction"}, want: []string{"databases (flag --databases)", `database "app": pool_mode transaction needs the proxy to authenticate clients itself`}},
		{args: []string{"--user", "bob=pool_mode=statement"}, want: []string{"-user", `user "bob": pool_mode "statement" is not one of session, transaction`}},
		{env: []string{"LEAFPROXY_DATABASES=app=host=h hots=x"}, want: []string{"databases (env LEAFPROXY_DATABASES)", `unknown key "hots"`}},
		{args: []string{"--database", "app=upstream=nohostport"}, want: []string{"databases (flag --databases)", `upstream "nohostport" is not host:port`}},
	} {
		r := leafproxy(t, append([]string{"LEAFPROXY_STORE=postgres://leaf@127.0.0.1:1/x"}, tc.env...), append([]string{"serve"}, tc.args...)...)
		if r.code != 2 {
			t.Errorf("%v %v: exit %d, want 2\n%s", tc.args, tc.env, r.code, r.stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%v %v: stderr lacks %q:\n%s", tc.args, tc.env, w, r.stderr)
			}
		}
	}
}

// TestDatabasesCatalog: the filled tables' columns are read from every database of the
// map. A table laid out the same everywhere is planned as usual; one whose columns differ
// between databases is left out, so an INSERT without a column list into it is refused
// (0A000) instead of filling the key position of another database's layout, while an
// INSERT naming its columns still gets its ID.
func TestDatabasesCatalog(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	dbA, dbB := testenv.NewDatabase(t), testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for dsn, ddl := range map[string]string{
		store: "CREATE TABLE orders (id bigint, item text)",
		dbA:   "CREATE TABLE orders (item text, id bigint)",
		dbB:   "CREATE TABLE orders (id bigint, item text)",
	} {
		conn := connectDB(t, dsn)
		if _, err := conn.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	s := startServe(t, nil, serveArgs(t, store, 32,
		"--database", "a=dbname="+databaseOf(dbA), "--database", "b=dbname="+databaseOf(dbB))...)
	waitReady(s)
	s.waitFor("the warning about orders", func() bool {
		return strings.Contains(s.log.String(), "filled tables whose columns differ between databases") &&
			strings.Contains(s.log.String(), "public.orders")
	})

	a := connectDB(t, proxyDB(t, store, s.listen, "a"))
	_, err := a.Exec(ctx, "INSERT INTO orders VALUES (NULL, DEFAULT)")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "0A000" {
		t.Errorf("INSERT without a column list into a's orders: %v, want 0A000", err)
	}
	var id int64
	if err := a.QueryRow(ctx, "INSERT INTO orders (item) VALUES ('named') RETURNING id").Scan(&id); err != nil || id == 0 {
		t.Errorf("INSERT naming its columns in a: %d, %v", id, err)
	}
	var n int
	if err := connectDB(t, dbA).QueryRow(ctx, "SELECT count(*) FROM orders WHERE id IS NULL OR item ~ '^[0-9]+$'").Scan(&n); err != nil || n != 0 {
		t.Errorf("rows of a with no ID or an ID in item: %d, %v", n, err)
	}
}

func TestRoutesOfAndCatalogDatabases(t *testing.T) {
	cfg := &config.Config{Upstream: "10.0.0.1:5432", Databases: config.Databases{
		{Name: "app", Upstream: "10.0.0.5:5433", DBName: "app_prod"},
		{Name: "sock", Upstream: "/var/run/postgresql/.s.PGSQL.5433"},
		{Name: "local", DBName: "app_dev"},
		{Name: "*"},
	}}
	routes := routesOf(cfg)
	for name, want := range map[string]proxy.Route{
		"app":   {Upstream: "10.0.0.5:5433", Database: "app_prod"},
		"sock":  {Upstream: "/var/run/postgresql/.s.PGSQL.5433"},
		"local": {Upstream: "10.0.0.1:5432", Database: "app_dev"},
		"other": {Upstream: "10.0.0.1:5432"},
	} {
		if got, ok := routes.Lookup(name); !ok || got != want {
			t.Errorf("route of %s = %+v, %v; want %+v", name, got, ok, want)
		}
	}
	wantDBs := []catalogDB{
		{addr: "10.0.0.5:5433", host: "10.0.0.5", port: 5433, name: "app_prod"},
		{addr: "/var/run/postgresql/.s.PGSQL.5433", host: "/var/run/postgresql", port: 5433, name: "sock"},
		{addr: "10.0.0.1:5432", host: "10.0.0.1", port: 5432, name: "app_dev"},
	}
	if got := catalogDatabases(cfg); !reflect.DeepEqual(got, wantDBs) {
		t.Errorf("catalogDatabases = %+v, want %+v", got, wantDBs)
	}
	if _, ok := routesOf(&config.Config{Upstream: "h:1", Databases: cfg.Databases[:1]}).Lookup("other"); ok {
		t.Error("a map without * routes a name it does not list")
	}
	if got, ok := routesOf(&config.Config{Upstream: "h:1"}).Lookup("any"); !ok || got != (proxy.Route{Upstream: "h:1"}) {
		t.Errorf("without databases: %+v, %v", got, ok)
	}
	if got := upstreamTarget(cfg); got != "/var/run/postgresql/.s.PGSQL.5433, 10.0.0.1:5432, 10.0.0.5:5433" {
		t.Errorf("upstreamTarget = %q", got)
	}
}

func TestMergeCatalog(t *testing.T) {
	ab := rewrite.Table{Columns: []string{"a", "b"}, Types: []string{"bigint", "text"}}
	ba := rewrite.Table{Columns: []string{"b", "a"}, Types: []string{"text", "bigint"}}
	snap := map[tableName]rewrite.Table{{"public", "t"}: ab, {"public", "u"}: ab}
	differ := mergeCatalog(snap, map[tableName]rewrite.Table{{"public", "t"}: ba, {"public", "u"}: ab, {"x", "v"}: ba}, nil)
	differ = mergeCatalog(snap, map[tableName]rewrite.Table{{"public", "t"}: ab}, differ)
	want := map[tableName]rewrite.Table{{"public", "u"}: ab, {"x", "v"}: ba}
	if !reflect.DeepEqual(snap, want) || !reflect.DeepEqual(differ, []tableName{{"public", "t"}}) {
		t.Errorf("merged %v, differ %v", snap, differ)
	}
}
