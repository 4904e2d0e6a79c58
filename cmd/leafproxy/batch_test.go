package main

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/idgen/snowflake"
)

// TestBatchWiring checks batches through serve's real engines: a segment batch larger
// than a segment is strictly increasing, a snowflake tag's batch carries the worker ID,
// max-batch bounds both SQL and HTTP, and every ID is counted.
func TestBatchWiring(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := startServe(t, nil, serveArgs(t, dsn, 13, "--max-batch", "300")...)
	waitReady(s)
	conn, err := pgx.Connect(ctx, proxyURL(t, dsn, s.listen))
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	defer conn.Close(ctx)

	rows, _ := conn.Query(ctx, "SELECT leaf_next('audit', 250)")
	seg, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(seg) != 250 {
		t.Fatalf("segment batch: %d IDs, %v", len(seg), err)
	}
	for i := 1; i < len(seg); i++ {
		if seg[i] <= seg[i-1] {
			t.Fatalf("segment batch not strictly increasing at %d: %d after %d", i, seg[i], seg[i-1])
		}
	}
	rows, _ = conn.Query(ctx, "SELECT leaf_next($1, $2)", "order", 40)
	snow, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(snow) != 40 {
		t.Fatalf("snowflake batch: %d IDs, %v", len(snow), err)
	}
	codec := snowflake.DefaultCodec()
	for _, id := range snow {
		if codec.Decompose(id).Worker != 13 {
			t.Fatalf("snowflake batch ID %d is not of worker 13", id)
		}
	}
	if !slices.IsSorted(snow) {
		t.Fatalf("snowflake batch not increasing: %v", snow)
	}
	var pgErr *pgconn.PgError
	if _, err = conn.Exec(ctx, "SELECT leaf_next('audit', 301)"); !errors.As(err, &pgErr) || pgErr.Code != "22023" || !strings.Contains(pgErr.Message, "between 1 and 300") {
		t.Errorf("batch above max-batch: %v, want 22023", err)
	}
	if _, err = conn.Exec(ctx, "SELECT leaf_next('no_such_tag', 3)"); !errors.As(err, &pgErr) || pgErr.Code != "42704" {
		t.Errorf("batch of an unknown tag: %v, want 42704", err)
	}

	code, body := s.get("/api/segment/get/audit?count=3", "")
	lines := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
	if code != 200 || len(lines) != 3 {
		t.Fatalf("HTTP count=3: %d %q", code, body)
	}
	if first, _ := strconv.ParseInt(lines[0], 10, 64); first <= seg[len(seg)-1] {
		t.Errorf("HTTP batch starts at %d, not after the SQL batch's %d", first, seg[len(seg)-1])
	}
	if code, _ := s.get("/api/segment/get/audit?count=301", ""); code != 400 {
		t.Errorf("HTTP count above max-batch: %d, want 400", code)
	}
	_, body = s.get("/metrics", "")
	if v := metricValue(t, body, `leafproxy_ids_issued_total{engine="segment",tag="audit"}`); v != 253 {
		t.Errorf(`segment IDs of tag audit = %v, want 253`, v)
	}
}

// TestDecodeWiring: SELECT leaf_decode(id) splits IDs by the configured epoch, as the
// engine stamps them and as /decodeSnowflakeId reads them.
func TestDecodeWiring(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := startServe(t, nil, serveArgs(t, dsn, 21, "--snowflake-epoch", "1600000000000")...)
	waitReady(s)
	conn, err := pgx.Connect(ctx, proxyURL(t, dsn, s.listen))
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	defer conn.Close(ctx)
	var id int64
	if err := conn.QueryRow(ctx, "SELECT leaf_next('order')").Scan(&id); err != nil {
		t.Fatal(err)
	}
	var ts time.Time
	var worker, seq int64
	if err := conn.QueryRow(ctx, "SELECT leaf_decode($1)", id).Scan(&ts, &worker, &seq); err != nil {
		t.Fatal(err)
	}
	if worker != 21 || time.Since(ts) > time.Minute || time.Until(ts) > time.Second {
		t.Fatalf("leaf_decode(%d) = %v, worker %d, sequence %d", id, ts, worker, seq)
	}
	_, body := s.get("/decodeSnowflakeId?snowflakeId="+strconv.FormatInt(id, 10), "")
	if !strings.Contains(body, `"timestamp": `+strconv.FormatInt(ts.UnixMilli(), 10)) || !strings.Contains(body, `"sequence": `+strconv.FormatInt(seq, 10)) {
		t.Fatalf("/decodeSnowflakeId disagrees with leaf_decode (%v, %d): %s", ts, seq, body)
	}
}
