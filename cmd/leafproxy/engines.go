package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/leafproxy/leafproxy/idgen/worker"
	wpostgres "github.com/leafproxy/leafproxy/idgen/worker/postgres"
	wzookeeper "github.com/leafproxy/leafproxy/idgen/worker/zookeeper"
	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/health"
	"github.com/leafproxy/leafproxy/internal/httpapi"
	"github.com/leafproxy/leafproxy/internal/metrics"
)

// workerSource builds the configured source of the snowflake worker ID.
func (a *app) workerSource() (worker.Source, error) {
	event := func(name string) { a.events.record(name); a.metrics.WorkerEvent(name) }
	hooks := worker.Hooks{
		OnReportError:    func(int64, error) { event("report_error") },
		OnReconnect:      func(int64) { event("reconnect") },
		OnSessionExpired: func(int64) { event("session_expired") },
		OnFenced:         func(id int64) { a.events.record("fenced"); a.metrics.WorkerFenced(id) },
		OnRegained:       func(id int64) { a.events.record("regained"); a.metrics.WorkerRegained(id) },
	}
	addr := a.advertisedAddr()
	switch a.cfg.WorkerSource {
	case config.WorkerStatic:
		return worker.Static{
			ID:       int64(a.cfg.WorkerID),
			StateDir: a.cfg.WorkerStateDir,
			Logger:   a.log,
			Hooks:    hooks,
		}, nil
	case config.WorkerPostgres:
		return wpostgres.New(wpostgres.Settings{
			Pool:   a.pool,
			TTL:    a.cfg.WorkerLeaseTTL, // 0: the source's default
			Holder: a.cfg.ZooKeeperName + "@" + addr,
			Now:    a.now, // the lease's deadline is checked on the engine's clock
			Logger: a.log,
			Hooks:  hooks,
		})
	case config.WorkerZooKeeper:
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("advertise: %w", err)
		}
		return wzookeeper.New(wzookeeper.Settings{
			Servers: a.cfg.ZooKeeper,
			Name:    a.cfg.ZooKeeperName,
			IP:      host,
			Port:    port,
			Now:     a.now,
			Logger:  a.log,
			Hooks:   hooks,
		})
	}
	return nil, fmt.Errorf("worker-source %q is not one of static, postgres, zookeeper", a.cfg.WorkerSource)
}

// advertisedAddr is the ip:port that names this proxy to the worker-ID source: Leaf keys
// its ZooKeeper node on it, and the lease table records it as the holder. The port is the
// listen port; the IP is the listen address unless that is loopback or unspecified.
func (a *app) advertisedAddr() string {
	if a.cfg.AdvertisedAddr != "" {
		return a.cfg.AdvertisedAddr
	}
	host, port, err := net.SplitHostPort(a.cfg.Listen)
	if err != nil {
		return a.cfg.Listen
	}
	// A loopback address names no machine: two hosts both listening on 127.0.0.1:6432
	// would share one ZooKeeper node, hence one worker ID. Use the host's address instead.
	if ip := net.ParseIP(host); host == "" || host == "localhost" || ip != nil && (ip.IsUnspecified() || ip.IsLoopback()) {
		host = firstNonLoopbackIP()
	}
	return net.JoinHostPort(host, port)
}

// firstNonLoopbackIP returns this host's first IPv4 address that is not loopback, as
// Leaf's Utils.getIp does, or 127.0.0.1.
func firstNonLoopbackIP() string {
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, addr := range addrs {
			if ipn, ok := addr.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
				return ipn.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

// ready reports whether the proxy can serve clients and issue IDs now, and if not, why:
// the upstream answers, the snowflake engine holds its worker ID, and the segment engine
// has started and either reaches the store or still holds buffered IDs. The dependencies'
// states come from the background probes, so a probe of /readyz never dials anything.
func (a *app) ready(ctx context.Context) error {
	if a.stopping.Load() {
		return errors.New("shutting down")
	}
	var problems []string
	if !a.serving.Load() {
		// The admin server comes up first; clients are served once the fill rules and the
		// catalog of the filled tables are loaded.
		problems = append(problems, "starting: the proxy does not accept clients yet")
	}
	if a.upstreamProbe != nil {
		if p := a.upstreamProbe.State().Problem(); p != "" {
			problems = append(problems, p)
		}
	}
	if a.snowflake != nil {
		if in := a.snowflake.Info(); !in.Running {
			problems = append(problems, "snowflake engine not running")
		} else if !in.Held {
			problems = append(problems, fmt.Sprintf("snowflake worker ID %d not held (source %s)", in.WorkerID, in.Source))
		}
	}
	if err := a.segmentReady(); err != nil {
		problems = append(problems, err.Error())
	}
	return joinProblems(problems)
}

// segmentReady: the segment engine can issue when it has started and either reaches the
// store or still holds buffered IDs.
func (a *app) segmentReady() error {
	if a.segment == nil {
		return errors.New("segment engine not configured")
	}
	if !a.segReady.Load() {
		return errors.New("segment engine starting: waiting for the store to list the tags")
	}
	st := a.storeProbe.State()
	if !st.Checked || st.OK {
		return nil
	}
	var buffered int64
	for _, s := range a.segment.Snapshot() {
		buffered += httpapi.Remaining(s)
	}
	if buffered > 0 {
		// Degraded but able to issue: stay in the load balancer.
		return nil
	}
	return fmt.Errorf("store unreachable (%s) and no segment IDs buffered", st.LastError)
}

// bufferLevels feeds the segment buffer gauges of /metrics.
func (a *app) bufferLevels() []metrics.BufferLevel {
	if a.segment == nil {
		return nil
	}
	snaps := a.segment.Snapshot()
	out := make([]metrics.BufferLevel, 0, len(snaps))
	for _, s := range snaps {
		out = append(out, metrics.BufferLevel{Tag: s.Tag, Remaining: httpapi.Remaining(s), Step: s.Buffers[s.Pos].Step})
	}
	return out
}

// status feeds the status page.
func (a *app) status() httpapi.Status {
	st := httpapi.Status{
		Version:       buildVersion(),
		StartedAt:     a.started,
		Listen:        a.cfg.Listen,
		Upstream:      upstreamTarget(a.routingConfig()),
		SnowflakeTags: a.cfg.SnowflakeTags,
	}
	for _, r := range a.fill.current() {
		st.FillRules = append(st.FillRules, r.String())
	}
	if a.snowflake != nil {
		in := a.snowflake.Info()
		hw := max(in.LastMillis, in.HighWaterMillis)
		sf := &httpapi.SnowflakeStatus{Source: in.Source, WorkerID: in.WorkerID, Held: in.Held,
			Layout: in.Layout.String(), Epoch: in.Epoch}
		if hw > 0 {
			sf.HighWater = time.UnixMilli(hw)
		}
		st.Snowflake = sf
		st.Lease = a.leaseStatus()
	}
	st.Health = []health.State{a.upstreamProbe.State(), a.storeProbe.State()}
	st.ClientsOpen, st.ClientsTotal = a.metrics.Clients()
	if a.runway != nil {
		rw := a.runway.Snapshot()
		st.Runway = &rw
	}
	a.mu.Lock()
	st.Conflicts = a.conflicts
	a.mu.Unlock()
	return st
}
