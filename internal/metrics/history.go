package metrics

import (
	"sync"
	"time"
)

// HistorySample is the running totals at one moment; the differences between samples are
// the history the status page draws.
type HistorySample struct {
	At         time.Time
	IDs        uint64            // IDs issued, all engines and tags
	Loads      uint64            // successful segment loads
	LoadErrors uint64            // failed segment loads
	Errors     map[string]uint64 // errors the proxy answered statements with, by SQLSTATE
	Rejects    map[string]uint64 // clients the proxy refused, by SQLSTATE
}

// Snapshot returns the totals now.
func (m *Metrics) Snapshot(now time.Time) HistorySample {
	s := HistorySample{At: now, Errors: m.ErrorTotals(), Rejects: m.RejectTotals()}
	for _, n := range m.IssuedTotals() {
		s.IDs += n
	}
	s.Loads, s.LoadErrors = m.SegmentLoadTotals()
	return s
}

// History keeps the newest samples in a fixed ring, in memory only: at one sample every
// 10 s, 360 samples are the last hour.
type History struct {
	mu   sync.Mutex
	ring []HistorySample
	next int  // where the next sample goes
	full bool // the ring has wrapped
}

// NewHistory returns a ring of size samples (at least 2).
func NewHistory(size int) *History {
	return &History{ring: make([]HistorySample, max(size, 2))}
}

// Add records a sample, dropping the oldest when the ring is full.
func (h *History) Add(s HistorySample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ring[h.next] = s
	h.next = (h.next + 1) % len(h.ring)
	if h.next == 0 {
		h.full = true
	}
}

// Samples returns the samples kept, oldest first.
func (h *History) Samples() []HistorySample {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.full {
		return append([]HistorySample(nil), h.ring[:h.next]...)
	}
	out := make([]HistorySample, 0, len(h.ring))
	out = append(out, h.ring[h.next:]...)
	return append(out, h.ring[:h.next]...)
}
