package proxy

import "testing"

// TestTxWordsRefusal: one pass finds the lock functions wherever they are, in any case, and
// the words that make a statement worth parsing; the same for text and bytes.
func TestTxWordsRefusal(t *testing.T) {
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
		w, bw := scanTxWords(c.sql), scanTxWords([]byte(c.sql))
		if w.lock != c.lock || w.refusable != c.other || bw != w {
			t.Errorf("scanTxWords(%q) = %+v (bytes %+v), want lock %v, refusable %v", c.sql, w, bw, c.lock, c.other)
		}
	}
}
