package zookeeper

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"
)

// The liveness claim. Leaf's persistent node names an ip:port, not a process: two live
// processes advertising the same ip:port (containers on two hosts behind the same bridge
// address, a copied configuration) would both find the node and issue IDs of its worker
// ID. So a lease also claims its worker ID with an ephemeral node,
// /snowflake/{name}/live/{workerID}, whose data names the holder. ZooKeeper deletes an
// ephemeral node when its session ends, so the claim lives exactly as long as the holder's
// session:
//   - A second process finds the claim taken and issues nothing: its lease is never valid
//     (ValidUntil in the past), it logs the other holder, and it watches the claim. When
//     the claim goes, the lease ends (Done) and the engine acquires again, reading the
//     first holder's last timestamp from the persistent node.
//   - The holder proves its claim every SessionTimeout/6 by reading the claim node's
//     owner. An answered check sent at s proves that the server heard from the session
//     after s, so the session, and the claim, last at least until s + SessionTimeout; the
//     lease stays valid until s + 2/3 SessionTimeout. The third left is the guard for the
//     servers' and the client's clocks, and for a follower answering a moment before it
//     notices that it lost the leader. A holder cut off from ZooKeeper, or paused, thus
//     stops issuing before the claim can go to anyone else.
//   - Once the session expires or the connection is replaced (which ends the session),
//     the claim is gone for good: the lease ends (Done) and the engine acquires again.
//   - A process killed without a goodbye leaves its claim until ZooKeeper ends its session
//     (a session timeout). A claim made in the same kernel and PID namespace (same boot ID,
//     same namespace inode) by a PID that no longer exists is stale: a restart on the same
//     host removes it (a delete of that very version) instead of waiting. A dead holder
//     issues nothing, and its IDs are older than the clock of the same host.
// ZooKeeper's maxSessionTimeout must not be below SessionTimeout (its default is 20 ticks,
// 40 s): a server granting a shorter session would end the claim before the deadline.

// claimData is the JSON of a claim node: who holds the worker ID.
type claimData struct {
	Host    string `json:"host"`
	PID     int    `json:"pid"`
	Started int64  `json:"started"` // Unix ms the holder process started its lease
	IP      string `json:"ip"`
	Port    string `json:"port"`
	Scope   string `json:"scope,omitempty"` // machineScope of the holder
}

// stale reports whether the claim's holder is provably dead: it ran in this process'
// kernel and PID namespace, and its PID is gone.
func (d claimData) stale() bool {
	return d.Scope != "" && d.Scope == machineScope() && processGone(d.PID)
}

func (d claimData) String() string {
	return fmt.Sprintf("%s pid %d (advertising %s:%s, since %s)", d.Host, d.PID, d.IP, d.Port,
		time.UnixMilli(d.Started).UTC().Format(time.RFC3339))
}

func (s *Source) claimPath(id int64) string {
	return path.Join(s.liveDir, strconv.FormatInt(id, 10))
}

// proveInterval is the time between two checks of the claim.
func (l *lease) proveInterval() time.Duration { return l.src.s.SessionTimeout / 6 }

// proofLasts is how long an answered check keeps the lease valid, counted from its send.
func (l *lease) proofLasts() time.Duration { return l.src.s.SessionTimeout * 2 / 3 }

