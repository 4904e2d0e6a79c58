package httpapi

import (
	"net/http"
	"sync"
	"time"

	"github.com/leafproxy/leafproxy/proxy/pool"
)

// pools serves /pools: the figures of every pool of server connections, as JSON
// ({"pools": [...]}, in the words of PgBouncer's SHOW POOLS and SHOW STATS).
func (s *server) pools(w http.ResponseWriter, r *http.Request) {
	if s.Pools == nil {
		unavailable("pool figures are not configured")(w, r)
		return
	}
	writeJSON(w, map[string]any{"pools": s.Pools()})
}

// poolRow is a pool on the status page: its figures, and its transactions and queries
// per second since the page was last made (Rated false until a second look).
type poolRow struct {
	pool.Stats
	Rated       bool
	TxPerSecond float64
	QPerSecond  float64
}

// rateMinInterval is the shortest time over which the status page works out a pool's
// rates; a page made sooner after the last (two viewers) shows the last rates again.
const rateMinInterval = time.Second

// poolRates works out the pools' transactions and queries per second from the totals
// of successive looks, one look per status page.
type poolRates struct {
	mu   sync.Mutex
	last map[poolRateKey]poolRateSample
}

type poolRateKey struct{ database, user, mode string }

// poolRateSample is a pool's totals at a look, and the rates worked out then.
type poolRateSample struct {
	at            time.Time
	tx, queries   uint64
	rated         bool
	txRate, qRate float64
}

// rows returns the status page's rows of the pools in st, looked at at now.
func (r *poolRates) rows(st []pool.Stats, now time.Time) []poolRow {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := make(map[poolRateKey]poolRateSample, len(st))
	rows := make([]poolRow, 0, len(st))
	for _, s := range st {
		k := poolRateKey{s.Database, s.User, s.Mode}
		cur := poolRateSample{at: now, tx: s.Transactions, queries: s.Queries}
		prev, seen := r.last[k]
		switch dt := now.Sub(prev.at); {
		case !seen || s.Transactions < prev.tx || s.Queries < prev.queries:
			// New, or a pool made again since (its totals start over).
		case dt < rateMinInterval:
			cur = prev
		default:
			cur.rated = true
			cur.txRate = float64(s.Transactions-prev.tx) / dt.Seconds()
			cur.qRate = float64(s.Queries-prev.queries) / dt.Seconds()
		}
		next[k] = cur
		rows = append(rows, poolRow{Stats: s, Rated: cur.rated, TxPerSecond: cur.txRate, QPerSecond: cur.qRate})
	}
	r.last = next
	return rows
}
