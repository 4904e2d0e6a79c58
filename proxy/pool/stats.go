package pool

import (
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// counters are the cumulative figures of one key, guarded by the Pool's lock except
// the two the borrower reports, which are atomic so that counting costs no lock.
type counters struct {
	acquires       uint64
	waitTime       time.Duration
	waitTimeouts   uint64
	dials          uint64
	dialErrors     uint64
	resetErrors    uint64
	closes         uint64
	idleCloses     uint64
	lifetimeCloses uint64
	evictions      uint64

	transactions atomic.Uint64
	queries      atomic.Uint64
}

// CountTransaction records that the borrower ran one transaction on the connection
// (and queries statements in it), for Stats.
func (s *Server[C]) CountTransaction(queries int) {
	s.kp.transactions.Add(1)
	if queries > 0 {
		s.kp.queries.Add(uint64(queries))
	}
}

// Stats are the figures of one key at one moment, in the words of PgBouncer's SHOW
// POOLS and SHOW STATS.
type Stats struct {
	Database string `json:"database"`
	User     string `json:"user"`
	// Mode is the pool mode of the key's sessions, "transaction" or "session"; the
	// proxy sets it (a Pool's own Snapshot leaves it empty).
	Mode string `json:"pool_mode,omitempty"`

	// ClientsActive are the borrowers holding a connection; ClientsWaiting those queued
	// in Acquire, and MaxWait how long the first of them has waited.
	ClientsActive  int           `json:"cl_active"`
	ClientsWaiting int           `json:"cl_waiting"`
	MaxWait        time.Duration `json:"maxwait_ns"`

	// ServersActive are lent, ServersIdle ready to lend, ServersUsed being reset,
	// ServersLogin being dialled.
	ServersActive int `json:"sv_active"`
	ServersIdle   int `json:"sv_idle"`
	ServersUsed   int `json:"sv_used"`
	ServersLogin  int `json:"sv_login"`

	PoolSize    int `json:"pool_size"`
	MinPoolSize int `json:"min_pool_size"`

	// Cumulative since the key's pool was created.
	Acquires       uint64        `json:"acquires"`
	WaitTime       time.Duration `json:"total_wait_time_ns"`
	WaitTimeouts   uint64        `json:"wait_timeouts"`
	Transactions   uint64        `json:"total_xact_count"`
	Queries        uint64        `json:"total_query_count"`
	Dials          uint64        `json:"dials"`
	DialErrors     uint64        `json:"dial_errors"`
	ResetErrors    uint64        `json:"reset_errors"`
	Closes         uint64        `json:"closes"`
	IdleCloses     uint64        `json:"idle_closes"`
	LifetimeCloses uint64        `json:"lifetime_closes"`
	Evictions      uint64        `json:"evictions"`
}

// Snapshot returns the figures of every key, sorted by database then user.
func (p *Pool[C]) Snapshot() []Stats {
	p.mu.Lock()
	now := p.clock.Now()
	out := make([]Stats, 0, len(p.keys))
	for _, kp := range p.keys {
		st := Stats{
			Database:       kp.key.Database,
			User:           kp.key.User,
			ClientsActive:  kp.lent,
			ClientsWaiting: kp.waiters.n,
			ServersActive:  kp.lent,
			ServersIdle:    len(kp.idle),
			ServersUsed:    kp.reset,
			ServersLogin:   kp.opening,
			PoolSize:       kp.lim.PoolSize,
			MinPoolSize:    kp.lim.MinPoolSize,
			Acquires:       kp.acquires,
			WaitTime:       kp.waitTime,
			WaitTimeouts:   kp.waitTimeouts,
			Transactions:   kp.transactions.Load(),
			Queries:        kp.queries.Load(),
			Dials:          kp.dials,
			DialErrors:     kp.dialErrors,
			ResetErrors:    kp.resetErrors,
			Closes:         kp.closes,
			IdleCloses:     kp.idleCloses,
			LifetimeCloses: kp.lifetimeCloses,
			Evictions:      kp.evictions,
		}
		if kp.waiters.head != nil {
			st.MaxWait = now.Sub(kp.waiters.head.since)
			// Waits still under way count in the total too, so that it never lags behind
			// a queue that does not move.
			for w := kp.waiters.head; w != nil; w = w.next {
				st.WaitTime += now.Sub(w.since)
			}
		}
		out = append(out, st)
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b Stats) int {
		if c := strings.Compare(a.Database, b.Database); c != 0 {
			return c
		}
		return strings.Compare(a.User, b.User)
	})
	return out
}

