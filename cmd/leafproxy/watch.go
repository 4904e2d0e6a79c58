package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/health"
	"github.com/leafproxy/leafproxy/internal/httpapi"
	"github.com/leafproxy/leafproxy/internal/metrics"
)

// What the proxy watches in the background for its operator: the upstream and the store
// (health probes), the totals of the last hour (history), the worker ID's lease, and tags
// named both as snowflake tags and as leaf_alloc rows.
const (
	healthInterval  = 2 * time.Second
	historyInterval = 10 * time.Second
	historySamples  = 360 // one hour at historyInterval
)

// newProbes builds the probes of the upstream database and the store. The first failure
// of each is a warning in the log; later changes are logged too.
func (a *app) newProbes() {
	logChange := func(what string) func(health.State) {
		first := true
		return func(st health.State) {
			fields := logrus.Fields{what: st.Target}
			switch {
			case st.OK && first:
			case st.OK:
				a.log.WithFields(fields).Info(what + " reachable again")
			case what == "upstream":
				fields["error"] = st.LastError
				a.log.WithFields(fields).Warn("cannot reach the upstream database: clients get FATAL 08001 and /readyz fails until it answers")
			default:
				fields["error"] = st.LastError
				a.log.WithFields(fields).Warn("cannot reach the store: segment tags are served from their buffers, new segments and worker-ID renewals wait for it")
			}
			first = false
		}
	}
	a.upstreamProbe = &health.Probe{Name: "upstream", Target: upstreamTarget(a.cfg), Interval: healthInterval,
		Check: a.checkUpstreams, OnChange: logChange("upstream")}
	a.storeProbe = &health.Probe{Name: "store", Target: storeTarget(a.cfg.Store), Interval: healthInterval,
		Check: func(ctx context.Context) error {
			if err := a.pool.Ping(ctx); err != nil {
				return errors.New(connectFailure(err))
			}
			return nil
		},
		OnChange: logChange("store")}
}

// storeTarget names the store by host:port and database, without user or password.
func storeTarget(dsn string) string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "(unparsable store URL)"
	}
	return fmt.Sprintf("%s/%s", net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port)), cfg.Database)
}

// connectFailure is the root cause of a failed connection in one line: the network error
// ("dial tcp 127.0.0.1:1: connect: connection refused") or the server's error with its
// SQLSTATE, rather than pgconn's multi-line account of every address it tried.
func connectFailure(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return fmt.Sprintf("%s (SQLSTATE %s)", pg.Message, pg.Code)
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return op.Error()
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		if inner := errors.Unwrap(ce); inner != nil {
			return health.OneLine(inner.Error())
		}
	}
	return health.OneLine(err.Error())
}

// startError words an error that stops serve before it serves, in one line: a store that
// cannot be reached says which one and why, without pgconn's list of attempts.
func startError(err error, cfg *config.Config) error {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return fmt.Errorf("cannot connect to the store %s: %s (check store: --store or LEAFPROXY_STORE)",
			storeTarget(cfg.Store), connectFailure(err))
	}
	return err
}

// leaseEvents remembers when each worker-ID lease event was last seen, for the status page.
type leaseEvents struct {
	mu     sync.Mutex
	counts map[string]uint64
	last   map[string]time.Time
}

func (l *leaseEvents) record(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.counts == nil {
		l.counts, l.last = map[string]uint64{}, map[string]time.Time{}
	}
	l.counts[name]++
	l.last[name] = time.Now().UTC()
}

func (l *leaseEvents) list() []httpapi.LeaseEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []httpapi.LeaseEvent
	for _, name := range metrics.WorkerEvents {
		if n := l.counts[name]; n > 0 {
			out = append(out, httpapi.LeaseEvent{Name: name, Count: n, Last: l.last[name]})
		}
	}
	return out
}

