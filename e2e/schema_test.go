package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/migrations"
)

// runLeafproxy runs a one-shot leafproxy command and returns its combined output.
func runLeafproxy(t testing.TB, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var buf bytes.Buffer
	cmd := exec.CommandContext(ctx, leafproxyBin(t), args...)
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	return buf.String(), err
}

// migrateUp creates the Leaf schema in the database of dsn with `leafproxy migrate up`, or,
// while the command has no migrate subcommand yet, with the migrations package it embeds.
func migrateUp(t testing.TB, dsn string) {
	t.Helper()
	if !hasFlag(t, "migrate up", "dsn") && !hasFlag(t, "migrate", "dsn") {
		if testenv.UnderCI() {
			t.Fatal("leafproxy has no `migrate up --dsn` command: required under CI")
		}
		t.Logf("leafproxy has no `migrate up --dsn` yet: applying the migrations package directly")
		if err := migrations.Up(dsn); err != nil {
			t.Fatalf("migrations.Up: %v", err)
		}
		return
	}
	if out, err := runLeafproxy(t, "migrate", "up", "--dsn", dsn); err != nil {
		t.Fatalf("leafproxy migrate up: %v\n%s", err, out)
	}
}

// addTag creates a segment tag with `leafproxy tag add`, or with an INSERT while the
// command has no tag subcommand yet.
func addTag(t testing.TB, dsn, name string, step int) {
	t.Helper()
	if !hasFlag(t, "tag add", "step") {
		if testenv.UnderCI() {
			t.Fatal("leafproxy has no `tag add --step` command: required under CI")
		}
		t.Logf("leafproxy has no `tag add --step` yet: inserting tag %s into leaf_alloc directly", name)
		execSQL(t, dsn, "INSERT INTO leaf_alloc (biz_tag, step, description) VALUES ($1, $2, 'e2e')", name, step)
		return
	}
	if out, err := runLeafproxy(t, "tag", "add", name, "--step", strconv.Itoa(step), "--dsn", dsn); err != nil {
		t.Fatalf("leafproxy tag add %s: %v\n%s", name, err, out)
	}
}

// execSQL runs statements straight against PostgreSQL (not through a proxy).
func execSQL(t testing.TB, dsn, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// queryInt64s returns the first column of every row, straight from PostgreSQL.
func queryInt64s(t testing.TB, dsn, sql string, args ...any) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a soak's tables hold millions of rows
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return ids
}

// fixture is one database prepared for the proxies: the Leaf schema, segment tags, and
// two tables whose primary key the proxies fill (orders from a snowflake tag, items from a
// segment tag).
type fixture struct {
	DSN           string // superuser URL of the database, straight to PostgreSQL
	SegmentTags   []string
	SnowflakeTags []string
	Fill          []string
}

// Tables and tags every load scenario uses.
const (
	snowOrder   = "order" // snowflake tag, fills orders.id
	snowPay     = "pay"   // snowflake tag
	segA        = "seg_a"
	segB        = "seg_b"
	segItem     = "item" // segment tag, fills items.id
	ordersTable = "orders"
	itemsTable  = "items"
)

func newFixture(t testing.TB, dsn string, step int) *fixture {
	t.Helper()
	migrateUp(t, dsn)
	f := &fixture{
		DSN:           dsn,
		SegmentTags:   []string{segA, segB, segItem},
		SnowflakeTags: []string{snowOrder, snowPay},
		Fill:          []string{ordersTable + ".id=" + snowOrder, itemsTable + ".id=" + segItem},
	}
	for _, tag := range f.SegmentTags {
		addTag(t, dsn, tag, step)
	}
	execSQL(t, dsn, `CREATE TABLE orders (id bigint PRIMARY KEY, item text NOT NULL, client text NOT NULL)`)
	execSQL(t, dsn, `CREATE TABLE items (id bigint PRIMARY KEY, note text NOT NULL)`)
	return f
}

// proxyConfig returns a ProxyConfig serving this fixture from upstream.
func (f *fixture) proxyConfig(t testing.TB) ProxyConfig {
	t.Helper()
	return ProxyConfig{
		Upstream:      hostPort(t, f.DSN),
		Store:         f.DSN,
		SnowflakeTags: f.SnowflakeTags,
		Fill:          f.Fill,
	}
}

