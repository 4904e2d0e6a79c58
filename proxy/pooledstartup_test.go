package proxy

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// TestPooledStartupWaitsPastQueryWaitTimeout: the first client of a pool key, whose
// startup needs a server connection of the key logged in, waits for one as long as its
// startup may last, not query-wait-timeout, which bounds a statement's wait: here the
// database's only connection is in another user's transaction for longer than
// query-wait-timeout.
func TestPooledStartupWaitsPastQueryWaitTimeout(t *testing.T) {
	db := testenv.NewDatabase(t)
	ctx := testContext(t)
	admin := connect(t, db)
	other := fmt.Sprintf("leaf_startup_%d", time.Now().UnixNano()%1e9)
	if _, err := admin.Exec(ctx, "CREATE ROLE "+other+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := testContext(t)
		if c, err := pgx.Connect(ctx, db); err == nil {
			_, _ = c.Exec(ctx, "DROP ROLE "+other)
			c.Close(ctx)
		}
	})
	const wait = 200 * time.Millisecond
	p := startProxy(t, db, inTransactionMode, func(s *Server) {
		s.Pooling.PoolSize = 1
		s.Pooling.MaxDBConnections = 1
		s.Pooling.QueryWaitTimeout = wait
	})
	holder := connect(t, p.url(db))
	tx := holdServer(t, ctx, holder)
	type result struct {
		conn *pgx.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		c, err := pgx.Connect(ctx, p.url(testenv.WithUser(db, other, "")))
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		if r.conn != nil {
			r.conn.Close(context.Background())
		}
		t.Fatalf("the startup ended (%v) while the database's only connection was in a transaction", r.err)
	case <-time.After(5 * wait):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("startup after the transaction ended: %v", r.err)
	}
	defer r.conn.Close(context.Background())
	var who string
	if err := r.conn.QueryRow(ctx, "SELECT current_user").Scan(&who); err != nil || who != other {
		t.Fatalf("current_user %q, %v; want %s", who, err, other)
	}
}
