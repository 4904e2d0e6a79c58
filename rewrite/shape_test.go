package rewrite

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/encoding/protowire"
)

// replacements are constant texts by token kind, chosen to change what a
// shape might wrongly carry over: lengths, quotes inside strings, escape and
// dollar quoting, continuation lines, leaf_ inside a string, numbers too big
// for int4 (which the scanner reads as FCONST) and other numeric spellings.
var replacements = map[pg_query.Token][]string{
	pg_query.Token_SCONST: {
		`'v'`, `''`, `'it''s'`, `'leaf_next(''x'')'`, `'ünïcödé'`, `'` + strings.Repeat("long ", 40) + `'`,
		"'con'\n'tinued'", `$$a'b$$`, `$q$x $$ y$q$`, `E'a\'b'`, `e'\n\\'`, `E'\u00e9'`, `'order'`, `'a'`, `'b'`,
		"'invalid \x92 UTF-8'",
	},
	pg_query.Token_USCONST: {`U&'\0041x'`, `U&'ab'`, `U&'\zzzz'`, `U&'\D800'`, `U&'d!0061t' UESCAPE '!'`},
	pg_query.Token_ICONST:  {`0`, `7`, `42`, `2147483647`, `0x1F`, `1_000`, `0o17`},
	pg_query.Token_FCONST:  {`1.5`, `2147483648`, `99999999999999999999`, `1e10`, `.5`, `0.000001`},
	pg_query.Token_BCONST:  {`b'0'`, `B'1010'`},
	pg_query.Token_XCONST:  {`x'1F'`, `X'ab'`},
}

// allReplacements are the texts of every kind, for variants that change a
// constant's kind (and so its shape).
var allReplacements = func() []string {
	var all []string
	for _, k := range []pg_query.Token{pg_query.Token_SCONST, pg_query.Token_ICONST, pg_query.Token_FCONST, pg_query.Token_BCONST, pg_query.Token_XCONST, pg_query.Token_USCONST} {
		all = append(all, replacements[k]...)
	}
	return append(all, `-3`, `- 2147483648`)
}()

// constVariants returns n texts that differ from sql only in the values of
// its constant tokens, as PostgreSQL's scanner finds them. Most keep each
// constant's kind, so that they share sql's shape when the replacement is
// spelled alike; every fourth may change kinds.
func constVariants(sql string, n int, rng *rand.Rand) []string {
	if strings.IndexByte(sql, 0) >= 0 {
		return nil
	}
	all, err := scan(sql)
	if err != nil {
		return nil
	}
	var out []string
	for v := 0; v < n; v++ {
		var b strings.Builder
		pos, changed := 0, false
		for _, t := range all {
			if constKind(t.Token) == 0 {
				continue
			}
			choices := replacements[t.Token]
			if v%4 == 3 {
				choices = allReplacements
			}
			b.WriteString(sql[pos:t.Start])
			b.WriteString(choices[rng.IntN(len(choices))])
			pos, changed = int(t.End), true
		}
		if !changed {
			return nil
		}
		b.WriteString(sql[pos:])
		if v := b.String(); sameTokensBesideConstants(all, v) {
			out = append(out, v)
		}
	}
	return out
}

// sameTokensBesideConstants reports whether v scans to tokens like orig
// but for the constants' values: a replacement must not fuse with its
// neighbours ($1 followed by 2 is the one token $12).
func sameTokensBesideConstants(orig []scanToken, v string) bool {
	toks, err := scan(v)
	if err != nil || len(toks) != len(orig) {
		return false
	}
	for i, t := range toks {
		if (constKind(t.Token) != 0) != (constKind(orig[i].Token) != 0) ||
			(constKind(t.Token) == 0 && t.Token != orig[i].Token) {
			return false
		}
	}
	return true
}

