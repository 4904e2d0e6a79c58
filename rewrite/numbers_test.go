package rewrite

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func TestSameButNumbers(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"", "", true},
		{"SELECT 1", "SELECT 1", true},
		{"SELECT 1", "SELECT 23", true},
		{"SELECT 123456789012", "SELECT 7", true},
		{"WHERE id = 17 AND n = 3", "WHERE id = 4242 AND n = 99", true},
		{"SELECT 1", "SELECT 1;", false},
		{"SELECT 1", "SELECT", false},
		{"SELECT 1", "SELECT a", false},
		{"SELECT 1a", "SELECT 12b", false},
		{"t1", "t", false},
		{"t", "t1", false},
		{"x1y", "xy", false},
		{"SELECT abalance FROM pgbench_accounts WHERE aid = 871254;", "SELECT abalance FROM pgbench_accounts WHERE aid = 12;", true},
		{"SELECT abalance FROM pgbench_accounts WHERE aid = 871254;", "SELECT abalance FROM pgbench_accounts WHERE bid = 12;", false},
		{"select 'é' || 1", "select 'é' || 2", true},
		{"select 'é'", "select 'è'", false},
	} {
		if got := SameButNumbers(c.a, c.b); got != c.want {
			t.Errorf("SameButNumbers(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
		if got := SameButNumbers(c.b, []byte(c.a)); got != c.want {
			t.Errorf("SameButNumbers(%q, %q) = %v, want %v", c.b, c.a, got, c.want)
		}
	}
}

// TestSameButNumbersMatchesDefinition checks SameButNumbers against its definition,
// on random texts of pieces that put numbers and differences at every distance from
// the eight-byte steps; and that the prefilter clears a text the same but for its
// numbers as one without its words, which is what callers rely on.
func TestSameButNumbersMatchesDefinition(t *testing.T) {
	rw, err := New(goldenSettings)
	if err != nil {
		t.Fatal(err)
	}
	canon := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			if isDigit(s[i]) {
				if i == 0 || !isDigit(s[i-1]) {
					b.WriteByte('0')
				}
				continue
			}
			b.WriteByte(s[i])
		}
		return b.String()
	}
	pieces := []string{"1", "23", "456789012", "0", "a", "b", "SELECT ", "leaf_", "lea", "f_",
		"insert", "orders", "orders2", " ", "=", "x", "é", "\x00", "12345678"}
	rng := rand.New(rand.NewPCG(7, 8)) // reproducible
	next := rng.IntN
	text := func() string {
		var b strings.Builder
		for range next(10) {
			b.WriteString(pieces[next(len(pieces))])
		}
		return b.String()
	}
	alike := 0
	for range 200000 {
		a := text()
		b := a
		switch next(3) {
		case 0:
			b = text()
		case 1:
			// The same text with its numbers changed.
			var nb strings.Builder
			for i := 0; i < len(a); i++ {
				if isDigit(a[i]) {
					nb.WriteString(pieces[next(4)])
					for i+1 < len(a) && isDigit(a[i+1]) {
						i++
					}
					continue
				}
				nb.WriteByte(a[i])
			}
			b = nb.String()
		case 2:
			// The same text with other digits in its numbers, or a byte changed.
			nb := []byte(a)
			for i := range nb {
				if isDigit(nb[i]) {
					nb[i] = '0' + byte(next(10))
				}
			}
			if len(nb) > 0 && next(4) == 0 {
				nb[next(len(nb))] = "1a \x00"[next(4)]
			}
			b = string(nb)
		}
		want := canon(a) == canon(b)
		if got := SameButNumbers(a, b); got != want {
			t.Fatalf("SameButNumbers(%q, %q) = %v, want %v", a, b, got, want)
		}
		if !want {
			continue
		}
		alike++
		if cleared, noWords := rw.Prefiltered(a); cleared && noWords {
			if cleared, _ := rw.Prefiltered(b); !cleared {
				t.Fatalf("%q has none of the prefilter's words, %q is the same but for its numbers, and it is not cleared", a, b)
			}
		}
	}
	if alike < 50000 {
		t.Fatalf("only %d pairs were alike: the test does not test", alike)
	}
}

// BenchmarkSameButNumbers compares pgbench's select-only texts as a loop's memo does for
// each of them: in the simple protocol, with numbers of the same length (most of them)
// and of another; in the extended protocol, the very same text.
func BenchmarkSameButNumbers(b *testing.B) {
	x := []byte("SELECT abalance FROM pgbench_accounts WHERE aid = 871254;")
	for _, c := range []struct{ name, y string }{
		{"same-length", "SELECT abalance FROM pgbench_accounts WHERE aid = 336112;"},
		{"other-length", "SELECT abalance FROM pgbench_accounts WHERE aid = 3361;"},
		{"equal", "SELECT abalance FROM pgbench_accounts WHERE aid = 871254;"},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if !SameButNumbers(x, c.y) {
					b.Fatal("not the same")
				}
			}
		})
	}
}

// TestLeadingDigits tries every byte in every place of a word of digits, and words of
// digits cut at every length.
func TestLeadingDigits(t *testing.T) {
	digits := []byte("01234567")
	for place := range 8 {
		for c := range 256 {
			b := append([]byte(nil), digits...)
			b[place] = byte(c)
			want := 8
			if !('0' <= c && c <= '9') {
				want = place
			}
			if got := leadingDigits(word(b, 0)); got != want {
				t.Fatalf("leadingDigits(%q) = %d, want %d", b, got, want)
			}
		}
	}
	for n := range 9 {
		b := []byte("98765432")
		for k := n; k < 8; k++ {
			b[k] = 'x'
		}
		if got := leadingDigits(word(b, 0)); got != n {
			t.Fatalf("leadingDigits(%q) = %d, want %d", b, got, n)
		}
	}
}

// TestSameButNumbersDoesNotAllocate: the comparison runs on every Query of a client that
// writes its values into its texts; looking at bytes as a string must not copy them.
func TestSameButNumbersDoesNotAllocate(t *testing.T) {
	x := []byte("SELECT abalance FROM pgbench_accounts WHERE aid = 871254 AND note = 'a long enough text'")
	y := []byte("SELECT abalance FROM pgbench_accounts WHERE aid = 871254 AND note = 'a long enough text'")
	z := "SELECT abalance FROM pgbench_accounts WHERE aid = 12 AND note = 'a long enough text'"
	if n := testing.AllocsPerRun(100, func() {
		if !SameButNumbers(x, y) || !SameButNumbers(x, z) || !SameButNumbers(z, y) {
			t.Fatal("not the same")
		}
	}); n != 0 {
		t.Fatalf("%v allocations per comparison", n)
	}
}
