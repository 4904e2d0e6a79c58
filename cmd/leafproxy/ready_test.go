package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// TestReadyzFollowsTheStore runs serve with its store on a private PostgreSQL and stops
// it (the upstream, on the shared server, stays up): while segments are buffered the proxy
// stays ready; once the store is down and no IDs are buffered /readyz answers 503 with the
// reason; when the store returns it is ready again.
func TestReadyzFollowsTheStore(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPostgres(t)
	dsn := pg.NewDatabase(t)
	mustRun(t, "migrate", "up", "--dsn", dsn)
	mustRun(t, "tag", "add", "buffered", "--step", "1000", "--dsn", dsn)
	mustRun(t, "tag", "add", "cold", "--step", "1000", "--dsn", dsn)
	serveArgs := func(t *testing.T, dsn string, workerID int) []string {
		return withUpstream(serveArgs(t, dsn, workerID), upstreamOf(t, testenv.PostgresURL(t)))
	}
	s := startServe(t, nil, serveArgs(t, dsn, 1)...)
	waitReady(s)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Load one segment of "buffered", then stop the database.
	if code, body := s.get("/api/segment/get/buffered", ""); code != 200 {
		t.Fatalf("segment: %d %s", code, body)
	}
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if code, body := s.get("/readyz", ""); code != 200 {
		t.Errorf("/readyz with IDs buffered and the store down = %d %q, want 200", code, body)
	}
	if code, body := s.get("/api/segment/get/buffered", ""); code != 200 {
		t.Errorf("buffered tag with the store down = %d %q, want an ID", code, body)
	}
	if code, body := s.get("/api/segment/get/cold", ""); code != 500 || !strings.Contains(body, "unavailable") {
		t.Errorf("cold tag with the store down = %d %q, want 500 unavailable", code, body)
	}
	s.stop()

	// A second proxy that never loaded a segment: not ready while the store is down.
	s2 := startServe(t, nil, serveArgs(t, dsn, 2)...)
	code, body := s2.get("/readyz", "")
	if code != 503 || !strings.Contains(body, "segment engine starting") {
		t.Errorf("/readyz of a proxy started with the store down = %d %q, want 503 starting", code, body)
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitReady(s2)
	if code, body := s2.get("/api/segment/get/cold", ""); code != 200 {
		t.Fatalf("cold tag after the store returned = %d %q", code, body)
	}
	// Store down again with the proxy started but "cold"'s buffer nearly full: drain it
	// so that nothing is buffered, then /readyz must say why it is not ready.
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10000; i++ {
		code, _ := s2.get("/api/segment/get/cold", "")
		if code != 200 {
			break
		}
	}
	// The store is checked in the background: wait for the check that sees it down.
	s2.waitFor("/readyz to say the store is down and nothing is buffered", func() bool {
		code, body = s2.get("/readyz", "")
		return code == 503 && strings.Contains(body, "store unreachable") && strings.Contains(body, "no segment IDs buffered")
	})
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitReady(s2)
}

// TestGracefulShutdownGivesBack: SIGTERM makes serve exit 0 and hand the unused tail of
// each segment back, so the next proxy continues right after the last issued ID.
func TestGracefulShutdownGivesBack(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	s := startServe(t, nil, serveArgs(t, dsn, 3)...)
	waitReady(s)
	var last int64
	for i := 0; i < 3; i++ {
		_, body := s.get("/api/segment/get/audit", "")
		last, _ = strconv.ParseInt(body, 10, 64)
	}
	s.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var maxID int64
	if err := conn.QueryRow(ctx, "SELECT max_id FROM leaf_alloc WHERE biz_tag = 'audit'").Scan(&maxID); err != nil {
		t.Fatal(err)
	}
	if maxID != last {
		t.Errorf("max_id after a clean shutdown = %d, want the last issued ID %d", maxID, last)
	}
	s2 := startServe(t, nil, serveArgs(t, dsn, 3)...)
	waitReady(s2)
	if _, body := s2.get("/api/segment/get/audit", ""); body != strconv.FormatInt(last+1, 10) {
		t.Errorf("first ID after restart = %s, want %d", body, last+1)
	}
}

// TestServeWithoutSchema: on a store without the Leaf tables serve exits 1 saying what to
// run; with --migrate-on-start it creates them and becomes ready.
func TestServeWithoutSchema(t *testing.T) {
	t.Parallel()
	dsn := testenv.NewDatabase(t)
	args := []string{"serve", "--store", dsn, "--upstream", upstreamOf(t, dsn), "--listen", freeAddr(t), "--http", freeAddr(t)}
	r := leafproxy(t, nil, args...)
	if r.code != 1 || !strings.Contains(r.stderr, "leafproxy migrate up") || !strings.Contains(r.stderr, "leaf_worker_lease") {
		t.Errorf("serve on an empty store: exit %d\n%s", r.code, r.stderr)
	}
	s := startServe(t, nil, serveArgs(t, dsn, 4, "--migrate-on-start")...)
	waitReady(s)
	if out := mustRun(t, "migrate", "version", "--dsn", dsn); !strings.Contains(out, "version 3 of 3") {
		t.Errorf("after migrate-on-start: %q", out)
	}
}