// checkShapePath plans sql through the shape cache of rw and compares the
// outcome with a full parse by ref, whose shape cache is off. It reports
// whether the shape cache served sql; a miss lets rw learn sql's shape.
func checkShapePath(t testing.TB, rw, ref *Rewriter, sql string) bool {
	t.Helper()
	want, _, wantErr := ref.build(ref.caches.Load(), sql)
	got, hit, gotErr := rw.build(rw.caches.Load(), sql)
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gotErr, wantErr) {
		t.Fatalf("shape path (hit=%v) differs from a full parse for %q\nfull:  %s\nshape: %s",
			hit, sql, show(t, sql, want, wantErr), show(t, sql, got, gotErr))
	}
	if hit && wantErr != nil {
		t.Fatalf("shape cache served %q, whose full parse is refused: %v", sql, wantErr)
	}
	checkInvariants(t, sql, got)
	return hit
}

func show(t testing.TB, sql string, p *Plan, err error) string {
	t.Helper()
	b, _ := json.Marshal(describe(t, sql, p, err))
	if p != nil {
		return fmt.Sprintf("%s edits=%+v exec=%+v", b, p.edits, p.exec)
	}
	return string(b)
}

func shapeRewriters(t testing.TB) (rw, ref *Rewriter) {
	t.Helper()
	rw, err := New(goldenSettings)
	if err != nil {
		t.Fatal(err)
	}
	s := goldenSettings
	s.ShapeCacheSize = -1
	if ref, err = New(s); err != nil {
		t.Fatal(err)
	}
	if ref.caches.Load().shapes != nil {
		t.Fatal("a negative ShapeCacheSize left the shape cache on")
	}
	return rw, ref
}

// shapeCases are statements whose outcome depends on a constant in ways the
// golden cases do not show: the grammar interprets or checks the value.
var shapeCases = []string{
	"SELECT leaf_next('a'), 1::float(24)",
	"SELECT leaf_next('a'), 1::float(25)",
	"SELECT leaf_next('a'), 1::float(0)",
	"SELECT leaf_next('a'), 1::float(54)",
	"SELECT (leaf_next('a') + 1)::float(10)",
	"SELECT leaf_next('a'), U&'\\0041' UESCAPE '!'",
	"SELECT leaf_next('a'), U&'d!0061t' UESCAPE '!'",
	"SELECT leaf_next('a'), U&'d!0061t' UESCAPE '+'",
	"INSERT INTO orders (item) VALUES (U&'\\0041')",
	"INSERT INTO orders (item) VALUES (U&'\\zzzz')",
	"SELECT leaf_next(U&'\\0061')",
	"SELECT leaf_next(E'a\\'b'), leaf_next($$x$$), leaf_next('it''s')",
	"SELECT leaf_next('a'::varchar(10)), 'x'::char(3)",
	"SELECT leaf_next('a'), -5, - 2147483648, -(7), -(-8)",
	"SELECT leaf_next('a') AS x, interval '1' day, interval(3) '2 s', time(2) '1:00'",
	"INSERT INTO orders (item, qty) VALUES ('a', -1), ('b', x'1F'), ('c', b'101'), ('d', 1.5e3)",
	"INSERT INTO orders (item) VALUES ('a'); SELECT 1, 'x'",
	"SELECT leaf_next('a')   , 'it''s' -- comment 'x'\n",
	"SELECT leaf_next('a'), 'con'\n'tinued'",
	"SELECT $$x$$leaf_next('a')",
	"SELECT 'x'||leaf_next('a')||'y'",
	"SELECT 1leaf_next('a')",
	"EXECUTE p('order', 5)",
	"EXECUTE p('order'::text, 'x', 7)",
	"EXPLAIN (FORMAT 'json') EXECUTE p('order')",
	"PREPARE p (int) AS INSERT INTO orders (item, qty) VALUES ('a', $1)",
	"PREPARE p AS SELECT leaf_next('a'), 'x', 3",
	"INSERT INTO orders (item) VALUES ('a') ON CONFLICT DO NOTHING RETURNING id, 'x', 5",
	"SELECT leaf_next('a') LIMIT 5",
	"SELECT leaf_next('a'), 'x' COLLATE \"C\"",
	"CALL f(leaf_next('a'), 'x', 3)",
	"WITH x AS (INSERT INTO orders (item) VALUES ('a') RETURNING id) SELECT *, 'k' FROM x",
	"INSERT INTO orders (item) SELECT 'a' FROM t LIMIT 3",
	"SELECT leaf_next('a'), xmlelement(name foo, 'bar')",
	"SELECT leaf_next('a') FROM t WHERE x = 'y'",
	"SELECT leaf_next('')",
	"SELECT leaf_next(1)",
	"SELECT leaf_next('a'), jsonb_path_query('{}', '$.a')",
	"SELECT leaf_next('a'), 'leaf_', U&\"\\006Ceaf_next\"('x')",
	"INSERT INTO orders (item) VALUES (U&\"\\006Ceaf_next\"('x'))",
	"INSERT INTO orders (item) VALUES (U&\"\\006Ceaf_next\"('leaf_'))",
}

