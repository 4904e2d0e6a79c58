package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/metrics"
	"github.com/leafproxy/leafproxy/internal/testenv"
)

// withUpstream replaces the --upstream of serveArgs.
func withUpstream(args []string, upstream string) []string {
	for i := range args {
		if args[i] == "--upstream" {
			args[i+1] = upstream
		}
	}
	return args
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// connectThrough opens a session through the proxy as the shared server's superuser.
func connectThrough(ctx context.Context, t *testing.T, s *server, password string) (*pgconn.PgConn, error) {
	t.Helper()
	u := fmt.Sprintf("postgres://postgres%s@%s/postgres?sslmode=disable&connect_timeout=15", password, s.listen)
	return pgconn.Connect(ctx, u)
}

// TestReadinessFollowsTheUpstream: with its upstream on a private PostgreSQL that is
// stopped and started again, /readyz and `leafproxy healthcheck` fail with the reason
// while it is down and recover when it is back; a client meanwhile gets FATAL 08001 with
// the upstream's address and the dial error in DETAIL, and no credentials.
func TestReadinessFollowsTheUpstream(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	up := testenv.NewPostgres(t)
	upAddr := fmt.Sprintf("127.0.0.1:%d", up.Port)
	s := startServe(t, nil, withUpstream(serveArgs(t, dsn, 431), upAddr)...)
	waitReady(s)
	httpAddr := strings.TrimPrefix(s.http, "http://")
	if r := leafproxy(t, nil, "healthcheck", "--http", httpAddr); r.code != 0 {
		t.Fatalf("healthcheck while healthy: %+v", r)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := up.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	reason := fmt.Sprintf("upstream %s unreachable since ", upAddr)
	var body string
	s.waitFor("/readyz to fail for the upstream", func() bool {
		var code int
		code, body = s.get("/readyz", "")
		return code == 503
	})
	if !strings.Contains(body, reason) || !strings.Contains(body, "connection refused") {
		t.Errorf("/readyz with the upstream down = %q, want %q and the dial error", body, reason)
	}
	r := leafproxy(t, nil, "healthcheck", "--http", httpAddr)
	if r.code != 1 || !strings.HasPrefix(r.stderr, "leafproxy: not ready: "+reason) || !strings.Contains(r.stderr, "connection refused") {
		t.Errorf("healthcheck with the upstream down: exit %d, stderr %q", r.code, r.stderr)
	}
	if !strings.Contains(s.log.String(), "cannot reach the upstream database") {
		t.Errorf("no warning in the log when the upstream went down:\n%s", s.log.String())
	}

	// A client: FATAL 08001 naming the upstream and the dial error, and not the password
	// it sent.
	_, err := connectThrough(ctx, t, s, ":pw-not-to-echo")
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		t.Fatalf("connect with the upstream down: %v, want a server error", err)
	}
	wantDetail := fmt.Sprintf("upstream %s: dial tcp %s: connect: connection refused", upAddr, upAddr)
	if pg.Severity != "FATAL" || pg.Code != "08001" || pg.Message != "could not connect to the upstream server" || pg.Detail != wantDetail {
		t.Errorf("client error = %s %s %q DETAIL %q; want FATAL 08001 with DETAIL %q", pg.Severity, pg.Code, pg.Message, pg.Detail, wantDetail)
	}
	if strings.Contains(pg.Detail+pg.Message+pg.Hint, "pw-not-to-echo") {
		t.Errorf("the error shows the password: %+v", pg)
	}

	if err := up.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitReady(s)
	if r := leafproxy(t, nil, "healthcheck", "--http", httpAddr); r.code != 0 || !strings.Contains(r.stdout, "ready") {
		t.Errorf("healthcheck after the upstream returned: %+v", r)
	}
	conn, err := connectThrough(ctx, t, s, "")
	if err != nil {
		t.Fatalf("connect after the upstream returned: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "select 1").ReadAll(); err != nil {
		t.Error(err)
	}
	if !strings.Contains(s.log.String(), "upstream reachable again") {
		t.Errorf("no log line when the upstream returned")
	}
}

// TestStartWithUnreachableUpstream: the first failed dial is a warning at start, and the
// proxy never reports ready.
func TestStartWithUnreachableUpstream(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	dead := closedAddr(t)
	s := startServe(t, nil, withUpstream(serveArgs(t, dsn, 432), dead)...)
	s.waitFor("the warning about the upstream", func() bool {
		log := s.log.String()
		return strings.Contains(log, `"level":"warning","msg":"cannot reach the upstream database: clients get FATAL 08001 and /readyz fails until it answers"`) &&
			strings.Contains(log, `"upstream":"`+dead+`"`)
	})
	// The engines start all the same; /readyz keeps failing for the upstream alone.
	s.waitFor("/readyz to name only the upstream", func() bool {
		code, body := s.get("/readyz", "")
		return code == 503 && strings.HasPrefix(body, "not ready: upstream "+dead+" unreachable since ") && !strings.Contains(body, ";")
	})
}

// TestStoreUnreachableAtStart: a store nobody listens on stops serve with one line that
// names the store and the cause, without pgconn's list of attempts or package prefixes.
func TestStoreUnreachableAtStart(t *testing.T) {
	t.Parallel()
	dead := closedAddr(t)
	r := leafproxy(t, nil, "serve", "--store", "postgres://leaf:secret@"+dead+"/app", "--upstream", dead,
		"--listen", freeAddr(t), "--http", freeAddr(t))
	if r.code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	last := lines[len(lines)-1]
	want := fmt.Sprintf(`level=error msg="leafproxy stopped" error="cannot connect to the store %s/app: dial tcp %s: connect: connection refused (check store: --store or LEAFPROXY_STORE)"`, dead, dead)
	if !strings.HasSuffix(last, want) {
		t.Errorf("last line\n%s\nwant it to end with\n%s", last, want)
	}
	for _, bad := range []string{`\n\t`, "postgres worker source", "snowflake: ", "secret"} {
		if strings.Contains(r.stderr, bad) {
			t.Errorf("stderr contains %q:\n%s", bad, r.stderr)
		}
	}
}

// TestIDErrorsForTheUser: an unknown tag through the proxy is 42704 with a message free of
// package names, a DETAIL and a HINT with the fix; the session stays usable. Over HTTP the
// segment endpoint names the snowflake endpoint for a snowflake tag.
func TestIDErrorsForTheUser(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	s := startServe(t, nil, serveArgs(t, dsn, 433)...)
	waitReady(s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=15", s.listen))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var id int64
	err = conn.QueryRow(ctx, "select leaf_next('nosuchtag')").Scan(&id)
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		t.Fatalf("unknown tag: %v", err)
	}
	want := pgconn.PgError{Severity: "ERROR", Code: "42704", Message: `unknown ID tag "nosuchtag"`,
		Detail: `No leaf_alloc row and no snowflake-tags entry is named "nosuchtag".`,
		Hint:   `Create it with "leafproxy tag add nosuchtag --step 1000" (proxies see new tags within 60 s), or add it to snowflake-tags to serve it from the snowflake engine.`}
	if pg.Severity != want.Severity || pg.Code != want.Code || pg.Message != want.Message || pg.Detail != want.Detail || pg.Hint != want.Hint {
		t.Errorf("unknown tag:\n got %s %s %q DETAIL %q HINT %q\nwant %s %s %q DETAIL %q HINT %q",
			pg.Severity, pg.Code, pg.Message, pg.Detail, pg.Hint, want.Severity, want.Code, want.Message, want.Detail, want.Hint)
	}
	if err := conn.QueryRow(ctx, "select leaf_next('audit')").Scan(&id); err != nil || id <= 0 {
		t.Errorf("the session after the error: %d %v", id, err)
	}

	for path, want := range map[string]string{
		"/api/segment/get/order":     `"order" is a snowflake tag: ask /api/snowflake/get/order` + "\n",
		"/api/segment/get/nosuchtag": `unknown segment tag "nosuchtag": create it with "leafproxy tag add nosuchtag --step 1000" (proxies see new tags within 60 s)` + "\n",
	} {
		if code, body := s.get(path, ""); code != 404 || body != want {
			t.Errorf("GET %s = %d %q, want 404 %q", path, code, body, want)
		}
	}
}

// TestCLIMessages: a mistyped flag is one line with the nearest flag; tag list without a
// store names LEAFPROXY_STORE; decode warns about values that cannot be snowflake IDs.
func TestCLIMessages(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"serve", "--upstrem", "db:5432"}, 2,
			"leafproxy: serve: unknown flag --upstrem (did you mean --upstream?); run \"leafproxy serve --help\" for the flags\n"},
		{[]string{"tag", "add", "x", "--stp", "10"}, 2,
			"leafproxy: tag add: unknown flag --stp (did you mean --step?); run \"leafproxy tag add --help\" for the flags\n"},
		{[]string{"serve", "--frobnicate"}, 2,
			"leafproxy: serve: unknown flag --frobnicate; run \"leafproxy serve --help\" for the flags\n"},
		{[]string{"tag", "list"}, 2,
			"leafproxy: no store given: pass --dsn URL or set LEAFPROXY_STORE, e.g. postgres://leaf@127.0.0.1:5432/app\n"},
		{[]string{"decode", "7"}, 0,
			"leafproxy: warning: 7 cannot be a snowflake ID of this layout: its time 2010-11-04T01:42:54Z is less than a day after the epoch 2010-11-04T01:42:54Z (a segment ID?)\n"},
		{[]string{"decode", "9223372036854775807"}, 0,
			"leafproxy: warning: 9223372036854775807 cannot be a snowflake ID of this layout: its time 2080-07-10T17:30:30Z is in the future (another epoch or layout?)\n"},
		{[]string{"decode", "1865209932517781504"}, 0, ""},
	} {
		r := leafproxy(t, nil, tc.args...)
		if r.code != tc.code || r.stderr != tc.stderr {
			t.Errorf("leafproxy %v: exit %d, stderr %q; want %d, %q", tc.args, r.code, r.stderr, tc.code, tc.stderr)
		}
	}
}

