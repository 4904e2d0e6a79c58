package zookeeper

import (
	"context"
	"encoding/json"
	"path"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/idgen/worker"
)

// lease is a worker ID bound to a persistent node, usable while its liveness claim is
// proven (see claim.go). With the claim its goroutines rewrite the node data (and the cache
// file) with the high-water mark every ReportInterval and prove the claim; without it (held
// by another process, or a start from the cache file) it issues nothing and waits for a
// reason to acquire again.
type lease struct {
	src       *Source
	id        int64      // set before the lease is handed out
	highWater int64      // likewise
	claimed   bool       // likewise: the claim was made by this lease's session
	other     *claimData // likewise: the holder of the claim when another process has it

	node      atomic.Pointer[string] // node name; nil until known (start from the cache file)
	recorded  atomic.Int64
	persisted atomic.Int64

	fenceMu    sync.Mutex // serialises extend and end
	ended      bool
	validUntil atomic.Pointer[time.Time]
	done       chan struct{} // closed by end

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

	stop      chan struct{}
	stopped   chan struct{} // closed when run returns (at once without the claim)
	wg        sync.WaitGroup
	closeOnce sync.Once
}

func newLease(s *Source) *lease {
	l := &lease{src: s, session: make(chan struct{}), stop: make(chan struct{}), stopped: make(chan struct{}),
		done: make(chan struct{})}
	past := s.s.Now()
	l.validUntil.Store(&past) // not valid before the claim is made
	return l
}

func (l *lease) WorkerID() int64       { return l.id }
func (l *lease) HighWater() int64      { return l.highWater }
func (l *lease) Record(ms int64)       { worker.RecordMax(&l.recorded, ms) }
func (l *lease) ValidUntil() time.Time { return *l.validUntil.Load() }
func (l *lease) Done() <-chan struct{} { return l.done }

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
// expired, makes a new one. An expired session took the claim with it, so the lease ends.
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
		log.Warn("ZooKeeper session expired, and the worker ID's liveness claim with it")
		l.src.s.Hooks.SessionExpired(l.id)
		if l.claimed {
			go l.end("session expired: refusing snowflake IDs until the worker ID is claimed again")
		}
	case zk.StateDisconnected:
		if !l.down {
			l.down = true
			log.Warn("ZooKeeper connection lost; reconnecting (IDs go on until the session could have expired)")
		}
	}
}

// start runs the lease's goroutines: with the claim, the reports and the proofs; without
// it, the wait for a reason to acquire again.
func (l *lease) start() {
	l.wg.Add(1)
	if !l.claimed {
		close(l.stopped)
		l.mu.Lock()
		l.assigned = true
		l.mu.Unlock()
		go l.await()
		return
	}
	go l.prove()
	go l.run()
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

// report writes the high-water mark to the node and the cache file. The node is written
// only upward (a compare-and-set on its version), so a late report of a lease that
// has ended never lowers the mark of the next holder of the same ip:port.
func (l *lease) report() {
	hw := max(l.recorded.Load(), l.persisted.Load())
	if hw != l.lastCached {
		if err := l.src.cache.write(l.id, hw); err != nil {
			l.logger().WithError(err).Warn("writing the worker ID cache file failed")
		} else {
			l.lastCached = hw
		}
	}
	if l.node.Load() == nil {
		return
	}
	err := l.do(func(c *zk.Conn) error {
		raw, stat, err := c.Get(l.nodePath())
		if err != nil {
			return err
		}
		var d nodeData
		if json.Unmarshal(raw, &d) == nil && d.Timestamp >= hw {
			return nil
		}
		_, err = c.Set(l.nodePath(), l.src.encode(hw), stat.Version)
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

// Close makes a last report, when ZooKeeper is there, and disconnects, which ends the
// session and so the claim. The node stays: it is this ip:port's worker ID for good.
func (l *lease) Close(ctx context.Context) error {
	l.closeOnce.Do(func() {
		defer l.wg.Wait()
		defer l.shutdown() // also ends a report or a proof stuck on a dead connection
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
