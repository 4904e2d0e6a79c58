package pool

import (
	"context"
	"slices"
)

// tick runs the janitor and arms the next run.
func (p *Pool[C]) tick() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.maintainLocked()
	p.janitor = p.clock.AfterFunc(p.set.JanitorInterval, p.tick)
}

// maintainLocked is one round of the janitor over every key: it closes idle connections
// past server-lifetime, and past server-idle-timeout as long as the key keeps
// min-pool-size; it closes idle connections a key has beyond its pool-size (after a
// Reload made it smaller); and it dials what min-pool-size lacks.
func (p *Pool[C]) maintainLocked() {
	now := p.clock.Now()
	for _, kp := range p.keys {
		keep := kp.idle[:0]
		for _, s := range kp.idle {
			switch {
			case kp.pastLifetime(s, now):
				kp.lifetimeCloses++
				p.closeLocked(s)
			case kp.lim.ServerIdleTimeout > 0 && now.Sub(s.lastUsed) > kp.lim.ServerIdleTimeout && kp.kept() > kp.lim.MinPoolSize:
				kp.idleCloses++
				p.closeLocked(s)
			default:
				keep = append(keep, s)
			}
		}
		clear(kp.idle[len(keep):])
		kp.idle = keep
		p.trimLocked(kp)
		if kp.unused() {
			p.forgetLocked(kp)
			continue
		}
		for kp.total < kp.lim.MinPoolSize && !now.Before(kp.retryAt) && p.roomLocked(kp, false) {
			p.dialLocked(kp)
		}
	}
}

// unused reports whether a key's pool holds nothing worth keeping: no connection, no
// borrower, nothing to keep open, and no dial failure whose pause it must remember.
func (kp *keyPool[C]) unused() bool {
	return kp.total == 0 && kp.lent == 0 && kp.reset == 0 && kp.waiters.n == 0 &&
		kp.lim.MinPoolSize == 0 && kp.lastErr == nil
}

// forgetLocked drops the pool of an unused key, so that a Pool that has seen many
// users does not keep them all; its figures leave the Snapshot with it. Acquire creates
// it again when needed.
func (p *Pool[C]) forgetLocked(kp *keyPool[C]) {
	delete(p.keys, kp.key)
	if p.lastKey == kp {
		p.lastKey = nil
	}
	db := kp.db
	db.pools = slices.DeleteFunc(db.pools, func(o *keyPool[C]) bool { return o == kp })
	if len(db.pools) == 0 {
		delete(p.dbs, kp.key.Database)
	}
}

// trimLocked closes the oldest idle connections of a key that has more than its
// pool-size, or whose database has more than max-db-connections.
func (p *Pool[C]) trimLocked(kp *keyPool[C]) {
	n := 0
	for n < len(kp.idle) && (kp.kept() > kp.lim.PoolSize || kp.db.overLimit()) {
		p.closeLocked(kp.idle[n])
		n++
	}
	if n > 0 {
		rest := copy(kp.idle, kp.idle[n:])
		clear(kp.idle[rest:])
		kp.idle = kp.idle[:rest]
	}
}

// Reload applies new settings. Connections in use are untouched: a key whose pool-size
// shrank closes its surplus idle connections now and the rest as they come back; one that
// grew starts the dials its waiters need.
func (p *Pool[C]) Reload(s Settings) error {
	s, err := s.validate()
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.set = s
	for name, db := range p.dbs {
		db.max = s.maxFor(name)
	}
	for _, kp := range p.keys {
		kp.lim = s.limitsFor(kp.key)
		p.trimLocked(kp)
	}
	for _, db := range p.dbs {
		p.serveLocked(db)
	}
	return nil
}

// Shutdown stops lending: waiting Acquires fail with ErrClosed, idle connections are
// closed, and connections in use are closed as they come back. It returns once none is
// in use, being reset or dialled and every close has finished, or with ctx's error when
// ctx ends first, in which case Close should follow.
func (p *Pool[C]) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	p.closeLendingLocked()
	p.mu.Unlock()
	// Dials and resets in flight only serve connections that will be closed: cut them
	// short.
	p.cancel()
	select {
	case <-p.drained:
	case <-ctx.Done():
		return ctx.Err()
	}
	return p.waitCloses(ctx)
}

// Close stops lending and closes every connection not in use at once, cancelling dials
// and resets in flight. Connections in use are closed when given back.
func (p *Pool[C]) Close() {
	p.mu.Lock()
	p.closeLendingLocked()
	p.mu.Unlock()
	p.cancel()
}

func (p *Pool[C]) closeLendingLocked() {
	if p.closed {
		return
	}
	p.closed = true
	if p.janitor != nil {
		p.janitor.Stop()
	}
	now := p.clock.Now()
	for _, kp := range p.keys {
		if kp.expiry != nil {
			kp.expiry.Stop()
			kp.expiry = nil
		}
		for w := kp.waiters.pop(); w != nil; w = kp.waiters.pop() {
			kp.waitTime += now.Sub(w.since)
			w.finish(nil, closedError(kp.key))
		}
		for _, s := range kp.idle {
			p.closeLocked(s)
		}
		clear(kp.idle)
		kp.idle = kp.idle[:0]
	}
	p.checkDrainedLocked()
}

func (p *Pool[C]) waitCloses(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		p.closing.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
