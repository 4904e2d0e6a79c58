package pool

import (
	"context"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// Key names the pool a server connection belongs to: the database and the user it
// logged in as. Connections of one key are interchangeable once reset.
type Key struct {
	Database string
	User     string
}

// Connector opens, resets and closes the server connections of type C. The session code
// supplies it; the pool never reads or writes a connection itself.
type Connector[C any] interface {
	// Dial opens and logs in a new server connection for key. ctx carries
	// ServerConnectTimeout and is cancelled when the Pool closes.
	Dial(ctx context.Context, key Key) (C, error)
	// Reset returns a connection to a blank session (DISCARD ALL, as PgBouncer's
	// server_reset_query). An error closes the connection.
	Reset(ctx context.Context, c C) error
	// Close closes a connection; it is called once per connection, from a goroutine of
	// its own, and may block.
	Close(c C)
}

// Checker is an optional interface of a Connector: Check is called on an idle connection
// just before it is lent, outside the pool's lock, and a non-nil error closes the
// connection and lends another. It should be cheap (a non-blocking look at the socket
// for a server that went away while the connection was idle).
type Checker[C any] interface {
	Check(c C) error
}

// State says how a borrower gives a server connection back.
type State int

const (
	// Clean: the connection is idle (ReadyForQuery with status I) and holds no state the
	// next borrower could see; it is lent again as it is.
	Clean State = iota
	// NeedsReset: the connection is idle but carries session state (session mode); the
	// pool runs Connector.Reset before lending it again.
	NeedsReset
	// Broken: the connection is in an unknown state (lost mid-transaction, protocol
	// error, a client gone mid-transaction that could not be rolled back); the pool
	// closes it and never lends it again.
	Broken
)

// Pool lends server connections of type C, one pool of them per Key. It is safe for
// concurrent use.
type Pool[C any] struct {
	conn  Connector[C]
	check func(C) error
	clock clock

	// ctx bounds dials and resets; cancelled by Close.
	ctx    context.Context
	cancel context.CancelFunc
	// closing counts the goroutines that close connections, so that Close can wait for
	// them.
	closing sync.WaitGroup

	// waiters recycles the waiters of Acquires that have returned.
	waiters sync.Pool

	mu      sync.Mutex
	set     Settings
	keys    map[Key]*keyPool[C]
	lastKey *keyPool[C] // the key's pool keyPoolLocked returned last; nil after forgetLocked
	dbs     map[string]*database[C]
	closed  bool
	busy    int           // connections lent, being reset or being dialled, over all keys
	drained chan struct{} // closed when closed and busy drops to 0
	janitor timer
}

// database groups the pools of one database for MaxDBConnections.
type database[C any] struct {
	name    string
	max     int // max-db-connections, 0 for none
	total   int // connections open, opening or closing, over its keys
	closing int
	pools   []*keyPool[C]
}

// keyPool is the pool of one key.
type keyPool[C any] struct {
	key     Key
	db      *database[C]
	lim     Limits
	idle    []*Server[C] // oldest first; lent from the end
	waiters waitQueue[C]
	// expiry is the one timer that ends the waits reaching QueryWaitTimeout, armed for
	// expiryAt, the earliest deadline of a waiter when it was armed (nil when none is).
	// One timer per key rather than per wait: waits are the common case when clients
	// outnumber the connections, and all of a key's waiters share one timeout.
	expiry   timer
	expiryAt instant
	total    int // open, opening or closing
	opening  int
	closing  int
	lent     int
	reset    int // given back with NeedsReset, being reset

	retryAt instant       // no dial before this after a failure
	backoff time.Duration // the pause set at the last failure
	lastErr error

	counters
}

// Server is one server connection lent to a borrower. The borrower uses Conn until it
// calls Release, once.
type Server[C any] struct {
	conn     C
	pool     *Pool[C]
	kp       *keyPool[C]
	born     instant
	lastUsed instant
	lent     bool
}

// Conn returns the connection.
func (s *Server[C]) Conn() C { return s.conn }

// Key returns the key of the pool the connection belongs to.
func (s *Server[C]) Key() Key { return s.kp.key }

// New returns a Pool that dials with conn and starts its janitor.
func New[C any](conn Connector[C], s Settings) (*Pool[C], error) {
	return newPool(conn, s, realClock{})
}

func newPool[C any](conn Connector[C], s Settings, clk clock) (*Pool[C], error) {
	s, err := s.validate()
	if err != nil {
		return nil, err
	}
	p := &Pool[C]{
		conn:    conn,
		clock:   clk,
		set:     s,
		keys:    make(map[Key]*keyPool[C]),
		dbs:     make(map[string]*database[C]),
		drained: make(chan struct{}),
	}
	if c, ok := conn.(Checker[C]); ok {
		p.check = c.Check
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.mu.Lock()
	p.janitor = p.clock.AfterFunc(s.JanitorInterval, p.tick)
	p.mu.Unlock()
	return p, nil
}

// Acquire lends a server connection of key, waiting in FIFO order behind earlier
// callers when none is free. It fails with ctx's error when ctx ends first, with
// ErrWaitTimeout after QueryWaitTimeout, with ErrServerDown when the key's server cannot
// be dialled and with ErrClosed once the Pool shuts down. A connection handed over at
// the moment ctx ends is returned rather than dropped; the caller, who checks its
// context anyway, gives it back.
func (p *Pool[C]) Acquire(ctx context.Context, key Key) (*Server[C], error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for {
		s, fromIdle, err := p.acquire(ctx, key)
		if err != nil || p.check == nil || !fromIdle {
			return s, err
		}
		// A connection that sat idle may have been closed by the server meanwhile.
		if p.check(s.conn) == nil {
			return s, nil
		}
		s.Release(Broken)
	}
}

// AcquireFunc lends a server connection of key like Acquire, without blocking: a
// connection that can be lent at once is returned; otherwise the caller joins the queue
// and gets a Wait, and done is called later, exactly once, with that Wait and the
// connection or the error Acquire would have returned (ErrWaitTimeout, ErrServerDown, ErrClosed). done
// runs on whichever goroutine hands the connection over (a Release, a dial, a timer) with
// the Pool's lock held: it must hand the result on (to an event loop, say) and return,
// without calling the Pool. An event loop serves many sessions from one goroutine, which
// must never wait for a connection.
func (p *Pool[C]) AcquireFunc(key Key, done func(*Wait[C], *Server[C], error)) (*Server[C], *Wait[C], error) {
	return p.AcquireFuncIn(key, nil, done)
}

// AcquireFuncIn is AcquireFunc that waits, when it must, in wt rather than in a new Wait
// (in a new one when wt is nil): a caller that waits for one connection at a time keeps
// one Wait, and waits without allocating. wt must be free: new, or its last wait over
// (its done called, or CancelWait reported true).
func (p *Pool[C]) AcquireFuncIn(key Key, wt *Wait[C], done func(*Wait[C], *Server[C], error)) (*Server[C], *Wait[C], error) {
	for {
		s, w, err := p.lendOrQueue(key, wt, done)
		switch {
		case w != nil:
			return nil, w.wait, nil
		case s != nil && p.check != nil && p.check(s.conn) != nil:
			s.Release(Broken) // it may have been closed by the server while idle
			continue
		}
		return s, nil, err
	}
}

// CancelWait ends a wait of AcquireFunc, reporting true when it did: its done is then
// never called. It reports false when done has been called or is being called; a
// connection done gets must then be given back.
func (p *Pool[C]) CancelWait(wt *Wait[C]) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := &wt.w
	if w.done {
		return false
	}
	w.kp.waiters.remove(w)
	w.kp.waitTime += p.clock.Now().Sub(w.since)
	w.done = true
	return true
}

// acquire lends a connection; fromIdle says it was taken from the idle list (rather than
// handed over by a borrower or just dialled), so that it is worth a Check.
func (p *Pool[C]) acquire(ctx context.Context, key Key) (s *Server[C], fromIdle bool, err error) {
	s, w, err := p.lendOrQueue(key, nil, nil)
	if w == nil {
		return s, s != nil, err
	}
	kp := w.kp
	if done := ctx.Done(); done == nil {
		<-w.ready
	} else {
		select {
		case <-w.ready:
		case <-done:
			p.mu.Lock()
			if !w.done {
				kp.waiters.remove(w)
				kp.waitTime += p.clock.Now().Sub(w.since)
				w.finish(nil, ctx.Err())
			}
			p.mu.Unlock()
			<-w.ready
		}
	}
	// A connection granted at the same moment the context ended is kept: the caller
	// checks its context anyway, and gives it back.
	s, err = w.srv, w.err
	p.freeWaiter(w)
	return s, false, err
}

// lendOrQueue starts a borrow: it lends the most recently used idle connection of key
// when nobody waits for one, fails when the Pool is closed or the key's server is known to
// be down with no connection that could come back, and otherwise queues a waiter (for
// Acquire when done is nil, else for AcquireFunc, in wt unless it is nil) and starts the
// dials the waiters need.
func (p *Pool[C]) lendOrQueue(key Key, wt *Wait[C], done func(*Wait[C], *Server[C], error)) (*Server[C], *waiter[C], error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, nil, closedError(key)
	}
	kp := p.keyPoolLocked(key)
	kp.acquires++
	// The most recently used idle connection goes first, so that the others age out.
	// Its lifetime is not checked here: it was checked when it came back, and the
	// janitor closes idle ones that pass it since.
	if kp.waiters.n == 0 && len(kp.idle) > 0 {
		s := kp.idle[len(kp.idle)-1]
		kp.idle[len(kp.idle)-1] = nil
		kp.idle = kp.idle[:len(kp.idle)-1]
		p.lendLocked(s)
		return s, nil, nil
	}
	now := p.clock.Now()
	// Nothing to lend: wait, unless the server is known to be down and there is no
	// connection that could come back to us.
	if now.Before(kp.retryAt) && kp.total == 0 {
		return nil, nil, serverDownError(key, kp.lastErr)
	}
	var w *waiter[C]
	if done == nil {
		w = p.newWaiter(now, kp.lim.QueryWaitTimeout)
	} else {
		if wt == nil {
			wt = new(Wait[C])
		}
		wt.w = waiter[C]{since: now, timeout: kp.lim.QueryWaitTimeout, notify: done}
		w = &wt.w
		w.wait = wt
	}
	w.kp = kp
	kp.waiters.push(w)
	if w.timeout > 0 {
		p.armExpiryLocked(kp, w.since.Add(w.timeout))
	}
	p.serveLocked(kp.db)
	return nil, w, nil
}

