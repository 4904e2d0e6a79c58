package proxy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/internal/testenv"
)

func TestPgxQueryModes(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db)
	modes := []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement,
		pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec,
		pgx.QueryExecModeSimpleProtocol,
	}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testContext(t)
			cfg, err := pgx.ParseConfig(p.url(db))
			if err != nil {
				t.Fatal(err)
			}
			cfg.DefaultQueryExecMode = mode
			conn, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			table := "t_" + strings.ReplaceAll(mode.String(), " ", "_")
			if _, err := conn.Exec(ctx, "CREATE TABLE "+table+" (id int8 PRIMARY KEY, name text, data bytea)"); err != nil {
				t.Fatal(err)
			}
			for i := range 10 {
				if _, err := conn.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, $2, $3)", i, fmt.Sprintf("n%d", i), []byte{byte(i), 0, 255}); err != nil {
					t.Fatal(err)
				}
			}
			var n int64
			var sum int64
			if err := conn.QueryRow(ctx, "SELECT count(*), sum(id) FROM "+table+" WHERE name LIKE $1", "n%").Scan(&n, &sum); err != nil {
				t.Fatal(err)
			}
			if n != 10 || sum != 45 {
				t.Fatalf("count, sum = %d, %d; want 10, 45", n, sum)
			}
			var data []byte
			if err := conn.QueryRow(ctx, "SELECT data FROM "+table+" WHERE id = $1", 7).Scan(&data); err != nil {
				t.Fatal(err)
			}
			if string(data) != string([]byte{7, 0, 255}) {
				t.Fatalf("data = %v", data)
			}
			_, err = conn.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, 'dup', NULL)", 1)
			wantSQLState(t, err, "23505")
			// The session is usable after the error.
			if err := conn.Ping(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestPgxLargeRow(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db)
	ctx := testContext(t)
	conn := connect(t, p.url(db))
	// Larger than every buffer of the proxy in both directions.
	big := strings.Repeat("leaf", 4<<20)
	var got string
	if err := conn.QueryRow(ctx, "SELECT $1::text || 'x'", big).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(big)+1 || got[:len(big)] != big {
		t.Fatalf("got %d bytes back, want %d", len(got), len(big)+1)
	}
}

func TestMaxMessageSize(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, func(s *Server) { s.MaxMessageSize = 64 << 10 })
	ctx := testContext(t)
	conn := connect(t, p.url(db))
	_, err := conn.Exec(ctx, "SELECT $1::text", strings.Repeat("x", 100<<10))
	wantSQLState(t, err, sqlstate.ProgramLimitExceeded)
	// Large results are limited just the same.
	conn2 := connect(t, p.url(db))
	_, err = conn2.Exec(ctx, "SELECT repeat('x', 100000)")
	wantSQLState(t, err, sqlstate.ProgramLimitExceeded)
}

func TestPgxPipeline(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db)
	ctx := testContext(t)
	conn := connect(t, p.url(db))
	if _, err := conn.Exec(ctx, "CREATE TABLE pipe (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	batch := &pgx.Batch{}
	for i := range 100 {
		batch.Queue("INSERT INTO pipe VALUES ($1) RETURNING id * 2", i)
	}
	results := conn.SendBatch(ctx, batch)
	for i := range 100 {
		var got int
		if err := results.QueryRow().Scan(&got); err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		if got != 2*i {
			t.Fatalf("query %d returned %d, want %d", i, got, 2*i)
		}
	}
	if err := results.Close(); err != nil {
		t.Fatal(err)
	}

	// A lower-level pipeline with an error in the middle: the server skips to the next
	// Sync and everything after it still works.
	pipeline := conn.PgConn().StartPipeline(ctx)
	pipeline.SendQueryParams("SELECT 1", nil, nil, nil, nil)
	pipeline.SendQueryParams("SELECT 1/0", nil, nil, nil, nil)
	if err := pipeline.Sync(); err != nil {
		t.Fatal(err)
	}
	pipeline.SendQueryParams("SELECT 3", nil, nil, nil, nil)
	if err := pipeline.Sync(); err != nil {
		t.Fatal(err)
	}
	var errs, rows int
	for {
		res, err := pipeline.GetResults()
		if err != nil {
			wantSQLState(t, err, "22012")
			errs++
			continue
		}
		if res == nil {
			break
		}
		switch r := res.(type) {
		case *pgconn.ResultReader:
			if _, err := r.Close(); err != nil {
				errs++
			} else {
				rows++
			}
		case *pgconn.PipelineSync:
		}
	}
	if err := pipeline.Close(); err != nil {
		t.Fatal(err)
	}
	if errs != 1 || rows < 2 {
		t.Fatalf("pipeline results: %d errors, %d results; want 1 error and the other queries", errs, rows)
	}
}

