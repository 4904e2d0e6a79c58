package proxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// Session mode's pool. A session the proxy authenticated holds one server connection
// for as long as it lasts, as with PgBouncer's session pools, and its (database, user)
// has at most pool-size of them open at once (its database at most max-db-connections):
// the sessions' own, those kept idle for later sessions (sessionreuse.go), and those
// being opened. Room is a count, not a connection: a session that finds its (database,
// user) full closes an idle connection of another startup of its own (database, user),
// or of another user when it is its database that is full, to open its own; when there
// is none it waits, up to query-wait-timeout, for a session to end or a connection to
// go idle, behind the sessions that came before it for the same room (aheadLocked). A
// session whose login the proxy relays (auth-type passthrough) counts nowhere: its user
// is the database's to check, and a count taken before the check would let clients
// without a password hold the room of those with one.

// sessionPool holds the counts of session mode's server connections and the idle ones.
type sessionPool struct {
	mu      sync.Mutex
	byKey   map[string][]*idleServer        // idle connections by reuseTarget key, newest last
	idle    map[pool.Key]int                // idle connections of each (database, user)
	open    map[pool.Key]int                // connections of each (database, user): in a session, idle or opening
	openDB  map[string]int                  // connections of each database, over its users
	changed chan struct{}                   // closed when room may have come; nil while nobody waits
	keys    map[pool.Key]*sessionKeyFigures // waits and counters of each (database, user)
	queue   []*sessionWait                  // the sessions waiting for room, first come first
	closed  bool                            // the server closed: nothing is kept or lent
	refused bool                            // the server shuts down: no more sessions are admitted
	reused  atomic.Uint64                   // sessions served by a connection of an earlier one
}

// idleServer is one idle server connection.
type idleServer struct {
	sc     *serverConn
	target *reuseTarget
	since  time.Time   // when it went idle
	timer  *time.Timer // closes it after server-idle-timeout; nil: never
	// lifetime is its server-lifetime: older, it serves no later session (0: no limit).
	lifetime time.Duration
	// resetDue: its DISCARD ALL was sent and the answer is to be read, within
	// resetTimeout, by the session that takes it.
	resetDue     bool
	resetTimeout time.Duration
}

// sessionLimits are the limits of one (database, user)'s server connections in session
// mode.
type sessionLimits struct {
	pool.Limits
	maxDB        int           // max-db-connections of its database; 0: none
	resetTimeout time.Duration // server-reset-timeout
}

// sessionLimits returns the limits of k's server connections in session mode: its
// route's or user's pool-size, server-idle-timeout, server-lifetime, query-wait-timeout
// and max-db-connections, else the server's, else the defaults.
func (s *Server) sessionLimits(k pool.Key) sessionLimits {
	s.pooling.mu.Lock()
	settings := s.poolSettings(s.Pooling) // the routes' limits too
	s.pooling.mu.Unlock()
	l := sessionLimits{Limits: settings.Limits, maxDB: settings.MaxDBConnections, resetTimeout: settings.ServerResetTimeout}
	if settings.PerKey != nil {
		l.Limits = l.Override(settings.PerKey(k))
	}
	if settings.PerDatabase != nil {
		if n := settings.PerDatabase(k.Database); n > 0 {
			l.maxDB = n
		}
	}
	if l.PoolSize <= 0 {
		l.PoolSize = pool.DefaultPoolSize
	}
	if l.ServerIdleTimeout == 0 {
		l.ServerIdleTimeout = pool.DefaultServerIdleTimeout
	}
	if l.ServerLifetime == 0 {
		l.ServerLifetime = pool.DefaultServerLifetime
	}
	if l.QueryWaitTimeout == 0 {
		l.QueryWaitTimeout = pool.DefaultQueryWaitTimeout
	}
	if l.resetTimeout <= 0 {
		l.resetTimeout = pool.DefaultServerResetTimeout
	}
	return l
}

// sessionKey returns the pool key of a session of upstream addr whose startup
// parameters, as routed, are params (as transaction mode's pools name it).
func (s *Server) sessionKey(addr string, params map[string]string) pool.Key {
	database := params["database"]
	if database == "" {
		database = params["user"]
	}
	return s.keyOf(addr, database, params["user"])
}

// errSessionPoolClosed is acquire's error once the server shuts down.
var errSessionPoolClosed = errors.New("the proxy is shutting down")

