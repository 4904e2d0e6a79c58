package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

func TestFillCommands(t *testing.T) {
	t.Parallel()
	dsn := testenv.NewDatabase(t)
	if r := leafproxy(t, nil, "fill", "list", "--dsn", dsn); r.code != 1 || !strings.Contains(r.stderr, "leaf_fill does not exist (run `leafproxy migrate up` first)") {
		t.Errorf("fill list before migrate up: %+v", r)
	}
	mustRun(t, "migrate", "up", "--dsn", dsn)
	if out := mustRun(t, "fill", "add", "orders.id=order", "--dsn", dsn); !strings.Contains(out, "added fill rule orders.id=order") {
		t.Errorf("add: %q", out)
	}
	mustRun(t, "fill", "add", "--dsn", dsn, `App."Order Lines".Line_ID=line`) // flags first, quoted names
	// The DSN may come from LEAFPROXY_STORE, as for tag.
	if r := leafproxy(t, []string{"LEAFPROXY_STORE=" + dsn}, "fill", "add", "public.items.id=item"); r.code != 0 {
		t.Errorf("add via LEAFPROXY_STORE: %+v", r)
	}
	var rows []fillRow
	if err := json.Unmarshal([]byte(mustRun(t, "fill", "list", "--json", "--dsn", dsn)), &rows); err != nil {
		t.Fatal(err)
	}
	want := []fillRow{{`app."Order Lines"`, "line_id", "line"}, {"orders", "id", "order"}, {"public.items", "id", "item"}}
	if len(rows) != len(want) {
		t.Fatalf("fill list --json = %+v, want %+v", rows, want)
	}
	for i := range want {
		if rows[i] != want[i] {
			t.Errorf("row %d = %+v, want %+v", i, rows[i], want[i])
		}
	}
	table := mustRun(t, "fill", "list", "--dsn", dsn)
	if !strings.Contains(table, "TABLE") || !strings.Contains(table, `app."Order Lines"`) || !strings.Contains(table, "order") {
		t.Errorf("fill list:\n%s", table)
	}

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"duplicate", []string{"fill", "add", "orders.id=order"}, 1, "fill rule already exists: orders.id=order"},
		{"other tag", []string{"fill", "add", "ORDERS.ID=other"}, 1, "orders.id is filled from two tags: orders.id=order (stored) and orders.id=other (new)"},
		{"second key column", []string{"fill", "add", "orders.order_no=order"}, 1, "table orders has two key columns"},
		{"no tag", []string{"fill", "add", "orders.id"}, 2, "want [schema.]table.column=tag"},
		{"bad tag", []string{"fill", "add", "orders.id=a/b"}, 2, "contains white space, '/'"},
		{"one name", []string{"fill", "add", "orders=x"}, 2, "got 1 names"},
		{"two rules", []string{"fill", "add", "a.id=x", "b.id=x"}, 2, "exactly one"},
		{"remove unknown", []string{"fill", "remove", "nope.id"}, 1, "no such fill rule: nope.id"},
		{"remove bad target", []string{"fill", "remove", "a.b.c.d"}, 2, "got 4 names"},
		{"unknown subcommand", []string{"fill", "rename"}, 2, `unknown subcommand "rename"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := leafproxy(t, nil, append(tc.args, "--dsn", dsn)...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", r.code, r.stderr, tc.code, tc.want)
			}
		})
	}
	if r := leafproxy(t, nil, "fill", "add", "x.id=x"); r.code != 2 || !strings.Contains(r.stderr, "no store given") {
		t.Errorf("fill add without a store: %+v", r)
	}
	if out := mustRun(t, "fill", "remove", `app."Order Lines".line_id`, "--dsn", dsn); !strings.Contains(out, `removed fill rule app."Order Lines".line_id=line`) {
		t.Errorf("remove: %q", out)
	}
	if out := mustRun(t, "fill", "remove", "orders.id", "--dsn", dsn); !strings.Contains(out, "orders.id=order") {
		t.Errorf("remove: %q", out)
	}
	// With the rule gone, the table may take another key column.
	mustRun(t, "fill", "add", "orders.order_no=order", "--dsn", dsn)
	if out := mustRun(t, "fill", "list", "--json", "--dsn", dsn); strings.Contains(out, `"line"`) || !strings.Contains(out, "order_no") {
		t.Errorf("after remove and add: %s", out)
	}
}

// TestFillRulesAfterStoreReturns starts a proxy while the store is down: it starts with
// its configuration's rules, and applies the stored ones soon after the store is back,
// without waiting for fill-refresh (an hour here) or a SIGHUP.
func TestFillRulesAfterStoreReturns(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPostgres(t)
	dsn := pg.NewDatabase(t)
	mustRun(t, "migrate", "up", "--dsn", dsn)
	mustRun(t, "fill", "add", "items.id=pay", "--dsn", dsn) // pay is a snowflake tag of serveArgs
	up := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	setup, err := pgx.Connect(ctx, up)
	if err != nil {
		t.Fatal(err)
	}
	defer setup.Close(context.Background())
	if _, err := setup.Exec(ctx, "CREATE TABLE items (id bigint, v int)"); err != nil {
		t.Fatal(err)
	}
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, nil, withUpstream(serveArgs(t, dsn, 611, "--fill-refresh", "1h"), upstreamOf(t, up))...)
	s.waitFor("the proxy accepting connections", func() bool { return strings.Contains(s.log.String(), "proxy accepting connections") })
	cfg, err := pgx.ParseConfig(proxyURL(t, up, s.listen))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.ConnectTimeout = 15 * time.Second
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	filled := func() bool {
		var id *int64
		if err := conn.QueryRow(ctx, "INSERT INTO items (v) VALUES (1) RETURNING id").Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id != nil
	}
	if filled() {
		t.Fatal("items filled while the store holding its rule is down")
	}
	if !strings.Contains(s.log.String(), "starting with the fill rules of the configuration only") {
		t.Errorf("the proxy does not say it started without the stored rules:\n%s", s.log.String())
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	s.waitFor("the stored rule applied", filled)
	t.Logf("stored rule applied %s after the store came back", time.Since(back).Round(time.Millisecond))
}