// newWaiter returns a waiter, a recycled one when there is one.
func (p *Pool[C]) newWaiter(now instant, timeout time.Duration) *waiter[C] {
	w, _ := p.waiters.Get().(*waiter[C])
	if w == nil {
		w = &waiter[C]{ready: make(chan struct{}, 1)}
	}
	w.since, w.timeout = now, timeout
	return w
}

// freeWaiter recycles a finished waiter whose value its Acquire has received: it is in
// no queue, and no timer refers to it.
func (p *Pool[C]) freeWaiter(w *waiter[C]) {
	*w = waiter[C]{ready: w.ready}
	p.waiters.Put(w)
}

// armExpiryLocked makes sure kp's expiry timer fires by at, the deadline of a new waiter.
// Deadlines grow with the queue while QueryWaitTimeout stays the same, so that this
// arms a timer only when the key has none.
func (p *Pool[C]) armExpiryLocked(kp *keyPool[C], at instant) {
	if kp.expiry != nil {
		if !at.Before(kp.expiryAt) {
			return
		}
		kp.expiry.Stop() // a Reload shortened QueryWaitTimeout: fire earlier
	}
	kp.expiryAt = at
	kp.expiry = p.clock.AfterFunc(at.Sub(p.clock.Now()), func() { p.expire(kp) })
}

