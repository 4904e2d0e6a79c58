package httpapi

import (
	"time"

	"github.com/leafproxy/leafproxy/idgen/segment"
)

// tagCache is one tag of /cache. The camelCase names and the flat value0/max0/step0,
// value1/max1/step1 fields are those of Leaf's SegmentBufferView, so Leaf dashboards keep
// working; buffers repeats them with more detail.
type tagCache struct {
	Key         string        `json:"key"`
	InitOk      bool          `json:"initOk"`
	Pos         int           `json:"pos"`
	NextReady   bool          `json:"nextReady"`
	AutoLoading bool          `json:"autoLoading"`
	Step        int64         `json:"step"`
	MinStep     int64         `json:"minStep"`
	Loads       int64         `json:"loads"`
	LastLoad    *time.Time    `json:"lastLoad,omitempty"`
	LastError   string        `json:"lastError,omitempty"`
	Value0      int64         `json:"value0"`
	Max0        int64         `json:"max0"`
	Step0       int64         `json:"step0"`
	Value1      int64         `json:"value1"`
	Max1        int64         `json:"max1"`
	Step1       int64         `json:"step1"`
	Buffers     [2]bufferView `json:"buffers"`
}

type bufferView struct {
	Start    int64      `json:"start"`
	Max      int64      `json:"max"`
	Value    int64      `json:"value"`
	Step     int64      `json:"step"`
	Idle     int64      `json:"idle"`
	LoadedAt *time.Time `json:"loadedAt,omitempty"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func cacheView(snaps []segment.TagSnapshot) []tagCache {
	out := make([]tagCache, 0, len(snaps))
	for _, s := range snaps {
		c := tagCache{
			Key: s.Tag, InitOk: s.Initialized, Pos: s.Pos, NextReady: s.NextReady,
			AutoLoading: s.Loading, Step: s.Step, MinStep: s.MinStep, Loads: s.Loads,
			LastLoad: timePtr(s.LastLoad), LastError: s.LastError,
			Value0: s.Buffers[0].Value, Max0: s.Buffers[0].Max, Step0: s.Buffers[0].Step,
			Value1: s.Buffers[1].Value, Max1: s.Buffers[1].Max, Step1: s.Buffers[1].Step,
		}
		for i, b := range s.Buffers {
			c.Buffers[i] = bufferView{Start: b.Start, Max: b.Max, Value: b.Value, Step: b.Step,
				Idle: b.Idle, LoadedAt: timePtr(b.LoadedAt)}
		}
		out = append(out, c)
	}
	return out
}

// Remaining returns the IDs a tag has left in memory: the idle part of the current buffer
// and, when ready, of the next one.
func Remaining(s segment.TagSnapshot) int64 {
	n := s.Buffers[s.Pos].Idle
	if s.NextReady {
		n += s.Buffers[1-s.Pos].Idle
	}
	return n
}
