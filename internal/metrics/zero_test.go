package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestSeriesExistAtZero: the series an alert watches exist before their first event, at
// zero, for every known label value; per-tag series appear at zero once the tags are known.
func TestSeriesExistAtZero(t *testing.T) {
	m := New("v-test", nil)
	text := scrape(t, m)
	want := []string{
		`leafproxy_snowflake_clock_backwards_total{outcome="refused"} 0`,
		`leafproxy_snowflake_clock_backwards_total{outcome="waited"} 0`,
		`leafproxy_snowflake_sequence_exhausted_total 0`,
		`leafproxy_segment_tag_refreshes_total{result="error"} 0`,
		`leafproxy_id_errors_total{engine="snowflake",reason="clock_backwards"} 0`,
		`leafproxy_id_errors_total{engine="segment",reason="unavailable"} 0`,
		`leafproxy_worker_id_held 0`,
		`leafproxy_worker_id -1`,
		`leafproxy_client_connections 0`,
		`leafproxy_client_connections_total 0`,
		`leafproxy_rewrites_total{kind="fast_path"} 0`,
	}
	for _, c := range StatementSQLStates {
		want = append(want, `leafproxy_errors_total{sqlstate="`+c+`"} 0`)
	}
	for _, c := range StartupSQLStates {
		want = append(want, `leafproxy_client_rejects_total{sqlstate="`+c+`"} 0`)
	}
	for _, e := range WorkerEvents {
		want = append(want, `leafproxy_worker_events_total{event="`+e+`"} 0`)
	}
	for _, w := range want {
		if !strings.Contains(text, w+"\n") {
			t.Errorf("scrape at start lacks %s", w)
		}
	}

	m.KnownTags([]string{"audit"}, []string{"order"})
	text = scrape(t, m)
	for _, w := range []string{
		`leafproxy_ids_issued_total{engine="segment",tag="audit"} 0`,
		`leafproxy_ids_issued_total{engine="snowflake",tag="order"} 0`,
		`leafproxy_segment_loads_total{result="error",tag="audit"} 0`,
		`leafproxy_segment_unavailable_total{tag="audit"} 0`,
	} {
		if !strings.Contains(text, w+"\n") {
			t.Errorf("scrape after KnownTags lacks %s", w)
		}
	}
	// Counting on a touched series continues from zero.
	m.Error("42704")
	m.ClockBackwards(time.Second, false)
	text = scrape(t, m)
	for _, w := range []string{`leafproxy_errors_total{sqlstate="42704"} 1`, `leafproxy_snowflake_clock_backwards_total{outcome="refused"} 1`} {
		if !strings.Contains(text, w+"\n") {
			t.Errorf("scrape lacks %s", w)
		}
	}
}

func TestHistoryRing(t *testing.T) {
	h := NewHistory(3)
	t0 := time.Unix(1000, 0)
	for i := range 5 {
		h.Add(HistorySample{At: t0.Add(time.Duration(i) * time.Second), IDs: uint64(i)})
	}
	got := h.Samples()
	if len(got) != 3 || got[0].IDs != 2 || got[2].IDs != 4 {
		t.Errorf("samples %+v, want the newest three, oldest first", got)
	}
	m := New("v", nil)
	m.Error("58000")
	m.Rejected("08001")
	m.SegmentLoad("a", 10, time.Millisecond, nil)
	m.SegmentLoad("a", 0, time.Millisecond, io.EOF)
	s := m.Snapshot(t0)
	if s.Errors["58000"] != 1 || s.Rejects["08001"] != 1 || s.Loads != 1 || s.LoadErrors != 1 {
		t.Errorf("snapshot %+v", s)
	}
}