func TestPgxCopy(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db)
	ctx := testContext(t)
	conn := connect(t, p.url(db))
	if _, err := conn.Exec(ctx, "CREATE TABLE copied (id int8, name text)"); err != nil {
		t.Fatal(err)
	}
	const rows = 100000
	n, err := conn.CopyFrom(ctx, pgx.Identifier{"copied"}, []string{"id", "name"},
		pgx.CopyFromSlice(rows, func(i int) ([]any, error) { return []any{int64(i), fmt.Sprintf("row %d", i)}, nil }))
	if err != nil {
		t.Fatal(err)
	}
	if n != rows {
		t.Fatalf("copied %d rows, want %d", n, rows)
	}
	var count, sum int64
	if err := conn.QueryRow(ctx, "SELECT count(*), sum(id) FROM copied").Scan(&count, &sum); err != nil {
		t.Fatal(err)
	}
	if count != rows || sum != rows*(rows-1)/2 {
		t.Fatalf("count, sum = %d, %d", count, sum)
	}

	// COPY TO STDOUT through the proxy.
	var out strings.Builder
	tag, err := conn.PgConn().CopyTo(ctx, &out, "COPY (SELECT id, name FROM copied ORDER BY id LIMIT 3) TO STDOUT")
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != 3 || out.String() != "0\trow 0\n1\trow 1\n2\trow 2\n" {
		t.Fatalf("COPY TO returned %q (%s)", out.String(), tag)
	}

	// A COPY FROM that fails half-way leaves a usable session.
	_, err = conn.PgConn().CopyFrom(ctx, strings.NewReader("1\tok\nnot-a-number\tbad\n"), "COPY copied FROM STDIN")
	wantSQLState(t, err, "22P02")
	if err := conn.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestPgxListenNotify(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db)
	ctx := testContext(t)
	listener := connect(t, p.url(db))
	notifier := connect(t, p.url(db))
	if _, err := listener.Exec(ctx, "LISTEN leaf_events"); err != nil {
		t.Fatal(err)
	}
	var pid uint32
	if err := notifier.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := notifier.Exec(ctx, "SELECT pg_notify('leaf_events', 'hello')"); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Channel != "leaf_events" || n.Payload != "hello" || n.PID != pid {
		t.Fatalf("notification %+v, want channel leaf_events, payload hello, pid %d", n, pid)
	}
}

func TestPgxNoticeAndParameterStatus(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db)
	ctx := testContext(t)
	cfg, err := pgx.ParseConfig(p.url(db))
	if err != nil {
		t.Fatal(err)
	}
	notices := make(chan string, 1)
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices <- n.Message }
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DO $$ BEGIN RAISE NOTICE 'leaf notice'; END $$"); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-notices:
		if msg != "leaf notice" {
			t.Fatalf("notice %q", msg)
		}
	default:
		t.Fatal("no NoticeResponse reached the client")
	}
	if _, err := conn.Exec(ctx, "SET application_name = 'leafapp'"); err != nil {
		t.Fatal(err)
	}
	if got := conn.PgConn().ParameterStatus("application_name"); got != "leafapp" {
		t.Fatalf("ParameterStatus application_name = %q", got)
	}
}

func TestPgxCancel(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db)
	conn := connect(t, p.url(db))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := conn.Exec(ctx, "SELECT pg_sleep(10)")
	if err == nil {
		t.Fatal("pg_sleep(10) was not cancelled")
	}
	// pg_sleep(10) ending well before 10 s is the proof; the bound leaves room for a
	// loaded machine.
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("cancel took %v", d)
	}
	// pgx closes a connection whose context ended; the cancel itself must have reached
	// the server: check with a connection that cancels by key explicitly.
	conn2 := connect(t, p.url(db))
	ctx2 := testContext(t)
	done := make(chan error, 1)
	go func() {
		_, err := conn2.Exec(ctx2, "SELECT pg_sleep(10)")
		done <- err
	}()
	direct := connect(t, db)
	waitFor(t, 5*time.Second, "pg_sleep to run", func() error {
		var n int
		if err := direct.QueryRow(ctx2, "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(10)' AND state = 'active'").Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("not running yet")
		}
		return nil
	})
	start = time.Now()
	if err := conn2.PgConn().CancelRequest(ctx2); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		wantSQLState(t, err, "57014")
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("cancel took %v", d)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("the query was not cancelled")
	}
	if err := conn2.Ping(ctx2); err != nil {
		t.Fatal(err)
	}
}
