package e2e

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// Where an ID came from, for reports and for matching IDs against table rows.
const (
	originLeafNext    = "leaf_next"
	originOrderInsert = "insert orders"
	originItemInsert  = "insert items"
	originRolledBack  = "insert rolled back"
	originHTTP        = "http"
	originClient      = "client"
)

// snowflakeNamespace is the one namespace of every snowflake tag: the engine's IDs are
// unique across tags, while each segment tag counts on its own.
const snowflakeNamespace = "snowflake"

// Default snowflake layout of DESIGN.md: 41 bits of ms since the epoch, 10 worker, 12 seq.
const (
	snowflakeEpochMS = 1288834974657
	workerBits       = 10
	sequenceBits     = 12
)

// decodeSnowflake splits an ID of the default layout.
func decodeSnowflake(id int64) (at time.Time, worker, seq int64) {
	ms := id>>(workerBits+sequenceBits) + snowflakeEpochMS
	return time.UnixMilli(ms), (id >> sequenceBits) & (1<<workerBits - 1), id & (1<<sequenceBits - 1)
}

// IDRow is one ID some client was handed.
type IDRow struct {
	Namespace string
	ID        int64
	Origin    string
	Proxy     string
	Run       int // which start of the proxy process served it (Proxy.Starts), 0 if unknown
	Phase     string
}

// Collector gathers every ID the test's clients receive and finds duplicates as they
// arrive. It is safe for concurrent use.
type Collector struct {
	mu        sync.Mutex
	seen      map[string]map[int64]IDRow
	rows      []IDRow
	dups      []string
	uncertain map[string]int // origin → rows an INSERT may have written without telling us
}

// NewCollector returns an empty collector.
func NewCollector() *Collector {
	return &Collector{seen: map[string]map[int64]IDRow{}, uncertain: map[string]int{}}
}

// Add records one ID; a second sighting in the same namespace is a duplicate.
func (c *Collector) Add(r IDRow) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ns := c.seen[r.Namespace]
	if ns == nil {
		ns = map[int64]IDRow{}
		c.seen[r.Namespace] = ns
	}
	if first, dup := ns[r.ID]; dup {
		c.dups = append(c.dups, fmt.Sprintf("%s ID %d: first %s via %s (%s), again %s via %s (%s)",
			r.Namespace, r.ID, first.Origin, first.Proxy, first.Phase, r.Origin, r.Proxy, r.Phase))
		return
	}
	ns[r.ID] = r
	c.rows = append(c.rows, r)
}

// Uncertain records that an INSERT of n rows ended with a broken connection, so PostgreSQL
// may hold rows whose IDs no client saw.
func (c *Collector) Uncertain(origin string, n int) {
	c.mu.Lock()
	c.uncertain[origin] += n
	c.mu.Unlock()
}

// UncertainInserts is the number of rows of origin whose outcome is unknown.
func (c *Collector) UncertainInserts(origin string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.uncertain[origin]
}

// Duplicates lists every duplicate seen.
func (c *Collector) Duplicates() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.dups...)
}

// Rows returns a copy of every distinct ID recorded.
func (c *Collector) Rows() []IDRow {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]IDRow(nil), c.rows...)
}

// Len is the number of distinct IDs recorded.
func (c *Collector) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.rows)
}

// ByOrigin returns the IDs of one origin.
func (c *Collector) ByOrigin(origin string) []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []int64
	for _, r := range c.rows {
		if r.Origin == origin {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

// Select returns the rows for which keep is true.
func (c *Collector) Select(keep func(IDRow) bool) []IDRow {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []IDRow
	for _, r := range c.rows {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// CountBy returns how many IDs each key has, sorted by key, for logs.
func (c *Collector) CountBy(key func(IDRow) string) string {
	c.mu.Lock()
	counts := map[string]int{}
	for _, r := range c.rows {
		counts[key(r)]++
	}
	c.mu.Unlock()
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	s := ""
	for _, k := range keys {
		s += fmt.Sprintf(" %s=%d", k, counts[k])
	}
	return s
}

// Workers returns the distinct snowflake worker IDs in the IDs a proxy handed out.
func (c *Collector) Workers(proxy string) []int64 {
	set := map[int64]bool{}
	for _, r := range c.Select(func(r IDRow) bool { return r.Namespace == snowflakeNamespace && r.Proxy == proxy }) {
		_, w, _ := decodeSnowflake(r.ID)
		set[w] = true
	}
	out := make([]int64, 0, len(set))
	for w := range set {
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// tenure is the span of the snowflake IDs of one worker ID that one run of one proxy issued.
type tenure struct {
	holder      string // proxy and run
	first, last time.Time
	ids         int
}

// WorkerOverlaps checks what fencing promises, which uniqueness alone would only catch by
// the chance of an equal sequence number in an equal millisecond: no two processes issue
// IDs of one worker ID over overlapping times. Per worker ID it orders the runs' spans of
// ID timestamps and reports every run whose first ID is not after the previous run's last
// one. IDs of an unknown run (Run 0) are left out.
func (c *Collector) WorkerOverlaps() []string {
	spans := map[int64]map[string]*tenure{}
	for _, r := range c.Select(func(r IDRow) bool { return r.Namespace == snowflakeNamespace && r.Run > 0 }) {
		at, w, _ := decodeSnowflake(r.ID)
		holder := fmt.Sprintf("%s run %d", r.Proxy, r.Run)
		if spans[w] == nil {
			spans[w] = map[string]*tenure{}
		}
		s := spans[w][holder]
		if s == nil {
			s = &tenure{holder: holder, first: at, last: at}
			spans[w][holder] = s
		}
		if at.Before(s.first) {
			s.first = at
		}
		if at.After(s.last) {
			s.last = at
		}
		s.ids++
	}
	var out []string
	for w, byHolder := range spans {
		list := make([]*tenure, 0, len(byHolder))
		for _, s := range byHolder {
			list = append(list, s)
		}
		sort.Slice(list, func(i, j int) bool { return list[i].first.Before(list[j].first) })
		for i := 1; i < len(list); i++ {
			prev, cur := list[i-1], list[i]
			if !cur.first.After(prev.last) {
				out = append(out, fmt.Sprintf("worker ID %d: %s issued %d IDs from %s to %s, %s %d IDs from %s to %s",
					w, prev.holder, prev.ids, prev.first.Format("15:04:05.000"), prev.last.Format("15:04:05.000"),
					cur.holder, cur.ids, cur.first.Format("15:04:05.000"), cur.last.Format("15:04:05.000")))
			}
		}
	}
	sort.Strings(out)
	return out
}