// waitTimeoutError is acquire's error when no room came within query-wait-timeout.
type waitTimeoutError struct {
	key  pool.Key
	l    sessionLimits
	full string // what was full: "pool-size" or "max-db-connections"
}

func (e *waitTimeoutError) Error() string {
	n := e.l.PoolSize
	if e.full == "max-db-connections" {
		n = e.l.maxDB
	}
	return fmt.Sprintf("no server connection for user %q of database %q within query-wait-timeout (%v): %s %d in use by other sessions",
		e.key.User, e.key.Database, e.l.QueryWaitTimeout, e.full, n)
}

// acquire gets a session of k a server connection: an idle one of its startup
// (reuseTarget key; "" when the session takes none), or room to open one, reported as
// (nil, nil); the session holds the room until it gives it back with release, or hands
// its connection to put. Without room it closes an idle connection to make some, else
// waits until a session ends or a connection goes idle, up to l.QueryWaitTimeout (none
// when negative), until ctx ends, or until gone reports true (checked every second).
func (p *sessionPool) acquire(ctx context.Context, k pool.Key, startup string, l sessionLimits, gone func() bool) (sc *serverConn, err error) {
	var wait *sessionWait // set at the first look that finds no room
	defer func() { p.endAcquire(k, wait, err) }()
	var expired <-chan time.Time
	if l.QueryWaitTimeout > 0 {
		t := time.NewTimer(l.QueryWaitTimeout)
		defer t.Stop()
		expired = t.C
	}
	var tick *time.Ticker
	defer func() {
		if tick != nil {
			tick.Stop()
		}
	}()
	for {
		p.mu.Lock()
		if p.closed || p.refused {
			p.mu.Unlock()
			return nil, errSessionPoolClosed
		}
		full := p.aheadLocked(k, wait)
		if full == "" {
			if e := p.popLocked(startup); e != nil {
				p.mu.Unlock()
				if fit := p.vet(e); fit != nil {
					return fit, nil
				}
				continue
			}
			if full = p.makeRoomLocked(k, l); full == "" {
				p.mu.Unlock()
				return nil, nil
			}
		}
		if p.changed == nil {
			p.changed = make(chan struct{})
		}
		changed := p.changed
		if wait == nil {
			wait = p.startWaitLocked(k, full)
		}
		wait.full = full
		p.mu.Unlock()
		if tick == nil {
			tick = time.NewTicker(time.Second)
		}
		select {
		case <-changed:
		case <-expired:
			return nil, &waitTimeoutError{key: k, l: l, full: full}
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-tick.C:
			if gone() {
				return nil, errClientGone
			}
		}
	}
}

// aheadLocked returns what an earlier wait than w (nil: a session that does not wait
// yet) that a session of k must let go first waits under, "" when there is none: a wait
// of k itself, or one under max-db-connections of k's database. The waits are thus
// served first come first, and a session that comes while others wait for the same room
// does not take it before them.
func (p *sessionPool) aheadLocked(k pool.Key, w *sessionWait) string {
	for _, x := range p.queue {
		switch {
		case x == w:
			return ""
		case x.key == k:
			return x.full
		case x.full == "max-db-connections" && x.key.Database == k.Database:
			return x.full
		}
	}
	return ""
}

// errClientGone is acquire's error when the client went away while it waited.
var errClientGone = errors.New("the client went away while waiting for a server connection")

// makeRoomLocked counts a connection more for k when k and its database are below their
// limits, or when closing an idle connection makes room: one of k's when k is full (its
// oldest), else one of the database's. It returns "" when it did, else what is full.
func (p *sessionPool) makeRoomLocked(k pool.Key, l sessionLimits) string {
	full := ""
	switch {
	case p.open[k] >= l.PoolSize:
		full = "pool-size"
	case l.maxDB > 0 && p.openDB[k.Database] >= l.maxDB:
		full = "max-db-connections"
	}
	if full != "" {
		victim := p.oldestIdleLocked(func(e *idleServer) bool {
			if full == "pool-size" {
				return e.target.pool == k
			}
			return e.target.pool.Database == k.Database
		})
		if victim == nil {
			return full
		}
		p.removeLocked(victim)
		p.releaseLocked(victim.target.pool)
		go p.closeServer(victim.sc)
	}
	if p.open == nil {
		p.open = make(map[pool.Key]int)
		p.openDB = make(map[string]int)
	}
	p.open[k]++
	p.openDB[k.Database]++
	return ""
}

