package rewrite

import (
	"errors"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// FuzzPlan checks the planner's invariants on arbitrary text: no panic (the
// planner's recover would turn one into XX000, which fails here), only the
// documented SQLSTATEs, every rewrite parses again, and each slot puts
// exactly one ID into the text.
func FuzzPlan(f *testing.F) {
	for _, file := range goldenFiles(f) {
		for _, c := range readCases(f, file) {
			f.Add(c.SQL)
		}
	}
	rw, err := New(goldenSettings)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		p, err := rw.build(sql)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || (e.Code != CodeInvalidParameter && e.Code != CodeNotSupported) {
				t.Fatalf("Plan(%q) = %v, want a 22023 or 0A000 *Error", sql, err)
			}
			return
		}
		if p == nil {
			return
		}
		if _, err := pg_query.Parse(sql); err != nil {
			t.Fatalf("Plan(%q) planned text that does not parse", sql)
		}
		checkInvariants(t, sql, p)
	})
}