// claim creates the claim node of l.id. When another session holds it, the lease stays
// unclaimed and l.other names the holder.
func (l *lease) claim() error {
	s := l.src
	host, _ := os.Hostname()
	data, _ := json.Marshal(claimData{Host: host, PID: os.Getpid(), Started: s.s.Now().UnixMilli(), IP: s.s.IP, Port: s.s.Port,
		Scope: machineScope()})
	p := s.claimPath(l.id)
	for attempt := 0; attempt < 3; attempt++ {
		sent := s.s.Now()
		_, err := l.conn.Create(p, data, zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
		if err == nil {
			l.claimed = true
			l.extend(sent)
			return nil
		}
		if !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("zookeeper worker source: claim worker %d at %s: %w", l.id, p, err)
		}
		raw, stat, err := l.conn.Get(p)
		if errors.Is(err, zk.ErrNoNode) {
			continue // the holder just went: claim again
		}
		if err != nil {
			return fmt.Errorf("zookeeper worker source: read the claim %s: %w", p, err)
		}
		if stat.EphemeralOwner == l.conn.SessionID() {
			l.claimed = true // our own Create, retried by the client after a lost answer
			l.extend(sent)
			return nil
		}
		var other claimData
		if err := json.Unmarshal(raw, &other); err != nil {
			other = claimData{Host: fmt.Sprintf("unknown (claim holds %q)", raw)}
		}
		if other.stale() {
			err := l.conn.Delete(p, stat.Version)
			if err != nil && !errors.Is(err, zk.ErrNoNode) && !errors.Is(err, zk.ErrBadVersion) {
				return fmt.Errorf("zookeeper worker source: remove the stale claim %s: %w", p, err)
			}
			l.logger().WithField("holder", other.String()).Info("removed the claim of a holder that no longer runs on this host")
			continue
		}
		l.other = &other
		return nil
	}
	return fmt.Errorf("zookeeper worker source: the claim %s keeps changing hands", p)
}

// extend moves the deadline to sent + proofLasts unless the lease has ended.
func (l *lease) extend(sent time.Time) {
	l.fenceMu.Lock()
	defer l.fenceMu.Unlock()
	if l.ended {
		return
	}
	t := sent.Add(l.proofLasts())
	l.validUntil.Store(&t)
}

// end makes the lease invalid from now on and closes Done: the engine then acquires a
// new lease, through a new session and a new claim.
func (l *lease) end(reason string) {
	l.fenceMu.Lock()
	first := !l.ended
	l.ended = true
	t := l.src.s.Now()
	l.validUntil.Store(&t)
	l.fenceMu.Unlock()
	if first {
		l.logger().Warn(reason)
		if l.claimed {
			l.src.s.Hooks.Fenced(l.id)
		}
		close(l.done)
	}
}

// prove checks the claim every proveInterval and extends the deadline with each answer
// that shows the claim still belongs to this lease's session.
func (l *lease) prove() {
	defer l.wg.Done()
	t := time.NewTicker(l.proveInterval())
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-l.done:
			return
		case <-t.C:
		}
		c := l.current()
		if c == nil {
			continue
		}
		sent := l.src.s.Now()
		// A request that hangs holds this loop and the deadline is not extended: the
		// lease is fenced, which is right while nothing proves the claim.
		ok, stat, err := c.Exists(l.src.claimPath(l.id))
		if err != nil {
			continue // disconnected: the deadline runs out unless an answer comes in time
		}
		if !ok || stat.EphemeralOwner != c.SessionID() {
			l.end("the liveness claim of the worker ID is gone or another session's; refusing snowflake IDs and claiming again")
			return
		}
		l.extend(sent)
	}
}

// await waits, for a lease without the claim, until it is worth acquiring again: the
// other holder's claim is gone, or (after a start from the cache file) ZooKeeper answers.
func (l *lease) await() {
	defer l.wg.Done()
	t := time.NewTicker(l.proveInterval())
	defer t.Stop()
	for {
		var watch <-chan zk.Event
		if c := l.current(); c != nil && c.State() == zk.StateHasSession {
			if l.other == nil {
				l.end("ZooKeeper answers again; acquiring the worker ID with a liveness claim")
				return
			}
			raw, _, ch, err := c.GetW(l.src.claimPath(l.id))
			var d claimData
			gone := errors.Is(err, zk.ErrNoNode) || err == nil && json.Unmarshal(raw, &d) == nil && d.stale()
			if gone {
				l.logger().WithField("holder", l.other.String()).
					Info("the other holder of the worker ID is gone; taking it over after its last timestamp")
				l.end("worker ID free again")
				return
			}
			watch = ch
		}
		select {
		case <-l.stop:
			return
		case <-watch:
		case <-t.C:
		}
	}
}

// logHeldElsewhere tells the operator which process holds the worker ID.
func (l *lease) logHeldElsewhere() {
	l.logger().WithFields(logrus.Fields{"holder": l.other.String(), "claim": l.src.claimPath(l.id)}).
		Error("another live process holds this worker ID (same ip:port in ZooKeeper); refusing snowflake IDs until it is gone")
}
