package rewrite

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// Golden files under testdata/*_cases.json hold SQL in and the expected plan
// out. Regenerate them with
//
//	go test ./rewrite -update
//
// and review the diff.
var update = flag.Bool("update", false, "rewrite the expected results in testdata/*_cases.json")

// goldenSettings are the fill rules every golden case runs with.
var goldenSettings = Settings{Fill: []FillRule{
	{Table: "orders", Column: "id", Tag: "order"},
	{Schema: "billing", Table: "invoices", Column: "invoice_no", Tag: "invoice"},
	{Table: "Orders", Column: "Id", Tag: "legacy"},
	{Table: "events", Column: "id", Tag: "event"},
	{Table: "events", Column: "seq", Tag: "event_seq"},
	{Table: "accounts", Column: "user", Tag: "acct"},
	{Table: "tickets", Column: "id", Tag: "ticket"},
}, Catalog: goldenCatalog}

// goldenCatalog is the catalog the golden cases see: accounts and the
// tables of other schemas are not in it.
var goldenCatalog = mapCatalog{
	"public.orders":  {Columns: []string{"id", "item", "qty"}, Types: []string{"bigint", "text", "integer"}},
	"public.events":  {Columns: []string{"note", "seq", "id"}, Types: []string{"text", "bigint", "bigint"}},
	"public.tickets": {Columns: []string{"id", "title"}, Types: []string{"integer", "text"}},
}

// mapCatalog is a Catalog keyed by "schema.table". An unqualified name gets public's
// table: the tests' other schemas hold no table of the same name.
type mapCatalog map[string]Table

// Schemas lists the schemas of m's keys that name table.
func (m mapCatalog) Schemas(table string) []string {
	var out []string
	for k := range m {
		if schema, name, _ := strings.Cut(k, "."); name == table {
			out = append(out, schema)
		}
	}
	slices.Sort(out)
	return out
}

func (m mapCatalog) Table(schema, table string) (Table, bool) {
	if schema == "" {
		schema = "public"
	}
	t, ok := m[schema+"."+table]
	return t, ok
}

// executeIDs is how many IDs the golden files append to an EXECUTE, as if
// its prepared statement had that many slots.
const executeIDs = 2

type goldenCase struct {
	Comment string  `json:"comment,omitempty"`
	SQL     string  `json:"sql"`
	Result  *result `json:"result"`
}

// result is a Plan as the golden files print it.
type result struct {
	Forward      bool       `json:"forward,omitempty"` // Plan returned (nil, nil)
	Literal      string     `json:"literal,omitempty"` // IDs 1001, 1002, …
	Params       string     `json:"params,omitempty"`  // hidden parameters from MaxParam+1
	Slots        []string   `json:"slots,omitempty"`
	MaxParam     int        `json:"max_param,omitempty"`
	Unreferenced []int      `json:"unreferenced_params,omitempty"`
	FastPath     string     `json:"fast_path,omitempty"`
	Batch        string     `json:"batch,omitempty"`
	Decode       string     `json:"decode,omitempty"`
	Prepare      string     `json:"prepare,omitempty"`
	Execute      string     `json:"execute,omitempty"`
	Deallocate   string     `json:"deallocate,omitempty"`
	SessionRefs  []string   `json:"session_refs,omitempty"`
	CopyFill     []string   `json:"copy_fill,omitempty"`
	CopyFormat   string     `json:"copy_format,omitempty"`
	Error        *goldenErr `json:"error,omitempty"`
}

type goldenErr struct {
	Code     string `json:"code"`
	Message  string `json:"message"`
	Hint     string `json:"hint,omitempty"`
	Position int    `json:"position,omitempty"`
}

func describe(t testing.TB, sql string, p *Plan, err error) *result {
	t.Helper()
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("Plan(%q) returned %T %v, want *Error", sql, err, err)
		}
		return &result{Error: &goldenErr{Code: e.Code, Message: e.Message, Hint: e.Hint, Position: e.Position}}
	}
	if p == nil {
		return &result{Forward: true}
	}
	r := &result{MaxParam: p.MaxParam, Unreferenced: p.UnreferencedParams}
	for _, s := range p.Slots {
		r.Slots = append(r.Slots, s.String())
	}
	n := len(p.Slots)
	if p.Execute != nil {
		n += executeIDs
	}
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = int64(1001 + i)
	}
	r.Literal = string(p.AppendLiteral(nil, ids))
	if p.Execute != nil {
		r.Params = string(p.AppendExecuteParams(nil, p.MaxParam+1, executeIDs))
	} else {
		r.Params = string(p.AppendParams(nil, p.MaxParam+1))
	}
	if b := p.Batch; b != nil {
		// The statement the server runs when the proxy cannot answer: three IDs here.
		r.Literal = string(b.AppendLiteral(nil, []int64{1001, 1002, 1003}))
		r.Params = string(b.AppendParam(nil, p.MaxParam+1))
		r.Batch = fmt.Sprintf("column=%s tag=%q tag_param=%d count=%d count_param=%d", b.Column, b.Tag, b.TagParam, b.Count, b.CountParam)
	}
	if d := p.Decode; d != nil {
		r.Decode = fmt.Sprintf("param=%d", d.Param)
	}
	if f := p.FastPath; f != nil {
		r.FastPath = fmt.Sprintf("column=%s slot=%s", f.Column, f.Slot)
	}
	if x := p.Prepare; x != nil {
		r.Prepare = fmt.Sprintf("name=%s slots=%v", x.Name, x.Slots)
	}
	if x := p.Execute; x != nil {
		r.Execute = fmt.Sprintf("name=%s args=%d", x.Name, len(x.Args))
		for i := range x.Args {
			if tag, err := x.Tag(i + 1); err == nil {
				r.Execute += fmt.Sprintf(" $%d=%q", i+1, tag)
			} else if x.Args[i].Param > 0 {
				r.Execute += fmt.Sprintf(" $%d=client$%d", i+1, x.Args[i].Param)
			}
		}
	}
	if x := p.Deallocate; x != nil {
		r.Deallocate = fmt.Sprintf("name=%s all=%v", x.Name, x.All)
	}
	for _, s := range p.SessionRefs {
		r.SessionRefs = append(r.SessionRefs, fmt.Sprintf("name=%s all=%v", s.Name, s.All))
	}
	if x := p.CopyFill; x != nil {
		for i, s := range x.Keys {
			r.CopyFill = append(r.CopyFill, x.Columns[i]+"="+s.String())
		}
		f := x.Format
		r.CopyFormat = fmt.Sprintf("%s delimiter=%q quote=%q escape=%q header=%q", f.Kind, f.Delimiter, f.Quote, f.Escape, f.Header)
	}
	return r
}

