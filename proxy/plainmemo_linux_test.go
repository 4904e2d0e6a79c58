package proxy

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/leafproxy/leafproxy/internal/testenv"
)

// TestTxPoolRefusalAfterMemo: in transaction mode on an event loop, a statement the
// loop's memo clears by comparison still gets transaction mode's refusal when the text
// the memo holds has a refused word, in both protocols. The statement before it, the
// same but for its number as a text without the word, is not refused; the refused one
// is the same but for its number as the refused text just before it, so that the memo
// clears it by comparison with a text it looked at before.
func TestTxPoolRefusalAfterMemo(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := rewritingProxy(t, db, inTransactionMode)
	ctx := testContext(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
		conn := connectMode(t, p.url(db), mode)
		for _, n := range []int{1, 2} {
			var got int
			if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT %d", n)).Scan(&got); err != nil || got != n {
				t.Fatalf("%v: SELECT %d: %d, %v", mode, n, got, err)
			}
		}
		for _, n := range []int{1, 2} {
			_, err := conn.Exec(ctx, fmt.Sprintf("SELECT pg_advisory_lock(%d)", n))
			wantSQLState(t, err, "0A000")
		}
		var got int
		if err := conn.QueryRow(ctx, "SELECT 3").Scan(&got); err != nil || got != 3 {
			t.Fatalf("%v: after the refusals: %d, %v", mode, got, err)
		}
	}
}
