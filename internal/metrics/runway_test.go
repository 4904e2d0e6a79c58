package metrics

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeStore is the store as the runway reader sees it; a test moves its clock and rows.
type fakeStore struct {
	mu         sync.Mutex
	now        time.Time
	tags       map[string]int64
	free, capa int64
	err        error
}

func (f *fakeStore) Now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now }

func (f *fakeStore) advance(d time.Duration, tag string, ids int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	if tag != "" {
		f.tags[tag] += ids
	}
}

func (f *fakeStore) set(fn func(*fakeStore)) { f.mu.Lock(); defer f.mu.Unlock(); fn(f) }

func (f *fakeStore) readTags(context.Context) ([]TagMax, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	var out []TagMax
	for tag, m := range f.tags {
		out = append(out, TagMax{Tag: tag, MaxID: m})
	}
	return out, nil
}

func (f *fakeStore) readWorkers(context.Context) (int64, int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.free, f.capa, f.err
}

func newRunwayFixture(t *testing.T) (*Metrics, *Runway, *fakeStore) {
	t.Helper()
	st := &fakeStore{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		tags: map[string]int64{"order": 1, "small": math.MaxInt32 - 1_000_000, "web": 1}, free: 1020, capa: 1024}
	m := New("v", nil)
	r := m.NewRunway(RunwaySettings{
		ReadTags:     st.readTags,
		ReadWorkers:  st.readWorkers,
		KeyTypes:     map[string]KeyType{"small": KeyInteger, "web": KeyJS},
		SnowflakeEnd: time.Date(2080, 9, 6, 15, 47, 35, 552_000_000, time.UTC),
		Window:       time.Hour,
		Now:          st.Now,
	})
	return m, r, st
}

// TestRunwayBeforeFirstReading: the gauges exist from the start; what is unknown is NaN.
func TestRunwayBeforeFirstReading(t *testing.T) {
	m, _, st := newRunwayFixture(t)
	text := gatherText(t, m)
	for _, want := range []string{
		"leafproxy_store_up NaN",
		"leafproxy_worker_ids_free NaN",
		"leafproxy_worker_ids_capacity NaN",
		"leafproxy_snowflake_exhaustion_timestamp_seconds 3.492863255552e+09",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("scrape lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "leafproxy_segment_ids_left") {
		t.Error("per-tag runway before any reading of the tags")
	}
	if got, want := st.Now(), time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Fatalf("fixture clock moved: %v", got)
	}
}

// TestRunwaySegment: remaining IDs against each key type's maximum, the rate from max_id's
// advance over the window, and the seconds left at that rate.
func TestRunwaySegment(t *testing.T) {
	m, r, st := newRunwayFixture(t)
	ctx := context.Background()
	r.ReadNow(ctx)
	snap := r.Snapshot()
	if !snap.Read || !snap.StoreUp || len(snap.Tags) != 3 {
		t.Fatalf("first reading: %+v", snap)
	}
	for _, tr := range snap.Tags {
		if tr.Rate != 0 || !math.IsInf(tr.SecondsLeft, 1) {
			t.Errorf("%s after one reading: rate %v, seconds left %v; want 0 and +Inf", tr.Tag, tr.Rate, tr.SecondsLeft)
		}
	}
	// 10 minutes later "small" advanced by 60,000 (100/s), "web" by 6,000,000 (10,000/s).
	st.advance(5*time.Minute, "small", 30_000)
	st.advance(0, "web", 3_000_000)
	r.ReadNow(ctx)
	st.advance(5*time.Minute, "small", 30_000)
	st.advance(0, "web", 3_000_000)
	r.ReadNow(ctx)
	byTag := map[string]TagRunway{}
	for _, tr := range r.Snapshot().Tags {
		byTag[tr.Tag] = tr
	}
	small := byTag["small"]
	if small.KeyType != KeyInteger || small.Limit != math.MaxInt32 || small.Left != 1_000_000-60_000 {
		t.Errorf("small: %+v", small)
	}
	if small.Rate != 100 || small.SecondsLeft != 9400 || small.Over != 10*time.Minute {
		t.Errorf("small: rate %v over %v, seconds left %v; want 100/s over 10m, 9400 s", small.Rate, small.Over, small.SecondsLeft)
	}
	web := byTag["web"]
	if web.KeyType != KeyJS || web.Left != (1<<53-1)-6_000_001 || web.Rate != 10_000 {
		t.Errorf("web: %+v", web)
	}
	if order := byTag["order"]; order.KeyType != KeyBigint || order.Left != math.MaxInt64-1 || !math.IsInf(order.SecondsLeft, 1) {
		t.Errorf("order (idle bigint): %+v", order)
	}

	text := gatherText(t, m)
	for _, want := range []string{
		`leafproxy_segment_ids_left{key_type="integer",tag="small"} 940000`,
		`leafproxy_segment_seconds_left{key_type="integer",tag="small"} 9400`,
		`leafproxy_segment_consumption_rate{tag="small"} 100`,
		`leafproxy_segment_max_id{tag="small"} 2.146543647e+09`,
		`leafproxy_segment_seconds_left{key_type="bigint",tag="order"} +Inf`,
		`leafproxy_segment_consumption_rate{tag="web"} 10000`,
		"leafproxy_store_up 1",
		"leafproxy_worker_ids_free 1020",
		"leafproxy_worker_ids_capacity 1024",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}

	// The burst ends: once the window has slid past it, the rate is zero and the runway
	// endless again.
	for i := 0; i < 5; i++ {
		st.advance(15*time.Minute, "", 0)
		r.ReadNow(ctx)
	}
	for _, tr := range r.Snapshot().Tags {
		if tr.Tag == "small" && (tr.Rate != 0 || !math.IsInf(tr.SecondsLeft, 1) || tr.Over < time.Hour) {
			t.Errorf("small after the window slid past the burst: %+v", tr)
		}
	}
}

