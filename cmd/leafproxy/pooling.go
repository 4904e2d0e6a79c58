package main

import (
	"cmp"
	"errors"
	"slices"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/proxy"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// poolFigures gives the admin server and /metrics the figures of the proxy's pools; the
// proxy is set once it exists (the admin server starts first).
type poolFigures struct{ srv atomic.Pointer[proxy.Server] }

// sessionServers returns the proxy's figures of session mode's server connections
// (proxy.Server.SessionServers); zero before the proxy runs.
func (f *poolFigures) sessionServers() proxy.SessionServerFigures {
	if s := f.srv.Load(); s != nil {
		return s.SessionServers()
	}
	return proxy.SessionServerFigures{}
}

// all returns the figures of every pool, of both modes, for /pools and the status page:
// by database and user, a (database, user) whose mode changed at a reload having both.
func (f *poolFigures) all() []pool.Stats {
	st := append(f.snapshot(), f.sessionSnapshot()...)
	slices.SortStableFunc(st, func(a, b pool.Stats) int {
		return cmp.Or(cmp.Compare(a.Database, b.Database), cmp.Compare(a.User, b.User), cmp.Compare(a.Mode, b.Mode))
	})
	return st
}

// sessionSnapshot returns the figures of session mode's pools, which /metrics exports as
// leafproxy_session_pool_…; none before the proxy runs.
func (f *poolFigures) sessionSnapshot() []pool.Stats {
	if s := f.srv.Load(); s != nil {
		return s.SessionPoolStats()
	}
	return []pool.Stats{}
}

// sessionPoolFigures are the figures of pool.Stats that session mode's pools keep.
var sessionPoolFigures = []string{"clients_active", "clients_waiting", "max_wait_seconds", "servers_active", "servers_idle",
	"size", "acquires_total", "wait_seconds_total", "wait_timeouts_total"}

// snapshot returns the figures of transaction mode's pools, which /metrics exports as
// leafproxy_pool_…; none before the proxy runs or in session mode.
func (f *poolFigures) snapshot() []pool.Stats {
	s := f.srv.Load()
	if s == nil {
		return []pool.Stats{}
	}
	st := s.PoolStats()
	if st == nil {
		return []pool.Stats{}
	}
	return st
}

// configurePooling applies the pooling settings to the proxy and exports its figures.
func (a *app) configurePooling(s *proxy.Server) error {
	cfg := a.cfg
	mode, err := proxy.ParsePoolMode(cfg.PoolMode)
	if err != nil {
		return err
	}
	s.PoolMode = mode
	s.Pooling = a.poolSettings(cfg)
	s.MaxPreparedStatements = cfg.MaxPreparedStatements
	s.ReuseSessionServers = cfg.SessionReuse
	a.pools.srv.Store(s)
	reg := a.metrics.Registry()
	for _, c := range []prometheus.Collector{
		pool.NewCollector(a.pools.snapshot),
		pool.NewCollectorOf("leafproxy_session_pool_", a.pools.sessionSnapshot, sessionPoolFigures...),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "leafproxy_session_servers",
			Help: "Server connections of session mode's sessions authenticated by the proxy: in a session, idle or opening."},
			func() float64 { return float64(a.pools.sessionServers().Open) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "leafproxy_session_servers_idle",
			Help: "Server connections of session mode waiting idle for a later session."},
			func() float64 { return float64(a.pools.sessionServers().Idle) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "leafproxy_session_clients_waiting",
			Help: "Sessions of session mode waiting for a server connection under pool-size or max-db-connections."},
			func() float64 { return float64(a.pools.sessionServers().Waiting) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "leafproxy_session_servers_reused_total",
			Help: "Sessions of session mode served by a server connection of an earlier session."},
			func() float64 { return float64(a.pools.sessionServers().Reused) }),
	} {
		err := reg.Register(c)
		if are := (prometheus.AlreadyRegisteredError{}); err != nil && !errors.As(err, &are) {
			return err
		}
	}
	return nil
}

// poolSettings are the pool settings of a configuration.
func (a *app) poolSettings(cfg *config.Config) pool.Settings {
	return pool.Settings{
		Limits: pool.Limits{
			PoolSize:          cfg.PoolSize,
			MinPoolSize:       cfg.MinPoolSize,
			ServerIdleTimeout: cfg.ServerIdleTimeout,
			ServerLifetime:    cfg.ServerLifetime,
			QueryWaitTimeout:  cfg.QueryWaitTimeout,
		},
		MaxDBConnections: cfg.MaxDBConnections,
		Log:              a.log,
	}
}

// poolReloadable names the pool settings SIGHUP applies to a running proxy: the sizes and
// timeouts to the running pools, pool-mode and the users' modes to new sessions (through
// the routing table, see routesOf).
var poolReloadable = map[string]bool{
	"pool-mode": true, "pool-size": true, "min-pool-size": true, "server-idle-timeout": true, "server-lifetime": true,
	"query-wait-timeout": true, "max-db-connections": true, "users": true,
}

// reloadPooling applies the pool settings of a configuration read again on SIGHUP.
func (a *app) reloadPooling(cfg *config.Config) {
	if err := a.proxy.ReloadPooling(a.poolSettings(cfg)); err != nil {
		a.log.WithError(err).Error("pool settings not reloaded")
		return
	}
	a.log.WithFields(logrus.Fields{"pool_size": cfg.PoolSize, "min_pool_size": cfg.MinPoolSize,
		"max_db_connections": cfg.MaxDBConnections}).Info("pool settings reloaded")
}