// checkStoredUnique asserts, with PostgreSQL's own unique index, that every ID the clients
// saw is distinct within its namespace: it copies them into a table whose primary key is
// (namespace, id). It also checks that every ID returned by a filled INSERT is in its
// table, and that the filled tables hold no row the clients did not hear of, beyond the
// INSERTs whose outcome a broken connection left unknown.
func checkStoredUnique(t testing.TB, f *fixture, c *Collector) {
	t.Helper()
	rows := c.Rows()
	// A soak collects millions of IDs: the time allowed grows with them.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+time.Duration(len(rows))*(time.Minute/1_000_000))
	defer cancel()
	conn, err := pgx.Connect(ctx, f.DSN)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	// Load first and index after: one sorted index build is much faster than an index kept
	// up to date row by row, and refuses a duplicate just the same.
	if _, err := conn.Exec(ctx, `CREATE UNLOGGED TABLE e2e_seen (namespace text, id bigint)`); err != nil {
		t.Fatal(err)
	}
	n, err := conn.CopyFrom(ctx, pgx.Identifier{"e2e_seen"}, []string{"namespace", "id"}, pgx.CopyFromSlice(len(rows), func(i int) ([]any, error) {
		return []any{rows[i].Namespace, rows[i].ID}, nil
	}))
	if err != nil {
		t.Fatalf("copy the IDs the clients saw into PostgreSQL: %v", err)
	} else if int(n) != len(rows) {
		t.Errorf("copied %d of %d IDs", n, len(rows))
	}
	_, err = conn.Exec(ctx, `CREATE UNIQUE INDEX e2e_seen_unique ON e2e_seen (namespace, id)`)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "23505":
		t.Errorf("the unique index refused the IDs the clients saw (a duplicate): %v", err)
	case err != nil:
		t.Fatalf("index the IDs the clients saw: %v", err)
	}
	for _, tbl := range []struct{ table, origin string }{{ordersTable, originOrderInsert}, {itemsTable, originItemInsert}} {
		returned := c.ByOrigin(tbl.origin)
		stored := map[int64]bool{}
		for _, id := range queryInt64s(t, f.DSN, "SELECT id FROM "+tbl.table) {
			stored[id] = true
		}
		missing := 0
		for _, id := range returned {
			if !stored[id] {
				missing++
			}
		}
		if missing > 0 {
			t.Errorf("%s: %d IDs returned by INSERT … RETURNING are not in the table", tbl.table, missing)
		}
		if tbl.table == ordersTable {
			for _, id := range c.ByOrigin(originRolledBack) {
				if stored[id] {
					t.Errorf("orders holds ID %d of a rolled-back INSERT", id)
				}
			}
		}
		unknown := c.UncertainInserts(tbl.origin)
		if extra := len(stored) - len(returned); extra < 0 || extra > unknown {
			t.Errorf("%s holds %d rows, clients were told of %d and %d INSERTs ended with a broken connection",
				tbl.table, len(stored), len(returned), unknown)
		}
	}
}

// requireRewriting skips the test (fails it under CI) when the proxy forwards leaf_next to
// PostgreSQL unchanged, which PostgreSQL answers with 42883 (no such function): the binary
// does not intercept the SQL surface. Any other failure of the probe fails the test.
func requireRewriting(t testing.TB, p *Proxy, dbURL, tag string) {
	t.Helper()
	if reason := rewritingMissing(t, p, dbURL, tag); reason != "" {
		testenv.SkipOrFail(t, "%s", reason)
	}
}

// rewritingMissing returns why the proxy does not intercept leaf_next, or "" when it does.
func rewritingMissing(t testing.TB, p *Proxy, dbURL, tag string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL(dbURL, "postgres", ""))
	if err != nil {
		t.Fatalf("connect through %s: %v", p.Name, err)
	}
	defer conn.Close(ctx)
	var id int64
	err = conn.QueryRow(ctx, "SELECT leaf_next('"+tag+"')").Scan(&id)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42883" && strings.Contains(pgErr.Message, "leaf_next") {
		return fmt.Sprintf("%s forwards leaf_next to PostgreSQL unchanged (%s): the SQL rewriting is not in the binary yet", p.Name, pgErr.Message)
	}
	if err != nil {
		t.Fatalf("SELECT leaf_next('%s') through %s: %v", tag, p.Name, err)
	}
	return ""
}
