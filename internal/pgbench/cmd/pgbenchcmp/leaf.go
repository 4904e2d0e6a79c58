package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/internal/pgbench"
	"github.com/leafproxy/leafproxy/migrations"
	"github.com/leafproxy/leafproxy/proxy"
)

// benchTag is the segment tag of the ID workloads; benchFilled is the table whose key the
// proxy fills from it; snowflakeTags are the snowflake tags of the production example.
const (
	benchTag      = "bench"
	benchFilled   = "bench_filled"
	snowflakeTags = "order,pay"
)

// prepareLeaf prepares the database of dbURL for leafproxy and the ID workloads: the
// Leaf schema, a segment tag, a sequence and the tables the workloads and fill rules
// name.
func prepareLeaf(ctx context.Context, dbURL string) error {
	if err := migrations.Up(dbURL); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, stmt := range []string{
		"INSERT INTO leaf_alloc (biz_tag, max_id, step) VALUES ('" + benchTag + "', 1, 1000) ON CONFLICT DO NOTHING",
		"CREATE SEQUENCE IF NOT EXISTS bench_seq",
		"CREATE TABLE IF NOT EXISTS bench_serial (id bigserial PRIMARY KEY, item text)",
		"CREATE TABLE IF NOT EXISTS " + benchFilled + " (id int8 PRIMARY KEY, item text)",
		"CREATE TABLE IF NOT EXISTS orders (id int8 PRIMARY KEY, item text)",
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return nil
}

// leafGroups are the ID workloads: a leaf_next through leafproxy against nextval on the
// server, and an INSERT whose key leafproxy fills against one with a bigserial default.
func leafGroups(dbURL string, leaf pgbench.Endpoint) []pgbench.Group {
	return []pgbench.Group{
		{Name: "next-id", Endpoints: []pgbench.Endpoint{
			{Name: "direct nextval", URL: dbURL, Script: "SELECT nextval('bench_seq');\n"},
			{Name: "leafproxy leaf_next", URL: leaf.URL, Script: "SELECT leaf_next('" + benchTag + "');\n", CPU: leaf.CPU},
		}},
		insertGroup("insert", dbURL, leaf),
		batchGroup(leaf),
	}
}

// batchSize is the n of the next-batch group's leaf_next('bench', n).
const batchSize = 1000

// batchGroup compares SELECT leaf_next('bench', 1000) with the single form, both through
// leafproxy, by IDs per second (the ratio column counts 1,000 IDs per batch).
func batchGroup(leaf pgbench.Endpoint) pgbench.Group {
	return pgbench.Group{Name: "next-batch", Endpoints: []pgbench.Endpoint{
		{Name: "leafproxy leaf_next", URL: leaf.URL, Script: "SELECT leaf_next('" + benchTag + "');\n", CPU: leaf.CPU},
		{Name: fmt.Sprintf("leafproxy leaf_next(%d)", batchSize), URL: leaf.URL, Units: batchSize,
			Script: fmt.Sprintf("SELECT leaf_next('%s', %d);\n", benchTag, batchSize), CPU: leaf.CPU},
	}}
}

// insertGroup is a filled INSERT through leafproxy against a bigserial default on the
// server.
func insertGroup(name, dbURL string, leaf pgbench.Endpoint) pgbench.Group {
	return pgbench.Group{Name: name, Endpoints: []pgbench.Endpoint{
		{Name: "direct bigserial", URL: dbURL, Script: "INSERT INTO bench_serial (item) VALUES ('book');\n"},
		{Name: "leafproxy filled", URL: leaf.URL, Script: "INSERT INTO " + benchFilled + " (item) VALUES ('book');\n", CPU: leaf.CPU},
	}}
}

// durableInsertGroup is insertGroup on a server with PostgreSQL's default durability
// (fsync, synchronous_commit and full_page_writes on), as in production; the test
// servers run with all three off. The settings are changed with ALTER SYSTEM for the
// group's runs and reset after them.
func durableInsertGroup(serverURL, dbURL string, leaf pgbench.Endpoint) pgbench.Group {
	g := insertGroup("insert-durable", dbURL, leaf)
	g.Prepare = func(ctx context.Context) (func() error, error) {
		if err := setDurability(ctx, serverURL, "ALTER SYSTEM SET %s = on", "on"); err != nil {
			return nil, err
		}
		return func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return setDurability(ctx, serverURL, "ALTER SYSTEM RESET %s", "")
		}, nil
	}
	return g
}

// durabilitySettings are the settings durableInsertGroup turns on.
var durabilitySettings = []string{"fsync", "synchronous_commit", "full_page_writes"}

// setDurability applies stmt (a format with the setting's name) to each durability
// setting, reloads the configuration and waits until a new session sees want ("" means
// any value: the reset case, whose value is the configuration file's).
func setDurability(ctx context.Context, serverURL, stmt, want string) error {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, name := range durabilitySettings {
		if _, err := conn.Exec(ctx, fmt.Sprintf(stmt, name)); err != nil {
			return err
		}
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	if want == "" {
		return nil
	}
	// The postmaster rereads the configuration asynchronously; a new session started
	// after it has done so sees the new values.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, err := settingsAre(ctx, serverURL, want)
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the server did not take %v = %s within 10 s", durabilitySettings, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// settingsAre reports whether a new session sees every durability setting at want.
func settingsAre(ctx context.Context, serverURL, want string) (bool, error) {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return false, err
	}
	defer conn.Close(ctx)
	for _, name := range durabilitySettings {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			return false, err
		}
		if v != want {
			return false, nil
		}
	}
	return true, nil
}

// serveProxy serves a bare proxy.Server on a loopback port in front of the server of dbURL.
func serveProxy(dbURL string, configure func(*proxy.Server)) (string, func(), error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", nil, err
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	srv := &proxy.Server{Upstream: u.Host, UpstreamSSLMode: proxy.SSLDisable, Logger: log}
	if configure != nil {
		configure(srv)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	go srv.Serve(l)
	u.Host = l.Addr().String()
	return u.String(), func() { srv.Close() }, nil
}
