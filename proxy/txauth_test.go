package proxy

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// TestTxPoolSessionAuthorization: SET and RESET SESSION AUTHORIZATION of a superuser are
// refused in transaction mode, in both protocols, lest the session user stay on the
// server connection for the next client (a pool of one); SET LOCAL, which ends with the
// transaction, works and reaches nobody else.
func TestTxPoolSessionAuthorization(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 1 })
	ctx := testContext(t)
	setup := connect(t, db)
	role := dbName(t, db) + "_auth"
	if _, err := setup.Exec(ctx, "CREATE ROLE "+role+" NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = setup.Exec(context.Background(), "DROP ROLE "+role) })
	a := connect(t, p.url(db))
	b := connect(t, p.url(db))
	users := func(c *pgx.Conn) string {
		t.Helper()
		var session, current string
		if err := c.QueryRow(ctx, "SELECT session_user, current_user").Scan(&session, &current); err != nil {
			t.Fatal(err)
		}
		return session + "/" + current
	}
	login := users(b)
	for _, sql := range []string{
		"SET SESSION AUTHORIZATION " + role,
		"SET SESSION AUTHORIZATION DEFAULT",
		"SET session_authorization = " + role,
		"RESET SESSION AUTHORIZATION",
	} {
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
			_, err := a.Exec(ctx, sql, mode)
			pgErr := wantSQLState(t, err, "0A000")
			if !strings.Contains(pgErr.Hint, "session") {
				t.Fatalf("%s: hint %q does not name session mode", sql, pgErr.Hint)
			}
			for _, c := range []*pgx.Conn{b, a} {
				if u := users(c); u != login {
					t.Fatalf("after %s (%s): session_user/current_user %s, want %s", sql, mode, u, login)
				}
			}
		}
	}
	// set_config is not refused, but the connection it ran on is reset before another
	// client gets it.
	var got string
	if err := a.QueryRow(ctx, "SELECT set_config('session_authorization', $1, false)", role).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if u := users(b); u != login {
		t.Fatalf("after set_config('session_authorization'): session_user/current_user %s, want %s", u, login)
	}
	tx, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SET LOCAL SESSION AUTHORIZATION "+role); err != nil {
		t.Fatal(err)
	}
	var current string
	if err := tx.QueryRow(ctx, "SELECT current_user").Scan(&current); err != nil || current != role {
		t.Fatalf("SET LOCAL SESSION AUTHORIZATION: current_user %s (%v), want %s", current, err, role)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*pgx.Conn{b, a} {
		if u := users(c); u != login {
			t.Fatalf("after SET LOCAL: session_user/current_user %s, want %s", u, login)
		}
		if got := c.PgConn().ParameterStatus("session_authorization"); got != strings.Split(login, "/")[0] {
			t.Fatalf("ParameterStatus session_authorization %q, want %q", got, strings.Split(login, "/")[0])
		}
	}
}
