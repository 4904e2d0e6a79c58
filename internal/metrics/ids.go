package metrics

import (
	"context"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leafproxy/leafproxy/idgen"
)

// Key names one series of issued IDs.
type Key struct {
	Engine string
	Tag    string
}

// issuedCollector counts IDs in plain atomics (one add per ID, no label hashing) and turns
// them into leafproxy_ids_issued_total at scrape time.
type issuedCollector struct {
	desc     *prometheus.Desc
	counters sync.Map // Key → *atomic.Uint64
}

func newIssuedCollector() *issuedCollector {
	return &issuedCollector{desc: prometheus.NewDesc(namespace+"_ids_issued_total",
		"IDs handed out, by engine (segment, snowflake) and tag.", []string{"engine", "tag"}, nil)}
}

func (c *issuedCollector) counter(engine, tag string) *atomic.Uint64 {
	k := Key{engine, tag}
	if v, ok := c.counters.Load(k); ok {
		return v.(*atomic.Uint64)
	}
	v, _ := c.counters.LoadOrStore(k, new(atomic.Uint64))
	return v.(*atomic.Uint64)
}

func (c *issuedCollector) totals() map[Key]uint64 {
	out := map[Key]uint64{}
	c.counters.Range(func(k, v any) bool {
		out[k.(Key)] = v.(*atomic.Uint64).Load()
		return true
	})
	return out
}

func (c *issuedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *issuedCollector) Collect(ch chan<- prometheus.Metric) {
	for k, n := range c.totals() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n), k.Engine, k.Tag)
	}
}

// BufferLevel is what the segment engine holds for one tag, for the buffer gauges.
type BufferLevel struct {
	Tag       string
	Remaining int64 // IDs left in the current and the next segment together
	Step      int64 // size of the current segment
}

type bufferCollector struct {
	levels func() []BufferLevel
}

var (
	bufferRemainingDesc = prometheus.NewDesc(namespace+"_segment_buffer_remaining",
		"IDs left in memory for a segment tag (current and next segment).", []string{"tag"}, nil)
	bufferStepDesc = prometheus.NewDesc(namespace+"_segment_step",
		"Size of the segment a tag is serving from.", []string{"tag"}, nil)
)

func (c *bufferCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- bufferRemainingDesc
	ch <- bufferStepDesc
}

func (c *bufferCollector) Collect(ch chan<- prometheus.Metric) {
	for _, l := range c.levels() {
		ch <- prometheus.MustNewConstMetric(bufferRemainingDesc, prometheus.GaugeValue, float64(l.Remaining), l.Tag)
		ch <- prometheus.MustNewConstMetric(bufferStepDesc, prometheus.GaugeValue, float64(l.Step), l.Tag)
	}
}

// Counting wraps a generator so that every ID it returns is counted under engine and its
// tag, and every failure under engine and its reason.
func (m *Metrics) Counting(engine string, g idgen.Generator) idgen.Generator {
	return &counting{m: m, engine: engine, g: g}
}

type counting struct {
	m      *Metrics
	engine string
	g      idgen.Generator
	// recent holds the counters of the tags counted lately, each in the slot its
	// digest picks: an ID of a tag found there costs a pointer load, a string
	// comparison and the counter's add. Only a tag missing from its slot is looked up
	// in byTag, which hashes it, and then takes the slot.
	recent [recentSlots]atomic.Pointer[tagCounter]
	// byTag is a copy-on-write map: a plain map read through an atomic pointer costs a
	// string hash, where sync.Map also hashes and compares interfaces. Tags are few (rows
	// of leaf_alloc, configured snowflake tags; failures are not counted here), so copying
	// on the rare new tag is cheap.
	byTag atomic.Pointer[map[string]*tagCounter]
	mu    sync.Mutex // serializes the copies
}

// tagCounter is the counter of one tag's issued IDs, with the tag (a copy of its own).
type tagCounter struct {
	tag string
	n   *atomic.Uint64
}

// recentSlots is the size of counting.recent, a power of two.
const recentSlots = 16

// recentSlot is the slot of tag in counting.recent: a digest of its length and its first
// and last bytes, which tells apart the few tags a proxy serves without reading them
// whole.
func recentSlot(tag string) int {
	if tag == "" {
		return 0
	}
	return (len(tag) + 7*int(tag[0]) + 13*int(tag[len(tag)-1])) & (recentSlots - 1)
}

