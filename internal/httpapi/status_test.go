package httpapi

import (
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen/segment"
	"github.com/leafproxy/leafproxy/internal/health"
	"github.com/leafproxy/leafproxy/internal/metrics"
)

// TestStatusPageOperatorView: the dependencies with their last error, the clients, the
// errors by SQLSTATE over the last 5 minutes and hour, the history graphs, the per-tag
// range, last load and last error, and the lease.
func TestStatusPageOperatorView(t *testing.T) {
	now := time.Now()
	o := fullOptions()
	base := o.Status
	o.Status = func() Status {
		st := base()
		st.Health = []health.State{
			{Name: "upstream", Target: "127.0.0.1:5999", Checked: true, OK: false, Since: now.Add(-time.Minute), LastCheck: now,
				LastError: "dial tcp 127.0.0.1:5999: connect: connection refused", LastErrorAt: now},
			{Name: "store", Target: "127.0.0.1:5432/app", Checked: true, OK: true, Since: now.Add(-time.Hour), LastCheck: now},
		}
		st.ClientsOpen, st.ClientsTotal = 3, 41
		st.Lease = &LeaseStatus{Holder: "leafproxy@10.0.0.7:6432", ExpiresAt: now.Add(30 * time.Second), Renewed: now,
			Events: []LeaseEvent{{Name: "acquired", Count: 1, Last: now}, {Name: "fenced", Count: 2}}}
		return st
	}
	o.Cache = func() []segment.TagSnapshot {
		return []segment.TagSnapshot{{Tag: "audit", Initialized: true, Pos: 0, Step: 1000, LastLoad: now,
			LastError: "store: connection refused",
			Buffers:   [2]segment.SegmentSnapshot{{Start: 3001, Max: 4000, Value: 3101, Step: 1000, Idle: 900}}}}
	}
	sample := func(ago time.Duration, ids, loads uint64, errs, rejects map[string]uint64) metrics.HistorySample {
		return metrics.HistorySample{At: now.Add(-ago), IDs: ids, Loads: loads, Errors: errs, Rejects: rejects}
	}
	o.History = func() []metrics.HistorySample {
		return []metrics.HistorySample{
			sample(50*time.Minute, 0, 0, map[string]uint64{"42704": 0}, map[string]uint64{"08001": 0}),
			sample(10*time.Minute, 6000, 2, map[string]uint64{"42704": 4}, map[string]uint64{"08001": 1}),
			sample(0, 9000, 3, map[string]uint64{"42704": 5}, map[string]uint64{"08001": 7}),
		}
	}
	srv := newTestServer(t, o)
	_, body, _ := get(t, srv, "/", "")
	for _, want := range []string{
		`id="health-upstream"`, "127.0.0.1:5999", "unreachable", "dial tcp 127.0.0.1:5999: connect: connection refused",
		`id="health-store"`, "reachable",
		`id="clients-open">3 open, 41 accepted since start<`,
		// 42704: 1 in the last 5 minutes, 5 in the last hour; 08001: 6 and 7.
		`<td><code>42704</code></td><td>unknown tag</td><td>statement error</td><td class="num">1</td><td class="num">5</td><td class="num">5</td>`,
		`<td><code>08001</code></td><td>upstream unreachable</td><td>client refused</td><td class="num">6</td><td class="num">7</td><td class="num">7</td>`,
		`<svg id="graph-ids"`, `<svg id="graph-loads"`, `<svg id="graph-errors"`, "<polyline",
		"3001–4000", "store: connection refused",
		`id="lease-holder">leafproxy@10.0.0.7:6432<`, `id="lease-expires">`, `id="lease-renewed">`, `id="lease-events">acquired 1 (last ` + now.Format("15:04:05") + `); fenced 2</dd>`,
		`id="freshness">Generated at`, `<meta http-equiv="refresh" content="5">`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("page:\n%s", body)
	}
}

