// Package metrics keeps the Prometheus metrics of leafproxy on a private registry and gives
// the engines and the proxy plain hook functions to call, so that neither imports
// Prometheus. Every hook is safe for concurrent use and cheap: label children are cached,
// so a hook on a hot path costs a map read and an atomic add.
package metrics

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

const namespace = "leafproxy"

// Label values known before anything happens. Their series exist from the start at zero,
// so that an alert on increase(…) > 0 sees the first event (a series that appears with
// the value 1 has no increase to show).
var (
	// StatementSQLStates are the SQLSTATEs the proxy answers a statement with itself
	// (leafproxy_errors_total).
	StatementSQLStates = []string{
		sqlstate.UndefinedObject, sqlstate.InvalidParameterValue, sqlstate.FeatureNotSupported,
		sqlstate.ObjectNotInPrerequisiteState, sqlstate.SystemError, sqlstate.BadCopyFileFormat,
		sqlstate.ProgramLimitExceeded, sqlstate.StatementTooComplex,
	}
	// StartupSQLStates are the SQLSTATEs of the FATAL errors with which the proxy refuses a
	// client itself (leafproxy_client_rejects_total).
	StartupSQLStates = []string{
		sqlstate.ConnectionUnable, sqlstate.TooManyConnections, sqlstate.CannotConnectNow,
		sqlstate.FeatureNotSupported,
	}
	// ErrorReasons are the reasons of leafproxy_id_errors_total (see ErrorReason).
	ErrorReasons = []string{"unknown_tag", "unavailable", "clock_backwards", "worker_not_held", "bad_argument", "canceled", "other"}
	// WorkerEvents are the events of leafproxy_worker_events_total.
	WorkerEvents = []string{"acquired", "lost", "fenced", "regained", "report_error", "reconnect", "session_expired"}
	// RewriteKinds are the kinds of leafproxy_rewrites_total.
	RewriteKinds = []string{"query", "parse", "fast_path"}
	// Engines are the engines of the per-engine series.
	Engines = []string{"segment", "snowflake"}
)

// Metrics owns the registry and every collector. Build it with New.
type Metrics struct {
	reg *prometheus.Registry

	issued *issuedCollector

	idErrors       *labeled
	segmentLoads   *labeled
	segmentLoadDur *prometheus.HistogramVec
	segmentUnavail *labeled
	tagRefreshes   *labeled
	givenBack      *prometheus.CounterVec

	clockBackwards    *labeled
	sequenceExhausted prometheus.Counter
	workerHeld        prometheus.Gauge
	workerID          prometheus.Gauge
	workerEvents      *labeled

	clientConns      prometheus.Gauge
	clientConnsTotal prometheus.Counter
	rejects          *labeled
	rewrites         *labeled
	// The children of rewrites for the kinds the proxy reports, resolved once.
	rewriteQuery, rewriteParse, rewriteFastPath prometheus.Counter
	errorsByState                               *labeled
}

// New registers every collector on a new private registry; buffers, when not nil, is read
// at each scrape for the segment buffer gauges.
func New(version string, buffers func() []BufferLevel) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{reg: reg, issued: newIssuedCollector()}
	counter := func(name, help string, labels ...string) *labeled {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
		reg.MustRegister(v)
		return &labeled{vec: v}
	}
	m.idErrors = counter("id_errors_total", "ID requests that failed, by engine and reason.", "engine", "reason")
	m.segmentLoads = counter("segment_loads_total", "Segment reservations in leaf_alloc, by tag and result.", "tag", "result")
	m.segmentLoadDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "segment_load_duration_seconds",
		Help:    "Time the store needed for one segment reservation.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	}, []string{"tag"})
	m.segmentUnavail = counter("segment_unavailable_total", "Segment requests that found both buffers empty and the store unusable.", "tag")
	m.tagRefreshes = counter("segment_tag_refreshes_total", "Reloads of the tag list from leaf_alloc, by result.", "result")
	m.givenBack = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "segment_given_back_ids_total",
		Help: "Unused IDs returned to leaf_alloc at shutdown."}, []string{"tag"})
	m.clockBackwards = counter("snowflake_clock_backwards_total", "Times the clock was seen behind the last snowflake ID, by outcome (waited: recovered by waiting, refused: the request failed).", "outcome")
	m.sequenceExhausted = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "snowflake_sequence_exhausted_total",
		Help: "Milliseconds that ran out of sequence numbers (requests waited for the next one)."})
	m.workerHeld = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "worker_id_held",
		Help: "1 while the snowflake engine holds its worker ID and may issue, else 0."})
	m.workerID = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "worker_id",
		Help: "The snowflake worker ID in use (-1 before one is acquired)."})
	m.workerID.Set(-1)
	m.workerEvents = counter("worker_events_total", "Worker-ID lease events: acquired, lost, fenced, regained, report_error, reconnect, session_expired.", "event")
	m.clientConns = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "client_connections",
		Help: "Client connections open now."})
	m.clientConnsTotal = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "client_connections_total",
		Help: "Client connections accepted."})
	m.rejects = counter("client_rejects_total", "Clients the proxy itself refused, by SQLSTATE.", "sqlstate")
	m.rewrites = counter("rewrites_total", "Statements rewritten, by kind.", "kind")
	m.rewriteQuery = m.rewrites.vec.WithLabelValues("query")
	m.rewriteParse = m.rewrites.vec.WithLabelValues("parse")
	m.rewriteFastPath = m.rewrites.vec.WithLabelValues("fast_path")
	m.errorsByState = counter("errors_total", "Errors the proxy answered itself, by SQLSTATE.", "sqlstate")

	for _, e := range Engines {
		for _, r := range ErrorReasons {
			m.idErrors.touch(e, r)
		}
	}
	for _, r := range []string{"ok", "error"} {
		m.tagRefreshes.touch(r)
	}
	for _, o := range []string{"waited", "refused"} {
		m.clockBackwards.touch(o)
	}
	for _, e := range WorkerEvents {
		m.workerEvents.touch(e)
	}
	for _, c := range StartupSQLStates {
		m.rejects.touch(c)
	}
	for _, k := range RewriteKinds {
		m.rewrites.touch(k)
	}
	for _, c := range StatementSQLStates {
		m.errorsByState.touch(c)
	}

	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "build_info",
		Help: "Always 1; labels name the version and Go release."}, []string{"version", "goversion"})
	build.WithLabelValues(version, runtime.Version()).Set(1)

	reg.MustRegister(m.issued, m.segmentLoadDur, m.givenBack, m.sequenceExhausted, m.workerHeld, m.workerID,
		m.clientConns, m.clientConnsTotal, build,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if buffers != nil {
		reg.MustRegister(&bufferCollector{levels: buffers})
	}
	return m
}