func (c *counting) Next(ctx context.Context, tag string) (int64, error) {
	id, err := c.g.Next(ctx, tag)
	if err != nil {
		c.m.IDError(c.engine, err)
		return id, err
	}
	c.count(tag)
	return id, nil
}

// NextBatch passes a batch on (idgen.NextBatch) and counts the IDs it got, also those of
// a batch cut short by a failure, which are spent.
func (c *counting) NextBatch(ctx context.Context, tag string, n int, dst []int64) ([]int64, error) {
	before := len(dst)
	dst, err := idgen.NextBatch(ctx, c.g, tag, n, dst)
	if got := len(dst) - before; got > 0 {
		c.countN(tag, uint64(got))
	}
	if err != nil {
		c.m.IDError(c.engine, err)
	}
	return dst, err
}

// TryNext passes the non-blocking request on (idgen.TryGenerator) and counts the ID it
// gets; ok=false is no failure (the caller goes on to Next), so it is not counted.
func (c *counting) TryNext(tag string) (int64, bool) {
	id, ok := idgen.TryNext(c.g, tag)
	if ok {
		c.count(tag)
	}
	return id, ok
}

// count counts one ID of tag.
func (c *counting) count(tag string) { c.countN(tag, 1) }

// countN counts k IDs of tag.
func (c *counting) countN(tag string, k uint64) {
	slot := &c.recent[recentSlot(tag)]
	if tc := slot.Load(); tc != nil && tc.tag == tag {
		tc.n.Add(k)
		return
	}
	tc := c.counterOf(tag)
	slot.Store(tc)
	tc.n.Add(k)
}

// counterOf returns the counter of tag, creating it on the tag's first ID.
func (c *counting) counterOf(tag string) *tagCounter {
	if m := c.byTag.Load(); m != nil {
		if tc := (*m)[tag]; tc != nil {
			return tc
		}
	}
	return c.counterSlow(tag)
}

func (c *counting) counterSlow(tag string) *tagCounter {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.byTag.Load()
	if old != nil && (*old)[tag] != nil {
		return (*old)[tag]
	}
	next := make(map[string]*tagCounter, 1)
	if old != nil {
		for k, v := range *old {
			next[k] = v
		}
	}
	tag = strings.Clone(tag) // the caller's may be a view of a buffer it reuses
	tc := &tagCounter{tag: tag, n: c.m.issued.counter(c.engine, tag)}
	next[tag] = tc
	c.byTag.Store(&next)
	return tc
}

// RateMeter turns the issued totals into IDs per second over a sliding window. Call
// Sample about once a second (a ticker in the server does) and Rates whenever.
type RateMeter struct {
	m      *Metrics
	window time.Duration

	mu      sync.Mutex
	samples []rateSample // oldest first, spanning at most window
}

type rateSample struct {
	at     time.Time
	totals map[Key]uint64
}

// NewRateMeter measures rates over window (10 s when zero).
func (m *Metrics) NewRateMeter(window time.Duration) *RateMeter {
	if window <= 0 {
		window = 10 * time.Second
	}
	return &RateMeter{m: m, window: window}
}

// Sample records the totals at now.
func (r *RateMeter) Sample(now time.Time) {
	s := rateSample{at: now, totals: r.m.IssuedTotals()}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples = append(r.samples, s)
	// Keep one sample older than the window so the rate spans the whole window.
	for len(r.samples) > 2 && now.Sub(r.samples[1].at) >= r.window {
		r.samples = r.samples[1:]
	}
}

// Rates returns IDs per second per series between the oldest and the newest sample; a
// series is missing until two samples exist.
func (r *RateMeter) Rates() map[Key]float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[Key]float64{}
	if len(r.samples) < 2 {
		return out
	}
	first, last := r.samples[0], r.samples[len(r.samples)-1]
	secs := last.at.Sub(first.at).Seconds()
	if secs <= 0 {
		return out
	}
	for k, n := range last.totals {
		out[k] = float64(n-first.totals[k]) / secs
	}
	return out
}

// SortedKeys returns the keys of a totals or rates map in engine, tag order.
func SortedKeys[V any](m map[Key]V) []Key {
	keys := make([]Key, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Engine != keys[j].Engine {
			return keys[i].Engine < keys[j].Engine
		}
		return keys[i].Tag < keys[j].Tag
	})
	return keys
}