// oldestIdleLocked returns the idle connection longest idle among those match accepts,
// its timer stopped; nil when there is none.
func (p *sessionPool) oldestIdleLocked(match func(*idleServer) bool) *idleServer {
	var oldest *idleServer
	for _, list := range p.byKey {
		for _, e := range list { // oldest first
			if match(e) {
				if oldest == nil || e.since.Before(oldest.since) {
					oldest = e
				}
				break
			}
		}
	}
	if oldest != nil && oldest.timer != nil {
		oldest.timer.Stop()
	}
	return oldest
}

// release gives back the room of a connection of k that closes.
func (p *sessionPool) release(k pool.Key) {
	p.mu.Lock()
	p.releaseLocked(k)
	p.mu.Unlock()
}

func (p *sessionPool) releaseLocked(k pool.Key) {
	if p.open[k]--; p.open[k] <= 0 {
		delete(p.open, k)
	}
	if p.openDB[k.Database]--; p.openDB[k.Database] <= 0 {
		delete(p.openDB, k.Database)
	}
	p.wakeLocked()
}

// wakeLocked tells the waiting sessions to look again.
func (p *sessionPool) wakeLocked() {
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
}

// vet returns the connection of e, just taken from the idle set, when it is fit to
// serve; one past its lifetime, whose reset fails, or whose server sent something or
// hung up while it was idle, is closed and its room given back.
func (p *sessionPool) vet(e *idleServer) *serverConn {
	if e.resetDue {
		_ = e.sc.nc.SetDeadline(time.Now().Add(e.resetTimeout))
		if err := e.sc.awaitReset(); err != nil {
			p.discard(e)
			return nil
		}
	}
	if e.lifetime > 0 && time.Since(e.sc.born) > e.lifetime || e.sc.r.br.Buffered() > 0 || !socketQuiet(e.sc.nc) {
		p.discard(e)
		return nil
	}
	p.reused.Add(1)
	return e.sc
}

// discard closes the connection of e, out of the idle set, and gives its room back.
func (p *sessionPool) discard(e *idleServer) {
	p.closeServer(e.sc)
	p.release(e.target.pool)
}

// popLocked takes the newest idle connection of the startup key out of the set, its
// timer stopped; nil when there is none.
func (p *sessionPool) popLocked(key string) *idleServer {
	list := p.byKey[key]
	if key == "" || len(list) == 0 {
		return nil
	}
	e := list[len(list)-1]
	p.removeLocked(e)
	if e.timer != nil {
		e.timer.Stop()
	}
	return e
}

// put keeps sc, the connection of a session of target that ended, idle for a later
// session, with the room the session held; unless its (database, user) is over
// pool-size (after a reload made it smaller), it is past its lifetime or the pool is
// closed: then sc is closed, on a goroutine of its own (an event loop may call put), and
// its room given back. resetDue says that sc's DISCARD ALL has been sent and its answer
// is still to be read (see vet).
func (p *sessionPool) put(target *reuseTarget, sc *serverConn, l sessionLimits, resetDue bool) {
	p.mu.Lock()
	if p.closed || p.open[target.pool] > l.PoolSize || p.idle[target.pool] >= l.PoolSize ||
		l.ServerLifetime > 0 && time.Since(sc.born) > l.ServerLifetime {
		p.releaseLocked(target.pool)
		p.mu.Unlock()
		go p.closeServer(sc)
		return
	}
	if p.byKey == nil {
		p.byKey = make(map[string][]*idleServer)
		p.idle = make(map[pool.Key]int)
	}
	e := &idleServer{sc: sc, target: target, since: time.Now(), lifetime: max(l.ServerLifetime, 0),
		resetDue: resetDue, resetTimeout: l.resetTimeout}
	p.byKey[target.key] = append(p.byKey[target.key], e)
	p.idle[target.pool]++
	if l.ServerIdleTimeout > 0 {
		e.timer = time.AfterFunc(l.ServerIdleTimeout, func() { p.expire(e) })
	}
	p.wakeLocked()
	p.mu.Unlock()
}

// expire closes e when it is still idle.
func (p *sessionPool) expire(e *idleServer) {
	p.mu.Lock()
	ok := p.removeLocked(e)
	if ok {
		p.releaseLocked(e.target.pool)
	}
	p.mu.Unlock()
	if ok {
		p.closeServer(e.sc)
	}
}

