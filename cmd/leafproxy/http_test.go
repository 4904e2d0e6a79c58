package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/internal/testenv"
)

// newStore returns a fresh migrated database with segment tags audit (step 100) and
// invoice (step 10).
func newStore(t *testing.T) string {
	t.Helper()
	dsn := testenv.NewDatabase(t)
	mustRun(t, "migrate", "up", "--dsn", dsn)
	mustRun(t, "tag", "add", "audit", "--step", "100", "--dsn", dsn)
	mustRun(t, "tag", "add", "invoice", "--step", "10", "--max-id", "5000", "--dsn", dsn)
	return dsn
}

// serveArgs are the flags of a proxy on dsn's server with a static worker ID.
func serveArgs(t *testing.T, dsn string, workerID int, extra ...string) []string {
	return append([]string{"--store", dsn, "--upstream", upstreamOf(t, dsn), "--upstream-sslmode", "disable",
		"--worker-source", "static", "--worker-id", strconv.Itoa(workerID), "--snowflake-tags", "order,pay",
		"--fill", "orders.id=order", "--log-format", "json"}, extra...)
}

func waitReady(s *server) {
	s.t.Helper()
	s.waitFor("/readyz to answer 200", func() bool {
		code, _ := s.get("/readyz", "")
		return code == http.StatusOK
	})
}

func TestHTTPEndpoints(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	s := startServe(t, nil, serveArgs(t, dsn, 77)...)
	waitReady(s)

	// Segment IDs: plain text, strictly increasing, from the tag's range.
	var last int64
	for i := 0; i < 5; i++ {
		code, body := s.get("/api/segment/get/audit", "")
		id, err := strconv.ParseInt(body, 10, 64)
		if code != 200 || err != nil || id <= last || id < 2 || id > 101 {
			t.Fatalf("segment ID %d: %d %q", i, code, body)
		}
		last = id
	}
	if code, body := s.get("/api/segment/get/invoice", ""); code != 200 || body != "5001" {
		t.Errorf("first invoice ID = %d %q, want 5001", code, body)
	}
	if code, body := s.get("/api/segment/get/no-such-tag", ""); code != 404 || !strings.Contains(body, `unknown segment tag "no-such-tag"`) {
		t.Errorf("unknown segment tag = %d %q, want 404", code, body)
	}

	// Snowflake IDs: any key, our worker ID, a time of now.
	codec := snowflake.DefaultCodec()
	for _, key := range []string{"order", "whatever"} {
		code, body := s.get("/api/snowflake/get/"+key, "")
		id, err := strconv.ParseInt(body, 10, 64)
		if code != 200 || err != nil {
			t.Fatalf("snowflake %s: %d %q", key, code, body)
		}
		p := codec.Decompose(id)
		if p.Worker != 77 || time.Since(p.Time) > time.Minute || time.Until(p.Time) > time.Second {
			t.Errorf("snowflake ID %d decodes to %+v", id, p)
		}
		// /decodeSnowflakeId agrees with the codec.
		code, body = s.get("/decodeSnowflakeId?snowflakeId="+strconv.FormatInt(id, 10), "")
		var d struct {
			Timestamp int64  `json:"timestamp"`
			Worker    int64  `json:"worker"`
			Sequence  int64  `json:"sequence"`
			WorkerID  string `json:"workerId"`
		}
		if err := json.Unmarshal([]byte(body), &d); code != 200 || err != nil {
			t.Fatalf("decode: %d %q %v", code, body, err)
		}
		if d.Timestamp != p.Millis || d.Worker != 77 || d.Sequence != p.Sequence || d.WorkerID != "77" {
			t.Errorf("decode = %+v, want %+v", d, p)
		}
	}
	if code, _ := s.get("/decodeSnowflakeId?snowflakeId=x", ""); code != 400 {
		t.Errorf("decode of x = %d, want 400", code)
	}

	// /cache shows the two loaded tags with Leaf's field names.
	code, body := s.get("/cache", "")
	var cache []struct {
		Key    string `json:"key"`
		InitOk bool   `json:"initOk"`
		Step   int64  `json:"step"`
		Pos    int    `json:"pos"`
		Value0 int64  `json:"value0"`
		Max0   int64  `json:"max0"`
	}
	if err := json.Unmarshal([]byte(body), &cache); code != 200 || err != nil {
		t.Fatalf("/cache: %d %v %q", code, err, body)
	}
	byTag := map[string]int{}
	for i, c := range cache {
		byTag[c.Key] = i
	}
	if i, ok := byTag["audit"]; !ok || !cache[i].InitOk || cache[i].Step != 100 || cache[i].Max0 != 101 || cache[i].Value0 != last+1 {
		t.Errorf("/cache audit = %+v (last ID %d)", cache, last)
	}

	if code, body := s.get("/healthz", ""); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if code, body := s.get("/", ""); code != 200 || !strings.Contains(body, "<td>audit</td>") || !strings.Contains(body, `id="worker-id">77<`) {
		t.Errorf("status page = %d\n%s", code, body)
	}
}

