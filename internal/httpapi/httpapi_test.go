package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/segment"
	"github.com/leafproxy/leafproxy/internal/metrics"
)

// fakeGen answers from a table: a tag maps to an ID or an error.
type fakeGen map[string]any

func (g fakeGen) Next(_ context.Context, tag string) (int64, error) {
	switch v := g[tag].(type) {
	case int64:
		return v, nil
	case error:
		return 0, v
	}
	return 0, fmt.Errorf("%w: %q", idgen.ErrUnknownTag, tag)
}

func newTestServer(t *testing.T, o Options) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(New(o))
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, srv *httptest.Server, path, token string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header
}

func fullOptions() Options {
	m := metrics.New("test", nil)
	return Options{
		Segment:   fakeGen{"audit": int64(1001), "down": fmt.Errorf("x: %w", idgen.ErrUnavailable)},
		Snowflake: fakeGen{"": int64(1 << 40)},
		Decode: func(id int64) Decoded {
			return Decoded{ID: id, Timestamp: 1700000000000, Time: time.UnixMilli(1700000000000).UTC(), Worker: 3, Sequence: 9, WorkerID: "3", SequenceID: "9"}
		},
		Cache: func() []segment.TagSnapshot {
			return []segment.TagSnapshot{{Tag: "audit", Initialized: true, Pos: 1, NextReady: true, Step: 1000, MinStep: 1000, Loads: 2,
				Buffers: [2]segment.SegmentSnapshot{{Start: 2001, Max: 3000, Value: 2001, Step: 1000, Idle: 1000}, {Start: 1001, Max: 2000, Value: 1101, Step: 1000, Idle: 900}}}}
		},
		Status: func() Status {
			return Status{Version: "v-test", Listen: "127.0.0.1:6432", Upstream: "127.0.0.1:5432", SnowflakeTags: []string{"order"},
				FillRules: []string{"orders.id=order"},
				Snowflake: &SnowflakeStatus{Source: "postgres", WorkerID: 17, Held: true, Layout: "41/10/12", Epoch: time.UnixMilli(1288834974657)}}
		},
		Rates: func() map[metrics.Key]float64 {
			return map[metrics.Key]float64{{Engine: "segment", Tag: "audit"}: 12.5}
		},
		Totals:         func() map[metrics.Key]uint64 { return map[metrics.Key]uint64{{Engine: "segment", Tag: "audit"}: 100} },
		Ready:          func(context.Context) error { return nil },
		Metrics:        m.Handler(),
		IsSnowflakeTag: func(tag string) bool { return tag == "order" },
	}
}

func TestEndpoints(t *testing.T) {
	srv := newTestServer(t, fullOptions())
	for _, tc := range []struct {
		path  string
		code  int
		body  string // substring
		ctype string
	}{
		{"/api/segment/get/audit", 200, "1001", "text/plain"},
		{"/api/segment/get/nope", 404, `unknown segment tag "nope": create it with "leafproxy tag add nope --step 1000"`, "text/plain"},
		{"/api/segment/get/order", 404, `"order" is a snowflake tag: ask /api/snowflake/get/order`, "text/plain"},
		{"/api/segment/get/down", 500, "cannot issue a segment ID now, the ID source is unavailable: x (see /readyz)", "text/plain"},
		{"/api/snowflake/get/anything", 200, "1099511627776", "text/plain"},
		{"/decodeSnowflakeId?snowflakeId=42", 200, `"worker": 3`, "application/json"},
		{"/decodeSnowflakeId?snowflakeId=abc", 400, "non-negative", "text/plain"},
		{"/decodeSnowflakeId?snowflakeId=-1", 400, "non-negative", "text/plain"},
		{"/cache", 200, `"key": "audit"`, "application/json"},
		{"/healthz", 200, "ok", "text/plain"},
		{"/readyz", 200, "ready", "text/plain"},
		{"/metrics", 200, "leafproxy_build_info", "text/plain"},
		{"/", 200, "<td>audit</td>", "text/html"},
		{"/nope", 404, "", ""},
	} {
		code, body, h := get(t, srv, tc.path, "")
		if code != tc.code || !strings.Contains(body, tc.body) || !strings.HasPrefix(h.Get("Content-Type"), tc.ctype) {
			t.Errorf("GET %s = %d %q (%s); want %d containing %q (%s)", tc.path, code, body, h.Get("Content-Type"), tc.code, tc.body, tc.ctype)
		}
	}
	if code, body, _ := get(t, srv, "/api/segment/get/audit", ""); body != "1001" || code != 200 {
		t.Errorf("segment ID body must be exactly the ID, got %q", body)
	}
}

func TestCacheJSON(t *testing.T) {
	srv := newTestServer(t, fullOptions())
	_, body, _ := get(t, srv, "/cache", "")
	var got []map[string]any
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("cache = %s", body)
	}
	c := got[0]
	for k, want := range map[string]any{"key": "audit", "initOk": true, "pos": 1.0, "nextReady": true, "step": 1000.0,
		"value1": 1101.0, "max1": 2000.0, "value0": 2001.0, "max0": 3000.0} {
		if c[k] != want {
			t.Errorf("cache[%s] = %v, want %v", k, c[k], want)
		}
	}
	bufs := c["buffers"].([]any)
	if b := bufs[1].(map[string]any); b["idle"] != 900.0 || b["start"] != 1001.0 {
		t.Errorf("buffer 1 = %v", b)
	}
}

