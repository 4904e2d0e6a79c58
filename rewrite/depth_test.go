package rewrite

import (
	"errors"
	"strings"
	"testing"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

func TestChainDepth(t *testing.T) {
	rows := func(n int, row string) string { return strings.TrimSuffix(strings.Repeat(row+", ", n), ", ") }
	tests := []struct {
		name string
		sql  string
		want int
	}{
		{"no operators", "SELECT a, b FROM t WHERE c = 1", 0},
		{"comparisons do not chain", "SELECT 1 WHERE a = 1 AND b < 2 OR c >= 3", 0},
		{"operator chain", "SELECT 1" + strings.Repeat(" + 1", 50), 50},
		{"cast chain", "SELECT 1" + strings.Repeat("::int8", 7), 7},
		{"mixed chain", "SELECT 'a' || 'b' || 'c' COLLATE \"C\"", 3},
		{"long VALUES list with casts", "INSERT INTO t VALUES " + rows(5000, "('x'::text, -1, 2 * 3)"), 1},
		{"argument lists", "SELECT f(1 + 1, 2 + 2 + 2, 3)", 2},
		{"a group carries its deepest item", "SELECT (1 + 1 + 1, 2) + 1 + 1", 4},
		{"nested groups", "SELECT ((1 + 1) + 1) + 1", 3},
		{"set operations", "SELECT 1" + strings.Repeat(" UNION SELECT 1", 40), 40},
		{"joins", "SELECT a.id FROM a" + strings.Repeat(" JOIN a USING (id)", 30), 30},
		{"statements count apart", "SELECT 1 + 1 + 1; SELECT 1 + 1", 2},
		{"unbalanced parentheses", "SELECT ) 1 + 1 ( 1 + 1 + 1", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			all, err := scan(tt.sql)
			if err != nil {
				t.Fatal(err)
			}
			if got := chainDepth(withoutComments(all)); got != tt.want {
				t.Fatalf("chainDepth = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestDeepStatementsRefused plans statements far deeper than libpg_query can render
// on a thread's stack (without the bound, the test binary dies with SIGSEGV) and
// statements as deep as PostgreSQL runs by default, which must still be rewritten.
func TestDeepStatementsRefused(t *testing.T) {
	rw, err := New(goldenSettings)
	if err != nil {
		t.Fatal(err)
	}
	const crash = 100000
	refused := []string{
		"SELECT leaf_next('t')" + strings.Repeat(" + 1", crash),
		"SELECT leaf_next('t')" + strings.Repeat("::int8", crash),
		"INSERT INTO orders (item) VALUES ('a' || 'b'" + strings.Repeat(" || 'b'", crash) + ")",
		"SELECT 1" + strings.Repeat(" UNION SELECT 1", crash/10) + " -- leaf_next",
		"SELECT leaf_next('t')" + strings.Repeat(" + 1", maxChainDepth+1),
	}
	for _, sql := range refused {
		_, err := rw.Plan(sql)
		var re *Error
		if !errors.As(err, &re) || re.Code != sqlstate.StatementTooComplex {
			t.Errorf("Plan(%.60q…) = %v, want SQLSTATE %s", sql, err, sqlstate.StatementTooComplex)
		}
	}
	// A chain of 3,000 operators runs on PostgreSQL with its default max_stack_depth.
	p, err := rw.Plan("INSERT INTO orders (item) VALUES (1" + strings.Repeat(" + 1", 3000) + ")")
	if err != nil || p == nil || len(p.Slots) != 1 {
		t.Fatalf("a chain of 3,000 operators: plan %v, error %v; want one slot", p, err)
	}
}
