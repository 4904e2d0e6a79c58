package main

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

// seriesValue returns the value of the series named exactly series (name and labels as
// the text format writes them) in a scrape, and whether it is there.
func seriesValue(scrape, series string) (float64, bool) {
	for _, line := range strings.Split(scrape, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			return v, err == nil
		}
	}
	return 0, false
}

// TestRunwayFromTheStore: serve reads leaf_alloc and the lease table in the background and
// reports each tag's IDs left against its configured key type, the free worker IDs, the
// store's reachability, and when the snowflake time bits of its epoch run out.
func TestRunwayFromTheStore(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	args := serveArgs(t, dsn, 0, "--key-types", "invoice=integer,*=js")
	for i, a := range args {
		if a == "static" {
			args[i] = "postgres"
		}
	}
	s := startServe(t, nil, args...)
	waitReady(s)
	if code, _ := s.get("/api/segment/get/invoice", ""); code != 200 {
		t.Fatalf("segment ID: HTTP %d", code)
	}
	var scrape string
	s.waitFor("the runway figures of both tags", func() bool {
		_, scrape = s.get("/metrics", "")
		_, inv := seriesValue(scrape, `leafproxy_segment_ids_left{key_type="integer",tag="invoice"}`)
		_, aud := seriesValue(scrape, `leafproxy_segment_ids_left{key_type="js",tag="audit"}`)
		return inv && aud
	})
	for tag, limit := range map[string]float64{"invoice": math.MaxInt32, "audit": 1<<53 - 1} {
		maxID, _ := seriesValue(scrape, `leafproxy_segment_max_id{tag="`+tag+`"}`)
		kt := map[string]string{"invoice": "integer", "audit": "js"}[tag]
		left, _ := seriesValue(scrape, `leafproxy_segment_ids_left{key_type="`+kt+`",tag="`+tag+`"}`)
		if maxID < 1 || left != limit-maxID {
			t.Errorf("%s: max_id %v, ids left %v; want ids left = %v - max_id", tag, maxID, left, limit)
		}
		if secs, ok := seriesValue(scrape, `leafproxy_segment_seconds_left{key_type="`+kt+`",tag="`+tag+`"}`); !ok || secs <= 0 {
			t.Errorf("%s: seconds left %v (present %v)", tag, secs, ok)
		}
	}
	if up, _ := seriesValue(scrape, "leafproxy_store_up"); up != 1 {
		t.Errorf("store_up = %v, want 1", up)
	}
	// Leaf's epoch and 41 time bits end at 2080-07-10T17:30:30.209Z.
	if end, _ := seriesValue(scrape, "leafproxy_snowflake_exhaustion_timestamp_seconds"); end != 3487858230.209 {
		t.Errorf("snowflake exhaustion = %v, want 3487858230.209", end)
	}
	if capa, _ := seriesValue(scrape, "leafproxy_worker_ids_capacity"); capa != 1024 {
		t.Errorf("worker ID capacity = %v, want 1024", capa)
	}
	// The reading may predate this proxy's claim; the next one counts it.
	s.waitFor("the proxy's own lease to be counted", func() bool {
		_, scrape = s.get("/metrics", "")
		free, _ := seriesValue(scrape, "leafproxy_worker_ids_free")
		return free == 1023
	})
}
