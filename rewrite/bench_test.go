package rewrite

import (
	"strconv"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"github.com/pganalyze/pg_query_go/v6/parser"
)

const benchInsert = "INSERT INTO orders (item, qty) VALUES ('book', 2) RETURNING id"

func benchRewriter(b *testing.B) *Rewriter {
	b.Helper()
	rw, err := New(goldenSettings)
	if err != nil {
		b.Fatal(err)
	}
	return rw
}

// The three costs of planning an INSERT with inlined values, as a client
// of the simple query protocol sends it:
//   - BenchmarkPlanInsertNewShape: the first text of its shape, parsed and
//     planned in full (floor: BenchmarkParserFloor);
//   - BenchmarkPlanInsertNewText: a new text of a known shape, the same
//     INSERT with other values, served by the shape cache without parsing
//     (floor: BenchmarkScannerFloor);
//   - BenchmarkPlanInsertCached: a text seen before, from the text cache.
//
// The first two cycle through more distinct texts than the text cache
// holds, so every call misses it. A parsed text is then added to the text
// cache, evicting another; a text the shape cache served is not.

const benchTexts = 2 * DefaultCacheSize

// BenchmarkPlanInsertNewShape plans texts whose shapes (here: the RETURNING
// alias) differ, so neither cache level can serve them.
func BenchmarkPlanInsertNewShape(b *testing.B) {
	rw := benchRewriter(b)
	qs := make([]string, benchTexts)
	for i := range qs {
		qs[i] = benchInsert + " AS id_" + strconv.Itoa(i)
	}
	planEach(b, rw, qs)
}

// BenchmarkPlanInsertNewText plans texts that differ only in their values.
func BenchmarkPlanInsertNewText(b *testing.B) {
	rw := benchRewriter(b)
	qs := make([]string, benchTexts)
	for i := range qs {
		qs[i] = "INSERT INTO orders (item, qty) VALUES ('book " + strconv.Itoa(i) + "', " + strconv.Itoa(i) + ") RETURNING id"
	}
	if _, err := rw.Plan(benchInsert); err != nil {
		b.Fatal(err)
	}
	planEach(b, rw, qs)
}

// planEach plans the texts qs in turn, round and round, each to a plan.
func planEach(b *testing.B, rw *Rewriter, qs []string) {
	b.Helper()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if p, err := rw.Plan(qs[i%len(qs)]); err != nil || p == nil {
			b.Fatal(p, err)
		}
		i++
	}
}

// BenchmarkPlanInsertCached is the steady state: the plan comes from the LRU.
func BenchmarkPlanInsertCached(b *testing.B) {
	rw := benchRewriter(b)
	if _, err := rw.Plan(benchInsert); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if p, err := rw.Plan(benchInsert); err != nil || p == nil {
			b.Fatal(p, err)
		}
	}
}

// BenchmarkPlanInsertCachedParallel measures lock contention on the LRU.
func BenchmarkPlanInsertCachedParallel(b *testing.B) {
	rw := benchRewriter(b)
	if _, err := rw.Plan(benchInsert); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if p, err := rw.Plan(benchInsert); err != nil || p == nil {
				b.Fatal(p, err)
			}
		}
	})
}

// BenchmarkPlanPrefilterMiss is a statement that needs nothing: it must not
// be parsed or cached.
func BenchmarkPlanPrefilterMiss(b *testing.B) {
	rw := benchRewriter(b)
	const q = "SELECT abalance FROM pgbench_accounts WHERE aid = $1"
	b.ReportAllocs()
	for b.Loop() {
		if p, err := rw.Plan(q); err != nil || p != nil {
			b.Fatal(p, err)
		}
	}
}

// BenchmarkAppendLiteral renders a cached plan with fresh IDs.
func BenchmarkAppendLiteral(b *testing.B) {
	rw := benchRewriter(b)
	p, err := rw.Plan(benchInsert)
	if err != nil {
		b.Fatal(err)
	}
	ids := []int64{1234567890123}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf = p.AppendLiteral(buf[:0], ids)
	}
}

// BenchmarkAppendParams renders a cached plan for the extended protocol.
func BenchmarkAppendParams(b *testing.B) {
	rw := benchRewriter(b)
	p, err := rw.Plan(benchInsert)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf = p.AppendParams(buf[:0], 1)
	}
}

// BenchmarkPlanCacheChurn plans distinct texts through a small text cache
// without the shape cache, so every call parses, misses and evicts.
func BenchmarkPlanCacheChurn(b *testing.B) {
	rw, err := New(Settings{Fill: goldenSettings.Fill, CacheSize: 64, ShapeCacheSize: -1})
	if err != nil {
		b.Fatal(err)
	}
	qs := make([]string, 1024)
	for i := range qs {
		qs[i] = "INSERT INTO orders (item) VALUES ('" + strconv.Itoa(i) + "')"
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := rw.Plan(qs[i%len(qs)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkParserFloor is the part of planning a new shape spent in
// pg_query's C code: the token stream and the parse tree as JSON (see
// parseTree).
func BenchmarkParserFloor(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parser.ScanToProtobuf(benchInsert); err != nil {
			b.Fatal(err)
		}
		if _, err := parser.ParseToJSON(benchInsert); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGrammarFloor is PostgreSQL's grammar without any output:
// pg_query's IsUtilityStmt runs the raw parser and returns one bool per
// statement. The difference to BenchmarkParserFloor is the cost of
// rendering tokens and tree for Go.
func BenchmarkGrammarFloor(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parser.IsUtilityStmt(benchInsert); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseTree is the parse tree as the planner gets it: parsed,
// rendered as JSON and decoded into pg_query's structs.
func BenchmarkParseTree(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := parseTree(benchInsert); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPgQueryParse is pg_query.Parse, which parseTree replaces: the
// tree rendered as protobuf in C and unmarshalled.
func BenchmarkPgQueryParse(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := pg_query.Parse(benchInsert); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScannerFloor is the part of planning a new text of a known shape
// spent in pg_query: the token stream.
func BenchmarkScannerFloor(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parser.ScanToProtobuf(benchInsert); err != nil {
			b.Fatal(err)
		}
	}
}