// expire ends the waits of kp that reached their QueryWaitTimeout and arms the timer for
// the earliest deadline left.
func (p *Pool[C]) expire(kp *keyPool[C]) {
	p.mu.Lock()
	defer p.mu.Unlock()
	kp.expiry = nil
	now := p.clock.Now()
	var next instant
	found := false // next is a waiter's deadline
	for w := kp.waiters.head; w != nil; {
		following := w.next
		if deadline := w.since.Add(w.timeout); w.timeout > 0 {
			if !deadline.After(now) {
				kp.waiters.remove(w)
				kp.waitTimeouts++
				kp.waitTime += now.Sub(w.since)
				w.finish(nil, waitTimeoutError(kp.key, w.timeout))
			} else if !found || deadline.Before(next) {
				next, found = deadline, true
			}
		}
		w = following
	}
	if found && !p.closed {
		p.armExpiryLocked(kp, next)
	}
}

// Release gives the connection back, in the state the borrower leaves it. It must be
// called exactly once per Acquire; the connection must not be used afterwards.
func (s *Server[C]) Release(st State) {
	p, kp := s.pool, s.kp
	p.mu.Lock()
	if !s.lent {
		p.mu.Unlock()
		panic("pool: server connection given back twice")
	}
	s.lent = false
	kp.lent--
	switch st {
	case Broken:
		p.busy--
		p.closeLocked(s)
	case NeedsReset:
		if p.closed {
			// It will be closed anyway: no point resetting it.
			p.busy--
			p.closeLocked(s)
			break
		}
		kp.reset++
		p.mu.Unlock()
		go p.reset(s)
		return
	default:
		p.busy--
		p.putLocked(s)
	}
	p.serveLocked(kp.db)
	p.mu.Unlock()
}

