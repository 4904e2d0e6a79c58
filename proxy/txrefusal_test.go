package proxy

import "testing"

// TestRefusalWords: one pass finds the lock functions wherever they are, in any case, and
// the words that make a statement worth parsing; the same for text and bytes.
func TestRefusalWords(t *testing.T) {
	for _, c := range []struct {
		sql         string
		lock, other bool
	}{
		{"SELECT 1", false, false},
		{"select pg_advisory_xact_lock(1)", false, false},
		{"SELECT PG_Advisory_Lock(1)", true, false},
		{"PREPARE p AS SELECT pg_try_advisory_lock_shared(1)", true, true},
		{"LISTEN x", false, true},
		{"declare c cursor with HOLD for select 1", false, true},
		{"create Temp table t (n int)", false, true},
		{"SELECT 'pg_advisory_lock'", true, false},
		{"pg_advisory_loc", false, false},
		{"", false, false},
	} {
		lock, other := refusalWords(c.sql)
		block, bother := refusalWords([]byte(c.sql))
		if lock != c.lock || other != c.other || block != lock || bother != other {
			t.Errorf("refusalWords(%q) = %v, %v (bytes %v, %v), want %v, %v", c.sql, lock, other, block, bother, c.lock, c.other)
		}
	}
}
