package metrics

// Runway: how long the IDs last. Three things run out in leafproxy, each slowly enough to
// be forgotten until it is too late:
//
//   - a segment tag reaches the maximum of its key column (bigint, integer, or the largest
//     integer JavaScript holds exactly) — how soon depends on how fast max_id in leaf_alloc
//     advances, summed over every proxy sharing the table;
//   - the snowflake time bits overflow at a fixed date given by the epoch and the layout;
//   - the lease table runs out of free worker IDs.
//
// The figures come from a background reader (one small query per interval on the store),
// never from the scrape, so a scrape costs arithmetic on the last reading only. The same
// reading is the store's reachability.

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// KeyType names the type of the key column a segment tag fills; its maximum is where the
// tag's IDs run out.
type KeyType string

// Key types.
const (
	KeyBigint  KeyType = "bigint"  // 2^63-1
	KeyInteger KeyType = "integer" // 2^31-1
	KeyJS      KeyType = "js"      // 2^53-1, JavaScript's Number.MAX_SAFE_INTEGER
)

// KeyTypes lists the key types in the order the documentation gives them.
var KeyTypes = []KeyType{KeyBigint, KeyInteger, KeyJS}

// ParseKeyType accepts a key type name and its PostgreSQL aliases (int8, int4, int).
func ParseKeyType(s string) (KeyType, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "bigint", "int8":
		return KeyBigint, nil
	case "integer", "int4", "int":
		return KeyInteger, nil
	case "js", "javascript":
		return KeyJS, nil
	}
	return "", fmt.Errorf("key type %q is not one of bigint, integer, js", s)
}

// Max is the largest ID a column of the key type holds.
func (k KeyType) Max() int64 {
	switch k {
	case KeyInteger:
		return math.MaxInt32
	case KeyJS:
		return 1<<53 - 1
	}
	return math.MaxInt64
}

// TagMax is one row of leaf_alloc as the runway reader sees it.
type TagMax struct {
	Tag   string
	MaxID int64
}

// Default timing of the runway reader.
const (
	DefaultRunwayInterval = 15 * time.Second
	DefaultRunwayWindow   = time.Hour
	DefaultRunwayTimeout  = 10 * time.Second
)