func TestGolden(t *testing.T) {
	total := 0
	for _, file := range goldenFiles(t) {
		t.Run(strings.TrimSuffix(filepath.Base(file), "_cases.json"), func(t *testing.T) {
			cases := readCases(t, file)
			total += len(cases)
			rw, err := New(goldenSettings)
			if err != nil {
				t.Fatal(err)
			}
			for i := range cases {
				c := &cases[i]
				p, err := rw.Plan(c.SQL)
				got := describe(t, c.SQL, p, err)
				checkInvariants(t, c.SQL, p)
				if *update {
					c.Result = got
					continue
				}
				want, _ := json.MarshalIndent(c.Result, "", "  ")
				have, _ := json.MarshalIndent(got, "", "  ")
				if string(want) != string(have) {
					t.Errorf("%s: case %d (%s)\nSQL: %s\nwant: %s\ngot:  %s", file, i, c.Comment, c.SQL, want, have)
				}
			}
			if *update {
				writeCases(t, file, cases)
			}
		})
	}
	if total < 80 {
		t.Errorf("golden files hold %d cases, want at least 80", total)
	}
}

func goldenFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob("testdata/*_cases.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	return files
}

func readCases(t testing.TB, file string) []goldenCase {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var cases []goldenCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return cases
}

func writeCases(t *testing.T, file string, cases []goldenCase) {
	t.Helper()
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(cases); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkInvariants checks what must hold for every plan: both renderings
// parse again, and the literal one holds each ID exactly once more than the
// original text did.
func checkInvariants(t testing.TB, sql string, p *Plan) {
	t.Helper()
	if p == nil {
		return
	}
	n := len(p.Slots)
	if p.Execute != nil {
		n++
	}
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = 7770000000000001 + int64(i)
	}
	lit := string(p.AppendLiteral(nil, ids))
	if _, err := pg_query.Parse(lit); err != nil {
		t.Errorf("literal rewrite of %q does not parse: %v\n%s", sql, err, lit)
	}
	for _, id := range ids {
		s := fmt.Sprint(id)
		if got, orig := strings.Count(lit, s), strings.Count(sql, s); got != orig+1 {
			t.Errorf("literal rewrite of %q holds ID %s %d times, want %d\n%s", sql, s, got, orig+1, lit)
		}
	}
	first := p.MaxParam + 1
	var params string
	if p.Execute != nil {
		params = string(p.AppendExecuteParams(nil, first, 1))
	} else {
		params = string(p.AppendParams(nil, first))
	}
	if _, err := pg_query.Parse(params); err != nil {
		t.Errorf("parameter rewrite of %q does not parse: %v\n%s", sql, err, params)
	}
	if p.Prepare == nil && len(p.SessionRefs) == 0 {
		if got := countHidden(params, first); got != n {
			t.Errorf("parameter rewrite of %q references %d hidden parameters, want %d\n%s", sql, got, n, params)
		}
	}
}

// countHidden counts the distinct parameters $first… in sql, read by
// PostgreSQL's scanner.
func countHidden(sql string, first int) int {
	res, err := pg_query.Scan(sql)
	if err != nil {
		return -1
	}
	seen := map[string]bool{}
	for _, tok := range res.Tokens {
		if tok.Token != pg_query.Token_PARAM {
			continue
		}
		if paramNumber(sql[tok.Start+1:tok.End]) >= first {
			seen[sql[tok.Start:tok.End]] = true
		}
	}
	return len(seen)
}

// paramNumber reads the digits of $n as PostgreSQL 17's scanner does: with
// atol, which saturates, stored in an int, which wraps. $10000000000 is
// parameter 1410065408 to the server as much as to the planner.
func paramNumber(digits string) int {
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		n = math.MaxInt64
	}
	return int(int32(n))
}
