package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// counterGen hands out 1, 2, 3, … per tag and counts its batch calls.
type counterGen struct {
	mu      sync.Mutex
	next    map[string]int64
	batches int
}

func (g *counterGen) Next(_ context.Context, tag string) (int64, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.next == nil {
		g.next = map[string]int64{}
	}
	g.next[tag]++
	return g.next[tag], nil
}

func (g *counterGen) NextBatch(ctx context.Context, tag string, n int, dst []int64) ([]int64, error) {
	g.mu.Lock()
	g.batches++
	g.mu.Unlock()
	for range n {
		id, _ := g.Next(ctx, tag)
		dst = append(dst, id)
	}
	return dst, nil
}

func TestBatchEndpoints(t *testing.T) {
	o := fullOptions()
	seg, snow := &counterGen{}, &counterGen{}
	o.Segment, o.Snowflake, o.MaxBatch = seg, snow, 100
	srv := newTestServer(t, o)

	code, body, h := get(t, srv, "/api/segment/get/audit?count=5", "")
	if code != 200 || body != "1\n2\n3\n4\n5\n" || !strings.HasPrefix(h.Get("Content-Type"), "text/plain") {
		t.Fatalf("segment count=5: %d %q (%s)", code, body, h.Get("Content-Type"))
	}
	if seg.batches != 1 {
		t.Fatalf("the segment batch took %d batch calls, want 1", seg.batches)
	}
	code, body, _ = get(t, srv, "/api/snowflake/get/anything?count=3", "")
	if code != 200 || body != "1\n2\n3\n" {
		t.Fatalf("snowflake count=3: %d %q", code, body)
	}
	// Without count the answer stays Leaf's: the bare ID.
	if code, body, _ = get(t, srv, "/api/segment/get/audit", ""); code != 200 || body != "6" {
		t.Fatalf("without count: %d %q", code, body)
	}

	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/segment/get/audit?count=4", nil)
	req.Header.Set("Accept", "text/html, application/json;q=0.9")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err != nil || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("JSON: %v %q (%s)", err, raw, resp.Header.Get("Content-Type"))
	}
	if len(ids) != 4 || ids[0] != 7 || ids[3] != 10 {
		t.Fatalf("JSON IDs %v", ids)
	}

	for _, bad := range []string{"0", "-1", "101", "x", ""} {
		code, body, _ := get(t, srv, "/api/segment/get/audit?count="+bad, "")
		if code != 400 || !strings.Contains(body, "between 1 and 100") {
			t.Errorf("count=%q: %d %q", bad, code, body)
		}
	}
	// An engine without batches gets one Next per ID; errors keep their status.
	o.Segment = fakeGen{"audit": int64(1001)}
	srv = newTestServer(t, o)
	if code, body, _ := get(t, srv, "/api/segment/get/audit?count=2", ""); code != 200 || body != "1001\n1001\n" {
		t.Fatalf("fallback: %d %q", code, body)
	}
	if code, _, _ := get(t, srv, "/api/segment/get/nope?count=2", ""); code != 404 {
		t.Fatalf("unknown tag: %d", code)
	}
}