// removeLocked takes e out of the idle set, reporting whether it was there.
func (p *sessionPool) removeLocked(e *idleServer) bool {
	list := p.byKey[e.target.key]
	for i, x := range list {
		if x != e {
			continue
		}
		list = append(list[:i], list[i+1:]...)
		if len(list) == 0 {
			delete(p.byKey, e.target.key)
		} else {
			p.byKey[e.target.key] = list
		}
		if p.idle[e.target.pool]--; p.idle[e.target.pool] == 0 {
			delete(p.idle, e.target.pool)
		}
		return true
	}
	return false
}

// refuse ends the waits and admits no more sessions: the server shuts down.
func (p *sessionPool) refuse() {
	p.mu.Lock()
	p.refused = true
	p.wakeLocked()
	p.mu.Unlock()
}

// close closes every idle connection and ends the waits; put closes what comes later.
func (p *sessionPool) close() {
	p.mu.Lock()
	p.closed = true
	var all []*idleServer
	for _, list := range p.byKey {
		all = append(all, list...)
	}
	p.byKey, p.idle = nil, nil
	for _, e := range all {
		p.releaseLocked(e.target.pool)
	}
	p.wakeLocked()
	p.mu.Unlock()
	for _, e := range all {
		if e.timer != nil {
			e.timer.Stop()
		}
		p.closeServer(e.sc)
	}
}

// SessionServerFigures are the figures of session mode's server connections (see
// Server.SessionServers).
type SessionServerFigures struct {
	Open    int    // in a session, idle or being opened
	Idle    int    // waiting for a later session
	Waiting int    // sessions waiting for room under pool-size or max-db-connections
	Reused  uint64 // sessions served by a connection of an earlier one, so far
}

// figures returns the pool's figures.
func (p *sessionPool) figures() SessionServerFigures {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := SessionServerFigures{Waiting: len(p.queue), Reused: p.reused.Load()}
	for _, n := range p.open {
		f.Open += n
	}
	for _, n := range p.idle {
		f.Idle += n
	}
	return f
}

// SessionServers returns the figures of the server connections of session mode's
// sessions that the proxy authenticated (see ReuseSessionServers).
func (s *Server) SessionServers() SessionServerFigures { return s.sessionPool.figures() }

// closeServer ends a server connection of no session: Terminate, then close.
func (p *sessionPool) closeServer(sc *serverConn) {
	_ = sc.nc.SetWriteDeadline(time.Now().Add(time.Second))
	_ = writeHeader(sc.w, clientTerminate, 0)
	_ = sc.w.Flush()
	_ = sc.nc.Close()
}

// admitSession gets the session, authenticated by the proxy in session mode, its room
// in the session pool (see sessionPool.acquire), and an idle server connection of an
// earlier session when one fits; it reports false when the session cannot go on (the
// client was told why, unless it went away).
func (c *conn) admitSession(params map[string]string) (sc *serverConn, ok bool) {
	s := c.srv
	k := s.sessionKey(c.upstreamAddr, params)
	startup := ""
	if c.reuse != nil {
		startup = c.reuse.key
	}
	sc, err := s.sessionPool.acquire(c.ctx, k, startup, s.sessionLimits(k), func() bool { return socketClosed(c.client) })
	var timeout *waitTimeoutError
	switch {
	case errors.As(err, &timeout):
		c.log.WithError(err).Warn("session refused: no server connection")
		c.refuseDetail(sqlstate.TooManyConnections, "no server connection available within query-wait-timeout",
			timeout.Error())
		return nil, false
	case errors.Is(err, errSessionPoolClosed):
		c.refuse(sqlstate.CannotConnectNow, "the database system is shutting down")
		return nil, false
	case err != nil:
		c.log.WithError(err).Debug("startup ended")
		return nil, false
	}
	if !c.holdServerRoom(k, sc) {
		return nil, false
	}
	// The wait may have outlasted the startup's deadline.
	_ = c.client.SetDeadline(time.Now().Add(s.startupTimeout()))
	return sc, true
}

// holdServerRoom records that the connection holds room in the session pool for k, and
// sc, when not nil, there; it gives both back at once when the connection was closed
// meanwhile.
func (c *conn) holdServerRoom(k pool.Key, sc *serverConn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		if sc != nil {
			c.srv.sessionPool.closeServer(sc)
		}
		c.srv.sessionPool.release(k)
		return false
	}
	c.room = &k
	return true
}
