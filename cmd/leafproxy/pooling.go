package main

import (
	"errors"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leafproxy/leafproxy/proxy"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// poolFigures gives the admin server and /metrics the figures of the proxy's pools; the
// proxy is set once it exists (the admin server starts first).
type poolFigures struct{ srv atomic.Pointer[proxy.Server] }

// snapshot returns the figures of every pool; none before the proxy runs or in session
// mode.
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
	s.Pooling = pool.Settings{
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
	a.pools.srv.Store(s)
	err = a.metrics.Registry().Register(pool.NewCollector(a.pools.snapshot))
	if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
		err = nil
	}
	return err
}
