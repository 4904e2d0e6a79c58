package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/internal/testenv"
)

// workerOf asks a proxy for a snowflake ID and returns its worker ID.
func workerOf(t *testing.T, s *server) int64 {
	t.Helper()
	code, body := s.get("/api/snowflake/get/x", "")
	id, err := strconv.ParseInt(body, 10, 64)
	if code != 200 || err != nil {
		t.Fatalf("snowflake ID: %d %q", code, body)
	}
	return snowflake.DefaultCodec().Decompose(id).Worker
}

// TestWorkerSources runs serve with each non-static worker source: the default (the
// PostgreSQL lease, as no zk is given) and ZooKeeper. Two proxies never share a worker ID,
// and the status page and metrics name the source.
func TestWorkerSources(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	base := []string{"--store", dsn, "--upstream", upstreamOf(t, dsn), "--upstream-sslmode", "disable"}
	for _, tc := range []struct {
		name, source string
		extra        func(t *testing.T) []string
	}{
		{"default is the postgres lease", "postgres", func(*testing.T) []string { return nil }},
		{"zookeeper", "zookeeper", func(t *testing.T) []string {
			// zk alone selects the zookeeper source.
			return []string{"--zk", testenv.ZooKeeperAddr(t), "--zk-name", "cmdtest-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			extra := tc.extra(t)
			a := startServe(t, nil, append(append([]string{}, base...), extra...)...)
			b := startServe(t, nil, append(append([]string{}, base...), extra...)...)
			waitReady(a)
			waitReady(b)
			wa, wb := workerOf(t, a), workerOf(t, b)
			if wa == wb {
				t.Errorf("both proxies use worker ID %d", wa)
			}
			for _, s := range []*server{a, b} {
				if _, body := s.get("/", ""); !strings.Contains(body, `id="worker-source">`+tc.source+`<`) {
					t.Errorf("status page does not name the %s source", tc.source)
				}
				_, m := s.get("/metrics", "")
				if metricValue(t, m, "leafproxy_worker_id_held") != 1 {
					t.Errorf("leafproxy_worker_id_held is not 1")
				}
			}
			if got := metricValue(t, mustGet(t, a, "/metrics"), "leafproxy_worker_id"); got != float64(wa) {
				t.Errorf("leafproxy_worker_id = %v, IDs carry %d", got, wa)
			}
		})
	}
}

func mustGet(t *testing.T, s *server, path string) string {
	t.Helper()
	code, body := s.get(path, "")
	if code != 200 {
		t.Fatalf("GET %s: %d %q", path, code, body)
	}
	return body
}
