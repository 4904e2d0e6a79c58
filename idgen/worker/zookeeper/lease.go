package zookeeper

import (
	"context"
	"path"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/idgen/worker"
)

// lease is a worker ID bound to a persistent node: it is never lost, so Held is always
// true and Done is nil. Its goroutine rewrites the node data (and the cache file) with the
// high-water mark every ReportInterval.
type lease struct {
	src       *Source
	id        int64 // set before the lease is handed out
	highWater int64 // likewise

	node      atomic.Pointer[string] // node name; nil until known (start from the cache file)
	recorded  atomic.Int64
	persisted atomic.Int64

	sessionOnce sync.Once
	session     chan struct{} // closed when the first session is established

	mu       sync.Mutex // guards the connection and its bookkeeping
	conn     *zk.Conn   // the current connection; nil after a failed dial and after Close
	gen      uint64     // generation of conn: events of older connections are ignored
	closed   bool       // Close is done with the connection; dial no other
	assigned bool       // id is final; events may name it
	down     bool       // the connection was lost and has not come back yet

	// owned by run
	failing    bool
	lastCached int64
	warnedNode bool

	stop      chan struct{}
	stopped   chan struct{}
	closeOnce sync.Once
}

func newLease(s *Source) *lease {
	return &lease{src: s, session: make(chan struct{}), stop: make(chan struct{}), stopped: make(chan struct{})}
}

func (l *lease) WorkerID() int64       { return l.id }
func (l *lease) HighWater() int64      { return l.highWater }
func (l *lease) Record(ms int64)       { worker.RecordMax(&l.recorded, ms) }
func (l *lease) ValidUntil() time.Time { return time.Time{} }
func (l *lease) Done() <-chan struct{} { return nil }

func (l *lease) nodePath() string {
	if n := l.node.Load(); n != nil {
		return path.Join(l.src.dir, *n)
	}
	return ""
}

func (l *lease) logger() logrus.FieldLogger {
	return l.src.s.Logger.WithFields(logrus.Fields{"worker_id": l.id, "node": l.nodePath()})
}

// waitSession waits for the first session, at most timeout.
func (l *lease) waitSession(ctx context.Context, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-l.session:
		return nil
	case <-t.C:
		return errNoSession(timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

type errNoSession time.Duration

func (e errNoSession) Error() string {
	return "no ZooKeeper session within " + time.Duration(e).String()
}

func (e errNoSession) Unwrap() error { return worker.ErrUnreachable }

// onEvent follows the session: the client reconnects by itself and, once the session has
// expired, makes a new one; all there is to do is to tell the operator and the metrics.
// It runs on the client's goroutine and must not block. gen is the generation of the
// connection the event comes from.
func (l *lease) onEvent(gen uint64, ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if gen != l.gen {
		return
	}
	if ev.State == zk.StateHasSession {
		l.sessionOnce.Do(func() { close(l.session) })
	}
	if !l.assigned {
		return
	}
	log := l.src.s.Logger.WithFields(logrus.Fields{"worker_id": l.id, "server": ev.Server})
	switch ev.State {
	case zk.StateHasSession:
		if l.down {
			l.down = false
			log.Info("ZooKeeper connection back; resuming the worker ID reports")
			l.src.s.Hooks.Reconnect(l.id)
		}
	case zk.StateExpired:
		l.down = true
		log.Warn("ZooKeeper session expired; making a new one (the worker ID node is persistent and stays ours)")
		l.src.s.Hooks.SessionExpired(l.id)
	case zk.StateDisconnected:
		if !l.down {
			l.down = true
			log.Warn("ZooKeeper connection lost; still issuing IDs, reconnecting")
		}
	}
}

// run reports the high-water mark every ReportInterval until Close.
func (l *lease) run() {
	defer close(l.stopped)
	down := !l.hasSession()
	l.mu.Lock()
	l.assigned = true
	l.down = down
	l.mu.Unlock()
	l.lastCached = l.highWater
	t := time.NewTicker(l.src.s.ReportInterval)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.report()
		}
	}
}

// report writes the high-water mark to the node and the cache file.
func (l *lease) report() {
	hw := max(l.recorded.Load(), l.persisted.Load())
	if hw != l.lastCached {
		if err := l.src.cache.write(l.id, hw); err != nil {
			l.logger().WithError(err).Warn("writing the worker ID cache file failed")
		} else {
			l.lastCached = hw
		}
	}
	if l.node.Load() == nil && !l.resolveNode() {
		return
	}
	err := l.do(func(c *zk.Conn) error {
		_, err := c.Set(l.nodePath(), l.src.encode(hw), -1)
		return err
	})
	if err != nil {
		if !l.failing {
			l.logger().WithError(err).Warn("reporting the worker ID timestamp to ZooKeeper failed; retrying")
		}
		l.failing = true
		l.src.s.Hooks.ReportError(l.id, err)
		return
	}
	if l.failing {
		l.failing = false
		l.logger().Info("worker ID timestamp reports to ZooKeeper resumed")
	}
	l.persisted.Store(hw)
}

// resolveNode finds the node after a start from the cache file, once ZooKeeper answers.
func (l *lease) resolveNode() bool {
	var seq int64
	var name string
	err := l.do(func(c *zk.Conn) (err error) {
		seq, name, err = l.findNode(c)
		return err
	})
	if err != nil {
		l.src.s.Hooks.ReportError(l.id, err)
		return false
	}
	if name == "" || seq != l.id {
		if !l.warnedNode {
			l.warnedNode = true
			l.logger().WithFields(logrus.Fields{"found": name, "prefix": l.src.NodePrefix()}).
				Error("ZooKeeper has no node for this ip:port with the cached worker ID; timestamps are kept in the cache file only")
		}
		return false
	}
	l.node.Store(&name)
	l.logger().Info("found the worker ID node after starting from the cache file")
	return true
}

// Close makes a last report, when ZooKeeper is there, and disconnects. The node stays: it
// is this ip:port's worker ID for good.
func (l *lease) Close(ctx context.Context) error {
	l.closeOnce.Do(func() {
		defer l.shutdown() // also ends a report stuck on a dead connection
		close(l.stop)
		select {
		case <-l.stopped:
		case <-ctx.Done():
			return
		}
		if !l.hasSession() {
			return
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			l.report()
		}()
		select {
		case <-done:
		case <-ctx.Done():
		}
	})
	return ctx.Err()
}