func metricValue(t *testing.T, text, series string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestMetricsMove(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	s := startServe(t, nil, serveArgs(t, dsn, 5)...)
	waitReady(s)
	_, before := s.get("/metrics", "")
	for _, series := range []string{
		`leafproxy_build_info`, `leafproxy_worker_id 5`, `leafproxy_worker_id_held 1`, `leafproxy_client_connections 0`,
		`leafproxy_snowflake_sequence_exhausted_total 0`, `go_goroutines`, `process_resident_memory_bytes`,
	} {
		if !strings.Contains(before, series) {
			t.Errorf("/metrics lacks %s before traffic", series)
		}
	}
	for i := 0; i < 150; i++ { // more than one segment of audit (step 100)
		if code, body := s.get("/api/segment/get/audit", ""); code != 200 {
			t.Fatalf("segment: %d %s", code, body)
		}
	}
	for i := 0; i < 7; i++ {
		s.get("/api/snowflake/get/x", "")
	}
	s.get("/api/segment/get/nope", "")
	// A client connection through the proxy moves the connection counters.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, proxyURL(t, dsn, s.listen))
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 through the proxy: %v", err)
	}
	// A leaf_next answered by the proxy and an error of its own move the rewrite and
	// error counters.
	var id int64
	if err := conn.QueryRow(ctx, "SELECT leaf_next('audit')", pgx.QueryExecModeSimpleProtocol).Scan(&id); err != nil {
		t.Fatalf("leaf_next through the proxy: %v", err)
	}
	if _, err := conn.Exec(ctx, "SELECT leaf_next('nope')", pgx.QueryExecModeSimpleProtocol); err == nil {
		t.Fatal("leaf_next of an unknown tag succeeded")
	}
	_, during := s.get("/metrics", "")
	conn.Close(ctx)

	for _, tc := range []struct {
		series string
		min    float64
	}{
		{`leafproxy_ids_issued_total{engine="segment",tag="audit"}`, 150},
		{`leafproxy_ids_issued_total{engine="snowflake",tag=""}`, 7},
		{`leafproxy_segment_loads_total{result="ok",tag="audit"}`, 2},
		{`leafproxy_segment_load_duration_seconds_count{tag="audit"}`, 2},
		{`leafproxy_segment_buffer_remaining{tag="audit"}`, 1},
		{`leafproxy_segment_step{tag="audit"}`, 100},
		{`leafproxy_id_errors_total{engine="segment",reason="unknown_tag"}`, 1},
		{`leafproxy_client_connections`, 1},
		{`leafproxy_client_connections_total`, 1},
		{`leafproxy_rewrites_total{kind="fast_path"}`, 1},
		{`leafproxy_errors_total{sqlstate="42704"}`, 1},
	} {
		if got := metricValue(t, during, tc.series); got < tc.min {
			t.Errorf("%s = %v after traffic, want ≥ %v", tc.series, got, tc.min)
		}
	}
	s.waitFor("the connection gauge to drop back to 0", func() bool {
		_, after := s.get("/metrics", "")
		return metricValue(t, after, "leafproxy_client_connections") == 0
	})
}

