package httpapi

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

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

// TestStatusPagePools: the status page has a row per pool with its figures; a
// transaction pool's rates wait for a second look, a session pool has none.
func TestStatusPagePools(t *testing.T) {
	o := fullOptions()
	o.Pools = func() []pool.Stats {
		return []pool.Stats{
			{Database: "app", User: "alice", Mode: "transaction", ClientsActive: 3, ClientsWaiting: 2, MaxWait: 1500 * time.Millisecond,
				ServersActive: 3, ServersIdle: 1, ServersUsed: 1, ServersLogin: 1, PoolSize: 6, Transactions: 70, Queries: 90,
				WaitTime: 4 * time.Second, WaitTimeouts: 5},
			{Database: "app", User: "bob", Mode: "session", ClientsActive: 4, ServersActive: 4, ServersIdle: 2, PoolSize: 8},
		}
	}
	srv := newTestServer(t, o)
	_, body, _ := get(t, srv, "/", "")
	for _, want := range []string{
		`<table id="pools">`,
		`<tr class="pool"><td>app</td><td>alice</td><td>transaction</td><td class="num">3</td><td class="num">2</td><td class="num">1.5s</td><td class="num">3</td><td class="num">1</td><td class="num">1</td><td class="num">1</td><td class="num">6</td><td class="num muted">next look</td><td class="num muted">next look</td><td class="num">4s</td><td class="num">5</td></tr>`,
		`<tr class="pool"><td>app</td><td>bob</td><td>session</td><td class="num">4</td><td class="num">0</td><td class="num">0s</td><td class="num">4</td><td class="num">2</td><td class="num">0</td><td class="num">0</td><td class="num">8</td><td class="num">—</td><td class="num">—</td>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("page:\n%s", body)
	}

	_, body, _ = get(t, newTestServer(t, fullOptions()), "/", "")
	if strings.Contains(body, "<h2>Pools</h2>") {
		t.Errorf("status page of a proxy without pool figures has a Pools section")
	}
}

// TestPoolRates: rates come from the totals of two looks at least a second apart; a look
// sooner shows the last rates again, and a pool whose totals went back starts over.
func TestPoolRates(t *testing.T) {
	var r poolRates
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	look := func(at time.Duration, tx, q uint64) poolRow {
		t.Helper()
		rows := r.rows([]pool.Stats{{Database: "app", User: "alice", Mode: "transaction", Transactions: tx, Queries: q}}, t0.Add(at))
		if len(rows) != 1 {
			t.Fatalf("rows: %+v", rows)
		}
		return rows[0]
	}
	if row := look(0, 100, 300); row.Rated {
		t.Fatalf("first look rated: %+v", row)
	}
	if row := look(2*time.Second, 300, 500); !row.Rated || row.TxPerSecond != 100 || row.QPerSecond != 100 {
		t.Fatalf("second look: %+v, want 100 tx/s and 100 q/s", row)
	}
	if row := look(2500*time.Millisecond, 900, 900); !row.Rated || row.TxPerSecond != 100 {
		t.Fatalf("a look half a second later: %+v, want the last rates", row)
	}
	// Measured from the look at 2 s, the last one kept: 600 transactions in 2 s.
	if row := look(4*time.Second, 900, 900); !row.Rated || row.TxPerSecond != 300 || row.QPerSecond != 200 {
		t.Fatalf("look at 4 s: %+v, want 300 tx/s and 200 q/s", row)
	}
	if row := look(6*time.Second, 10, 10); row.Rated {
		t.Fatalf("totals that went back rated: %+v", row)
	}
}
