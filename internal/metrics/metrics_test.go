package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/leafproxy/leafproxy/idgen"
)

type fakeGen struct{ err error }

func (g fakeGen) Next(_ context.Context, tag string) (int64, error) {
	if g.err != nil {
		return 0, g.err
	}
	return 42, nil
}

func TestHooksReachTheScrape(t *testing.T) {
	m := New("v-test", func() []BufferLevel { return []BufferLevel{{Tag: "audit", Remaining: 1900, Step: 1000}} })
	ctx := context.Background()
	seg := m.Counting("segment", fakeGen{})
	for i := 0; i < 3; i++ {
		if _, err := seg.Next(ctx, "audit"); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = m.Counting("snowflake", fakeGen{err: fmt.Errorf("x: %w", idgen.ErrClockBackwards)}).Next(ctx, "order")
	_, _ = m.Counting("segment", fakeGen{err: idgen.ErrUnknownTag}).Next(ctx, "nope")
	m.SegmentLoad("audit", 1000, 3*time.Millisecond, nil)
	m.SegmentLoad("audit", 0, time.Second, errors.New("down"))
	m.SegmentUnavailable("audit")
	m.TagRefresh(2, time.Millisecond, nil)
	m.GiveBack("audit", 700, nil)
	m.ClockBackwards(2*time.Millisecond, true)
	m.ClockBackwards(20*time.Millisecond, false)
	m.SequenceExhausted()
	m.WorkerAcquired(7)
	m.ConnOpened()
	m.ConnOpened()
	m.ConnClosed()
	m.Rejected("53300")
	m.Rewrite("fill")
	m.Error("42704")
	m.Error("42704")

	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`leafproxy_ids_issued_total{engine="segment",tag="audit"} 3`,
		`leafproxy_id_errors_total{engine="snowflake",reason="clock_backwards"} 1`,
		`leafproxy_id_errors_total{engine="segment",reason="unknown_tag"} 1`,
		`leafproxy_segment_loads_total{result="ok",tag="audit"} 1`,
		`leafproxy_segment_loads_total{result="error",tag="audit"} 1`,
		`leafproxy_segment_load_duration_seconds_count{tag="audit"} 2`,
		`leafproxy_segment_unavailable_total{tag="audit"} 1`,
		`leafproxy_segment_tag_refreshes_total{result="ok"} 1`,
		`leafproxy_segment_given_back_ids_total{tag="audit"} 700`,
		`leafproxy_segment_buffer_remaining{tag="audit"} 1900`,
		`leafproxy_segment_step{tag="audit"} 1000`,
		`leafproxy_snowflake_clock_backwards_total{outcome="waited"} 1`,
		`leafproxy_snowflake_clock_backwards_total{outcome="refused"} 1`,
		`leafproxy_snowflake_sequence_exhausted_total 1`,
		`leafproxy_worker_id 7`,
		`leafproxy_worker_id_held 1`,
		`leafproxy_worker_events_total{event="acquired"} 1`,
		`leafproxy_client_connections 1`,
		`leafproxy_client_connections_total 2`,
		`leafproxy_client_rejects_total{sqlstate="53300"} 1`,
		`leafproxy_rewrites_total{kind="fill"} 1`,
		`leafproxy_errors_total{sqlstate="42704"} 2`,
		`leafproxy_build_info{goversion=`,
		`go_goroutines`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "leafproxy_ids_issued_total" && len(f.GetMetric()) != 1 {
			t.Errorf("ids_issued series = %d, want 1 (errors are not counted as issued)", len(f.GetMetric()))
		}
	}
}

func TestWorkerState(t *testing.T) {
	m := New("v", nil)
	if got := value(t, m.workerID); got != -1 {
		t.Errorf("worker_id before acquire = %v", got)
	}
	m.WorkerAcquired(3)
	m.WorkerFenced(3)
	if got := value(t, m.workerHeld); got != 0 {
		t.Errorf("held after fence = %v", got)
	}
	m.WorkerRegained(3)
	if got := value(t, m.workerHeld); got != 1 {
		t.Errorf("held after regain = %v", got)
	}
	m.WorkerLost(3)
	if got := value(t, m.workerHeld); got != 0 {
		t.Errorf("held after loss = %v", got)
	}
}

func TestRateMeter(t *testing.T) {
	m := New("v", nil)
	r := m.NewRateMeter(10 * time.Second)
	t0 := time.Unix(1000, 0)
	if len(r.Rates()) != 0 {
		t.Fatal("rates before any sample")
	}
	r.Sample(t0)
	for i := 0; i < 50; i++ {
		m.Issued("segment", "audit")
	}
	r.Sample(t0.Add(5 * time.Second))
	if got := r.Rates()[Key{"segment", "audit"}]; got != 10 {
		t.Errorf("rate = %v, want 10/s", got)
	}
	// After the window slides past the burst, the rate falls to zero.
	r.Sample(t0.Add(20 * time.Second))
	r.Sample(t0.Add(31 * time.Second))
	if got := r.Rates()[Key{"segment", "audit"}]; got != 0 {
		t.Errorf("rate after the window = %v, want 0", got)
	}
}

func TestErrorReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{idgen.ErrUnknownTag, "unknown_tag"},
		{fmt.Errorf("wrapped: %w", idgen.ErrUnavailable), "unavailable"},
		{idgen.ErrWorkerNotHeld, "worker_not_held"},
		{idgen.ErrBadArgument, "bad_argument"},
		{context.DeadlineExceeded, "canceled"},
		{errors.New("boom"), "other"},
	} {
		if got := ErrorReason(tc.err); got != tc.want {
			t.Errorf("ErrorReason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

func BenchmarkCountingNext(b *testing.B) {
	m := New("v", nil)
	g := m.Counting("segment", fakeGen{})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = g.Next(ctx, "audit")
	}
}

func value(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var d dto.Metric
	if err := g.Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetGauge().GetValue()
}

func BenchmarkUncountedNext(b *testing.B) {
	var g idgen.Generator = fakeGen{}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = g.Next(ctx, "audit")
	}
}

// TestCountingConcurrentTags: goroutines that see new tags at the same time lose no counts.
func TestCountingConcurrentTags(t *testing.T) {
	m := New("v", nil)
	g := m.Counting("segment", fakeGen{})
	ctx := context.Background()
	const workers, perTag = 8, 500
	tags := []string{"a", "b", "c", "d", "e"}
	done := make(chan struct{})
	for w := 0; w < workers; w++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; i < perTag; i++ {
				for _, tag := range tags {
					if _, err := g.Next(ctx, tag); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	for w := 0; w < workers; w++ {
		<-done
	}
	totals := m.IssuedTotals()
	for _, tag := range tags {
		if got := totals[Key{"segment", tag}]; got != workers*perTag {
			t.Errorf("tag %s counted %d, want %d", tag, got, workers*perTag)
		}
	}
}

// tryGen answers TryNext with ok, and Next always.
type tryGen struct {
	fakeGen
	ok bool
}

func (g tryGen) TryNext(string) (int64, bool) { return 43, g.ok }

// TestCountingTryNext: the wrapper passes TryNext on, counts the IDs it issues and counts
// nothing, not even an error, when none was at hand; a generator without TryNext has none.
func TestCountingTryNext(t *testing.T) {
	m := New("v-test", nil)
	tests := []struct {
		name   string
		g      idgen.Generator
		wantOK bool
	}{
		{"at hand", tryGen{ok: true}, true},
		{"not at hand", tryGen{ok: false}, false},
		{"no TryNext", fakeGen{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := m.Counting("segment", tt.g)
			before := m.IssuedTotals()[Key{"segment", tt.name}]
			id, ok := idgen.TryNext(g, tt.name)
			if ok != tt.wantOK || (ok && id != 43) {
				t.Fatalf("TryNext = %d, %v; want ok %v", id, ok, tt.wantOK)
			}
			want := before
			if ok {
				want++
			}
			if got := m.IssuedTotals()[Key{"segment", tt.name}]; got != want {
				t.Fatalf("issued %d, want %d", got, want)
			}
		})
	}
}

// BenchmarkRewrite is the metric of one rewritten statement: an atomic add, no allocation.
func BenchmarkRewrite(b *testing.B) {
	m := New("test", nil)
	b.ReportAllocs()
	for range b.N {
		m.Rewrite("query")
	}
}

// TestCountingTagsSharingASlot: tags whose digests pick the same slot of the recent
// counters, counted in turn, each keep their own count; and a tag passed as a view of a
// buffer the caller then reuses for another tag is counted under the tag it was.
func TestCountingTagsSharingASlot(t *testing.T) {
	m := New("v", nil)
	g := m.Counting("segment", fakeGen{})
	ctx := context.Background()
	if recentSlot("a") != recentSlot("e") {
		t.Fatalf("test premise: slots of a and e differ (%d, %d)", recentSlot("a"), recentSlot("e"))
	}
	for range 3 {
		for _, tag := range []string{"a", "e", "e"} {
			if _, err := g.Next(ctx, tag); err != nil {
				t.Fatal(err)
			}
		}
	}
	buf := []byte("orders")
	view := unsafe.String(&buf[0], len(buf))
	if _, err := g.Next(ctx, view); err != nil {
		t.Fatal(err)
	}
	copy(buf, "events")
	if _, err := g.Next(ctx, view); err != nil {
		t.Fatal(err)
	}
	totals := m.IssuedTotals()
	for tag, want := range map[string]uint64{"a": 3, "e": 6, "orders": 1, "events": 1} {
		if got := totals[Key{"segment", tag}]; got != want {
			t.Errorf("tag %s counted %d, want %d (totals %v)", tag, got, want, totals)
		}
	}
}

// BenchmarkCountingNextTwoTags alternates two tags, as a proxy serving two does.
func BenchmarkCountingNextTwoTags(b *testing.B) {
	m := New("v", nil)
	g := m.Counting("segment", fakeGen{})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = g.Next(ctx, "order")
		_, _ = g.Next(ctx, "pay")
	}
}
