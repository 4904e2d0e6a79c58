package proxy

import (
	"slices"
	"time"

	"github.com/leafproxy/leafproxy/proxy/pool"
)

// sessionKeyFigures are the session pool's totals of one (database, user), besides its
// counts of connections and its waits under way (sessionPool.queue). Under
// sessionPool.mu.
type sessionKeyFigures struct {
	acquires     uint64        // sessions that got a connection or room for one
	waitTime     time.Duration // time spent by waits that ended
	waitTimeouts uint64        // waits that reached query-wait-timeout
}

// sessionWait is one session's wait for room, from its first look at a full pool until
// acquire returns.
type sessionWait struct {
	since time.Time
	key   pool.Key
	full  string // what it waits for room under: "pool-size" or "max-db-connections"
}

// figuresLocked returns the figures of k, made on first use.
func (p *sessionPool) figuresLocked(k pool.Key) *sessionKeyFigures {
	f := p.keys[k]
	if f == nil {
		if p.keys == nil {
			p.keys = make(map[pool.Key]*sessionKeyFigures)
		}
		f = &sessionKeyFigures{}
		p.keys[k] = f
	}
	return f
}

// startWaitLocked records that a session of k waits for room.
func (p *sessionPool) startWaitLocked(k pool.Key, full string) *sessionWait {
	w := &sessionWait{since: time.Now(), key: k, full: full}
	p.queue = append(p.queue, w)
	p.figuresLocked(k) // listed by stats while it waits, connections or not
	return w
}

// endAcquire records how a session's acquire for k ended: with a connection or room
// (err nil), or not; w is its wait, nil when it did not wait.
func (p *sessionPool) endAcquire(k pool.Key, w *sessionWait, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.figuresLocked(k)
	if w != nil {
		p.queue = slices.DeleteFunc(p.queue, func(x *sessionWait) bool { return x == w })
		f.waitTime += time.Since(w.since)
		p.wakeLocked() // the next in the queue may go now
	}
	switch err.(type) {
	case nil:
		f.acquires++
	case *waitTimeoutError:
		f.waitTimeouts++
	}
}

// stats returns the figures of every (database, user) the pool has seen, in the words
// of pool.Stats, in no order; limits gives each its pool-size.
func (p *sessionPool) stats(limits func(pool.Key) sessionLimits) []pool.Stats {
	p.mu.Lock()
	now := time.Now()
	out := make([]pool.Stats, 0, len(p.keys))
	for k, f := range p.keys {
		out = append(out, p.keyStatsLocked(k, f, now))
	}
	for k := range p.open {
		if p.keys[k] == nil {
			out = append(out, p.keyStatsLocked(k, &sessionKeyFigures{}, now))
		}
	}
	p.mu.Unlock()
	for i := range out {
		out[i].PoolSize = limits(pool.Key{Database: out[i].Database, User: out[i].User}).PoolSize
	}
	return out
}

// keyStatsLocked returns the figures of k, whose own are f, at now: the connections in a
// session (or being opened for one) are both its active clients and active servers.
func (p *sessionPool) keyStatsLocked(k pool.Key, f *sessionKeyFigures, now time.Time) pool.Stats {
	inSession := p.open[k] - p.idle[k]
	st := pool.Stats{
		Database: k.Database, User: k.User, Mode: string(PoolSession),
		ClientsActive: inSession,
		ServersActive: inSession, ServersIdle: p.idle[k],
		Acquires: f.acquires, WaitTime: f.waitTime, WaitTimeouts: f.waitTimeouts,
	}
	// Waits under way count in the total too, as in transaction mode's pools.
	for _, w := range p.queue {
		if w.key != k {
			continue
		}
		st.ClientsWaiting++
		wait := now.Sub(w.since)
		st.WaitTime += wait
		st.MaxWait = max(st.MaxWait, wait)
	}
	return st
}

// SessionPoolStats returns the figures of session mode's pools, one per (database, user)
// whose sessions the proxy authenticated, in the words of PoolStats but in no order
// (/pools sorts both modes' together). Sessions in session mode are not counted by
// transaction or query (Transactions and Queries stay 0).
func (s *Server) SessionPoolStats() []pool.Stats { return s.sessionPool.stats(s.sessionLimits) }