func TestToken(t *testing.T) {
	o := fullOptions()
	o.Token = "s3cret"
	srv := newTestServer(t, o)
	for _, path := range []string{"/", "/api/segment/get/audit", "/api/snowflake/get/x", "/cache", "/metrics", "/readyz", "/decodeSnowflakeId?snowflakeId=1"} {
		if code, _, h := get(t, srv, path, ""); code != http.StatusUnauthorized || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("GET %s without token = %d", path, code)
		}
		if code, _, _ := get(t, srv, path, "wrong"); code != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong token = %d", path, code)
		}
		if code, _, _ := get(t, srv, path, "s3cret"); code != http.StatusOK {
			t.Errorf("GET %s with the token = %d", path, code)
		}
	}
	if code, _, _ := get(t, srv, "/healthz", ""); code != http.StatusOK {
		t.Errorf("/healthz must not need the token, got %d", code)
	}
	// A prefix of the token is not the token.
	if code, _, _ := get(t, srv, "/cache", "s3cre"); code != http.StatusUnauthorized {
		t.Errorf("token prefix accepted: %d", code)
	}
}

func TestNotReady(t *testing.T) {
	o := fullOptions()
	o.Ready = func(context.Context) error {
		return errors.New("upstream 127.0.0.1:1 unreachable; store unreachable and no segment IDs buffered")
	}
	srv := newTestServer(t, o)
	if code, body, _ := get(t, srv, "/readyz", ""); code != 503 || !strings.Contains(body, "store unreachable") {
		t.Errorf("/readyz = %d %q", code, body)
	}
	_, body, _ := get(t, srv, "/", "")
	for _, want := range []string{`id="ready">not ready<`,
		"<li>upstream 127.0.0.1:1 unreachable</li><li>store unreachable and no segment IDs buffered</li>"} {
		if !strings.Contains(body, want) {
			t.Errorf("status page lacks %q:\n%s", want, body)
		}
	}
}

func TestNothingConfigured(t *testing.T) {
	srv := newTestServer(t, Options{})
	for _, path := range []string{"/api/segment/get/a", "/api/snowflake/get/a", "/decodeSnowflakeId?snowflakeId=1", "/cache", "/metrics", "/readyz"} {
		if code, _, _ := get(t, srv, path, ""); code != http.StatusServiceUnavailable {
			t.Errorf("GET %s with nothing configured = %d, want 503", path, code)
		}
	}
	if code, body, _ := get(t, srv, "/", ""); code != 200 || !strings.Contains(body, "no tags yet") {
		t.Errorf("empty status page = %d %q", code, body)
	}
}

func TestStatusPage(t *testing.T) {
	o := fullOptions()
	o.Totals = func() map[metrics.Key]uint64 {
		return map[metrics.Key]uint64{{Engine: "segment", Tag: "audit"}: 100, {Engine: "snowflake", Tag: "order"}: 7, {Engine: "snowflake"}: 3}
	}
	srv := newTestServer(t, o)
	_, body, _ := get(t, srv, "/", "")
	for _, want := range []string{
		"<td>audit</td><td>segment</td>", "<td>order</td><td>snowflake</td>", "(untagged)",
		`id="worker-id">17<`, `id="worker-source">postgres<`, "900 left", "1000 ready",
		"12.5", "orders.id=order", "v-test", "<style>",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
	for _, bad := range []string{"<script", "http://", "https://"} {
		if strings.Contains(body, bad) {
			t.Errorf("status page contains %q (no external assets or scripts)", bad)
		}
	}
}

func TestRemaining(t *testing.T) {
	s := segment.TagSnapshot{Pos: 0, Buffers: [2]segment.SegmentSnapshot{{Idle: 10}, {Idle: 500}}}
	if got := Remaining(s); got != 10 {
		t.Errorf("Remaining without next = %d", got)
	}
	s.NextReady = true
	if got := Remaining(s); got != 510 {
		t.Errorf("Remaining with next = %d", got)
	}
}

func TestExtraHandlers(t *testing.T) {
	o := fullOptions()
	o.Token = "t"
	o.Extra = map[string]http.Handler{"POST /debug/x": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "extra")
	})}
	srv := newTestServer(t, o)
	post := func(token string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/debug/x", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(""); code != http.StatusUnauthorized {
		t.Errorf("extra handler without token = %d", code)
	}
	if code := post("t"); code != http.StatusOK {
		t.Errorf("extra handler with token = %d", code)
	}
	if code, _, _ := get(t, srv, "/debug/x", "t"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET on a POST pattern = %d", code)
	}
}

// TestIDFailureMessages: each engine failure over HTTP says what happened in words, with
// the engine's account and no Go package names.
func TestIDFailureMessages(t *testing.T) {
	o := fullOptions()
	o.Segment = fakeGen{
		"back": fmt.Errorf("%w: by 2s (the engine waits out at most 5ms)", idgen.ErrClockBackwards),
		"held": fmt.Errorf("%w: the lease on worker 7 could not be renewed", idgen.ErrWorkerNotHeld),
		"down": fmt.Errorf("segment: reload tags: %w", idgen.ErrUnavailable),
	}
	srv := newTestServer(t, o)
	for path, want := range map[string]string{
		"/api/segment/get/back": "cannot issue a segment ID now, the clock moved backwards: by 2s (the engine waits out at most 5ms) (see /readyz)\n",
		"/api/segment/get/held": "cannot issue a segment ID now, this proxy does not hold its worker ID: the lease on worker 7 could not be renewed (see /readyz)\n",
		"/api/segment/get/down": "cannot issue a segment ID now, the ID source is unavailable: reload tags (see /readyz)\n",
	} {
		if code, body, _ := get(t, srv, path, ""); code != 500 || body != want {
			t.Errorf("GET %s = %d %q, want 500 %q", path, code, body, want)
		}
	}
}