// TestStatusPageTagConflict: a tag that is both a snowflake tag and a leaf_alloc row is
// listed once, as snowflake, with the conflict said.
func TestStatusPageTagConflict(t *testing.T) {
	o := fullOptions()
	o.Cache = func() []segment.TagSnapshot {
		return []segment.TagSnapshot{{Tag: "audit"}, {Tag: "order"}}
	}
	base := o.Status
	o.Status = func() Status { st := base(); st.Conflicts = []string{"order"}; return st }
	srv := newTestServer(t, o)
	_, body, _ := get(t, srv, "/", "")
	if n := strings.Count(body, "<td>order</td>"); n != 1 {
		t.Errorf("tag order listed %d times, want once", n)
	}
	for _, want := range []string{"<td>order</td><td>snowflake</td>", "also a leaf_alloc row: ignored",
		"tag order is both a snowflake tag and a leaf_alloc row"} {
		if !strings.Contains(body, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
}

// TestHistoryGraphScale: the polyline spans the hour, with now at the right edge and the
// peak at the top.
func TestHistoryGraphScale(t *testing.T) {
	now := time.Now()
	g := drawGraph("g", "IDs per second", []point{{now.Add(-30 * time.Minute), 10}, {now, 20}}, now, "%.1f")
	m := regexp.MustCompile(`points="([^"]+)"`).FindStringSubmatch(string(g.SVG))
	if m == nil {
		t.Fatalf("no polyline in %s", g.SVG)
	}
	pts := strings.Fields(m[1])
	if len(pts) != 2 {
		t.Fatalf("points %q", m[1])
	}
	// plot: x from 34 to 316, y from 12 (peak) to 78 (zero).
	if pts[1] != "316.0,12.0" || pts[0] != "175.0,45.0" {
		t.Errorf("points %q, want 175.0,45.0 316.0,12.0", m[1])
	}
	if g.Caption != "IDs per second: now 20.0, peak 20.0" {
		t.Errorf("caption %q", g.Caption)
	}
	empty := drawGraph("g", "x", nil, now, "%.0f")
	if !strings.Contains(string(empty.SVG), "collecting samples") {
		t.Errorf("empty graph: %s", empty.SVG)
	}
}

// TestStatusPageRunway: how long each segment tag, the snowflake time bits and the worker
// IDs last, worded for a reader.
func TestStatusPageRunway(t *testing.T) {
	now := time.Now()
	o := fullOptions()
	base := o.Status
	o.Status = func() Status {
		st := base()
		st.Runway = &metrics.RunwaySnapshot{Read: true, ReadAt: now,
			Tags: []metrics.TagRunway{
				{Tag: "invoice", KeyType: metrics.KeyInteger, MaxID: 2_000_000_000, Left: 147_483_647, Rate: 20, SecondsLeft: 147_483_647.0 / 20},
				{Tag: "order", KeyType: metrics.KeyBigint, MaxID: 5000, Left: 1 << 40, SecondsLeft: math.Inf(1)},
			},
			Snowflake: &metrics.SnowflakeRunway{End: time.Date(2080, 7, 10, 17, 30, 30, 0, time.UTC), SecondsLeft: 54 * 365 * 86400},
			Workers:   &metrics.WorkerRunway{Free: 1020, Capacity: 1024},
		}
		return st
	}
	srv := newTestServer(t, o)
	_, body, _ := get(t, srv, "/", "")
	for _, want := range []string{
		`<td>segment tag invoice</td><td>integer</td><td class="num">2000000000</td><td class="num">147483647</td><td class="num">20.0/s</td><td>85 days</td>`,
		`<td>segment tag order</td><td>bigint</td>`, `<td>no consumption</td>`,
		`id="runway-snowflake"`, "until 2080-07-10", "54 years",
		`id="runway-workers"`, "1020 free",
		"Read from the store at " + now.Format("15:04:05"),
	} {
		if !strings.Contains(body, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("page:\n%s", body)
	}
}

func TestLasts(t *testing.T) {
	for _, c := range []struct {
		seconds float64
		want    string
	}{
		{math.Inf(1), "no consumption"}, {0, "used up"}, {-3, "used up"}, {59, "1 minute"}, {61, "2 minutes"},
		{7200, "2 hours"}, {3 * 86400, "3 days"}, {400 * 86400, "1 year"}, {800 * 86400, "2 years"},
	} {
		if got := lasts(c.seconds); got != c.want {
			t.Errorf("lasts(%v) = %q, want %q", c.seconds, got, c.want)
		}
	}
}
