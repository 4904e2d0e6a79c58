package rewrite

import (
	"bufio"
	"os"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"github.com/pganalyze/pg_query_go/v6/parser"
	"google.golang.org/protobuf/proto"
)

// treeCorpus returns SQL texts covering the planner's cases and a wide range
// of node types, field kinds and string escapes: the golden cases, the
// shape cases and testdata/tree_cases.sql (one statement string per line,
// with \n standing for a line break).
func treeCorpus(t testing.TB) []string {
	t.Helper()
	var out []string
	for _, file := range goldenFiles(t) {
		for _, c := range readCases(t, file) {
			out = append(out, c.SQL)
		}
	}
	out = append(out, shapeCases...)
	f, err := os.Open("testdata/tree_cases.sql")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := sc.Text(); line != "" && !strings.HasPrefix(line, "-- ") {
			out = append(out, strings.ReplaceAll(line, `\n`, "\n"))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkTree compares parseTree with pg_query.Parse on sql: the same error
// or the same tree, and the locations of exactly its A_Const nodes.
func checkTree(t testing.TB, sql string) {
	t.Helper()
	want, wantErr := pg_query.Parse(sql)
	got, consts, err := parseTree(sql)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("parseTree(%.200q) error %v, pg_query.Parse error %v", sql, err, wantErr)
	}
	if err != nil {
		return
	}
	if !proto.Equal(got, want) {
		t.Fatalf("parseTree(%.200q) =\n%v\nwant\n%v", sql, got, want)
	}
	wantConsts := constLocations(want)
	slices.Sort(consts)
	slices.Sort(wantConsts)
	if !slices.Equal(consts, wantConsts) {
		t.Fatalf("parseTree(%.200q) A_Const locations %v, want %v", sql, consts, wantConsts)
	}
}

func TestParseTreeMatchesPgQuery(t *testing.T) {
	for _, sql := range treeCorpus(t) {
		checkTree(t, sql)
	}
}

// TestParseTreeDeepNesting compares the routes on operator chains around
// the depth at which proto.Unmarshal, and so pg_query.Parse, gives up.
func TestParseTreeDeepNesting(t *testing.T) {
	for _, n := range []int{1000, 2400, 2600, 4900, 5100, 20000} {
		checkTree(t, "SELECT 1"+strings.Repeat(" + 1", n))
	}
}

// TestDecodeTreeReadsCorpus makes sure the comparison above exercises the
// JSON decoder rather than its fallback: every text of the corpus that
// parses to a UTF-8 tree is decoded without falling back.
func TestDecodeTreeReadsCorpus(t *testing.T) {
	decoded := 0
	for _, sql := range treeCorpus(t) {
		js, err := parser.ParseToJSON(sql)
		if err != nil || !utf8.ValidString(sql) {
			continue
		}
		if _, _, err := decodeTree(js); err != nil {
			t.Errorf("decodeTree(JSON of %q): %v\n%s", sql, err, js)
		}
		decoded++
	}
	if decoded < 300 {
		t.Fatalf("only %d texts of the corpus parse", decoded)
	}
}

func TestDecodeTreeRejectsUnexpectedJSON(t *testing.T) {
	for _, js := range []string{
		``,
		`{"version":170007,"stmts":[]`,
		`{"version":170007,"stmts":[]} `,
		`{"version":170007 ,"stmts":[]}`,
		`{"version":"170007"}`,
		`{"version":1e5}`,
		`{"version":99999999999}`,
		`{"nosuchfield":1}`,
		`{"stmts":[{"stmt":{"NoSuchNode":{}}}]}`,
		`{"stmts":[{"stmt":{"SelectStmt":{"op":"NO_SUCH_OP"}}}]}`,
		`{"stmts":[{"stmt":{"String":{"sval":"a\u00e9"}}}]}`,
		`{"stmts":[{"stmt":{"String":{"sval":"\x"}}}]}`,
		`{"stmts":[{"stmt":{"String":{"sval":"` + "\xff" + `"}}}]}`,
		`{"stmts":[{"stmt":{"String":{"sval":"` + "\n" + `"}}}]}`,
		`{"stmts":[{"stmt":{"String":{"sval":"abc}}}]}`,
		`{"stmts":[{"stmt":{"Boolean":{"boolval":1}}}]}`,
		`{"stmts":[{"stmt":{"FetchStmt":{"howMany":-}}}]}`,
		`{"st\"mts":[]}`,
	} {
		if tree, _, err := decodeTree(js); err == nil {
			t.Errorf("decodeTree(%q) = %v, want an error", js, tree)
		}
	}
}

func TestDecodeTreeEscapes(t *testing.T) {
	tree, _, err := decodeTree(`{"stmts":[{"stmt":{"String":{"sval":"a\"b\\c\/d\b\f\n\r\t\u001f\u003c\u003eé"}}}]}`)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tree.Stmts[0].Stmt.GetString_().GetSval(), "a\"b\\c/d\b\f\n\r\t\x1f<>é"; got != want {
		t.Fatalf("sval = %q, want %q", got, want)
	}
}

// FuzzParseTree compares parseTree with pg_query.Parse on arbitrary text.
func FuzzParseTree(f *testing.F) {
	for _, sql := range treeCorpus(f) {
		f.Add(sql)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		if strings.IndexByte(sql, 0) >= 0 {
			return // the C parser stops at NUL; plan never parses such text
		}
		checkTree(t, sql)
	})
}
