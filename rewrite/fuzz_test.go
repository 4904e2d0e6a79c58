package rewrite

import (
	"errors"
	"hash/fnv"
	"math/rand/v2"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// FuzzPlan checks the planner's invariants on arbitrary text: no panic (the
// planner's recover would turn one into XX000, which fails here), only the
// documented SQLSTATEs, every rewrite parses again, and each slot puts
// exactly one ID into the text. It also plans each input, and texts that
// differ from it only in constants, through the shape cache, which must
// give what a full parse gives.
func FuzzPlan(f *testing.F) {
	for _, file := range goldenFiles(f) {
		for _, c := range readCases(f, file) {
			f.Add(c.SQL)
		}
	}
	for _, sql := range shapeCases {
		f.Add(sql)
	}
	rw, ref := shapeRewriters(f)
	f.Fuzz(func(t *testing.T, sql string) {
		p, _, err := ref.build(ref.caches.Load(), sql)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || (e.Code != sqlstate.InvalidParameterValue && e.Code != sqlstate.FeatureNotSupported) {
				t.Fatalf("Plan(%q) = %v, want a 22023 or 0A000 *Error", sql, err)
			}
		} else if p != nil {
			if _, err := pg_query.Parse(sql); err != nil {
				t.Fatalf("Plan(%q) planned text that does not parse", sql)
			}
			checkInvariants(t, sql, p)
		}
		checkShapePath(t, rw, ref, sql)
		h := fnv.New64a()
		h.Write([]byte(sql))
		for _, v := range constVariants(sql, 4, rand.New(rand.NewPCG(h.Sum64(), 0))) {
			checkShapePath(t, rw, ref, v)
		}
	})
}
