package zookeeper_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen/worker"
	"github.com/leafproxy/leafproxy/internal/testenv"
)

// A report whose request never gets an answer, on a connection that keeps answering
// pings (so the client never declares it dead), must not stall the reports: once the
// link is healthy again the node's timestamp advances within about a session timeout.
func TestUnansweredReportDoesNotStallReports(t *testing.T) {
	addr := testenv.ZooKeeperAddr(t)
	name := uniqueName(t, addr)
	proxy := newCutProxy(t, addr)
	s := settings(t, proxy.Addr(), name, "7001")
	s.SessionTimeout = 2 * time.Second
	s.ReportInterval = 50 * time.Millisecond
	var reportErrors atomic.Int32
	s.Hooks = worker.Hooks{OnReportError: func(int64, error) { reportErrors.Add(1) }}
	l, err := newSource(t, s).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Bounded: without the fix the stuck report would hold Close forever.
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		l.Close(cctx)
	})
	node := fmt.Sprintf("%s/127.0.0.1:7001-%010d", forever(name), l.WorkerID())
	raw := rawConn(t, addr)

	proxy.swallow.Store(opSetData)
	// Above the node's timestamp (its creation time): reports only ever raise it.
	l.Record(readNode(t, raw, node).Timestamp + 1)
	waitUntil(t, 5*time.Second, "a report to be swallowed", func() bool { return proxy.swallowed.Load() > 0 })
	proxy.swallow.Store(0)
	healthy := time.Now()

	later := time.Now().UnixMilli()
	l.Record(later)
	// The bound: one session timeout for the stuck request, then a new session and a report.
	waitUntil(t, 3*s.SessionTimeout+2*time.Second, "reports to resume after the unanswered one", func() bool {
		return readNode(t, raw, node).Timestamp == later
	})
	t.Logf("reports resumed %v after the link was healthy again", time.Since(healthy).Round(time.Millisecond))
	if reportErrors.Load() == 0 {
		t.Error("the unanswered report was not counted as a failed report")
	}
	// The new session rewrote the same persistent node: no other node for this ip:port.
	if children, _, err := raw.Children(forever(name)); err != nil || len(children) != 1 {
		t.Errorf("nodes after the new session: %v, %v; want only %s", children, err, node)
	}
}