// reset runs Connector.Reset on a connection given back with NeedsReset, then lends it
// again or closes it.
func (p *Pool[C]) reset(s *Server[C]) {
	p.mu.Lock()
	d := p.set.ServerResetTimeout
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(p.ctx, d)
	err := p.conn.Reset(ctx, s.conn)
	cancel()
	p.mu.Lock()
	s.kp.reset--
	p.busy--
	if err != nil {
		s.kp.resetErrors++
		p.closeLocked(s)
		p.set.Log.WithFields(keyFields(s.kp.key)).WithError(err).Warn("server connection reset failed; closed")
	} else {
		p.putLocked(s)
	}
	p.serveLocked(s.kp.db)
	p.mu.Unlock()
}

// putLocked takes back a healthy connection that is not lent: it goes to the longest
// waiter, or to the idle list, or is closed when the key has more connections than it
// may have, when it is past its lifetime, or when the Pool is closed.
func (p *Pool[C]) putLocked(s *Server[C]) {
	kp := s.kp
	now := p.clock.Now()
	if p.closed || kp.kept() > kp.lim.PoolSize || kp.db.overLimit() || kp.pastLifetime(s, now) {
		p.closeLocked(s)
		return
	}
	if w := kp.waiters.pop(); w != nil {
		p.lendLocked(s)
		kp.waitTime += now.Sub(w.since)
		w.finish(s, nil)
		return
	}
	s.lastUsed = now
	kp.idle = append(kp.idle, s)
}

// overLimit reports whether the database has more connections than max-db-connections
// allows (after a Reload lowered it), not counting those being closed.
func (db *database[C]) overLimit() bool {
	return db.max > 0 && db.total-db.closing > db.max
}

// kept counts the connections of a key that are not being closed.
func (kp *keyPool[C]) kept() int { return kp.total - kp.closing }

func (kp *keyPool[C]) pastLifetime(s *Server[C], now instant) bool {
	return kp.lim.ServerLifetime > 0 && now.Sub(s.born) >= kp.lim.ServerLifetime
}

func (p *Pool[C]) lendLocked(s *Server[C]) {
	s.lent = true
	s.kp.lent++
	p.busy++
}

// closeLocked takes a connection that is not lent out of service and closes it in the
// background. It keeps counting against pool-size and max-db-connections until Close
// returns, so that the server never sees more connections than the limits allow.
func (p *Pool[C]) closeLocked(s *Server[C]) {
	kp := s.kp
	kp.closing++
	kp.db.closing++
	kp.closes++
	p.closing.Add(1)
	go func() {
		defer p.closing.Done()
		p.conn.Close(s.conn)
		p.mu.Lock()
		kp.closing--
		kp.db.closing--
		kp.total--
		kp.db.total--
		p.serveLocked(kp.db)
		p.mu.Unlock()
	}()
	p.checkDrainedLocked()
}

func (p *Pool[C]) checkDrainedLocked() {
	if p.closed && p.busy == 0 {
		select {
		case <-p.drained:
		default:
			close(p.drained)
		}
	}
}

// serveLocked starts the dials the waiters of a database need, oldest waiter first
// across its keys, within PoolSize and MaxDBConnections.
func (p *Pool[C]) serveLocked(db *database[C]) {
	if p.closed {
		return
	}
	var now instant // read only when a key needs a dial
	read := false
	for {
		var best *keyPool[C]
		for _, kp := range db.pools {
			if kp.waiters.n <= kp.opening+kp.reset || kp.total >= kp.lim.PoolSize {
				continue
			}
			if !read {
				now, read = p.clock.Now(), true
			}
			if now.Before(kp.retryAt) {
				continue
			}
			if best == nil || kp.waiters.head.since.Before(best.waiters.head.since) {
				best = kp
			}
		}
		if best == nil || !p.roomLocked(best, true) {
			return
		}
		p.dialLocked(best)
	}
}

