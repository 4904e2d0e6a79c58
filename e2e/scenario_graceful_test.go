package e2e

import (
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// TestGracefulRestartUnderLoad sends SIGTERM to a loaded proxy: it must exit by itself
// within its shutdown timeout, its clients see connection errors only, and — being the
// only proxy on its leaf_alloc — it gives the unused segment tails back, so the restarted
// proxy continues each segment tag where the old one stopped (no gap beyond the IDs of
// statements cut off by the shutdown).
func TestGracefulRestartUnderLoad(t *testing.T) {
	requireServeFlags(t, "snowflake-tags", "fill", "worker-source", "worker-id", "shutdown-timeout")
	dsn := testenv.NewDatabase(t)
	fx := newFixture(t, dsn, 1000)
	cfg := fx.proxyConfig(t)
	cfg.WorkerSource, cfg.WorkerID = "static", 21
	const shutdownTimeout = 3 * time.Second
	cfg.Extra = []string{"--shutdown-timeout", shutdownTimeout.String()}
	p := NewProxy(t, "graceful", cfg)
	p.Start()
	requireRewriting(t, p, dsn, snowOrder)

	coll := NewCollector()
	load := StartLoad(t, coll, dsn, []*Proxy{p}, 8)
	hold(loadDuration() / 5)

	load.SetPhase("stopping")
	termAt := time.Now()
	took, err := p.Terminate(shutdownTimeout + 15*time.Second)
	if err != nil {
		t.Errorf("exit after SIGTERM: %v (want status 0)", err)
	}
	if took > shutdownTimeout+5*time.Second {
		t.Errorf("took %v to exit after SIGTERM with a %v shutdown timeout", took, shutdownTimeout)
	}
	before := map[string]int64{}
	for _, r := range coll.Rows() {
		if r.Namespace != snowflakeNamespace {
			before[r.Namespace] = max(before[r.Namespace], r.ID)
		}
	}

	load.SetPhase("after")
	p.Start()
	readyAt := time.Now()
	if _, err := load.WaitSuccesses(p.Name, 200, 30*time.Second); err != nil {
		t.Errorf("after the restart: %v", err)
	}
	load.Stop()

	errs := load.Errors()
	reportErrors(t, "not a connection error", errs, func(e loadErr) bool { return !e.Conn })
	reportErrors(t, "connection error outside the shutdown", errs, func(e loadErr) bool {
		return e.Conn && (e.At.Before(termAt) || e.At.After(readyAt.Add(2*time.Second)))
	})
	requireNoDuplicates(t, coll)
	checkStoredUnique(t, fx, coll)

	// Each statement cut off by the shutdown may have taken up to two IDs of a tag.
	cutOff := int64(0)
	for _, e := range errs {
		if e.Op != "connect" {
			cutOff++
		}
	}
	for _, tag := range fx.SegmentTags {
		first := int64(-1)
		for _, r := range coll.Select(func(r IDRow) bool { return r.Namespace == tag && r.Phase == "after" }) {
			if first < 0 || r.ID < first {
				first = r.ID
			}
		}
		if first < 0 || before[tag] == 0 {
			t.Errorf("tag %s: no IDs before (%d) or after (%d) the restart", tag, before[tag], first)
			continue
		}
		gap := first - before[tag] - 1
		t.Logf("FIGURE graceful: tag %s: last ID before SIGTERM %d, first after restart %d (gap %d, %d statements cut off)",
			tag, before[tag], first, gap, cutOff)
		if gap > 2*cutOff {
			t.Errorf("tag %s: the restarted proxy skipped %d IDs after %d: the unused tail was not given back", tag, gap, before[tag])
		}
	}
	t.Logf("FIGURE graceful: SIGTERM to exit %v (shutdown timeout %v); %d connection errors", took.Round(time.Millisecond), shutdownTimeout, len(errs))
}
