package rewrite

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

func TestNewValidates(t *testing.T) {
	for _, c := range []struct {
		name string
		s    Settings
		ok   bool
	}{
		{"zero value", Settings{}, true},
		{"valid rules", goldenSettings, true},
		{"negative cache", Settings{CacheSize: -1}, false},
		{"rule without table", Settings{Fill: []FillRule{{Column: "id", Tag: "t"}}}, false},
		{"rule without column", Settings{Fill: []FillRule{{Table: "t", Tag: "t"}}}, false},
		{"rule without tag", Settings{Fill: []FillRule{{Table: "t", Column: "id"}}}, false},
		{"duplicate rule", Settings{Fill: []FillRule{{Table: "t", Column: "id", Tag: "a"}, {Table: "t", Column: "id", Tag: "b"}}}, false},
		{"name longer than 63 bytes", Settings{Fill: []FillRule{{Table: strings.Repeat("t", 64), Column: "id", Tag: "t"}}}, false},
		{"same column in two schemas", Settings{Fill: []FillRule{{Schema: "a", Table: "t", Column: "id", Tag: "a"}, {Schema: "b", Table: "t", Column: "id", Tag: "b"}}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.s)
			if (err == nil) != c.ok {
				t.Errorf("New(%+v) error = %v, want ok=%v", c.s, err, c.ok)
			}
		})
	}
}

