package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/rewrite"
)

// TestCatalogFilling runs the INSERT forms without a column list through a running proxy
// that read the filled tables' columns from the upstream's catalog, with pgx (extended
// protocol) and psql (simple protocol): DEFAULT, NULL and DEFAULT VALUES get an ID at the
// key's position, an explicit key is kept, a COPY without a column list is refused, an
// ID too large for an integer key is refused with 22003 before it reaches the server, a
// snowflake tag on an integer key is refused when the rules load, and tables with a
// trigger or a rule on INSERT are filled as before.
func TestCatalogFilling(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	// IDs of tag big start at 2^31-7: seven fit an integer key, the eighth does not.
	mustRun(t, "tag", "add", "big", "--step", "10", "--max-id", strconv.Itoa(math.MaxInt32-7), "--dsn", dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	direct, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	for _, sql := range []string{
		// The key is not the first column, and a dropped column sits before it.
		"CREATE TABLE orders (gone int, item text, id bigint PRIMARY KEY, qty int DEFAULT 1)",
		"ALTER TABLE orders DROP COLUMN gone",
		"CREATE TABLE tickets (id integer PRIMARY KEY, title text)",
		"CREATE TABLE snowy (id integer, v text)",
		"CREATE TABLE audited (id bigint PRIMARY KEY, item text, seen text)",
		`CREATE FUNCTION audit_seen() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN NEW.seen := 'trigger saw ' || NEW.id; RETURN NEW; END $$`,
		"CREATE TRIGGER audited_seen BEFORE INSERT ON audited FOR EACH ROW EXECUTE FUNCTION audit_seen()",
		"CREATE TABLE ruled (id bigint, item text)",
		"CREATE TABLE ruled_log (id bigint PRIMARY KEY, item text)",
		"CREATE RULE ruled_redirect AS ON INSERT TO ruled DO INSTEAD INSERT INTO ruled_log VALUES (NEW.id, NEW.item)",
	} {
		if _, err := direct.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	s := startServe(t, nil, serveArgs(t, dsn, 13,
		"--fill", "tickets.id=big", "--fill", "snowy.id=pay", "--fill", "audited.id=audit", "--fill", "ruled.id=audit")...)
	waitReady(s)
	// The rules are loaded before the proxy accepts clients, not before /readyz answers.
	s.waitFor("the refusal of the snowflake tag on an integer key in the log", func() bool {
		log := s.log.String()
		return strings.Contains(log, "fill rule refused") && strings.Contains(log, "snowy.id=pay")
	})
	s.waitFor("the proxy accepting connections", func() bool { return strings.Contains(s.log.String(), "proxy accepting connections") })
	url := proxyURL(t, dsn, s.listen)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	defer conn.Close(ctx)
	codec := snowflake.DefaultCodec()
	isOrderID := func(id int64) bool { return id > 0 && codec.Decompose(id).Worker == 13 }

	// pgx, extended protocol: each form returns the key the proxy filled.
	for _, sql := range []string{
		"INSERT INTO orders VALUES ('pgx default', DEFAULT) RETURNING id",
		"INSERT INTO orders VALUES ('pgx null', NULL, 2) RETURNING id",
		"INSERT INTO orders DEFAULT VALUES RETURNING id",
		"INSERT INTO orders VALUES ($1, DEFAULT, $2) RETURNING id",
	} {
		var args []any
		if strings.Contains(sql, "$1") {
			args = []any{"pgx param", 3}
		}
		var id int64
		if err := conn.QueryRow(ctx, sql, args...).Scan(&id); err != nil || !isOrderID(id) {
			t.Errorf("%s: id %d, %v; want a snowflake ID of worker 13", sql, id, err)
		}
	}
	var kept int64
	if err := conn.QueryRow(ctx, "INSERT INTO orders VALUES ('explicit', 42) RETURNING id").Scan(&kept); err != nil || kept != 42 {
		t.Errorf("explicit key: %d, %v; want 42 kept", kept, err)
	}

	// psql, simple protocol: the same forms.
	psql := filepath.Join(testenv.FindPostgresBin(), "psql")
	for _, sql := range []string{
		"INSERT INTO orders VALUES ('psql default', DEFAULT) RETURNING id",
		"INSERT INTO orders VALUES ('psql null', NULL), ('psql two', NULL) RETURNING id",
		"INSERT INTO orders DEFAULT VALUES RETURNING id",
	} {
		q := exec.Command(psql, "-X", "-At", "-v", "ON_ERROR_STOP=1", url, "-c", sql)
		var out bytes.Buffer
		q.Stdout, q.Stderr = &out, &out
		if err := q.Run(); err != nil {
			t.Errorf("psql -c %q: %v\n%s", sql, err, out.String())
			continue
		}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n")[:1] {
			if id, err := strconv.ParseInt(line, 10, 64); err != nil || !isOrderID(id) {
				t.Errorf("psql -c %q returned %q, want a snowflake ID of worker 13", sql, out.String())
			}
		}
	}
	var nulls, rows int
	if err := direct.QueryRow(ctx, "SELECT count(*) FILTER (WHERE id IS NULL OR id <= 0), count(*) FROM orders").Scan(&nulls, &rows); err != nil || nulls != 0 || rows != 9 {
		t.Errorf("orders holds %d rows, %d without a key (%v); want 9 rows, all with keys", rows, nulls, err)
	}

	// COPY without a column list is refused; the session goes on.
	var pgErr *pgconn.PgError
	_, err = conn.PgConn().CopyFrom(ctx, strings.NewReader("x\t7\t1\n"), "COPY orders FROM STDIN")
	if !errors.As(err, &pgErr) || pgErr.Code != "0A000" || !strings.Contains(pgErr.Hint, "List the columns") {
		t.Errorf("COPY without a column list: %v, want 0A000 with a hint to list the columns", err)
	}
	q := exec.Command(psql, "-X", "-At", url, "-c", `\copy orders from stdin`)
	q.Stdin = strings.NewReader("y\t8\t1\n\\.\n")
	if out, err := q.CombinedOutput(); err == nil || !strings.Contains(string(out), "without a column list") {
		t.Errorf("psql \\copy without a column list: %v %s; want the refusal", err, out)
	}
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Errorf("session unusable after the COPY refusal: %v", err)
	}

	// An integer key: IDs up to 2^31-1 go through, the next one is refused with 22003 and
	// never reaches the server; the session stays usable.
	var got []int64
	refused := false
	for i := 0; i < 12 && !refused; i++ {
		var id int64
		err := conn.QueryRow(ctx, "INSERT INTO tickets VALUES (DEFAULT, 'ticket') RETURNING id").Scan(&id)
		switch {
		case err == nil:
			got = append(got, id)
		case errors.As(err, &pgErr) && pgErr.Code == "22003":
			// The proxy's own error, not the server's "integer out of range".
			if !strings.Contains(pgErr.Message, `of tag "big" is out of range for the key column`) {
				t.Errorf("22003 from the server, not the proxy: %v", err)
			}
			refused = true
		default:
			t.Fatalf("insert %d into tickets: %v", i, err)
		}
	}
	if !refused || len(got) != 7 || got[6] != math.MaxInt32 {
		t.Errorf("integer key got IDs %v, refused %v; want 7 IDs up to %d, then 22003", got, refused, math.MaxInt32)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO tickets (title) VALUES ('x')"); !errors.As(err, &pgErr) || pgErr.Code != "22003" || !strings.Contains(pgErr.Message, "key column") {
		t.Errorf("column-list insert past the maximum: %v, want 22003", err)
	}
	// The same in the simple protocol (psql), and the session goes on.
	q = exec.Command(psql, "-X", "-At", url)
	q.Stdin = strings.NewReader("INSERT INTO tickets VALUES (DEFAULT, 'psql');\nSELECT 'still here';\n")
	if out, _ := q.CombinedOutput(); !strings.Contains(string(out), "out of range for the key column") || !strings.Contains(string(out), "still here") {
		t.Errorf("psql insert past the maximum: %s; want the range error, then the next statement's answer", out)
	}
	// A COPY into the integer key fails as a whole when an ID does not fit.
	_, err = conn.PgConn().CopyFrom(ctx, strings.NewReader("c1\nc2\n"), "COPY tickets (title) FROM STDIN")
	if !errors.As(err, &pgErr) || pgErr.Code != "22003" || !strings.Contains(pgErr.Message, "out of range for the key column") {
		t.Errorf("COPY past the maximum: %v, want the range error", err)
	}
	var tickets int
	if err := direct.QueryRow(ctx, "SELECT count(*) FROM tickets").Scan(&tickets); err != nil || tickets != len(got) {
		t.Errorf("tickets holds %d rows (%v), want the %d accepted", tickets, err, len(got))
	}
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Errorf("session unusable after 22003: %v", err)
	}

	// The refused rule is not applied: the key is left to the table (NULL here).
	if _, err := conn.Exec(ctx, "INSERT INTO snowy (v) VALUES ('s')"); err != nil {
		t.Errorf("insert into snowy: %v", err)
	}
	var snowyID *int64
	if err := direct.QueryRow(ctx, "SELECT id FROM snowy").Scan(&snowyID); err != nil || snowyID != nil {
		t.Errorf("snowy.id = %v (%v), want NULL: the refused rule must not fill it", snowyID, err)
	}

	// A trigger sees the filled key; a rule that redirects INSERTs gets it too.
	var aid int64
	var seen string
	if err := conn.QueryRow(ctx, "INSERT INTO audited VALUES (DEFAULT, 'a') RETURNING id, seen").Scan(&aid, &seen); err != nil || aid < 2 || seen != "trigger saw "+strconv.FormatInt(aid, 10) {
		t.Errorf("trigger table: id %d seen %q (%v)", aid, seen, err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO ruled VALUES (NULL, 'r')"); err != nil {
		t.Errorf("insert into the table with a rule: %v", err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO ruled (item) VALUES ('r2')"); err != nil {
		t.Errorf("insert with a column list into the table with a rule: %v", err)
	}
	var logged, loggedKeys int
	if err := direct.QueryRow(ctx, "SELECT count(*), count(id) FROM ruled_log").Scan(&logged, &loggedKeys); err != nil || logged != 2 || loggedKeys != 2 {
		t.Errorf("ruled_log holds %d rows, %d with keys (%v); want 2 and 2", logged, loggedKeys, err)
	}
}

// TestCatalogLoad reads the columns of the filled tables in every schema a rule allows,
// without dropped columns, and reports a change of the columns on the next read.
func TestCatalogLoad(t *testing.T) {
	t.Parallel()
	dsn := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	direct, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	for _, sql := range []string{
		"CREATE SCHEMA app",
		"CREATE SCHEMA billing",
		"CREATE TABLE orders (x int, id bigint, item text)",
		"ALTER TABLE orders DROP COLUMN x",
		"CREATE TABLE app.orders (id integer, note text)",
		"CREATE TABLE invoices (n int)",
		"CREATE TABLE billing.invoices (no smallint)",
		"CREATE TEMP TABLE invoices (t int)",
		"CREATE TABLE unrelated (id bigint)",
	} {
		if _, err := direct.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	rules := []config.FillRule{
		{Table: "orders", Column: "id", Tag: "order"},
		{Schema: "billing", Table: "invoices", Column: "no", Tag: "inv"},
	}
	cat, err := newCatalog(dsn, upstreamOf(t, dsn), rules)
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := cat.load(ctx); err != nil || !changed {
		t.Fatalf("first load: changed %v, %v", changed, err)
	}
	want := map[tableName]rewrite.Table{
		{"public", "orders"}:    {Columns: []string{"id", "item"}, Types: []string{"bigint", "text"}},
		{"app", "orders"}:       {Columns: []string{"id", "note"}, Types: []string{"integer", "text"}},
		{"billing", "invoices"}: {Columns: []string{"no"}, Types: []string{"smallint"}},
	}
	if got := cat.snap.Load().tables; !reflect.DeepEqual(got, want) {
		t.Errorf("catalog %v, want %v", got, want)
	}
	// invoices is in two schemas, of which only billing's is filled; the temporary table
	// of another session is not listed.
	if got := cat.Schemas("invoices"); !slices.Equal(got, []string{"billing", "public"}) {
		t.Errorf("schemas of invoices %v, want billing and public", got)
	}
	if got := cat.Schemas("orders"); !slices.Equal(got, []string{"app", "public"}) {
		t.Errorf("schemas of orders %v, want app and public", got)
	}
	if got := cat.Schemas("unrelated"); got != nil {
		t.Errorf("schemas of unrelated %v: no rule fills a table of that name", got)
	}
	if typ := cat.keyType(rules[1]); typ != "smallint" {
		t.Errorf("key type of %s = %q, want smallint", rules[1], typ)
	}
	// public.orders and app.orders differ: the unqualified name, which either may be
	// depending on the search_path, has no columns and no key type.
	if tb, ok := cat.Table("", "orders"); ok || !slices.Equal(cat.ambiguous, []string{"orders"}) {
		t.Errorf("unqualified orders: %v, %v; ambiguous names %v", tb, ok, cat.ambiguous)
	}
	if typ := cat.keyType(rules[0]); typ != "" {
		t.Errorf("key type of %s = %q, want none: the schemas differ", rules[0], typ)
	}
	if changed, err := cat.load(ctx); err != nil || changed {
		t.Errorf("second load without DDL: changed %v, %v", changed, err)
	}
	// A table of a filled name in another schema changes what an unqualified name may
	// reach, though no filled table's columns change: the plans must go.
	if _, err := direct.Exec(ctx, "CREATE TABLE app.invoices (z int)"); err != nil {
		t.Fatal(err)
	}
	if changed, err := cat.load(ctx); err != nil || !changed || !slices.Equal(cat.Schemas("invoices"), []string{"app", "billing", "public"}) {
		t.Errorf("load after CREATE TABLE app.invoices: changed %v, %v; schemas %v", changed, err, cat.Schemas("invoices"))
	}
	if _, err := direct.Exec(ctx, "ALTER TABLE orders ADD COLUMN qty int"); err != nil {
		t.Fatal(err)
	}
	if changed, err := cat.load(ctx); err != nil || !changed {
		t.Errorf("load after ADD COLUMN: changed %v, %v", changed, err)
	}
	if tb, ok := cat.Table("public", "orders"); !ok || !reflect.DeepEqual(tb.Columns, []string{"id", "item", "qty"}) {
		t.Errorf("public.orders after ADD COLUMN: %v", tb.Columns)
	}
	// With one orders left, the unqualified name gets its columns.
	if _, err := direct.Exec(ctx, "DROP TABLE app.orders"); err != nil {
		t.Fatal(err)
	}
	if changed, err := cat.load(ctx); err != nil || !changed {
		t.Errorf("load after DROP TABLE: changed %v, %v", changed, err)
	}
	if tb, ok := cat.Table("", "orders"); !ok || !reflect.DeepEqual(tb.Columns, []string{"id", "item", "qty"}) || len(cat.ambiguous) > 0 {
		t.Errorf("unqualified orders after DROP TABLE app.orders: %v, %v; ambiguous names %v", tb.Columns, ok, cat.ambiguous)
	}
	if typ := cat.keyType(rules[0]); typ != "bigint" {
		t.Errorf("key type of %s = %q, want bigint", rules[0], typ)
	}
}

// TestUnqualified: an unqualified name that a rule without a schema fills gets the
// columns its table has in every schema when they are the same everywhere; it gets none
// when they differ between schemas (and is named) or when one schema's table was left
// out for differing between databases (already named there); a table that only a rule
// with a schema fills gets no unqualified entry; another session's temporary table does
// not count.
func TestUnqualified(t *testing.T) {
	ab := rewrite.Table{Columns: []string{"a", "b"}, Types: []string{"bigint", "text"}}
	ba := rewrite.Table{Columns: []string{"b", "a"}, Types: []string{"text", "bigint"}}
	snap := map[tableName]rewrite.Table{
		{"public", "t"}: ab, {"app", "t"}: ab, {"pg_temp_3", "t"}: ba,
		{"public", "u"}: ab, {"app", "u"}: ba,
		{"public", "v"}:  ab,
		{"billing", "w"}: ab,
		{"app", "x"}:     ba,
	}
	rules := []config.FillRule{
		{Table: "t", Column: "a"}, {Table: "u", Column: "a"}, {Table: "v", Column: "a"},
		{Schema: "billing", Table: "w", Column: "a"}, {Table: "x", Column: "a"}, {Table: "missing", Column: "a"},
	}
	ambiguous := unqualified(snap, rules, []tableName{{"app", "v"}})
	if !slices.Equal(ambiguous, []string{"u"}) {
		t.Errorf("ambiguous names %v, want [u]", ambiguous)
	}
	for name, want := range map[string]*rewrite.Table{"t": &ab, "u": nil, "v": nil, "w": nil, "x": &ba, "missing": nil} {
		got, ok := snap[tableName{"", name}]
		if ok != (want != nil) || ok && !reflect.DeepEqual(got, *want) {
			t.Errorf("unqualified %s: %v, %v; want %v", name, got, ok, want)
		}
	}
}

// TestCatalogSchemasDiffer: with a filled table of one name in two schemas laid out
// differently, an INSERT without a column list that names it without a schema is refused
// (0A000) through the proxy, whatever the session's search_path, where it used to be
// planned by public's columns and could put an ID into another column of app's table;
// the session goes on, and INSERTs that name the schema or the columns are filled.
func TestCatalogSchemasDiffer(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	direct := connectDB(t, dsn)
	if _, err := direct.Exec(ctx, `CREATE SCHEMA app;
		CREATE TABLE orders (id bigint, item text);
		CREATE TABLE app.orders (item text, id bigint)`); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, nil, serveArgs(t, dsn, 34)...)
	waitReady(s)
	s.waitFor("the warning about orders", func() bool {
		log := s.log.String()
		return strings.Contains(log, "filled tables whose columns differ between schemas") && strings.Contains(log, `"tables":"orders"`)
	})
	s.waitFor("the proxy accepting connections", func() bool { return strings.Contains(s.log.String(), "proxy accepting connections") })
	conn := connectDB(t, proxyURL(t, dsn, s.listen))
	refusedOnAppPath(ctx, t, conn, "INSERT INTO orders VALUES (DEFAULT, DEFAULT)")
	for _, sql := range []string{
		"INSERT INTO app.orders VALUES ('app', DEFAULT) RETURNING id",
		"INSERT INTO public.orders VALUES (DEFAULT, 'public') RETURNING id",
		"INSERT INTO orders (item) VALUES ('named') RETURNING id",
	} {
		var id int64
		if err := conn.QueryRow(ctx, sql).Scan(&id); err != nil || id <= 0 {
			t.Errorf("%s: %d, %v", sql, id, err)
		}
	}
	var app, public, keyless int
	if err := direct.QueryRow(ctx, `SELECT (SELECT count(*) FROM app.orders), (SELECT count(*) FROM public.orders),
		(SELECT count(*) FROM app.orders WHERE id IS NULL OR item NOT IN ('app', 'named'))
		+ (SELECT count(*) FROM public.orders WHERE id IS NULL OR item <> 'public')`).Scan(&app, &public, &keyless); err != nil {
		t.Fatal(err)
	}
	if app != 2 || public != 1 || keyless != 0 {
		t.Errorf("app.orders %d rows, public.orders %d, %d without a key or with another value in item; want 2, 1, 0", app, public, keyless)
	}
}

// TestCatalogQualifiedRule: a rule that names a schema fills INSERTs and COPYs that name
// its table without the schema when no other schema has a table of that name (they used
// to go through with the key left to its default, here a NOT NULL failure), and refuses
// them (0A000) when another has one and they need an ID, since the search_path decides
// which table they reach: nothing of the refused statement is stored and the session
// goes on.
func TestCatalogQualifiedRule(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	direct := connectDB(t, dsn)
	if _, err := direct.Exec(ctx, `CREATE SCHEMA app;
		CREATE TABLE tickets (id bigint PRIMARY KEY, item text);
		CREATE TABLE parcels (id bigint PRIMARY KEY, item text);
		CREATE TABLE app.parcels (id bigint, item text)`); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, nil, serveArgs(t, dsn, 35, "--fill", "public.tickets.id=order", "--fill", "public.parcels.id=order")...)
	waitReady(s)
	s.waitFor("the proxy accepting connections", func() bool { return strings.Contains(s.log.String(), "proxy accepting connections") })
	conn := connectDB(t, proxyURL(t, dsn, s.listen))
	for _, sql := range []string{
		"INSERT INTO tickets (item) VALUES ('named') RETURNING id",
		"INSERT INTO tickets VALUES (DEFAULT, 'unnamed') RETURNING id",
	} {
		var id int64
		if err := conn.QueryRow(ctx, sql).Scan(&id); err != nil || id <= 0 {
			t.Errorf("%s: %d, %v", sql, id, err)
		}
	}
	if n, err := conn.CopyFrom(ctx, pgx.Identifier{"tickets"}, []string{"item"}, pgx.CopyFromRows([][]any{{"copied"}, {"copied"}})); err != nil || n != 2 {
		t.Errorf("COPY into the unqualified tickets: %d rows, %v", n, err)
	}

	refusedOnAppPath(ctx, t, conn, "INSERT INTO parcels (item) VALUES ('refused')")
	for _, sql := range []string{
		"INSERT INTO public.parcels (item) VALUES ('public')",
		"INSERT INTO app.parcels (item) VALUES ('app')",
		"INSERT INTO parcels (id, item) VALUES (42, 'explicit')", // needs no ID: forwarded, reaches app.parcels
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Errorf("%s: %v", sql, err)
		}
	}
	var tickets, public, appFilled, refused int
	if err := direct.QueryRow(ctx, `SELECT (SELECT count(*) FROM tickets), (SELECT count(*) FROM public.parcels WHERE item = 'public'),
		(SELECT count(*) FROM app.parcels WHERE id IS NOT NULL AND id <> 42),
		(SELECT count(*) FROM public.parcels WHERE item = 'refused') + (SELECT count(*) FROM app.parcels WHERE item = 'refused')`).Scan(&tickets, &public, &appFilled, &refused); err != nil {
		t.Fatal(err)
	}
	if tickets != 4 || public != 1 || appFilled != 0 || refused != 0 {
		t.Errorf("tickets %d rows, public.parcels %d, app.parcels %d with a key, %d refused rows stored; want 4, 1, 0, 0", tickets, public, appFilled, refused)
	}
}