// TestTagKindConflict: tag add refuses a name the configuration serves as snowflake; a
// proxy that finds a leaf_alloc row named like one of its snowflake tags logs an error,
// serves the tag from snowflake only and lists it once on its status page.
func TestTagKindConflict(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	r := leafproxy(t, []string{"LEAFPROXY_SNOWFLAKE_TAGS=order,pay"}, "tag", "add", "order", "--step", "10", "--dsn", dsn)
	want := `leafproxy: tag add: "order" is a snowflake tag (snowflake-tags in env LEAFPROXY_SNOWFLAKE_TAGS): a tag is served by one engine, so it cannot be a segment tag too; choose another name, or remove it from snowflake-tags first` + "\n"
	if r.code != 1 || r.stderr != want {
		t.Errorf("tag add with the env: exit %d %q, want 1 %q", r.code, r.stderr, want)
	}
	file := filepath.Join(t.TempDir(), "leafproxy.yaml")
	if err := os.WriteFile(file, []byte("snowflake-tags: [order, pay]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = leafproxy(t, nil, "tag", "add", "pay", "--step", "10", "--config", file, "--dsn", dsn)
	if r.code != 1 || !strings.Contains(r.stderr, `"pay" is a snowflake tag (snowflake-tags in file `+file+`)`) {
		t.Errorf("tag add with --config: exit %d %q", r.code, r.stderr)
	}
	// Without the configuration the command cannot know: the row is made.
	mustRun(t, "tag", "add", "order", "--step", "10", "--dsn", dsn)

	s := startServe(t, nil, serveArgs(t, dsn, 434)...)
	waitReady(s)
	s.waitFor("the conflict to be logged", func() bool {
		return strings.Contains(s.log.String(), `"msg":"tag is both a snowflake tag (snowflake-tags) and a segment tag (a leaf_alloc row): serving it from the snowflake engine only`) &&
			strings.Contains(s.log.String(), `"tag":"order"`)
	})
	_, page := s.get("/", "")
	if n := strings.Count(page, "<td>order</td>"); n != 1 || !strings.Contains(page, "<td>order</td><td>snowflake</td>") {
		t.Errorf("status page lists order %d times (want once, as snowflake)", n)
	}
	if !strings.Contains(page, "also a leaf_alloc row: ignored") {
		t.Error("status page does not say that the row is ignored")
	}
	// leaf_next('order') is a snowflake ID: the row's range is never touched.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=15", s.listen))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var id int64
	if err := conn.QueryRow(ctx, "select leaf_next('order')").Scan(&id); err != nil || id < 1<<40 {
		t.Errorf("leaf_next('order') = %d, %v; want a snowflake ID", id, err)
	}
	store, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close(ctx)
	var maxID int64
	if err := store.QueryRow(ctx, "SELECT max_id FROM leaf_alloc WHERE biz_tag = 'order'").Scan(&maxID); err != nil || maxID != 1 {
		t.Errorf("max_id of the conflicting row = %d (%v), want 1: nothing reserved", maxID, err)
	}
}

// TestMetricsAtZeroFromStart: before anything happens, /metrics has the series an alert
// watches, at zero, for every known label value and every tag.
func TestMetricsAtZeroFromStart(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	s := startServe(t, nil, serveArgs(t, dsn, 435)...)
	waitReady(s)
	want := []string{
		`leafproxy_snowflake_clock_backwards_total{outcome="refused"} 0`,
		`leafproxy_snowflake_clock_backwards_total{outcome="waited"} 0`,
		`leafproxy_segment_tag_refreshes_total{result="error"} 0`,
		`leafproxy_ids_issued_total{engine="segment",tag="audit"} 0`,
		`leafproxy_ids_issued_total{engine="snowflake",tag="order"} 0`,
		`leafproxy_segment_loads_total{result="error",tag="invoice"} 0`,
		`leafproxy_segment_unavailable_total{tag="audit"} 0`,
		`leafproxy_id_errors_total{engine="snowflake",reason="worker_not_held"} 0`,
	}
	for _, c := range metrics.StatementSQLStates {
		want = append(want, `leafproxy_errors_total{sqlstate="`+c+`"} 0`)
	}
	for _, c := range metrics.StartupSQLStates {
		want = append(want, `leafproxy_client_rejects_total{sqlstate="`+c+`"} 0`)
	}
	var text string
	s.waitFor("the per-tag series", func() bool {
		_, text = s.get("/metrics", "")
		return strings.Contains(text, `leafproxy_ids_issued_total{engine="segment",tag="audit"} 0`)
	})
	for _, w := range want {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(w) + `$`).MatchString(text) {
			t.Errorf("/metrics at start lacks %s", w)
		}
	}
}

// TestStatusPageShowsTheLease: with the postgres worker source the status page shows the
// lease row: holder, expiry and last renewal.
func TestStatusPageShowsTheLease(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	args := serveArgs(t, dsn, 0)
	for i := range args {
		if args[i] == "--worker-source" {
			args[i+1] = "postgres"
		}
		if args[i] == "--worker-id" {
			args = append(args[:i], args[i+2:]...)
			break
		}
	}
	s := startServe(t, nil, args...)
	waitReady(s)
	var page string
	s.waitFor("the lease on the status page", func() bool {
		_, page = s.get("/", "")
		return strings.Contains(page, `id="lease-holder">leafproxy@`)
	})
	for _, re := range []string{
		`id="lease-expires">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC<`,
		`id="lease-renewed">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC<`,
		`id="worker-source">postgres<`,
		`id="lease-events">acquired 1 \(last \d\d:\d\d:\d\d\)<`,
	} {
		if !regexp.MustCompile(re).MatchString(page) {
			t.Errorf("status page does not match %s", re)
		}
	}
	if t.Failed() {
		t.Logf("page:\n%s", page)
	}
}

// TestZooKeeperSessionFromEvents: the session state the status page shows follows the
// order of the worker source's events.
func TestZooKeeperSessionFromEvents(t *testing.T) {
	var l leaseEvents
	if got := l.zkSession(); got != "connected" {
		t.Errorf("no events: %q", got)
	}
	l.record("report_error")
	if got := l.zkSession(); !strings.HasPrefix(got, "reports failing since ") {
		t.Errorf("after a failed report: %q", got)
	}
	l.last["reconnect"] = l.last["report_error"].Add(time.Second)
	if got := l.zkSession(); !strings.HasPrefix(got, "connected (reconnected at ") {
		t.Errorf("after a reconnect: %q", got)
	}
	l.last["session_expired"] = l.last["reconnect"].Add(time.Second)
	if got := l.zkSession(); !strings.HasPrefix(got, "session expired at ") {
		t.Errorf("after an expiry: %q", got)
	}
}