// Collector exports a Pool's Snapshot as Prometheus metrics labelled by database and
// user. Register it with prometheus.MustRegister(pool.NewCollector(p.Snapshot)).
type Collector struct {
	snapshot func() []Stats
	gauges   []statDesc
	counters []statDesc
}

type statDesc struct {
	desc  *prometheus.Desc
	value func(*Stats) float64
}

// NewCollector returns a Collector of every figure, named leafproxy_pool_…, reading
// snapshot (a Pool's Snapshot method) at each scrape.
func NewCollector(snapshot func() []Stats) *Collector {
	return newCollector("leafproxy_pool_", snapshot, nil)
}

// NewCollectorOf returns a Collector of the figures named (as NewCollector's, without
// its prefix: "clients_active", "wait_timeouts_total", …), named prefix…, for pools
// that keep only those (session mode's, say).
func NewCollectorOf(prefix string, snapshot func() []Stats, names ...string) *Collector {
	return newCollector(prefix, snapshot, names)
}

// newCollector returns a Collector of the figures in names (all when nil) named prefix….
func newCollector(prefix string, snapshot func() []Stats, names []string) *Collector {
	labels := []string{"database", "user"}
	d := func(name, help string, v func(*Stats) float64) statDesc {
		if names != nil && !slices.Contains(names, name) {
			return statDesc{}
		}
		return statDesc{prometheus.NewDesc(prefix+name, help, labels, nil), v}
	}
	c := &Collector{
		snapshot: snapshot,
		gauges: []statDesc{
			d("clients_active", "Clients holding a server connection.", func(s *Stats) float64 { return float64(s.ClientsActive) }),
			d("clients_waiting", "Clients waiting for a server connection.", func(s *Stats) float64 { return float64(s.ClientsWaiting) }),
			d("max_wait_seconds", "How long the first waiting client has waited.", func(s *Stats) float64 { return s.MaxWait.Seconds() }),
			d("servers_active", "Server connections lent to a client.", func(s *Stats) float64 { return float64(s.ServersActive) }),
			d("servers_idle", "Server connections ready to lend.", func(s *Stats) float64 { return float64(s.ServersIdle) }),
			d("servers_used", "Server connections being reset.", func(s *Stats) float64 { return float64(s.ServersUsed) }),
			d("servers_login", "Server connections being opened.", func(s *Stats) float64 { return float64(s.ServersLogin) }),
			d("size", "Most server connections of the pool (pool-size).", func(s *Stats) float64 { return float64(s.PoolSize) }),
		},
		counters: []statDesc{
			d("acquires_total", "Server connections asked for.", func(s *Stats) float64 { return float64(s.Acquires) }),
			d("wait_seconds_total", "Time clients spent waiting for a server connection.", func(s *Stats) float64 { return s.WaitTime.Seconds() }),
			d("wait_timeouts_total", "Waits that reached query-wait-timeout.", func(s *Stats) float64 { return float64(s.WaitTimeouts) }),
			d("transactions_total", "Transactions run on lent connections.", func(s *Stats) float64 { return float64(s.Transactions) }),
			d("queries_total", "Queries run on lent connections.", func(s *Stats) float64 { return float64(s.Queries) }),
			d("dials_total", "Server connections opened.", func(s *Stats) float64 { return float64(s.Dials) }),
			d("dial_errors_total", "Server connections that failed to open.", func(s *Stats) float64 { return float64(s.DialErrors) }),
			d("closes_total", "Server connections closed.", func(s *Stats) float64 { return float64(s.Closes) }),
		},
	}
	named := func(ds []statDesc) []statDesc {
		return slices.DeleteFunc(ds, func(d statDesc) bool { return d.desc == nil })
	}
	c.gauges, c.counters = named(c.gauges), named(c.counters)
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, g := range c.gauges {
		ch <- g.desc
	}
	for _, g := range c.counters {
		ch <- g.desc
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.snapshot() {
		for _, g := range c.gauges {
			ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, g.value(&st), st.Database, st.User)
		}
		for _, g := range c.counters {
			ch <- prometheus.MustNewConstMetric(g.desc, prometheus.CounterValue, g.value(&st), st.Database, st.User)
		}
	}
}