// refusedOnAppPath sets conn's search_path to app, public and checks that sql, which
// names a table of both schemas without its schema, is refused with 0A000.
func refusedOnAppPath(ctx context.Context, t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(ctx, "SET search_path = app, public"); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	if _, err := conn.Exec(ctx, sql); !errors.As(err, &pgErr) || pgErr.Code != "0A000" {
		t.Errorf("%s, whose table app and public both hold: %v, want 0A000", sql, err)
	}
}

// TestCatalogRefresh: when a filled table's columns change, the refresh rereads them and
// the rewriter drops its plans, so the same INSERT text is planned by the new column order.
func TestCatalogRefresh(t *testing.T) {
	t.Parallel()
	dsn := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	direct, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	if _, err := direct.Exec(ctx, "CREATE TABLE t (id bigint, v text)"); err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	a := &app{cfg: &config.Config{Store: dsn, Upstream: upstreamOf(t, dsn)}, log: log,
		router: idgen.NewRouter(nil, nil, nil)}
	rules, cat, err := a.catalogRules([]config.FillRule{{Table: "t", Column: "id", Tag: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	rw, err := rewrite.New(rewrite.Settings{Fill: rules, Catalog: cat})
	if err != nil {
		t.Fatal(err)
	}
	a.rewriter = rw
	const sql = "INSERT INTO t VALUES (DEFAULT, DEFAULT)"
	literal := func() string {
		p, err := rw.Plan(sql)
		if err != nil || p == nil {
			t.Fatalf("Plan(%q) = %v, %v", sql, p, err)
		}
		return string(p.AppendLiteral(nil, []int64{9}))
	}
	if got, want := literal(), "INSERT INTO t (id, v) VALUES (9::int8, DEFAULT)"; got != want {
		t.Fatalf("before the change: %s, want %s", got, want)
	}
	for _, ddl := range []string{"ALTER TABLE t DROP COLUMN id", "ALTER TABLE t ADD COLUMN id integer"} {
		if _, err := direct.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.refreshCatalog(rctx, 20*time.Millisecond)
	}()
	defer func() { stop(); <-done }()
	want := "INSERT INTO t (v, id) VALUES (DEFAULT, 9::int8)"
	deadline := time.Now().Add(30 * time.Second)
	for literal() != want {
		if time.Now().After(deadline) {
			t.Fatalf("after the change: %s, want %s", literal(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if p, _ := rw.Plan(sql); p.Slots[0].Max != math.MaxInt32 {
		t.Errorf("slot %v after the key became integer, want the integer maximum", p.Slots[0])
	}
}

// TestCatalogLoadUnixSocket reads the columns through the server's Unix socket when the
// proxy's upstream is one, as `serve --upstream /dir/.s.PGSQL.5432 --fill …` does; a
// socket path used to stop the proxy at start-up ("missing port in address").
func TestCatalogLoadUnixSocket(t *testing.T) {
	t.Parallel()
	dsn := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	direct, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	var dirs, port string
	if err := direct.QueryRow(ctx, "SELECT current_setting('unix_socket_directories'), current_setting('port')").Scan(&dirs, &port); err != nil {
		t.Fatal(err)
	}
	dir := strings.TrimSpace(strings.Split(dirs, ",")[0])
	if dir == "" {
		t.Fatal("the test server listens on no Unix socket")
	}
	if _, err := direct.Exec(ctx, "CREATE TABLE orders (id bigint, item text)"); err != nil {
		t.Fatal(err)
	}
	rules := []config.FillRule{{Table: "orders", Column: "id", Tag: "order"}}
	cat, err := newCatalog(dsn, dir+"/.s.PGSQL."+port, rules)
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := cat.load(ctx); err != nil || !changed {
		t.Fatalf("load through the Unix socket: changed %v, %v", changed, err)
	}
	if tb, ok := cat.Table("public", "orders"); !ok || !reflect.DeepEqual(tb.Columns, []string{"id", "item"}) {
		t.Errorf("public.orders through the Unix socket: %v, %v", tb.Columns, ok)
	}
}

func TestSplitUpstream(t *testing.T) {
	for _, c := range []struct {
		upstream, host string
		port           uint16
		ok             bool
	}{
		{"127.0.0.1:5432", "127.0.0.1", 5432, true},
		{"[::1]:6432", "::1", 6432, true},
		{"/var/run/postgresql/.s.PGSQL.5433", "/var/run/postgresql", 5433, true},
		{"/tmp/.s.PGSQL.5432", "/tmp", 5432, true},
		{"/var/run/postgresql/socket", "", 0, false},
		{"db.example", "", 0, false},
	} {
		host, port, err := splitUpstream(c.upstream)
		if (err == nil) != c.ok || host != c.host || port != c.port {
			t.Errorf("splitUpstream(%q) = %q, %d, %v; want %q, %d, ok %v", c.upstream, host, port, err, c.host, c.port, c.ok)
		}
	}
}
