package proxy

import (
	"testing"

	"github.com/leafproxy/leafproxy/rewrite"
)

// TestPlainMemo checks what the loop's memo of cleared texts clears without the
// rewriter: the text it remembers; a text the same but for its numbers only when the
// remembered one has none of the prefilter's words, for a number in a table's name can
// make it a filled table's.
func TestPlainMemo(t *testing.T) {
	rw, err := rewrite.New(rewrite.Settings{Fill: []rewrite.FillRule{{Table: "orders2", Column: "id", Tag: "order"}}})
	if err != nil {
		t.Fatal(err)
	}
	other, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	var m plainMemo
	remember := func(sql string) {
		t.Helper()
		cleared, noWords := rw.Prefiltered(sql)
		if !cleared {
			t.Fatalf("the prefilter does not clear %q", sql)
		}
		m.remember(rw, sql, noWords)
	}
	check := func(sql string, want bool) {
		t.Helper()
		if got := m.clears(rw, sql); got != want {
			t.Errorf("after %q, clears(%q) = %v, want %v", m.text, sql, got, want)
		}
	}

	remember("SELECT abalance FROM pgbench_accounts WHERE aid = 871254")
	check("SELECT abalance FROM pgbench_accounts WHERE aid = 871254", true)
	check("SELECT abalance FROM pgbench_accounts WHERE aid = 3", true)
	check("SELECT abalance FROM pgbench_accounts WHERE aid = leaf_next('order')", false)
	check("SELECT abalance FROM pgbench_accounts WHERE aid = 3 OR aid = 4", false)
	// Two texts in a row with numbers of another length: the second is remembered
	// instead; a text of the remembered length between them keeps it.
	holds := func(want string) {
		t.Helper()
		if got := string(m.text); got != want {
			t.Errorf("the memo holds %q, want %q", got, want)
		}
	}
	six := "SELECT abalance FROM pgbench_accounts WHERE aid = 871254"
	remember(six)
	check("SELECT abalance FROM pgbench_accounts WHERE aid = 3", true)
	holds(six)
	check("SELECT abalance FROM pgbench_accounts WHERE aid = 171254", true)
	check("SELECT abalance FROM pgbench_accounts WHERE aid = 4", true)
	holds(six)
	check("SELECT abalance FROM pgbench_accounts WHERE aid = 5", true)
	holds("SELECT abalance FROM pgbench_accounts WHERE aid = 5")
	check(six, true)
	holds("SELECT abalance FROM pgbench_accounts WHERE aid = 5")
	check("SELECT abalance FROM pgbench_accounts WHERE aid = 9", true)
	check("SELECT abalance FROM pgbench_accounts WHERE aid = 3 OR aid = 4", false)
	check(six, true)
	holds("SELECT abalance FROM pgbench_accounts WHERE aid = 5")
	check(six, true)
	holds(six)
	if m.clears(other, "SELECT abalance FROM pgbench_accounts WHERE aid = 871254") {
		t.Error("a text remembered for one rewriter is cleared for another")
	}

	remember("INSERT INTO orders1 (n) VALUES (1)")
	check("INSERT INTO orders1 (n) VALUES (1)", true)
	check("INSERT INTO orders1 (n) VALUES (2)", false) // has insert: only the same text
	check("INSERT INTO orders2 (n) VALUES (1)", false)
	if cleared, _ := rw.Prefiltered("INSERT INTO orders2 (n) VALUES (1)"); cleared {
		t.Fatal("the prefilter clears an INSERT into a filled table")
	}
}

// TestPlainMemoTxWords checks what the memo says of transaction mode's words: whether
// the text it holds now has any, looked at again for each text it remembers.
func TestPlainMemoTxWords(t *testing.T) {
	rw, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	var m plainMemo
	for _, c := range []struct {
		sql  string
		free bool
	}{
		{"SELECT abalance FROM pgbench_accounts WHERE aid = 871254", true},
		{"SELECT pg_advisory_lock(1)", false},
		{"SELECT 1", true},
		{"LISTEN channel", false},
		{"SET app.tenant = 7", false},
		{"SELECT 2", true},
	} {
		cleared, noWords := rw.Prefiltered(c.sql)
		if !cleared {
			t.Fatalf("the prefilter does not clear %q", c.sql)
		}
		m.remember(rw, c.sql, noWords)
		for range 2 { // the second answer is the one remembered
			if got := m.freeOfTxWords(); got != c.free {
				t.Errorf("freeOfTxWords() after %q = %v, want %v", c.sql, got, c.free)
			}
		}
	}
}