// TestRunwayExhausted: a tag beyond its key type's maximum has nothing left, now.
func TestRunwayExhausted(t *testing.T) {
	_, r, st := newRunwayFixture(t)
	st.set(func(f *fakeStore) { f.tags["small"] = math.MaxInt32 + 5 })
	r.ReadNow(context.Background())
	for _, tr := range r.Snapshot().Tags {
		if tr.Tag == "small" && (tr.Left != 0 || tr.SecondsLeft != 0) {
			t.Errorf("small beyond 2^31-1: left %d, seconds %v; want 0, 0", tr.Left, tr.SecondsLeft)
		}
	}
}

// TestRunwayGiveBack: max_id stepping back (a proxy returning its unused tail) counts as
// the net advance, never as a negative rate.
func TestRunwayGiveBack(t *testing.T) {
	_, r, st := newRunwayFixture(t)
	ctx := context.Background()
	r.ReadNow(ctx)
	st.advance(time.Minute, "order", 6000)
	r.ReadNow(ctx)
	st.advance(time.Minute, "order", -3000)
	r.ReadNow(ctx)
	for _, tr := range r.Snapshot().Tags {
		if tr.Tag == "order" && tr.Rate != 25 {
			t.Errorf("order: rate %v, want 25/s (3000 net over 2 minutes)", tr.Rate)
		}
	}
	st.advance(time.Minute, "order", -3000)
	r.ReadNow(ctx)
	for _, tr := range r.Snapshot().Tags {
		if tr.Tag == "order" && (tr.Rate != 0 || !math.IsInf(tr.SecondsLeft, 1)) {
			t.Errorf("order back at its start: rate %v, seconds %v; want 0, +Inf", tr.Rate, tr.SecondsLeft)
		}
	}
}

// TestRunwayStoreDown: a failed reading sets store_up to 0 and keeps the last figures (an
// outage does not make the IDs last longer); a tag deleted from leaf_alloc goes away.
func TestRunwayStoreDown(t *testing.T) {
	m, r, st := newRunwayFixture(t)
	ctx := context.Background()
	r.ReadNow(ctx)
	st.set(func(f *fakeStore) { f.err = errors.New("connection refused") })
	st.advance(time.Minute, "", 0)
	r.ReadNow(ctx)
	snap := r.Snapshot()
	if !snap.Read || snap.StoreUp || snap.LastError != "connection refused" || len(snap.Tags) != 3 || snap.Workers == nil || snap.Workers.Free != 1020 {
		t.Errorf("after a failed reading: %+v", snap)
	}
	if text := gatherText(t, m); !strings.Contains(text, "leafproxy_store_up 0\n") {
		t.Errorf("store_up is not 0:\n%s", text)
	}
	st.set(func(f *fakeStore) { f.err = nil; delete(f.tags, "web"); f.free = 3 })
	r.ReadNow(ctx)
	snap = r.Snapshot()
	if !snap.StoreUp || snap.LastError != "" || len(snap.Tags) != 2 || snap.Workers.Free != 3 {
		t.Errorf("after the store came back: %+v", snap)
	}
}