// TestShapePathMatchesFullParse is the shape cache's differential test:
// for every golden case, the extra cases above and variants of them with
// other constants, the plan the shape cache gives is the one a fresh full
// parse of the same text gives, field for field.
func TestShapePathMatchesFullParse(t *testing.T) {
	rw, ref := shapeRewriters(t)
	sqls := append([]string(nil), shapeCases...)
	for _, file := range goldenFiles(t) {
		for _, c := range readCases(t, file) {
			sqls = append(sqls, c.SQL)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	hits, total := 0, 0
	for _, sql := range sqls {
		checkShapePath(t, rw, ref, sql)
		for _, v := range constVariants(sql, 16, rng) {
			total++
			if checkShapePath(t, rw, ref, v) {
				hits++
			}
		}
	}
	t.Logf("%d of %d variants served by the shape cache", hits, total)
	if hits < total/8 {
		t.Errorf("only %d of %d variants were served by the shape cache", hits, total)
	}
}

// TestShapeKeepsTags checks that a plan learnt for one leaf_next tag or
// EXECUTE argument is never served for another, while other constants of
// the same statements may change freely.
func TestShapeKeepsTags(t *testing.T) {
	rw, err := New(goldenSettings)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		learn     string
		sameDeps  string // other constants changed: served by shape
		otherDeps string // the tag changed: parsed again
		check     func(*Plan) string
	}{
		{"fast path", "SELECT leaf_next('a')", "", "SELECT leaf_next('b')",
			func(p *Plan) string { return p.Slots[0].Tag + "/" + p.FastPath.Slot.Tag }},
		{"insert", "INSERT INTO t (id, x) VALUES (leaf_next('a'), 'x')", "INSERT INTO t (id, x) VALUES (leaf_next('a'), 'yy')",
			"INSERT INTO t (id, x) VALUES (leaf_next('b'), 'z')", func(p *Plan) string { return p.Slots[0].Tag }},
		{"tag spelled with escapes", "SELECT leaf_next(E'a'), 1", "SELECT leaf_next(E'a'), 2", "SELECT leaf_next(E'\\x62'), 3",
			func(p *Plan) string { return p.Slots[0].Tag }},
		{"batch count", "SELECT leaf_next('x', 5)", "", "SELECT leaf_next('x', 6)",
			func(p *Plan) string { return "count " + strconv.FormatInt(p.Batch.Count, 10) }},
		{"batch tag", "SELECT leaf_next('a', 5)", "", "SELECT leaf_next('b', 5)",
			func(p *Plan) string { return p.Batch.Tag }},
		{"execute", "EXECUTE p('a', 1)", "EXECUTE p('a', 2)", "EXECUTE p('b', 3)",
			func(p *Plan) string { tag, _ := p.Execute.Tag(1); return tag }},
	} {
		t.Run(c.name, func(t *testing.T) {
			first, err := rw.Plan(c.learn)
			if err != nil || first == nil {
				t.Fatalf("Plan(%q) = %v, %v", c.learn, first, err)
			}
			if c.sameDeps != "" {
				if _, sh := rw.scan(rw.caches.Load().shapes, c.sameDeps); rw.caches.Load().shapes.lookup(sh) == nil {
					t.Errorf("%q is not served by the shape of %q", c.sameDeps, c.learn)
				}
				p, err := rw.Plan(c.sameDeps)
				if err != nil || c.check(p) != c.check(first) {
					t.Errorf("Plan(%q) gives %q, %v; want %q", c.sameDeps, c.check(p), err, c.check(first))
				}
			}
			if _, sh := rw.scan(rw.caches.Load().shapes, c.otherDeps); rw.caches.Load().shapes.lookup(sh) != nil {
				t.Errorf("%q is served by the plan of %q", c.otherDeps, c.learn)
			}
			p, err := rw.Plan(c.otherDeps)
			if err != nil || p == nil {
				t.Fatalf("Plan(%q) = %v, %v", c.otherDeps, p, err)
			}
			if got := c.check(p); got == c.check(first) || strings.Contains(got, "a") {
				t.Errorf("Plan(%q) gives %q, the tag of %q", c.otherDeps, got, c.learn)
			}
		})
	}
}

// TestShapeCacheIsBounded fills a small shape cache with more shapes, and
// more tags of one shape, than it may hold.
func TestShapeCacheIsBounded(t *testing.T) {
	const size = 8
	rw, err := New(Settings{Fill: goldenSettings.Fill, ShapeCacheSize: size, CacheSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10*size; i++ {
		for _, sql := range []string{
			fmt.Sprintf("INSERT INTO orders (item, col_%d) VALUES ('a', 1)", i),
			fmt.Sprintf("SELECT leaf_next('tag_%d'), 'x'", i),
		} {
			if p, err := rw.Plan(sql); err != nil || p == nil {
				t.Fatalf("Plan(%q) = %v, %v", sql, p, err)
			}
			if n := rw.caches.Load().shapes.lru.len(); n > size {
				t.Fatalf("shape cache holds %d entries, want at most %d", n, size)
			}
		}
	}
	// The most recent shape is still there: the bound evicts, it does not
	// stop learning.
	if _, sh := rw.scan(rw.caches.Load().shapes, "INSERT INTO orders (item, col_79) VALUES ('b', 2)"); rw.caches.Load().shapes.lookup(sh) == nil {
		t.Error("the most recently learnt shape was evicted")
	}
	if _, sh := rw.scan(rw.caches.Load().shapes, "INSERT INTO orders (item, col_0) VALUES ('b', 2)"); rw.caches.Load().shapes.lookup(sh) != nil {
		t.Error("the first shape is still cached")
	}
}

func TestShapeCacheOff(t *testing.T) {
	rw, err := New(Settings{Fill: goldenSettings.Fill, ShapeCacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{"INSERT INTO orders (item) VALUES ('a')", "INSERT INTO orders (item) VALUES ('b')"} {
		p, err := rw.Plan(sql)
		if err != nil || p == nil || len(p.Slots) != 1 {
			t.Fatalf("Plan(%q) = %v, %v", sql, p, err)
		}
	}
}

// TestScanMatchesPgQuery checks the direct decoding of the scanner's
// output against pg_query.Scan.
func TestScanMatchesPgQuery(t *testing.T) {
	sqls := append([]string{"", "   ", "SELECT 'unterminated", "/* only a comment */",
		"SELECT " + strings.Repeat("'x', ", 5000) + "1"}, shapeCases...)
	for _, file := range goldenFiles(t) {
		for _, c := range readCases(t, file) {
			sqls = append(sqls, c.SQL)
		}
	}
	for _, sql := range sqls {
		got, gotErr := scan(sql)
		want, wantErr := pg_query.Scan(sql)
		if (gotErr != nil) != (wantErr != nil) {
			t.Fatalf("scan(%q) error %v, pg_query.Scan error %v", sql, gotErr, wantErr)
		}
		if wantErr != nil {
			continue
		}
		if len(got) != len(want.Tokens) {
			t.Fatalf("scan(%q) gives %d tokens, pg_query.Scan %d", sql, len(got), len(want.Tokens))
		}
		for i, w := range want.Tokens {
			g := got[i]
			if g.Start != w.Start || g.End != w.End || g.Token != w.Token || g.Keyword != (w.KeywordKind != pg_query.KeywordKind_NO_KEYWORD) {
				t.Errorf("scan(%q) token %d = %+v, pg_query.Scan gives %v", sql, i, g, w)
			}
		}
	}
}

// TestDecodeTokenOtherFields checks a token carrying a field of another
// wire type, which the inline decoder hands to the general one.
func TestDecodeTokenOtherFields(t *testing.T) {
	var b []byte
	b = protowire.AppendTag(b, scanTokenStart, protowire.VarintType)
	b = protowire.AppendVarint(b, 300)
	b = protowire.AppendTag(b, 9, protowire.BytesType)
	b = protowire.AppendBytes(b, []byte("later"))
	b = protowire.AppendTag(b, scanTokenEnd, protowire.VarintType)
	b = protowire.AppendVarint(b, 70000)
	b = protowire.AppendTag(b, scanTokenKind, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(pg_query.Token_SCONST))
	b = protowire.AppendTag(b, 10, protowire.Fixed32Type)
	b = protowire.AppendFixed32(b, 7)
	got, ok := decodeToken(b)
	want := scanToken{Start: 300, End: 70000, Token: pg_query.Token_SCONST}
	if !ok || got != want {
		t.Errorf("decodeToken = %+v, %v; want %+v", got, ok, want)
	}
}

func TestDecodeScanRejectsMalformedOutput(t *testing.T) {
	for _, b := range [][]byte{
		{0x12},                               // tokens field without its length
		{0x12, 0x05, 0x08},                   // length past the end
		{0x12, 0x04, 0x08, 0x05, 0x10, 0x02}, // start after end
		{0x12, 0x04, 0x08, 0x00, 0x10, 0x7f}, // end past the text
		{0x12, 0x02, 0x08, 0x80},             // varint cut off inside the token
		{0xff},                               // truncated tag
	} {
		if toks, err := decodeScan(b, 10, nil); err == nil {
			t.Errorf("decodeScan(% x) = %v, want an error", b, toks)
		}
	}
}

// TestShapeKey checks which texts share a shape: only those that differ in
// the values of constants spelled alike.
func TestShapeKey(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"INSERT INTO t (a, b) VALUES ('x', 1)", "INSERT INTO t (a, b) VALUES ('it''s long', 123456)", true},
		{"SELECT 1.5, x'1F', b'1'", "SELECT 2e10, X'AB', B'0101'", true},
		{"SELECT $$a$$", "SELECT $q$b$q$", true},
		{"SELECT 'a'", "SELECT $$a$$", false},     // the last byte is an identifier byte or not
		{"SELECT 'a'", "SELECT E'a'", false},      // the first byte likewise
		{"SELECT 1", "SELECT 1.0", false},         // ICONST and FCONST
		{"SELECT 1", "SELECT 2147483648", false},  // too big for int4: FCONST
		{"SELECT 1", "SELECT -1", false},          // "-" is a token of its own
		{"SELECT 'x'", "SELECT 'leaf_x'", false},  // the planner looks for leaf_ in the whole text
		{"SELECT 1", "SELECT  1", false},          // the text between constants is kept as it is
		{"SELECT 1 -- a", "SELECT 1 -- b", false}, // comments too
		{"SELECT a, 1", "SELECT b, 1", false},
		{"SELECT 'a' 'b'", "SELECT 'a'\n'b'", false}, // one SCONST across lines
	} {
		sh := func(sql string) *shape {
			all, err := scan(sql)
			if err != nil {
				t.Fatalf("scan(%q): %v", sql, err)
			}
			s := shapeOf(sql, withoutComments(all))
			if s == nil {
				t.Fatalf("shapeOf(%q) = nil", sql)
			}
			return s
		}
		if same := sh(c.a).key == sh(c.b).key; same != c.same {
			t.Errorf("%q and %q share a shape: %v, want %v", c.a, c.b, same, c.same)
		}
	}
}

// TestShapeCacheConcurrent plans texts of a few shapes from several
// goroutines through small caches that evict all the time, and compares
// each plan with a full parse.
func TestShapeCacheConcurrent(t *testing.T) {
	rw, err := New(Settings{Fill: goldenSettings.Fill, CacheSize: 1, ShapeCacheSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	_, ref := shapeRewriters(t)
	var sqls []string
	for i := 0; i < 20; i++ {
		sqls = append(sqls,
			fmt.Sprintf("INSERT INTO orders (item, qty) VALUES ('item %d', %d)", i, i*i),
			fmt.Sprintf("SELECT leaf_next('tag%d'), 'v%d'", i%3, i),
			fmt.Sprintf("INSERT INTO t (id, x) VALUES (leaf_next('t%d'), %d.5)", i%2, i),
			fmt.Sprintf("EXECUTE p('a%d', %d)", i%2, i))
	}
	want := make(map[string]string, len(sqls))
	for _, sql := range sqls {
		p, _, err := ref.build(ref.caches.Load(), sql)
		want[sql] = show(t, sql, p, err)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 400; i++ {
				sql := sqls[(g*13+i*7)%len(sqls)]
				p, err := rw.Plan(sql)
				if got := show(t, sql, p, err); got != want[sql] {
					errs <- fmt.Sprintf("Plan(%q) = %s, want %s", sql, got, want[sql])
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestShapeServedTextsStayOutOfTextCache checks that a stream of texts with
// fresh values, served by the shape cache, does not evict the parsed texts
// from the text cache.
func TestShapeServedTextsStayOutOfTextCache(t *testing.T) {
	rw, err := New(Settings{Fill: goldenSettings.Fill, CacheSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	const first, params = "INSERT INTO orders (item) VALUES ('a')", "SELECT leaf_next($1)"
	p1, _ := rw.Plan(first)
	p2, _ := rw.Plan(params)
	for i := 0; i < 10; i++ {
		sql := fmt.Sprintf("INSERT INTO orders (item) VALUES ('%d')", i)
		p, shaped, err := rw.build(rw.caches.Load(), sql)
		if err != nil || p == nil || !shaped {
			t.Fatalf("build(%q) = %v, %v, %v; want a plan from the shape cache", sql, p, shaped, err)
		}
		if _, err := rw.Plan(sql); err != nil {
			t.Fatal(err)
		}
	}
	if n := rw.caches.Load().text.len(); n != 2 {
		t.Errorf("text cache holds %d entries, want the 2 parsed texts", n)
	}
	if again, _ := rw.Plan(first); again != p1 {
		t.Errorf("Plan(%q) was evicted from the text cache", first)
	}
	if again, _ := rw.Plan(params); again != p2 {
		t.Errorf("Plan(%q) was evicted from the text cache", params)
	}
}

// TestShapeKeysCopyFormat plans a binary COPY, then the same text with the format or a
// delimiter as another string constant: the shape cache must not serve the first plan,
// whose keys the proxy would write into the other stream in the wrong format.
func TestShapeKeysCopyFormat(t *testing.T) {
	rw, err := New(goldenSettings)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sql  string
		want string
	}{
		{"COPY orders (item) FROM STDIN (FORMAT 'binary')", "binary ','"},
		{"COPY orders (item) FROM STDIN (FORMAT 'csv')", "csv ','"},
		{"COPY orders (item) FROM STDIN (FORMAT 'csv', DELIMITER ';')", "csv ';'"},
		{"COPY orders (item) FROM STDIN (FORMAT 'csv', DELIMITER '|')", "csv '|'"},
		{"COPY orders (item) FROM STDIN (FORMAT 'csv', ENCODING 'SJIS')", "refused"},
	} {
		p, err := rw.Plan(c.sql)
		got := "refused"
		if err == nil && p != nil && p.CopyFill != nil {
			got = fmt.Sprintf("%s %q", p.CopyFill.Format.Kind, p.CopyFill.Format.Delimiter)
			if p.CopyFill.Format.Kind == "binary" {
				got = "binary ','"
			}
		}
		if got != c.want {
			t.Errorf("Plan(%q): %s, %v; want %s", c.sql, got, err, c.want)
		}
	}
}