// Registry returns the private registry (to register more collectors or gather in tests).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// labeled caches the children of a one- or two-label counter vector: WithLabelValues
// hashes its labels on every call, a sync.Map read does not.
type labeled struct {
	vec      *prometheus.CounterVec
	children sync.Map // string → prometheus.Counter
}

func (l *labeled) inc(values ...string) { l.child(values...).Add(1) }

// touch creates the series of values at zero.
func (l *labeled) touch(values ...string) { l.child(values...) }

func (l *labeled) child(values ...string) prometheus.Counter {
	key := values[0]
	if len(values) > 1 {
		key = values[0] + "\x00" + values[1]
	}
	c, ok := l.children.Load(key)
	if !ok {
		c, _ = l.children.LoadOrStore(key, l.vec.WithLabelValues(values...))
	}
	return c.(prometheus.Counter)
}

// totals returns the value of every series by its first label value (one-label vectors)
// or "first\x00second".
func (l *labeled) totals() map[string]uint64 {
	out := map[string]uint64{}
	l.children.Range(func(k, v any) bool {
		var m dto.Metric
		if v.(prometheus.Counter).Write(&m) == nil {
			out[k.(string)] = uint64(m.GetCounter().GetValue())
		}
		return true
	})
	return out
}

// --- segment engine hooks (segment.Hooks) ---

// SegmentLoad counts one reservation attempt (segment.Hooks.OnLoad).
func (m *Metrics) SegmentLoad(tag string, size int64, took time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.segmentLoads.inc(tag, result)
	m.segmentLoadDur.WithLabelValues(tag).Observe(took.Seconds())
}

// SegmentUnavailable counts a request that found no IDs (segment.Hooks.OnUnavailable).
func (m *Metrics) SegmentUnavailable(tag string) { m.segmentUnavail.inc(tag) }

// TagRefresh counts a reload of the tag list (segment.Hooks.OnRefresh).
func (m *Metrics) TagRefresh(tags int, took time.Duration, err error) {
	if err != nil {
		m.tagRefreshes.inc("error")
		return
	}
	m.tagRefreshes.inc("ok")
}

// GiveBack counts IDs returned at shutdown (segment.Hooks.OnGiveBack).
func (m *Metrics) GiveBack(tag string, ids int64, err error) {
	if err == nil && ids > 0 {
		m.givenBack.WithLabelValues(tag).Add(float64(ids))
	}
}

// --- snowflake engine and worker source hooks ---

// ClockBackwards counts a backwards clock (snowflake.Hooks.OnClockBackwards).
func (m *Metrics) ClockBackwards(offset time.Duration, recovered bool) {
	if recovered {
		m.clockBackwards.inc("waited")
		return
	}
	m.clockBackwards.inc("refused")
}

// SequenceExhausted counts a millisecond that ran out of sequence numbers.
func (m *Metrics) SequenceExhausted() { m.sequenceExhausted.Inc() }

// WorkerAcquired records the worker ID now held (snowflake.Hooks.OnWorkerAcquired).
func (m *Metrics) WorkerAcquired(id int64) {
	m.workerID.Set(float64(id))
	m.workerHeld.Set(1)
	m.workerEvents.inc("acquired")
}