// zkSession tells the ZooKeeper session's state from its events: failing reports after
// the last reconnect mean it is down.
func (l *leaseEvents) zkSession() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	failed, reconnected, expired := l.last["report_error"], l.last["reconnect"], l.last["session_expired"]
	switch {
	case !expired.IsZero() && expired.After(reconnected):
		return "session expired at " + expired.UTC().Format("15:04:05") + ", reconnecting"
	case !failed.IsZero() && failed.After(reconnected):
		return "reports failing since " + failed.UTC().Format("15:04:05") + ", reconnecting"
	case !reconnected.IsZero():
		return "connected (reconnected at " + reconnected.UTC().Format("15:04:05") + ")"
	}
	return "connected"
}

// watch runs the background chores until ctx ends: the history sample every
// historyInterval, the lease row, tag conflicts and the per-tag metric series.
func (a *app) watch(ctx context.Context) {
	t := time.NewTicker(historyInterval)
	defer t.Stop()
	for {
		a.history.Add(a.metrics.Snapshot(time.Now()))
		a.readLease(ctx)
		a.checkTags()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// historyNow is the history with now's totals as the newest sample.
func (a *app) historyNow() []metrics.HistorySample {
	return append(a.history.Samples(), a.metrics.Snapshot(time.Now()))
}

// checkTags creates the metric series of the tags now known, and logs an error once for
// each tag named both in snowflake-tags and in leaf_alloc: such a tag is served by the
// snowflake engine only (the router sends it there), and its leaf_alloc row is ignored.
func (a *app) checkTags() {
	if !a.segReady.Load() {
		a.metrics.KnownTags(nil, a.cfg.SnowflakeTags)
		return
	}
	seg := a.segment.Tags()
	a.metrics.KnownTags(seg, a.cfg.SnowflakeTags)
	var conflicts []string
	for _, tag := range seg {
		if slices.Contains(a.cfg.SnowflakeTags, tag) {
			conflicts = append(conflicts, tag)
		}
	}
	a.mu.Lock()
	old := a.conflicts
	a.conflicts = conflicts
	a.mu.Unlock()
	for _, tag := range conflicts {
		if !slices.Contains(old, tag) {
			a.log.WithField("tag", tag).Error("tag is both a snowflake tag (snowflake-tags) and a segment tag (a leaf_alloc row): serving it from the snowflake engine only; remove the leaf_alloc row (leafproxy tag remove) or the snowflake-tags entry")
		}
	}
}

// readLease reads the worker ID's lease row (postgres source) for the status page.
func (a *app) readLease(ctx context.Context) {
	if a.cfg.WorkerSource != config.WorkerPostgres || a.snowflake == nil {
		return
	}
	in := a.snowflake.Info()
	if in.WorkerID < 0 {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var l httpapi.LeaseStatus
	var holder *string
	err := a.pool.QueryRow(qctx, `SELECT holder, expires_at, update_time FROM leaf_worker_lease WHERE worker_id = $1`,
		in.WorkerID).Scan(&holder, &l.ExpiresAt, &l.Renewed)
	l.ExpiresAt, l.Renewed = l.ExpiresAt.UTC(), l.Renewed.UTC()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		a.mu.Lock()
		if a.lease != nil {
			l = *a.lease // keep what was last read, say why it is not fresh
		}
		a.mu.Unlock()
		l.ReadError = connectFailure(err)
	} else if holder != nil {
		l.Holder = *holder
	}
	a.mu.Lock()
	a.lease = &l
	a.mu.Unlock()
}

// leaseStatus is what the status page shows of the lease.
func (a *app) leaseStatus() *httpapi.LeaseStatus {
	var l httpapi.LeaseStatus
	a.mu.Lock()
	if a.lease != nil {
		l = *a.lease
	}
	a.mu.Unlock()
	if a.cfg.WorkerSource == config.WorkerZooKeeper {
		l.Session = a.events.zkSession()
	}
	l.Events = a.events.list()
	return &l
}

// joinProblems joins readiness problems for /readyz (the status page splits them again).
func joinProblems(problems []string) error {
	if len(problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(problems, "; "))
}
