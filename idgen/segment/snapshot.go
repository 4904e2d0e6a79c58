package segment

import "time"

// TagSnapshot is the state of one tag, as Leaf's /cache monitor shows it.
type TagSnapshot struct {
	Tag         string
	Initialized bool  // the first segment has been loaded (Leaf's initOk)
	Pos         int   // index in Buffers of the current segment (Leaf's pos)
	NextReady   bool  // Buffers[1-Pos] holds the next segment, unused
	Loading     bool  // a load runs or waits to retry
	Step        int64 // size of the newest segment; the next load starts from it
	MinStep     int64 // the step column as the last load saw it
	Loads       int64 // successful loads since start
	LastLoad    time.Time
	LastError   string // why the last load failed; empty when it succeeded
	Buffers     [2]SegmentSnapshot
}

// SegmentSnapshot is one of a tag's two buffers. A buffer never loaded is all zero.
type SegmentSnapshot struct {
	Start    int64 // first ID of the range
	Max      int64 // last ID of the range (Leaf's max)
	Value    int64 // next ID to hand out; Max+1 when used up (Leaf's value)
	Step     int64 // number of IDs in the range
	Idle     int64 // IDs left
	LoadedAt time.Time
}

// Snapshot returns the state of every tag, sorted by tag. It locks each tag briefly and
// is meant for monitoring, not for the request path.
func (e *Engine) Snapshot() []TagSnapshot {
	tags := *e.tags.Load()
	out := make([]TagSnapshot, 0, len(tags))
	for _, tag := range sortedKeys(tags) {
		out = append(out, tags[tag].snapshot())
	}
	return out
}

func (tb *tagBuffer) snapshot() TagSnapshot {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	ts := TagSnapshot{
		Tag:         tb.tag,
		Initialized: tb.cur.Load() != nil,
		Pos:         tb.pos,
		NextReady:   tb.nextReady,
		Loading:     tb.loading,
		Step:        tb.step,
		MinStep:     tb.minStep,
		Loads:       tb.loads,
		LastLoad:    tb.lastLoad,
	}
	if tb.lastErr != nil {
		ts.LastError = tb.lastErr.Error()
	}
	for i, s := range tb.segs {
		if s == nil {
			continue
		}
		issued := s.issued()
		ts.Buffers[i] = SegmentSnapshot{
			Start:    s.lo + 1,
			Max:      s.hi(),
			Value:    s.lo + issued + 1,
			Step:     s.size,
			Idle:     s.size - issued,
			LoadedAt: s.loadedAt,
		}
	}
	return ts
}
