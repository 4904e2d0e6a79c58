package pool

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

// fakeClock is a clock that moves only when the test advances it. Timers that fall due
// run in the advancing goroutine, in deadline order.
type fakeClock struct {
	mu     sync.Mutex
	now    instant
	timers []*fakeTimer
}

type fakeTimer struct {
	c    *fakeClock
	at   instant
	f    func()
	dead bool
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: instant(24 * time.Hour)} // past the zero instant, as the real clock's readings are
}

func (c *fakeClock) Now() instant {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.dead
	t.dead = true
	return was
}

// Advance moves the time forward by d, firing the timers due on the way.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	target := c.now.Add(d)
	for {
		c.timers = slices.DeleteFunc(c.timers, func(t *fakeTimer) bool { return t.dead })
		var next *fakeTimer
		for _, t := range c.timers {
			if !t.at.After(target) && (next == nil || t.at.Before(next.at)) {
				next = t
			}
		}
		if next == nil {
			break
		}
		next.dead = true
		if next.at.After(c.now) {
			c.now = next.at
		}
		c.mu.Unlock()
		next.f()
		c.mu.Lock()
	}
	c.now = target
	c.mu.Unlock()
}

// memConn is an in-memory server connection: it has an identity, a session state that
// borrowers write, and knows whether it was closed.
type memConn struct {
	id       int
	key      Key
	mu       sync.Mutex
	session  string // what a borrower left behind (a SET, a temp table...)
	resets   int
	closed   bool
	lostPeer bool // the server went away while it sat idle
}

func (c *memConn) set(v string) {
	c.mu.Lock()
	c.session = v
	c.mu.Unlock()
}

func (c *memConn) state() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.session
}

func (c *memConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// memConnector dials memConns. dialErr makes dials fail; gate, when set, holds every
// dial until the test sends on it.
type memConnector struct {
	mu       sync.Mutex
	conns    []*memConn
	dialErr  error
	resetErr error
	gate     chan struct{}
	dials    int
	open     map[string]int // per database
	maxOpen  map[string]int
}

func newMemConnector() *memConnector {
	return &memConnector{open: map[string]int{}, maxOpen: map[string]int{}}
}

func (m *memConnector) Dial(ctx context.Context, key Key) (*memConn, error) {
	m.mu.Lock()
	gate := m.gate
	m.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dials++
	if m.dialErr != nil {
		return nil, m.dialErr
	}
	c := &memConn{id: len(m.conns) + 1, key: key}
	m.conns = append(m.conns, c)
	m.open[key.Database]++
	m.maxOpen[key.Database] = max(m.maxOpen[key.Database], m.open[key.Database])
	return c, nil
}

func (m *memConnector) Reset(ctx context.Context, c *memConn) error {
	m.mu.Lock()
	err := m.resetErr
	m.mu.Unlock()
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.session = ""
	c.resets++
	c.mu.Unlock()
	return nil
}

func (m *memConnector) Close(c *memConn) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		panic("connection closed twice")
	}
	c.closed = true
	c.mu.Unlock()
	m.mu.Lock()
	m.open[c.key.Database]--
	m.mu.Unlock()
}

func (m *memConnector) setDialErr(err error) {
	m.mu.Lock()
	m.dialErr = err
	m.mu.Unlock()
}

func (m *memConnector) dialCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dials
}

func (m *memConnector) openCount(db string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.open[db]
}

func (m *memConnector) maxOpenCount(db string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.maxOpen[db]
}

// checkingConnector is a memConnector that also implements Checker.
type checkingConnector struct{ *memConnector }

func (checkingConnector) Check(c *memConn) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lostPeer {
		return errors.New("server closed the connection")
	}
	return nil
}

// waitFor waits until cond holds, failing the test after a generous deadline.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

type result struct {
	s   *Server[*memConn]
	err error
}

// goAcquire starts an Acquire in a goroutine and returns where its result arrives.
func goAcquire(ctx context.Context, p *Pool[*memConn], key Key) <-chan result {
	ch := make(chan result, 1)
	go func() {
		s, err := p.Acquire(ctx, key)
		ch <- result{s, err}
	}()
	return ch
}

// receive waits for an Acquire's result.
func receive(t testing.TB, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("Acquire did not return")
		return result{}
	}
}

// pending checks that an Acquire has not returned.
func pending(t testing.TB, ch <-chan result) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("Acquire returned early: %v %v", r.s, r.err)
	default:
	}
}

func statsOf(p *Pool[*memConn], k Key) Stats {
	for _, st := range p.Snapshot() {
		if st.Database == k.Database && st.User == k.User {
			return st
		}
	}
	return Stats{Database: k.Database, User: k.User}
}

// waitWaiting waits until n Acquires of k are queued.
func waitWaiting(t testing.TB, p *Pool[*memConn], k Key, n int) {
	t.Helper()
	waitFor(t, "waiting clients", func() bool { return statsOf(p, k).ClientsWaiting == n })
}

type fixture struct {
	p     *Pool[*memConn]
	clock *fakeClock
	conn  *memConnector
}

func newFixture(t testing.TB, s Settings) fixture {
	t.Helper()
	f := fixture{clock: newFakeClock(), conn: newMemConnector()}
	if s.Log == nil {
		s.Log = quietLog()
	}
	p, err := newPool[*memConn](f.conn, s, f.clock)
	if err != nil {
		t.Fatal(err)
	}
	f.p = p
	t.Cleanup(p.Close)
	return f
}

func mustAcquire(t testing.TB, p *Pool[*memConn], k Key) *Server[*memConn] {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := p.Acquire(ctx, k)
	if err != nil {
		t.Fatalf("Acquire(%v): %v", k, err)
	}
	return s
}

// quietLog is a logger for tests whose pools log expected failures.
func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}