func proxyURL(t *testing.T, dsn, listen string) string {
	t.Helper()
	at := strings.Index(dsn, "@")
	rest := dsn[at+1:]
	return dsn[:at+1] + listen + rest[strings.IndexAny(rest, "/?"):]
}

func TestToken(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	s := startServe(t, []string{"LEAFPROXY_HTTP_TOKEN=tok-123"}, serveArgs(t, dsn, 6)...)
	s.waitFor("ready with the token", func() bool {
		code, _ := s.get("/readyz", "tok-123")
		return code == 200
	})
	for _, path := range []string{"/", "/api/segment/get/audit", "/api/snowflake/get/x", "/decodeSnowflakeId?snowflakeId=1", "/cache", "/metrics", "/readyz"} {
		if code, _ := s.get(path, ""); code != http.StatusUnauthorized {
			t.Errorf("%s without token = %d, want 401", path, code)
		}
		if code, _ := s.get(path, "tok-12"); code != http.StatusUnauthorized {
			t.Errorf("%s with a wrong token = %d, want 401", path, code)
		}
		if code, _ := s.get(path, "tok-123"); code != http.StatusOK {
			t.Errorf("%s with the token = %d, want 200", path, code)
		}
	}
	if code, _ := s.get("/healthz", ""); code != 200 {
		t.Errorf("/healthz without token = %d, want 200", code)
	}
	// healthcheck reads the token from the same variable serve does.
	addr := strings.TrimPrefix(s.http, "http://")
	if r := leafproxy(t, []string{"LEAFPROXY_HTTP_TOKEN=tok-123"}, "healthcheck", "--http", addr); r.code != 0 || !strings.Contains(r.stdout, "ready") {
		t.Errorf("healthcheck with token: %+v", r)
	}
	if r := leafproxy(t, nil, "healthcheck", "--http", addr); r.code != 1 || !strings.Contains(r.stderr, "401") {
		t.Errorf("healthcheck without token: %+v", r)
	}
}

// TestPrecedenceThroughBinary: the admin server ends up where the flag says, not where
// the environment or the file say.
func TestPrecedenceThroughBinary(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	// The file's and the environment's addresses stay bound by the test, so serve can
	// only start if it did not try to use them.
	hold := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l.Addr().String()
	}
	fileHTTP, envHTTP, flagHTTP := hold(), hold(), freeAddr(t)
	file := writeFile(t, fmt.Sprintf("http: %s\nstore: %s\nworker-source: static\nworker-id: 9\nlog-format: json\n", fileHTTP, dsn))
	s := startServe(t, []string{"LEAFPROXY_HTTP=" + envHTTP, "LEAFPROXY_WORKER_ID=10"},
		"--config", file, "--http", flagHTTP, "--upstream", upstreamOf(t, dsn))
	waitReady(s)
	if s.http != "http://"+flagHTTP {
		t.Fatalf("test setup: %s", s.http)
	}
	// worker-id: env (10) over file (9).
	_, body := s.get("/api/snowflake/get/x", "")
	id, _ := strconv.ParseInt(body, 10, 64)
	if w := snowflake.DefaultCodec().Decompose(id).Worker; w != 10 {
		t.Errorf("worker ID %d, want 10 from LEAFPROXY_WORKER_ID over the file's 9", w)
	}
	// log-format from the file, where nothing else set it: every line is a JSON object.
	for _, line := range strings.Split(strings.TrimSpace(s.log.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("log line is not JSON although the file says log-format: json: %q", line)
		}
	}
}
