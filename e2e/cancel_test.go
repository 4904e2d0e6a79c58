package e2e

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// TestCancelWhileSegmentLoads cancels a leaf_next that waits for its tag's first segment,
// whose reservation is held up by a transaction locking the tag's row. The client's
// CancelRequest (pgx sends one when the query's context ends) ends the wait with 57014,
// the session goes on, and once the lock is gone the same session gets its ID.
func TestCancelWhileSegmentLoads(t *testing.T) {
	dsn := testenv.NewDatabase(t)
	migrateUp(t, dsn)
	addTag(t, dsn, "slow", 100)
	p := StartProxy(t, "cancel", ProxyConfig{
		WorkerSource: "static",
		WorkerID:     12,
		Upstream:     hostPort(t, dsn),
		Store:        dsn,
	})
	ctx, stop := context.WithTimeout(context.Background(), 2*time.Minute)
	defer stop()

	locker, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	lock, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.Background())
	if _, err := lock.Exec(ctx, "SELECT 1 FROM leaf_alloc WHERE biz_tag = 'slow' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}

	cfg, err := pgx.ParseConfig(p.URL(dsn, "postgres", ""))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnectTimeout = 20 * time.Second
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 30 * time.Second}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())

	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait() // before the connection closes
	wg.Go(func() { got <- conn.QueryRow(qctx, "SELECT leaf_next('slow')").Scan(new(int64)) })

	watcher, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close(context.Background())
	until(t, "the segment reservation to wait for the locked row", func() error {
		var n int
		err := watcher.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE query LIKE 'UPDATE leaf_alloc%' AND wait_event_type = 'Lock'`).Scan(&n)
		if err == nil && n == 0 {
			err = errors.New("not waiting")
		}
		return err
	})

	began := time.Now()
	cancel()
	select {
	case err := <-got:
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
			t.Fatalf("leaf_next cancelled while its segment loads: %v, want SQLSTATE 57014", err)
		}
		t.Logf("cancelled after %v: %s", time.Since(began).Round(time.Millisecond), pgErr.Message)
	case <-time.After(30 * time.Second):
		t.Fatal("the cancel did not end the wait for the segment")
	}

	var n int
	if err := conn.QueryRow(ctx, "SELECT 42").Scan(&n); err != nil || n != 42 {
		t.Fatalf("after the cancel: %d, %v", n, err)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var id, maxID int64
	// The engine may be between retries if the reservation it started timed out.
	until(t, "leaf_next once the row is free", func() error {
		return conn.QueryRow(ctx, "SELECT leaf_next('slow')").Scan(&id)
	})
	if err := watcher.QueryRow(ctx, "SELECT max_id FROM leaf_alloc WHERE biz_tag = 'slow'").Scan(&maxID); err != nil {
		t.Fatal(err)
	}
	if id <= 0 || id > maxID {
		t.Fatalf("leaf_next = %d, outside the reserved (0, %d]", id, maxID)
	}
}

// until polls cond until it returns nil, failing the test after 30 s with its last error.
func until(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
