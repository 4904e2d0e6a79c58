package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/idgen/snowflake"
)

// TestProxyWiring checks what serve wires into the proxy: the router behind leaf_next and
// leaf_snowflake, the fill rules, the SQLSTATEs of ID errors and their metric.
func TestProxyWiring(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	direct, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	if _, err := direct.Exec(ctx, "CREATE TABLE orders (id bigint PRIMARY KEY, item text)"); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, nil, serveArgs(t, dsn, 12)...)
	waitReady(s)
	conn, err := pgx.Connect(ctx, proxyURL(t, dsn, s.listen))
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	defer conn.Close(ctx)
	codec := snowflake.DefaultCodec()

	var seg, snow, anySnow, filled int64
	if err := conn.QueryRow(ctx, "SELECT leaf_next('audit')").Scan(&seg); err != nil || seg < 2 || seg > 101 {
		t.Errorf("leaf_next('audit') = %d, %v; want an ID of the audit segment", seg, err)
	}
	if err := conn.QueryRow(ctx, "SELECT leaf_next('order')").Scan(&snow); err != nil || codec.Decompose(snow).Worker != 12 {
		t.Errorf("leaf_next('order') = %d, %v; want a snowflake ID of worker 12", snow, err)
	}
	if err := conn.QueryRow(ctx, "SELECT leaf_snowflake()").Scan(&anySnow); err != nil || codec.Decompose(anySnow).Worker != 12 || anySnow <= snow {
		t.Errorf("leaf_snowflake() = %d, %v", anySnow, err)
	}
	if err := conn.QueryRow(ctx, "INSERT INTO orders (item) VALUES ('book') RETURNING id").Scan(&filled); err != nil || codec.Decompose(filled).Worker != 12 {
		t.Errorf("filled INSERT returned %d, %v; want a snowflake ID (rule orders.id=order)", filled, err)
	}
	var stored int64
	if err := direct.QueryRow(ctx, "SELECT id FROM orders WHERE item = 'book'").Scan(&stored); err != nil || stored != filled {
		t.Errorf("stored id %d, %v; the client saw %d", stored, err, filled)
	}

	var pgErr *pgconn.PgError
	_, err = conn.Exec(ctx, "SELECT leaf_next('no_such_tag')")
	if !errors.As(err, &pgErr) || pgErr.Code != "42704" {
		t.Errorf("unknown tag: %v, want SQLSTATE 42704", err)
	}
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Errorf("session unusable after an ID error: %v", err)
	}
	_, body := s.get("/metrics", "")
	if v := metricValue(t, body, `leafproxy_errors_total{sqlstate="42704"}`); v < 1 {
		t.Errorf(`leafproxy_errors_total{sqlstate="42704"} = %v, want ≥ 1`, v)
	}
	if v := metricValue(t, body, `leafproxy_ids_issued_total{engine="snowflake",tag="order"}`); v < 2 {
		t.Errorf(`snowflake IDs of tag order = %v, want ≥ 2 (leaf_next and the fill)`, v)
	}
}
