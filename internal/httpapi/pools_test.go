package httpapi

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/leafproxy/leafproxy/proxy/pool"
)

func TestPools(t *testing.T) {
	srv := newTestServer(t, Options{Pools: func() []pool.Stats {
		return []pool.Stats{{Database: "app", User: "alice", ServersIdle: 2, PoolSize: 5}}
	}})
	code, body, _ := get(t, srv, "/pools", "")
	var got struct{ Pools []pool.Stats }
	if err := json.Unmarshal([]byte(body), &got); code != http.StatusOK || err != nil {
		t.Fatalf("/pools: %d %v\n%s", code, err, body)
	}
	if len(got.Pools) != 1 || got.Pools[0].Database != "app" || got.Pools[0].ServersIdle != 2 {
		t.Fatalf("/pools: %+v", got.Pools)
	}
	off := newTestServer(t, Options{})
	if code, _, _ := get(t, off, "/pools", ""); code != http.StatusServiceUnavailable {
		t.Fatalf("/pools without pools: %d, want 503", code)
	}
}