// TestRunwaySnowflake: the seconds left count down to the end of the time bits, and stay
// at zero after it.
func TestRunwaySnowflake(t *testing.T) {
	_, r, st := newRunwayFixture(t)
	end := time.Date(2080, 9, 6, 15, 47, 35, 552_000_000, time.UTC)
	if got, want := r.Snapshot().Snowflake.SecondsLeft, end.Sub(st.Now()).Seconds(); got != want {
		t.Errorf("seconds left = %v, want %v", got, want)
	}
	st.set(func(f *fakeStore) { f.now = end.Add(time.Hour) })
	if got := r.Snapshot().Snowflake.SecondsLeft; got != 0 {
		t.Errorf("seconds left after the end = %v, want 0", got)
	}
}

// TestRunwayRunStops: Run reads at once and returns when its context ends.
func TestRunwayRunStops(t *testing.T) {
	_, r, _ := newRunwayFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	deadline := time.Now().Add(30 * time.Second)
	for !r.Snapshot().Read {
		if time.Now().After(deadline) {
			t.Fatal("no reading within 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestParseKeyType(t *testing.T) {
	for in, want := range map[string]KeyType{"bigint": KeyBigint, "INT8": KeyBigint, "integer": KeyInteger,
		"int4": KeyInteger, "js": KeyJS, " javascript ": KeyJS} {
		if got, err := ParseKeyType(in); err != nil || got != want {
			t.Errorf("ParseKeyType(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseKeyType("smallint"); err == nil {
		t.Error("smallint accepted")
	}
	if KeyJS.Max() != 9007199254740991 || KeyInteger.Max() != 2147483647 || KeyBigint.Max() != math.MaxInt64 {
		t.Error("key type maxima")
	}
}

func gatherText(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// TestAlertRulesNameRealMetrics: every leafproxy_* metric the shipped alert rules use is
// one this package exports, so a renamed metric cannot leave a rule silently empty.
func TestAlertRulesNameRealMetrics(t *testing.T) {
	rules, err := os.ReadFile(filepath.Join("..", "..", "deploy", "prometheus", "leafproxy-alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	m, r, _ := newRunwayFixture(t)
	r.ReadNow(context.Background())
	m.SegmentLoad("audit", 10, time.Millisecond, nil)
	m.SegmentLoad("audit", 0, time.Millisecond, errors.New("down"))
	m.ClockBackwards(time.Second, false)
	m.WorkerAcquired(1)
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
	}
	used := regexp.MustCompile(`\bleafproxy_[a-z_]+`).FindAllString(string(rules), -1)
	if len(used) < 7 {
		t.Fatalf("the rules name only %v", used)
	}
	for _, name := range used {
		if !exported[name] {
			t.Errorf("the alert rules use %s, which leafproxy does not export", name)
		}
	}
}

// TestRunwayStoreStateFromProbe: with a health probe, store_up follows the probe, not the
// slower runway readings.
func TestRunwayStoreStateFromProbe(t *testing.T) {
	st := &fakeStore{now: time.Unix(0, 0), tags: map[string]int64{}}
	var mu sync.Mutex
	checked, ok := false, false
	m := New("v", nil)
	r := m.NewRunway(RunwaySettings{ReadTags: st.readTags, Now: st.Now,
		StoreState: func() (bool, bool) { mu.Lock(); defer mu.Unlock(); return checked, ok }})
	r.ReadNow(context.Background()) // the reading succeeds, but the probe has not checked
	if text := gatherText(t, m); !strings.Contains(text, "leafproxy_store_up NaN") {
		t.Errorf("store_up before the probe's first check is not NaN:\n%s", text)
	}
	mu.Lock()
	checked = true
	mu.Unlock()
	if text := gatherText(t, m); !strings.Contains(text, "leafproxy_store_up 0\n") {
		t.Errorf("store_up with the probe failing is not 0:\n%s", text)
	}
	mu.Lock()
	ok = true
	mu.Unlock()
	if snap := r.Snapshot(); !snap.StoreChecked || !snap.StoreUp {
		t.Errorf("snapshot with the probe succeeding: %+v", snap)
	}
}
