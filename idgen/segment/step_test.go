package segment_test

import (
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen/segment"
)

// TestDynamicStep drives one tag through segments of chosen lifetimes on an injected clock
// and checks the size of each reservation: under ShortSegment doubles (up to MaxStep),
// over LongSegment halves (down to the step column), in between keeps.
func TestDynamicStep(t *testing.T) {
	const minStep, maxStep = 100, 800
	store := newFakeStore()
	store.addTag("t", minStep, 0)
	clock := newFakeClock()
	e := startEngine(t, store, segment.Settings{MaxStep: maxStep, Now: clock.Now})

	mustNext(t, e, "t")
	if a := store.allocations(); len(a) != 1 || a[0].hi-a[0].lo != minStep {
		t.Fatalf("first load: %v, want one segment of the step column (%d)", a, minStep)
	}
	steps := []struct {
		name       string
		lasted     time.Duration
		setMinStep int64 // when non-zero, the step column is changed before this load
		want       int64
	}{
		{"5m doubles", 5 * time.Minute, 0, 200},
		{"5m doubles again", 5 * time.Minute, 0, 400},
		{"5m reaches MaxStep", 5 * time.Minute, 0, 800},
		{"5m stays at MaxStep", 5 * time.Minute, 0, 800},
		{"20m keeps", 20 * time.Minute, 0, 800},
		{"40m halves", 40 * time.Minute, 0, 400},
		{"15m exactly keeps", 15 * time.Minute, 0, 400},
		{"30m exactly keeps", 30 * time.Minute, 0, 400},
		{"40m halves again", 40 * time.Minute, 0, 200},
		{"40m halves to the column", 40 * time.Minute, 0, 100},
		{"40m stays at the column", 40 * time.Minute, 0, 100},
		{"14m59s doubles", 15*time.Minute - time.Second, 0, 200},
		{"raised column wins at once", 20 * time.Minute, 300, 300},
		{"40m cannot go below the raised column", 40 * time.Minute, 0, 300},
		{"column above MaxStep wins over MaxStep", 5 * time.Minute, 1000, 1000},
		{"and is not doubled past MaxStep", 5 * time.Minute, 0, 1000},
	}
	for _, st := range steps {
		if st.setMinStep != 0 {
			store.mu.Lock()
			store.rows["t"].step = st.setMinStep
			store.mu.Unlock()
		}
		clock.Advance(st.lasted)
		// Hand out IDs until the threshold starts the next load; the Next that crosses it
		// starts the load before it returns.
		for s := snapshotOf(t, e, "t"); !s.Loading && !s.NextReady; s = snapshotOf(t, e, "t") {
			mustNext(t, e, "t")
		}
		eventually(t, st.name+": the preload to be installed", func() bool { return snapshotOf(t, e, "t").NextReady })
		a := store.allocations()
		if got := a[len(a)-1].hi - a[len(a)-1].lo; got != st.want {
			t.Fatalf("%s: reserved %d IDs, want %d", st.name, got, st.want)
		}
		if s := snapshotOf(t, e, "t"); s.Step != st.want {
			t.Fatalf("%s: snapshot step %d, want %d", st.name, s.Step, st.want)
		}
		// Use up the current segment so the next threshold belongs to the fresh one.
		for snapshotOf(t, e, "t").NextReady {
			mustNext(t, e, "t")
		}
	}
}