func TestPrefilter(t *testing.T) {
	rw, err := New(goldenSettings)
	if err != nil {
		t.Fatal(err)
	}
	bare, err := New(Settings{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		rw   *Rewriter
		sql  string
		want bool
	}{
		{rw, "SELECT 1", false},
		{rw, "SELECT LEAF_NEXT('x')", true},
		{rw, "select Leaf_Snowflake()", true},
		{rw, "INSERT INTO orders (item) VALUES ('a')", true},
		{rw, "insert into ORDERS (item) values ('a')", true},
		{rw, "INSERT INTO items (name) VALUES ('a')", false},
		{rw, "UPDATE orders SET item = 'a'", false},
		{rw, "MERGE INTO orders USING s ON true WHEN MATCHED THEN DO NOTHING", true},
		{rw, "COPY orders (item) FROM STDIN", true},
		{rw, "copy items (name) from stdin", false},
		{rw, "EXECUTE p", true},
		{rw, "deallocate all", true},
		{rw, "DISCARD ALL", true},
		{bare, "INSERT INTO orders (item) VALUES ('a')", false},
		{bare, "SELECT leaf_next('a')", true},
	} {
		if got := c.rw.mayNeed(c.sql); got != c.want {
			t.Errorf("mayNeed(%q) = %v, want %v", c.sql, got, c.want)
		}
	}
}

// TestPrefilterMatchesSubstrings checks the word-at-a-time prefilter against its
// definition, written with plain substring searches: a text may need the rewriter when,
// ignoring ASCII case, it contains leaf_, execute, deallocate or discard, or contains
// insert, merge or copy and the name of a filled table. The texts are random strings of
// keyword pieces, case flips and other bytes, so that keywords are cut at every position
// and end at every distance from the end of the text (the last eight bytes are read
// apart).
func TestPrefilterMatchesSubstrings(t *testing.T) {
	rw, err := New(goldenSettings)
	if err != nil {
		t.Fatal(err)
	}
	lower := func(s string) string {
		b := []byte(s)
		for i, c := range b {
			if 'A' <= c && c <= 'Z' {
				b[i] = c + 'a' - 'A'
			}
		}
		return string(b)
	}
	want := func(sql string) bool {
		l := lower(sql)
		for _, k := range []string{"leaf_", "execute", "deallocate", "discard"} {
			if strings.Contains(l, k) {
				return true
			}
		}
		writes := false
		for _, k := range []string{"insert", "merge", "copy"} {
			writes = writes || strings.Contains(l, k)
		}
		if !writes {
			return false
		}
		for _, n := range rw.needles {
			if strings.Contains(l, n) {
				return true
			}
		}
		return false
	}
	pieces := []string{"leaf_", "lEaF", "leaf", "_", "execut", "e", "EXECUTE", "dealloca", "te",
		"DEALLOCATE", "discar", "d", "insert", "INSERT", "inser", "merge", "MERG", "copy", "cop",
		"orders", "ORDER", "events", "accounts", "invoices", " ", "l", "x", "\x7f", "\x00", "é",
		"SELECT 1", "\xdf", "L", "E", "D", "I", "M", "C"}
	seed := uint64(1)
	next := func(n int) int { // xorshift: reproducible without math/rand's global state
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		return int(seed % uint64(n))
	}
	for range 200000 {
		var b strings.Builder
		for range next(8) {
			b.WriteString(pieces[next(len(pieces))])
		}
		sql := b.String()
		if got := rw.mayNeed(sql); got != want(sql) {
			t.Fatalf("mayNeed(%q) = %v, want %v", sql, got, !got)
		}
	}
}

func TestContainsFold(t *testing.T) {
	for _, c := range []struct {
		s, needle string
		want      bool
	}{
		{"", "leaf_", false},
		{"leaf", "leaf_", false},
		{"LEAF_", "leaf_", true},
		{"xxLeAf_yy", "leaf_", true},
		{"lleaf_", "leaf_", true},
		{"leaf-", "leaf_", false},
		{"anything", "", true},
		{"ÄINSERT", "insert", true},
	} {
		if got := containsFold(c.s, c.needle); got != c.want {
			t.Errorf("containsFold(%q, %q) = %v, want %v", c.s, c.needle, got, c.want)
		}
	}
}

func TestPrefilterMissIsNotParsedOrCached(t *testing.T) {
	rw, err := New(goldenSettings)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := rw.Plan("SELECT * FROM pgbench_accounts WHERE aid = $1"); p != nil || err != nil {
		t.Fatalf("Plan = %v, %v; want nil, nil", p, err)
	}
	if n := rw.caches.Load().text.len(); n != 0 {
		t.Errorf("cache holds %d entries after a prefilter miss, want 0", n)
	}
}

func TestCacheSharesPlansAndErrors(t *testing.T) {
	rw, err := New(goldenSettings)
	if err != nil {
		t.Fatal(err)
	}
	const q = "INSERT INTO orders (item) VALUES ('a')"
	p1, _ := rw.Plan(q)
	p2, _ := rw.Plan(q)
	if p1 == nil || p1 != p2 {
		t.Errorf("second Plan returned %p, want the cached %p", p2, p1)
	}
	const bad = "SELECT leaf_next(1)"
	_, e1 := rw.Plan(bad)
	_, e2 := rw.Plan(bad)
	if e1 == nil || e1 != e2 {
		t.Errorf("second Plan of a refusal returned %v, want the cached %v", e2, e1)
	}
	const none = "SELECT 'leaf_ only in a string'"
	if p, err := rw.Plan(none); p != nil || err != nil {
		t.Errorf("Plan(%q) = %v, %v", none, p, err)
	}
	if n := rw.caches.Load().text.len(); n != 3 {
		t.Errorf("cache holds %d entries, want 3 (plan, refusal, nothing to do)", n)
	}
}

func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	// The texts share a shape; without the shape cache all go through the
	// text cache.
	rw, err := New(Settings{Fill: goldenSettings.Fill, CacheSize: 2, ShapeCacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	q := func(i int) string { return fmt.Sprintf("INSERT INTO orders (item) VALUES ('%d')", i) }
	a, _ := rw.Plan(q(1))
	b, _ := rw.Plan(q(2))
	if again, _ := rw.Plan(q(1)); again != a { // q(1) is now the most recent
		t.Fatal("q(1) was not cached")
	}
	rw.Plan(q(3)) // evicts q(2)
	if n := rw.caches.Load().text.len(); n != 2 {
		t.Errorf("cache holds %d entries, want 2", n)
	}
	if again, _ := rw.Plan(q(1)); again != a {
		t.Error("q(1) was evicted although it was used more recently than q(2)")
	}
	if again, _ := rw.Plan(q(2)); again == b {
		t.Error("q(2) is still cached; it should have been evicted")
	}
}

func TestConcurrentPlan(t *testing.T) {
	rw, err := New(Settings{Fill: goldenSettings.Fill, CacheSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				sql := fmt.Sprintf("INSERT INTO orders (item) VALUES ('%d')", (g*7+i)%40)
				p, err := rw.Plan(sql)
				if err != nil || p == nil || len(p.Slots) != 1 {
					errs <- fmt.Errorf("Plan(%q) = %v, %v", sql, p, err)
					return
				}
				out := string(p.AppendLiteral(nil, []int64{int64(i)}))
				if !strings.Contains(out, fmt.Sprintf(", %d::int8)", i)) {
					errs <- fmt.Errorf("rendered %q", out)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestErrorCarriesSQLState(t *testing.T) {
	rw, err := New(Settings{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = rw.Plan("UPDATE t SET id = leaf_next('x')")
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("Plan error %T is not *Error", err)
	}
	var state interface{ SQLState() string }
	if !errors.As(err, &state) || state.SQLState() != sqlstate.FeatureNotSupported {
		t.Errorf("SQLState() = %v, want %s", state, sqlstate.FeatureNotSupported)
	}
	if e.Hint == "" || e.Position != 19 || !strings.Contains(e.Error(), "0A000") {
		t.Errorf("error %+v lacks hint, position 19 or SQLSTATE in its text", e)
	}
}

func TestExecuteTag(t *testing.T) {
	rw, err := New(Settings{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := rw.Plan("EXECUTE p('order', 5, $$pay$$::text, '')")
	if err != nil || p == nil || p.Execute == nil {
		t.Fatalf("Plan = %v, %v", p, err)
	}
	for _, c := range []struct {
		param int
		tag   string
		ok    bool
	}{{1, "order", true}, {2, "", false}, {3, "pay", true}, {4, "", false}, {0, "", false}, {5, "", false}} {
		tag, err := p.Execute.Tag(c.param)
		if tag != c.tag || (err == nil) != c.ok {
			t.Errorf("Tag(%d) = %q, %v; want %q, ok=%v", c.param, tag, err, c.tag, c.ok)
		}
		var e *Error
		if err != nil && (!errors.As(err, &e) || e.Code != sqlstate.InvalidParameterValue) {
			t.Errorf("Tag(%d) error %v is not a 22023 *Error", c.param, err)
		}
	}
}

func TestSessionConflict(t *testing.T) {
	rw, err := New(Settings{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := rw.Plan("EXECUTE a; DEALLOCATE b")
	if err != nil || p == nil {
		t.Fatalf("Plan = %v, %v", p, err)
	}
	if p.Execute != nil || p.Deallocate != nil {
		t.Errorf("a multi-statement plan sets Execute/Deallocate: %+v %+v", p.Execute, p.Deallocate)
	}
	withSlots := func(names ...string) func(string) bool {
		return func(n string) bool {
			for _, x := range names {
				if x == n || n == "" {
					return true
				}
			}
			return false
		}
	}
	if err := p.SessionConflict(withSlots()); err != nil {
		t.Errorf("no statement with slots: %v", err)
	}
	if err := p.SessionConflict(withSlots("c")); err != nil {
		t.Errorf("unrelated statement with slots: %v", err)
	}
	for _, name := range []string{"a", "b"} {
		var e *Error
		if err := p.SessionConflict(withSlots(name)); !errors.As(err, &e) || e.Code != sqlstate.FeatureNotSupported {
			t.Errorf("%s has slots: got %v, want 0A000", name, err)
		}
	}
	all, err := rw.Plan("SELECT 1; DISCARD ALL")
	if err != nil || all == nil {
		t.Fatalf("Plan = %v, %v", all, err)
	}
	if err := all.SessionConflict(withSlots("x")); err == nil {
		t.Error("DISCARD ALL with a statement holding slots: no conflict reported")
	}
}

func TestAppendLiteralPanicsOnMissingIDs(t *testing.T) {
	rw, err := New(Settings{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := rw.Plan("SELECT leaf_next('a'), leaf_next('b')")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Error("AppendLiteral with too few IDs did not panic")
		}
	}()
	p.AppendLiteral(nil, []int64{1})
}

func TestNegativeIDsStayOneToken(t *testing.T) {
	rw, err := New(Settings{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := rw.Plan("SELECT 2-leaf_next('a')")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(p.AppendLiteral(nil, []int64{-5})), "SELECT 2-(-5)::int8"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestLongTextIsNotCached(t *testing.T) {
	rw, err := New(goldenSettings)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("INSERT INTO orders (item) VALUES ('a')")
	for b.Len() <= maxCachedSQL {
		b.WriteString(", ('a')")
	}
	p, err := rw.Plan(b.String())
	if err != nil || p == nil {
		t.Fatalf("Plan = %v, %v", p, err)
	}
	rows := strings.Count(b.String(), "('a')")
	if len(p.Slots) != rows {
		t.Errorf("%d slots for %d rows", len(p.Slots), rows)
	}
	checkInvariants(t, b.String(), p)
	if n := rw.caches.Load().text.len(); n != 0 {
		t.Errorf("cache holds %d entries after a %d-byte statement, want 0", n, b.Len())
	}
}

func TestNULIsForwarded(t *testing.T) {
	rw, err := New(Settings{})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := rw.Plan("SELECT leaf_next('a')\x00, leaf_next('b')"); p != nil || err != nil {
		t.Errorf("Plan of text with NUL = %v, %v; want nil, nil", p, err)
	}
}

// TestCached answers from the prefilter and the text cache only, and the same as Plan.
func TestCached(t *testing.T) {
	rw, err := New(goldenSettings)
	if err != nil {
		t.Fatal(err)
	}
	if p, ok, err := rw.Cached("SELECT 1"); !ok || p != nil || err != nil {
		t.Fatalf("prefilter miss: %v %v %v", p, ok, err)
	}
	for _, sql := range []string{"INSERT INTO orders (item) VALUES ('a')", "SELECT leaf_next('x') FROM t"} {
		if _, ok, _ := rw.Cached(sql); ok {
			t.Fatalf("%s: answered before it was planned", sql)
		}
		want, wantErr := rw.Plan(sql)
		got, ok, err := rw.Cached(sql)
		if !ok || got != want || err != wantErr {
			t.Fatalf("%s: Cached gives %v %v %v, Plan gave %v %v", sql, got, ok, err, want, wantErr)
		}
	}
	// A text the shape cache serves is not kept by text, so it is not Cached.
	if _, ok, _ := rw.Cached("INSERT INTO orders (item) VALUES ('b')"); ok {
		t.Fatal("a new text of a known shape was answered without a scan")
	}
}

// swapCatalog is a Catalog a test can change.
type swapCatalog struct {
	mu sync.Mutex
	m  mapCatalog
}

func (c *swapCatalog) Schemas(table string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Schemas(table)
}

func (c *swapCatalog) Table(schema, table string) (Table, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Table(schema, table)
}

// A plan for an INSERT without a column list depends on the catalog: after
// CatalogChanged the same text (and a text of the same shape) is planned
// with the new column order.
func TestCatalogChangedDropsPlans(t *testing.T) {
	cat := &swapCatalog{m: mapCatalog{"public.t": {Columns: []string{"id", "v"}, Types: []string{"bigint", "text"}}}}
	rw, err := New(Settings{Fill: []FillRule{{Table: "t", Column: "id", Tag: "x"}}, Catalog: cat})
	if err != nil {
		t.Fatal(err)
	}
	literal := func(sql string) string {
		t.Helper()
		p, err := rw.Plan(sql)
		if err != nil || p == nil {
			t.Fatalf("Plan(%q) = %v, %v", sql, p, err)
		}
		return string(p.AppendLiteral(nil, []int64{7}))
	}
	if got, want := literal("INSERT INTO t VALUES (DEFAULT, DEFAULT)"), "INSERT INTO t (id, v) VALUES (7::int8, DEFAULT)"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if got, want := literal("INSERT INTO t VALUES (NULL, 'a')"), "INSERT INTO t (id, v) VALUES (7::int8, 'a')"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	cat.mu.Lock()
	cat.m = mapCatalog{"public.t": {Columns: []string{"v", "id"}, Types: []string{"text", "integer"}}}
	cat.mu.Unlock()
	rw.CatalogChanged()
	if got, want := literal("INSERT INTO t VALUES (DEFAULT, DEFAULT)"), "INSERT INTO t (v, id) VALUES (DEFAULT, 7::int8)"; got != want {
		t.Fatalf("after the change: got %s, want %s", got, want)
	}
	p, err := rw.Plan("INSERT INTO t VALUES ('b', NULL)")
	if err != nil || p == nil || len(p.Slots) != 1 || p.Slots[0].Max != math.MaxInt32 {
		t.Fatalf("after the change: plan %+v, %v; want one slot with the integer maximum", p, err)
	}
}

// A rule that names a schema fills an INSERT or COPY that leaves the name unqualified
// when the catalog knows no other schema with a table of that name; when another has
// one, the statement is refused (0A000), since the search_path decides which table it
// reaches; when only another schema has one, the rule does not apply. A plan made under
// one catalog goes with CatalogChanged.
func TestQualifiedRuleUnqualifiedName(t *testing.T) {
	tickets := Table{Columns: []string{"id", "item"}, Types: []string{"bigint", "text"}}
	cat := &swapCatalog{m: mapCatalog{"public.tickets": tickets}}
	rw, err := New(Settings{Fill: []FillRule{{Schema: "public", Table: "tickets", Column: "id", Tag: "t"}}, Catalog: cat})
	if err != nil {
		t.Fatal(err)
	}
	set := func(m mapCatalog) {
		cat.mu.Lock()
		cat.m = m
		cat.mu.Unlock()
		rw.CatalogChanged()
	}
	literal := func(sql string) string {
		t.Helper()
		p, err := rw.Plan(sql)
		if err != nil {
			t.Fatalf("Plan(%q): %v", sql, err)
		}
		if p == nil {
			return sql
		}
		return string(p.AppendLiteral(nil, []int64{7}))
	}
	for _, c := range [][2]string{
		{"INSERT INTO tickets (item) VALUES ('a')", "INSERT INTO tickets (item, id) VALUES ('a', 7::int8)"},
		{"INSERT INTO tickets VALUES (DEFAULT, 'b')", "INSERT INTO tickets (id, item) VALUES (7::int8, 'b')"},
		{"INSERT INTO public.tickets (item) VALUES ('c')", "INSERT INTO public.tickets (item, id) VALUES ('c', 7::int8)"},
	} {
		if got := literal(c[0]); got != c[1] {
			t.Errorf("one schema holds tickets: %s became %s, want %s", c[0], got, c[1])
		}
	}
	if p, err := rw.Plan("COPY tickets (item) FROM STDIN"); err != nil || p == nil || p.CopyFill == nil {
		t.Errorf("COPY into the unqualified tickets: plan %+v, %v; want the key added to its rows", p, err)
	}

	set(mapCatalog{"public.tickets": tickets, "app.tickets": tickets})
	for _, sql := range []string{
		"INSERT INTO tickets (item) VALUES ('a')",
		"INSERT INTO tickets (id, item) VALUES (1, 'a'), (DEFAULT, 'b')",
		"INSERT INTO tickets VALUES (1, 'a')",
		"COPY tickets (item) FROM STDIN",
		"WITH x AS (INSERT INTO tickets (item) VALUES ('a') RETURNING 1) SELECT 1",
		"MERGE INTO tickets t USING (VALUES (1)) s (n) ON t.id = s.n WHEN NOT MATCHED THEN INSERT (id, item) VALUES (s.n, 'a')",
	} {
		var e *Error
		if _, err := rw.Plan(sql); !errors.As(err, &e) || e.Code != "0A000" || !strings.Contains(e.Hint, "app.tickets or public.tickets") {
			t.Errorf("two schemas hold tickets: %s planned with %v, want 0A000 naming both tables", sql, err)
		}
	}
	// A statement that gives every key needs no ID, whichever table it reaches.
	for _, sql := range []string{
		"INSERT INTO tickets (id, item) VALUES (1, 'a'), (2, 'b')",
		"INSERT INTO tickets (id, item) SELECT 1, 'a'",
		"COPY tickets (id, item) FROM STDIN",
	} {
		if p, err := rw.Plan(sql); err != nil || p != nil && (len(p.Slots) > 0 || p.CopyFill != nil) {
			t.Errorf("two schemas hold tickets, every key given: %s planned %+v, %v; want it forwarded", sql, p, err)
		}
	}
	if got, want := literal("INSERT INTO app.tickets (item) VALUES ('a')"), "INSERT INTO app.tickets (item) VALUES ('a')"; got != want {
		t.Errorf("qualified with the schema no rule names: %s, want it unchanged", got)
	}
	if got, want := literal("INSERT INTO public.tickets (item) VALUES ('a')"), "INSERT INTO public.tickets (item, id) VALUES ('a', 7::int8)"; got != want {
		t.Errorf("qualified with the rule's schema: %s, want %s", got, want)
	}

	set(mapCatalog{"app.tickets": tickets})
	if got, want := literal("INSERT INTO tickets (item) VALUES ('a')"), "INSERT INTO tickets (item) VALUES ('a')"; got != want {
		t.Errorf("only app holds tickets: %s, want it unchanged", got)
	}
}