// RunwaySettings configure a Runway. Zero values mean the defaults; a nil reader leaves
// its figures out.
type RunwaySettings struct {
	// ReadTags returns max_id of every segment tag (the store's leaf_alloc).
	ReadTags func(ctx context.Context) ([]TagMax, error)
	// ReadWorkers returns the worker IDs free (released or expired) in the lease table and
	// the rows it has. Nil when the worker-ID source is not the lease table.
	ReadWorkers func(ctx context.Context) (free, capacity int64, err error)
	// KeyTypes gives the key type of tags; tags not listed get DefaultKeyType, and that
	// is bigint when empty.
	KeyTypes       map[string]KeyType
	DefaultKeyType KeyType
	// StoreState, when set, tells whether the store answers (checked: a check has
	// finished), for leafproxy_store_up; a health probe that checks more often than the
	// runway reads supplies it. Nil: the runway's own readings tell.
	StoreState func() (checked, ok bool)
	// SnowflakeEnd is the first instant the snowflake time bits cannot hold (epoch +
	// 2^timeBits ms). Zero leaves the snowflake figures out.
	SnowflakeEnd time.Time
	// Interval between readings, Window the span the consumption rate is measured over,
	// Timeout the bound of one reading.
	Interval, Window, Timeout time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Runway keeps the latest reading and serves it as gauges and as a Snapshot.
type Runway struct {
	s RunwaySettings

	mu      sync.Mutex
	read    bool // a reading has finished
	at      time.Time
	storeOK bool
	lastErr string
	tags    map[string][]maxSample // oldest first, spanning the window
	free    int64
	cap     int64
	workers bool // free/cap hold a reading
}

type maxSample struct {
	at  time.Time
	max int64
}

// NewRunway registers the runway gauges on m's registry; they exist from the start (the
// store's reachability and the free worker IDs as NaN until the first reading, the
// snowflake figures at once, the per-tag ones from the first reading that lists the tag).
// Call Run to read in the background.
func (m *Metrics) NewRunway(s RunwaySettings) *Runway {
	if s.Interval <= 0 {
		s.Interval = DefaultRunwayInterval
	}
	if s.Window <= 0 {
		s.Window = DefaultRunwayWindow
	}
	if s.Timeout <= 0 {
		s.Timeout = DefaultRunwayTimeout
	}
	if s.DefaultKeyType == "" {
		s.DefaultKeyType = KeyBigint
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	r := &Runway{s: s, tags: map[string][]maxSample{}}
	m.reg.MustRegister(&runwayCollector{r: r})
	return r
}

// Run reads at once, then every interval, until ctx ends.
func (r *Runway) Run(ctx context.Context) {
	t := time.NewTicker(r.s.Interval)
	defer t.Stop()
	for {
		r.ReadNow(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ReadNow takes one reading of the store.
func (r *Runway) ReadNow(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, r.s.Timeout)
	defer cancel()
	var (
		tags        []TagMax
		free, capa  int64
		tagErr, wkr error
	)
	if r.s.ReadTags != nil {
		tags, tagErr = r.s.ReadTags(cctx)
	}
	if r.s.ReadWorkers != nil {
		free, capa, wkr = r.s.ReadWorkers(cctx)
	}
	if ctx.Err() != nil {
		return // shutting down: says nothing about the store
	}
	now := r.s.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.read, r.at = true, now
	r.storeOK = tagErr == nil && wkr == nil
	r.lastErr = ""
	for _, err := range []error{tagErr, wkr} {
		if err != nil {
			r.lastErr = err.Error()
		}
	}
	if wkr == nil && r.s.ReadWorkers != nil {
		r.free, r.cap, r.workers = free, capa, true
	}
	if tagErr != nil || r.s.ReadTags == nil {
		return // keep the last known tags: a store outage does not make them last longer
	}
	seen := make(map[string]bool, len(tags))
	for _, tm := range tags {
		seen[tm.Tag] = true
		samples := append(r.tags[tm.Tag], maxSample{at: now, max: tm.MaxID})
		// Keep one sample older than the window, so the rate spans the whole window.
		for len(samples) > 2 && now.Sub(samples[1].at) >= r.s.Window {
			samples = samples[1:]
		}
		r.tags[tm.Tag] = samples
	}
	for tag := range r.tags {
		if !seen[tag] {
			delete(r.tags, tag)
		}
	}
}

// TagRunway is how long one segment tag lasts.
type TagRunway struct {
	Tag     string
	KeyType KeyType
	MaxID   int64 // leaf_alloc.max_id at the last reading
	Limit   int64 // the key type's maximum
	Left    int64 // IDs between max_id and the limit
	// Rate is max_id's advance in IDs per second over the window (every proxy sharing
	// the store together); 0 until it has advanced.
	Rate float64
	// SecondsLeft is Left at Rate; +Inf while Rate is 0.
	SecondsLeft float64
	// Over is the span Rate was measured over.
	Over time.Duration
}

// SnowflakeRunway is how long the snowflake time bits last.
type SnowflakeRunway struct {
	End         time.Time // first instant the time bits cannot hold
	SecondsLeft float64
}

// WorkerRunway is the lease table's free worker IDs.
type WorkerRunway struct {
	Free, Capacity int64
}

// RunwaySnapshot is everything Runway knows, for the status page.
type RunwaySnapshot struct {
	Read   bool      // a reading of the store has finished
	ReadAt time.Time // when the last one finished
	// StoreChecked: the store's state is known; StoreUp: it answered at the last check
	// (the health probe's, or this reader's when there is no probe).
	StoreChecked, StoreUp bool
	LastError             string // why the last reading failed
	Tags                  []TagRunway
	Snowflake             *SnowflakeRunway // nil when not configured
	Workers               *WorkerRunway    // nil when the source is not the lease table, or before a reading
}

// Snapshot returns the figures of the last reading, sorted by tag; the snowflake figure is
// computed for now.
func (r *Runway) Snapshot() RunwaySnapshot {
	now := r.s.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	snap := RunwaySnapshot{Read: r.read, ReadAt: r.at, StoreUp: r.storeOK, LastError: r.lastErr}
	if r.s.StoreState != nil {
		snap.StoreChecked, snap.StoreUp = r.s.StoreState()
	} else {
		snap.StoreChecked = r.read
	}
	for tag, samples := range r.tags {
		snap.Tags = append(snap.Tags, r.tagRunway(tag, samples))
	}
	sort.Slice(snap.Tags, func(i, j int) bool { return snap.Tags[i].Tag < snap.Tags[j].Tag })
	if !r.s.SnowflakeEnd.IsZero() {
		snap.Snowflake = &SnowflakeRunway{End: r.s.SnowflakeEnd,
			SecondsLeft: math.Max(0, r.s.SnowflakeEnd.Sub(now).Seconds())}
	}
	if r.workers {
		snap.Workers = &WorkerRunway{Free: r.free, Capacity: r.cap}
	}
	return snap
}

func (r *Runway) tagRunway(tag string, samples []maxSample) TagRunway {
	kt, ok := r.s.KeyTypes[tag]
	if !ok {
		kt = r.s.DefaultKeyType
	}
	first, last := samples[0], samples[len(samples)-1]
	tr := TagRunway{Tag: tag, KeyType: kt, MaxID: last.max, Limit: kt.Max(), Over: last.at.Sub(first.at)}
	tr.Left = max(0, tr.Limit-last.max)
	if secs := tr.Over.Seconds(); secs > 0 && last.max > first.max {
		// max_id can also step back (a proxy handing its unused tail back at shutdown):
		// the net advance over the window is the consumption.
		tr.Rate = float64(last.max-first.max) / secs
	}
	switch {
	case tr.Left == 0:
		tr.SecondsLeft = 0
	case tr.Rate > 0:
		tr.SecondsLeft = float64(tr.Left) / tr.Rate
	default:
		tr.SecondsLeft = math.Inf(1)
	}
	return tr
}

var (
	runwayMaxIDDesc = prometheus.NewDesc(namespace+"_segment_max_id",
		"leaf_alloc.max_id of a segment tag at the last reading of the store.", []string{"tag"}, nil)
	runwayLeftDesc = prometheus.NewDesc(namespace+"_segment_ids_left",
		"IDs a segment tag has left before its key type's maximum (bigint 2^63-1, integer 2^31-1, js 2^53-1).", []string{"tag", "key_type"}, nil)
	runwayRateDesc = prometheus.NewDesc(namespace+"_segment_consumption_rate",
		"IDs per second a segment tag consumes: max_id's advance over the last hour, all proxies sharing the store together.", []string{"tag"}, nil)
	runwaySecondsDesc = prometheus.NewDesc(namespace+"_segment_seconds_left",
		"Seconds until a segment tag reaches its key type's maximum at the current rate (+Inf while it does not advance).", []string{"tag", "key_type"}, nil)
	runwaySnowflakeDesc = prometheus.NewDesc(namespace+"_snowflake_seconds_left",
		"Seconds until the snowflake time bits overflow for the configured epoch and layout.", nil, nil)
	runwaySnowflakeEndDesc = prometheus.NewDesc(namespace+"_snowflake_exhaustion_timestamp_seconds",
		"Unix time at which the snowflake time bits overflow for the configured epoch and layout.", nil, nil)
	runwayFreeDesc = prometheus.NewDesc(namespace+"_worker_ids_free",
		"Worker IDs free or expired in leaf_worker_lease (NaN before the first reading).", nil, nil)
	runwayCapacityDesc = prometheus.NewDesc(namespace+"_worker_ids_capacity",
		"Rows of leaf_worker_lease, one per worker ID (NaN before the first reading).", nil, nil)
	runwayStoreUpDesc = prometheus.NewDesc(namespace+"_store_up",
		"1 when the store answered its last check, 0 when it did not, NaN before the first.", nil, nil)
)

type runwayCollector struct{ r *Runway }

func (c *runwayCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{runwayMaxIDDesc, runwayLeftDesc, runwayRateDesc, runwaySecondsDesc,
		runwaySnowflakeDesc, runwaySnowflakeEndDesc, runwayFreeDesc, runwayCapacityDesc, runwayStoreUpDesc} {
		ch <- d
	}
}

func (c *runwayCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.r.Snapshot()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	up := math.NaN()
	if snap.StoreChecked {
		up = 0
		if snap.StoreUp {
			up = 1
		}
	}
	gauge(runwayStoreUpDesc, up)
	for _, t := range snap.Tags {
		gauge(runwayMaxIDDesc, float64(t.MaxID), t.Tag)
		gauge(runwayLeftDesc, float64(t.Left), t.Tag, string(t.KeyType))
		gauge(runwayRateDesc, t.Rate, t.Tag)
		gauge(runwaySecondsDesc, t.SecondsLeft, t.Tag, string(t.KeyType))
	}
	if s := snap.Snowflake; s != nil {
		gauge(runwaySnowflakeDesc, s.SecondsLeft)
		gauge(runwaySnowflakeEndDesc, float64(s.End.UnixMilli())/1000)
	}
	if c.r.s.ReadWorkers != nil {
		free, capa := math.NaN(), math.NaN()
		if w := snap.Workers; w != nil {
			free, capa = float64(w.Free), float64(w.Capacity)
		}
		gauge(runwayFreeDesc, free)
		gauge(runwayCapacityDesc, capa)
	}
}
