package proxy

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/leafproxy/leafproxy/rewrite"
)

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

// TestScanTxWordsFindsEveryOccurrence: the scan, which looks further only where two
// letters start a word, finds what a check of every word at every byte finds, in texts
// made of the words, their pieces and their neighbours in any case.
func TestScanTxWordsFindsEveryOccurrence(t *testing.T) {
	words := []string{"pg_advisory_lock", "pg_try_advisory_lock", "prepare", "listen", "hold", "temp",
		"authorization", "deallocate", "set_config", "set", "reset", "session", "local"}
	pieces := append([]string{" ", "x.y", "pg_", "pr", "se", "SeT", "\u017f", "_", "'", "(", "a"}, words...)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		var b strings.Builder
		for range rng.IntN(6) {
			p := pieces[rng.IntN(len(pieces))]
			if rng.IntN(2) == 0 {
				p = strings.ToUpper(p)
			}
			b.WriteString(p)
			if rng.IntN(3) == 0 {
				b.WriteByte(' ')
			}
		}
		sql := b.String()
		var want txWords
		for i := range len(sql) {
			for _, w := range []string{"pg_advisory_lock", "pg_try_advisory_lock"} {
				want.lock = want.lock || hasWordAt(sql, i, w)
			}
			for _, w := range []string{"prepare", "listen", "hold", "temp", "authorization"} {
				want.refusable = want.refusable || hasWordAt(sql, i, w)
			}
			want.dealloc = want.dealloc || hasWordAt(sql, i, "deallocate")
			want.setConfig = want.setConfig || hasWordAt(sql, i, "set_config")
			want.set = want.set || !hasWordAt(sql, i, "set_config") && customSetAt(sql, i)
		}
		if got := scanTxWords(sql); got != want {
			t.Fatalf("scanTxWords(%q) = %+v, want %+v", sql, got, want)
		}
		if got := scanTxWords([]byte(sql)); got != want {
			t.Fatalf("scanTxWords(bytes %q) = %+v, want %+v", sql, got, want)
		}
	}
}

// TestScanTxWordsSameButNumbers: texts the same but for their numbers have the same
// words, which is what lets checkText clear a text like the last plain one without a
// scan (see rewrite.SameButNumbers).
func TestScanTxWordsSameButNumbers(t *testing.T) {
	pieces := []string{" ", "1", "23", "0", "x1", "1.5", "temp", "hold", "set", "app.x", "=", "pg_advisory_lock",
		"listen", "(", "_", "prepare", "a", "deallocate", "set_config", "'"}
	numbers := []string{"1", "42", "007", "9"}
	rng := rand.New(rand.NewPCG(3, 4))
	alike := 0
	for range 50000 {
		var b strings.Builder
		for range rng.IntN(8) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		a := b.String()
		var c strings.Builder // a with other numbers
		for i := 0; i < len(a); i++ {
			if '0' <= a[i] && a[i] <= '9' {
				c.WriteString(numbers[rng.IntN(len(numbers))])
				for i+1 < len(a) && '0' <= a[i+1] && a[i+1] <= '9' {
					i++
				}
				continue
			}
			c.WriteByte(a[i])
		}
		if !rewrite.SameButNumbers(a, c.String()) {
			t.Fatalf("%q and %q are not the same but for their numbers", a, c.String())
		}
		if a != c.String() {
			alike++
		}
		if wa, wc := scanTxWords(a), scanTxWords(c.String()); wa != wc {
			t.Fatalf("scanTxWords(%q) = %+v, but %+v for %q", a, wa, wc, c.String())
		}
	}
	if alike < 10000 {
		t.Fatalf("only %d texts had other numbers: the test does not test", alike)
	}
}

// TestHasWordAtFoldsAsEqualFold: hasWordAt finds a word where strings.EqualFold finds it in
// as many bytes, non-ASCII text included (the Kelvin sign and the long s fold to k and s,
// but take more bytes than the letters they fold to).
func TestHasWordAtFoldsAsEqualFold(t *testing.T) {
	words := []string{"set", "set_config", "pg_advisory_lock", "deallocate", "session", "local", "re"}
	texts := []string{
		"SET x.y = 1", "Set_Config('a.b', '1', false)", "select PG_ADVISORY_LOCK(1)",
		"DeAlLoCaTe ALL", "SESSION", "LOCAL", "RESET", "pg_advisory_loc\u212a(1)",
		"\u017fet x.y = 1", "s\u00e9t", "SET", "se", "", "sEt\x00", "_set", "[set]",
	}
	for _, text := range texts {
		for _, w := range words {
			for i := range len(text) + 1 {
				want := len(text)-i >= len(w) && strings.EqualFold(text[i:i+len(w)], w)
				if got := hasWordAt(text, i, w); got != want {
					t.Errorf("hasWordAt(%q, %d, %q) = %v, want %v", text, i, w, got, want)
				}
				if got := hasWordAt([]byte(text), i, w); got != want {
					t.Errorf("hasWordAt(bytes %q, %d, %q) = %v, want %v", text, i, w, got, want)
				}
			}
		}
	}
}

// BenchmarkScanTxWords is the scan of pgbench -S's statement in the simple protocol, which
// changes with every transaction: nothing is found.
func BenchmarkScanTxWords(b *testing.B) {
	sql := []byte("SELECT abalance FROM pgbench_accounts WHERE aid = 123456;")
	b.ReportAllocs()
	for range b.N {
		if w := scanTxWords(sql); w != (txWords{}) {
			b.Fatalf("found %+v", w)
		}
	}
}