// WorkerLost records that the worker ID is gone (snowflake.Hooks.OnWorkerLost).
func (m *Metrics) WorkerLost(id int64) {
	m.workerHeld.Set(0)
	m.workerEvents.inc("lost")
}

// WorkerFenced records a lease that could not be renewed in time (worker.Hooks.OnFenced).
func (m *Metrics) WorkerFenced(id int64) {
	m.workerHeld.Set(0)
	m.workerEvents.inc("fenced")
}

// WorkerRegained records a fenced lease renewed again (worker.Hooks.OnRegained).
func (m *Metrics) WorkerRegained(id int64) {
	m.workerHeld.Set(1)
	m.workerEvents.inc("regained")
}

// WorkerEvent counts any other lease event (report_error, reconnect, session_expired).
func (m *Metrics) WorkerEvent(event string) { m.workerEvents.inc(event) }

// --- proxy hooks ---

// ConnOpened counts an accepted client connection (proxy.Server.OnConnOpen).
func (m *Metrics) ConnOpened() {
	m.clientConns.Inc()
	m.clientConnsTotal.Inc()
}

// ConnClosed counts a closed client connection (proxy.Server.OnConnClose).
func (m *Metrics) ConnClosed() { m.clientConns.Dec() }

// Rejected counts a client the proxy refused itself (proxy.Server.OnReject).
func (m *Metrics) Rejected(sqlstate string) { m.rejects.inc(sqlstate) }

// Rewrite counts a statement the proxy rewrote or answered, by kind ("query", "parse",
// "fast_path"). The proxy's kinds have their counters resolved up front: a rewritten
// statement costs a string comparison and an atomic add, not a label lookup.
func (m *Metrics) Rewrite(kind string) {
	switch kind {
	case "query":
		m.rewriteQuery.Inc()
	case "parse":
		m.rewriteParse.Inc()
	case "fast_path":
		m.rewriteFastPath.Inc()
	default:
		m.rewrites.inc(kind)
	}
}

// Error counts an error the proxy answered itself, by SQLSTATE.
func (m *Metrics) Error(sqlstate string) { m.errorsByState.inc(sqlstate) }

// ErrorTotals returns the errors the proxy answered statements with, by SQLSTATE.
func (m *Metrics) ErrorTotals() map[string]uint64 { return m.errorsByState.totals() }

// RejectTotals returns the clients the proxy refused itself, by SQLSTATE.
func (m *Metrics) RejectTotals() map[string]uint64 { return m.rejects.totals() }

// Clients returns the client connections open now and accepted so far.
func (m *Metrics) Clients() (open, total int64) {
	var g, c dto.Metric
	_ = m.clientConns.Write(&g)
	_ = m.clientConnsTotal.Write(&c)
	return int64(g.GetGauge().GetValue()), int64(c.GetCounter().GetValue())
}

// SegmentLoadTotals returns the segment loads so far: successful and failed.
func (m *Metrics) SegmentLoadTotals() (ok, failed uint64) {
	for k, n := range m.segmentLoads.totals() {
		if strings.HasSuffix(k, "\x00error") {
			failed += n
		} else {
			ok += n
		}
	}
	return ok, failed
}

// KnownTags creates the per-tag series of the tags the engines serve at zero: IDs issued
// per engine and tag, segment loads by result, segment requests that found no ID.
func (m *Metrics) KnownTags(segmentTags, snowflakeTags []string) {
	for _, tag := range segmentTags {
		m.issued.counter("segment", tag)
		m.segmentLoads.touch(tag, "ok")
		m.segmentLoads.touch(tag, "error")
		m.segmentUnavail.touch(tag)
	}
	for _, tag := range snowflakeTags {
		m.issued.counter("snowflake", tag)
	}
}

// --- IDs ---

// Issued counts one ID of tag from engine ("segment" or "snowflake").
func (m *Metrics) Issued(engine, tag string) { m.issued.counter(engine, tag).Add(1) }

// IDError counts a failed ID request with the reason the idgen sentinel errors give.
func (m *Metrics) IDError(engine string, err error) { m.idErrors.inc(engine, ErrorReason(err)) }

// IssuedTotals returns the IDs issued so far per engine and tag.
func (m *Metrics) IssuedTotals() map[Key]uint64 { return m.issued.totals() }

// ErrorReason names an ID error for a label: unknown_tag, unavailable, clock_backwards,
// worker_not_held, bad_argument, canceled, or other.
func ErrorReason(err error) string {
	switch {
	case errors.Is(err, idgen.ErrUnknownTag):
		return "unknown_tag"
	case errors.Is(err, idgen.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, idgen.ErrClockBackwards):
		return "clock_backwards"
	case errors.Is(err, idgen.ErrWorkerNotHeld):
		return "worker_not_held"
	case errors.Is(err, idgen.ErrBadArgument):
		return "bad_argument"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "other"
}
