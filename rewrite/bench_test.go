package rewrite

import (
	"strconv"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
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

// BenchmarkPlanInsertUncached plans a filled INSERT without the cache: one
// parse, one scan, the walk and the edits.
func BenchmarkPlanInsertUncached(b *testing.B) {
	rw := benchRewriter(b)
	b.ReportAllocs()
	for b.Loop() {
		p, err := rw.build(benchInsert)
		if err != nil || p == nil {
			b.Fatal(p, err)
		}
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

// BenchmarkPlanCacheChurn plans distinct texts through a small cache, so
// every call misses and evicts.
func BenchmarkPlanCacheChurn(b *testing.B) {
	rw, err := New(Settings{Fill: goldenSettings.Fill, CacheSize: 64})
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

// BenchmarkParserFloor is the part of an uncached plan spent in pg_query:
// the parse tree and the token stream. It is the floor for
// BenchmarkPlanInsertUncached.
func BenchmarkParserFloor(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := pg_query.Parse(benchInsert); err != nil {
			b.Fatal(err)
		}
		if _, err := pg_query.Scan(benchInsert); err != nil {
			b.Fatal(err)
		}
	}
}