// roomLocked reports whether kp's database may open one more connection. With evict,
// a database at its limit makes room by closing the longest-idle connection of another
// of its keys, unless a close is already under way; the waiter is served when the close
// finishes.
func (p *Pool[C]) roomLocked(kp *keyPool[C], evict bool) bool {
	max := kp.db.max
	if max == 0 || kp.db.total < max {
		return true
	}
	if !evict || kp.db.closing > 0 {
		return false
	}
	var victim *keyPool[C]
	for _, other := range kp.db.pools {
		if other == kp || len(other.idle) == 0 {
			continue
		}
		if victim == nil || other.idle[0].lastUsed.Before(victim.idle[0].lastUsed) {
			victim = other
		}
	}
	if victim != nil {
		s := victim.idle[0]
		n := copy(victim.idle, victim.idle[1:])
		victim.idle[n] = nil
		victim.idle = victim.idle[:n]
		victim.evictions++
		p.closeLocked(s)
	}
	return false
}

// dialLocked counts a new connection of kp and dials it in the background.
func (p *Pool[C]) dialLocked(kp *keyPool[C]) {
	kp.total++
	kp.db.total++
	kp.opening++
	p.busy++
	go p.dial(kp, p.set.ServerConnectTimeout)
}

func (p *Pool[C]) dial(kp *keyPool[C], timeout time.Duration) {
	ctx, cancel := context.WithTimeout(p.ctx, timeout)
	c, err := p.conn.Dial(ctx, kp.key)
	cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	kp.opening--
	p.busy--
	now := p.clock.Now()
	if err != nil {
		kp.total--
		kp.db.total--
		if p.closed {
			// Cancelled by Close, or failed with nobody left to tell.
			p.checkDrainedLocked()
			return
		}
		kp.dialErrors++
		p.loginFailedLocked(kp, err, now)
		p.serveLocked(kp.db)
		p.checkDrainedLocked()
		return
	}
	kp.dials++
	kp.backoff, kp.retryAt, kp.lastErr = 0, 0, nil
	p.putLocked(&Server[C]{conn: c, pool: p, kp: kp, born: now})
	p.serveLocked(kp.db)
	p.checkDrainedLocked()
}

// loginFailedLocked fails every waiter of kp with the dial's error and holds further
// dials back: the server is down or refuses us, and queueing clients until
// QueryWaitTimeout would only hide that.
func (p *Pool[C]) loginFailedLocked(kp *keyPool[C], err error, now instant) {
	switch {
	case now.Before(kp.retryAt):
		// A dial started before the last failure: same outage, same pause.
	case kp.backoff == 0:
		kp.backoff = firstLoginRetry
	default:
		kp.backoff *= 2
	}
	if kp.backoff > p.set.ServerLoginRetry {
		kp.backoff = p.set.ServerLoginRetry
	}
	kp.retryAt = now.Add(kp.backoff)
	kp.lastErr = err
	p.set.Log.WithFields(keyFields(kp.key)).WithError(err).WithField("retry_in", kp.backoff).Warn("server connection failed")
	for w := kp.waiters.pop(); w != nil; w = kp.waiters.pop() {
		kp.waitTime += now.Sub(w.since)
		w.finish(nil, serverDownError(kp.key, err))
	}
}

func (p *Pool[C]) keyPoolLocked(key Key) *keyPool[C] {
	// Most pools serve one key, or a few in turns: comparing two short names is quicker
	// than hashing them.
	if kp := p.lastKey; kp != nil && kp.key == key {
		return kp
	}
	if kp := p.keys[key]; kp != nil {
		p.lastKey = kp
		return kp
	}
	db := p.dbs[key.Database]
	if db == nil {
		db = &database[C]{name: key.Database, max: p.set.maxFor(key.Database)}
		p.dbs[key.Database] = db
	}
	kp := &keyPool[C]{key: key, db: db, lim: p.set.limitsFor(key)}
	db.pools = append(db.pools, kp)
	p.keys[key] = kp
	p.lastKey = kp
	return kp
}

func keyFields(k Key) logrus.Fields {
	return logrus.Fields{"database": k.Database, "user": k.User}
}
