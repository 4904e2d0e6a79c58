package pool

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

var keyA = Key{Database: "app", User: "alice"}

func TestGiveBackGoesToLongestWaiterInFIFOOrder(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 1}})
	ctx := context.Background()
	held := mustAcquire(t, f.p, keyA)
	var waits []<-chan result
	for i := range 4 {
		waits = append(waits, goAcquire(ctx, f.p, keyA))
		waitWaiting(t, f.p, keyA, i+1)
	}
	for i, ch := range waits {
		held.Release(Clean)
		r := receive(t, ch)
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		for _, later := range waits[i+1:] {
			pending(t, later)
		}
		held = r.s
	}
	// A newcomer does not overtake a waiter: with one queued, a release goes to it.
	first := goAcquire(ctx, f.p, keyA)
	waitWaiting(t, f.p, keyA, 1)
	second := goAcquire(ctx, f.p, keyA)
	waitWaiting(t, f.p, keyA, 2)
	held.Release(Clean)
	r := receive(t, first)
	pending(t, second)
	r.s.Release(Clean)
	receive(t, second).s.Release(Clean)
	if n := f.conn.dialCount(); n != 1 {
		t.Errorf("dials = %d, want 1: one connection serves everyone in turn", n)
	}
}

func TestWaitTimeoutFailsWith57014AndPoolStaysUsable(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 1, QueryWaitTimeout: 5 * time.Second}})
	held := mustAcquire(t, f.p, keyA)
	ch := goAcquire(context.Background(), f.p, keyA)
	waitWaiting(t, f.p, keyA, 1)
	f.clock.Advance(4 * time.Second)
	pending(t, ch)
	f.clock.Advance(2 * time.Second)
	r := receive(t, ch)
	if !errors.Is(r.err, ErrWaitTimeout) {
		t.Fatalf("err = %v, want ErrWaitTimeout", r.err)
	}
	var pe *Error
	if !errors.As(r.err, &pe) || pe.SQLState() != "57014" {
		t.Fatalf("err = %#v, want SQLSTATE 57014", r.err)
	}
	st := statsOf(f.p, keyA)
	if st.ClientsWaiting != 0 || st.WaitTimeouts != 1 || st.WaitTime < 5*time.Second {
		t.Errorf("stats after timeout = %+v", st)
	}
	held.Release(Clean)
	mustAcquire(t, f.p, keyA).Release(Clean)
}

// TestWaitTimeoutOfEachWaiter: every waiter gets its own QueryWaitTimeout, counted from
// when it began to wait, although the key arms one timer for all of them; a Reload that
// shortens the timeout applies to the waits that begin afterwards, including one that
// must end before the waiters already queued.
func TestWaitTimeoutOfEachWaiter(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 1, QueryWaitTimeout: 5 * time.Second}})
	held := mustAcquire(t, f.p, keyA)
	first := goAcquire(context.Background(), f.p, keyA)
	waitWaiting(t, f.p, keyA, 1)
	f.clock.Advance(3 * time.Second)
	second := goAcquire(context.Background(), f.p, keyA)
	waitWaiting(t, f.p, keyA, 2)
	f.clock.Advance(2 * time.Second) // 5 s after the first began
	if r := receive(t, first); !errors.Is(r.err, ErrWaitTimeout) {
		t.Fatalf("first waiter: %v, want ErrWaitTimeout", r.err)
	}
	pending(t, second)

	if err := f.p.Reload(Settings{Limits: Limits{PoolSize: 1, QueryWaitTimeout: time.Second}}); err != nil {
		t.Fatal(err)
	}
	third := goAcquire(context.Background(), f.p, keyA)
	waitWaiting(t, f.p, keyA, 2)
	f.clock.Advance(900 * time.Millisecond) // 0.9 s after the third began
	pending(t, second)
	pending(t, third)
	f.clock.Advance(200 * time.Millisecond) // 1.1 s after the third began, 3.1 s after the second
	if r := receive(t, third); !errors.Is(r.err, ErrWaitTimeout) {
		t.Fatalf("third waiter: %v, want ErrWaitTimeout", r.err)
	}
	pending(t, second)
	f.clock.Advance(1800 * time.Millisecond) // 4.9 s after the second began
	pending(t, second)
	f.clock.Advance(200 * time.Millisecond)
	if r := receive(t, second); !errors.Is(r.err, ErrWaitTimeout) {
		t.Fatalf("second waiter: %v, want ErrWaitTimeout", r.err)
	}
	if st := statsOf(f.p, keyA); st.WaitTimeouts != 3 || st.ClientsWaiting != 0 {
		t.Errorf("stats = %+v, want 3 timeouts and nobody waiting", st)
	}

	// A waiter served in time is not failed later by the timer armed for it.
	fourth := goAcquire(context.Background(), f.p, keyA)
	waitWaiting(t, f.p, keyA, 1)
	held.Release(Clean)
	r := receive(t, fourth)
	if r.err != nil {
		t.Fatal(r.err)
	}
	fifth := goAcquire(context.Background(), f.p, keyA)
	waitWaiting(t, f.p, keyA, 1)
	f.clock.Advance(999 * time.Millisecond)
	pending(t, fifth)
	r.s.Release(Clean)
	if r := receive(t, fifth); r.err != nil {
		t.Fatalf("fifth waiter: %v", r.err)
	} else {
		r.s.Release(Clean)
	}
}

func TestCancelledContextStopsTheWait(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 1}})
	held := mustAcquire(t, f.p, keyA)
	ctx, cancel := context.WithCancel(context.Background())
	cancelled := goAcquire(ctx, f.p, keyA)
	waitWaiting(t, f.p, keyA, 1)
	next := goAcquire(context.Background(), f.p, keyA)
	waitWaiting(t, f.p, keyA, 2)
	cancel()
	if r := receive(t, cancelled); !errors.Is(r.err, context.Canceled) || r.s != nil {
		t.Fatalf("cancelled Acquire = %v, %v", r.s, r.err)
	}
	waitWaiting(t, f.p, keyA, 1)
	held.Release(Clean)
	r := receive(t, next)
	if r.err != nil || r.s.Conn() != held.Conn() {
		t.Fatalf("the waiter behind the cancelled one got %v, %v", r.s, r.err)
	}
	r.s.Release(Clean)

	// An Acquire with a context already done does not queue.
	if _, err := f.p.Acquire(ctx, keyA); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled context: %v", err)
	}
}

func TestServerLifetimeClosesOnlyWhenGivenBack(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 2, ServerLifetime: time.Hour, ServerIdleTimeout: -1}})
	inUse := mustAcquire(t, f.p, keyA)
	idle := mustAcquire(t, f.p, keyA)
	idle.Release(Clean)
	f.clock.Advance(time.Hour + time.Second) // the janitor runs on the way
	waitFor(t, "idle connection past its lifetime closed", idle.Conn().isClosed)
	if inUse.Conn().isClosed() {
		t.Fatal("a connection in use was closed for its lifetime")
	}
	c := inUse.Conn()
	inUse.Release(Clean)
	waitFor(t, "connection past its lifetime closed when given back", c.isClosed)
	s := mustAcquire(t, f.p, keyA)
	if s.Conn() == c || s.Conn() == idle.Conn() {
		t.Fatal("a connection past its lifetime was lent again")
	}
	s.Release(Clean)
	if st := statsOf(f.p, keyA); st.ServersIdle != 1 || st.LifetimeCloses != 1 {
		t.Errorf("stats = %+v", st)
	}
}

func TestIdleTimeoutKeepsMinPoolSize(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 5, MinPoolSize: 2, ServerIdleTimeout: 10 * time.Minute, ServerLifetime: -1}})
	var held []*Server[*memConn]
	for range 4 {
		held = append(held, mustAcquire(t, f.p, keyA))
	}
	for _, s := range held {
		s.Release(Clean)
	}
	f.clock.Advance(9 * time.Minute)
	if n := f.conn.openCount("app"); n != 4 {
		t.Fatalf("open = %d before the idle timeout, want 4", n)
	}
	f.clock.Advance(2 * time.Minute)
	waitFor(t, "idle connections closed down to min-pool-size", func() bool { return f.conn.openCount("app") == 2 })
	f.clock.Advance(time.Hour)
	if n := f.conn.openCount("app"); n != 2 {
		t.Fatalf("open = %d after long idleness, want min-pool-size 2", n)
	}
}

func TestJanitorOpensMinPoolSize(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 5, MinPoolSize: 3}})
	mustAcquire(t, f.p, keyA).Release(Clean)
	f.clock.Advance(time.Second)
	waitFor(t, "min-pool-size connections", func() bool { return statsOf(f.p, keyA).ServersIdle == 3 })
	// A broken connection is replaced by the next round.
	s := mustAcquire(t, f.p, keyA)
	s.Release(Broken)
	// The broken connection counts until it is closed; the janitor's next rounds
	// replace it.
	waitFor(t, "min-pool-size restored", func() bool {
		f.clock.Advance(time.Second)
		return statsOf(f.p, keyA).ServersIdle == 3
	})
	if n := f.conn.dialCount(); n != 4 {
		t.Errorf("dials = %d, want 4", n)
	}
}

func TestMaxDBConnectionsAcrossUsers(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 5}, MaxDBConnections: 2})
	keyB := Key{Database: "app", User: "bob"}
	a1 := mustAcquire(t, f.p, keyA)
	a2 := mustAcquire(t, f.p, keyA)
	b := goAcquire(context.Background(), f.p, keyB)
	waitWaiting(t, f.p, keyB, 1)
	// Another database is not limited by this one.
	other := mustAcquire(t, f.p, Key{Database: "other", User: "alice"})
	other.Release(Clean)
	pending(t, b)
	// alice's connection goes idle; bob needs one more than the database allows, so the
	// idle connection of alice is closed to make room.
	a1.Release(Clean)
	r := receive(t, b)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.s.Conn() == a1.Conn() {
		t.Fatal("bob got alice's connection")
	}
	waitFor(t, "alice's idle connection closed", a1.Conn().isClosed)
	if n := f.conn.maxOpenCount("app"); n > 2 {
		t.Fatalf("database app had %d connections open at once, max-db-connections is 2", n)
	}
	// With the database full and nothing idle, a waiter gets the next connection given
	// back... to its own key: alice's goes to alice's waiter, not bob's.
	waitA := goAcquire(context.Background(), f.p, keyA)
	waitWaiting(t, f.p, keyA, 1)
	r.s.Release(Clean) // bob's connection is idle now: alice's waiter evicts it
	ra := receive(t, waitA)
	if ra.err != nil {
		t.Fatal(ra.err)
	}
	if n := f.conn.maxOpenCount("app"); n > 2 {
		t.Fatalf("database app had %d connections open at once, max-db-connections is 2", n)
	}
	a2.Release(Clean)
	ra.s.Release(Clean)
}

func TestBrokenConnectionIsNeverReused(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 1}})
	s := mustAcquire(t, f.p, keyA)
	waiting := goAcquire(context.Background(), f.p, keyA)
	waitWaiting(t, f.p, keyA, 1)
	broken := s.Conn()
	s.Release(Broken)
	r := receive(t, waiting)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.s.Conn() == broken {
		t.Fatal("a broken connection was lent again")
	}
	waitFor(t, "broken connection closed", broken.isClosed)
	r.s.Release(Clean)
	if st := statsOf(f.p, keyA); st.Dials != 2 || st.Closes != 1 {
		t.Errorf("stats = %+v", st)
	}
}

func TestGiveBackTwicePanics(t *testing.T) {
	f := newFixture(t, Settings{})
	s := mustAcquire(t, f.p, keyA)
	s.Release(Clean)
	defer func() {
		if recover() == nil {
			t.Fatal("second Release did not panic")
		}
	}()
	s.Release(Clean)
}

func TestResetBeforeReuse(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 1}})
	s := mustAcquire(t, f.p, keyA)
	s.Conn().set("search_path=evil")
	waiting := goAcquire(context.Background(), f.p, keyA)
	waitWaiting(t, f.p, keyA, 1)
	s.Release(NeedsReset)
	r := receive(t, waiting)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.s.Conn() != s.Conn() {
		t.Fatal("reset connection not reused")
	}
	if got := r.s.Conn().state(); got != "" {
		t.Fatalf("the next borrower sees %q", got)
	}
	// Clean means clean: no reset is run.
	r.s.Release(Clean)
	s2 := mustAcquire(t, f.p, keyA)
	if s2.Conn().resets != 1 {
		t.Fatalf("resets = %d, want 1", s2.Conn().resets)
	}
	// A failed reset closes the connection.
	f.conn.mu.Lock()
	f.conn.resetErr = errors.New("reset failed")
	f.conn.mu.Unlock()
	s2.Conn().set("temp table")
	s2.Release(NeedsReset)
	waitFor(t, "connection whose reset failed closed", s2.Conn().isClosed)
	s3 := mustAcquire(t, f.p, keyA)
	if s3.Conn() == s2.Conn() || s3.Conn().state() != "" {
		t.Fatal("a connection whose reset failed was lent again")
	}
	s3.Release(Clean)
	if st := statsOf(f.p, keyA); st.ResetErrors != 1 {
		t.Errorf("reset errors = %d", st.ResetErrors)
	}
}

// sqlStateError is a dial error that carries PostgreSQL's SQLSTATE, as pgconn.PgError.
type sqlStateError struct{ code string }

func (e sqlStateError) Error() string    { return "FATAL: the database system is starting up" }
func (e sqlStateError) SQLState() string { return e.code }

func TestDialFailureFailsWaitersAtOnceAndBacksOff(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 3, QueryWaitTimeout: time.Hour}, ServerLoginRetry: time.Second})
	refused := errors.New("connection refused")
	f.conn.setDialErr(refused)
	f.conn.gate = make(chan struct{})
	var waits []<-chan result
	for i := range 5 {
		waits = append(waits, goAcquire(context.Background(), f.p, keyA))
		waitWaiting(t, f.p, keyA, i+1)
	}
	close(f.conn.gate) // the three dials fail; no time passes
	for i, ch := range waits {
		r := receive(t, ch)
		if !errors.Is(r.err, ErrServerDown) || !errors.Is(r.err, refused) {
			t.Fatalf("waiter %d: %v, want ErrServerDown wrapping the dial error", i, r.err)
		}
		var pe *Error
		if !errors.As(r.err, &pe) || pe.SQLState() != "08001" {
			t.Fatalf("waiter %d: SQLSTATE of %v, want 08001", i, r.err)
		}
	}
	// Dials started before the first failure are still finishing.
	waitFor(t, "dials in flight", func() bool { return statsOf(f.p, keyA).ServersLogin == 0 })
	dials := f.conn.dialCount()
	if dials < 1 || dials > 3 {
		t.Fatalf("dials = %d, want 1..3 (pool-size)", dials)
	}
	// Within the retry pause, Acquire fails at once without dialling.
	for range 10 {
		if _, err := f.p.Acquire(context.Background(), keyA); !errors.Is(err, refused) {
			t.Fatalf("Acquire during the retry pause: %v", err)
		}
	}
	if n := f.conn.dialCount(); n != dials {
		t.Fatalf("dialled %d more times during the retry pause", n-dials)
	}
	// The pause doubles from 250 ms, up to server-login-retry.
	var pauses []time.Duration
	for range 4 {
		before := f.conn.dialCount()
		step := 50 * time.Millisecond
		var waited time.Duration
		for {
			f.clock.Advance(step)
			waited += step
			_, err := f.p.Acquire(context.Background(), keyA)
			if !errors.Is(err, refused) {
				t.Fatalf("Acquire: %v", err)
			}
			if f.conn.dialCount() > before {
				break
			}
		}
		pauses = append(pauses, waited)
	}
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, time.Second}
	if fmt.Sprint(pauses) != fmt.Sprint(want) {
		t.Errorf("pauses between dials = %v, want %v", pauses, want)
	}
	// The server answers with its own SQLSTATE: the client gets it.
	f.conn.setDialErr(sqlStateError{"57P03"})
	f.clock.Advance(time.Second)
	_, err := f.p.Acquire(context.Background(), keyA)
	var pe *Error
	if !errors.As(err, &pe) || pe.SQLState() != "57P03" {
		t.Fatalf("Acquire against a server starting up: %v, want 57P03", err)
	}
	// Once the server is back, the next dial after the pause succeeds and resets the pause.
	f.conn.setDialErr(nil)
	f.clock.Advance(time.Second)
	s := mustAcquire(t, f.p, keyA)
	s.Release(Clean)
	if st := statsOf(f.p, keyA); st.DialErrors == 0 || st.Dials != 1 {
		t.Errorf("stats = %+v", st)
	}
}

func TestDialFailureWithConnectionsInUseStillQueues(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 2}})
	held := mustAcquire(t, f.p, keyA)
	f.conn.setDialErr(errors.New("too many connections"))
	if _, err := f.p.Acquire(context.Background(), keyA); !errors.Is(err, ErrServerDown) {
		t.Fatalf("Acquire while the dial fails: %v", err)
	}
	// During the pause a connection is in use: a new Acquire waits for it instead of
	// failing.
	ch := goAcquire(context.Background(), f.p, keyA)
	waitWaiting(t, f.p, keyA, 1)
	held.Release(Clean)
	r := receive(t, ch)
	if r.err != nil || r.s.Conn() != held.Conn() {
		t.Fatalf("Acquire = %v, %v", r.s, r.err)
	}
	r.s.Release(Clean)
}

func TestCheckReplacesAConnectionThatDiedIdle(t *testing.T) {
	clk, mc := newFakeClock(), newMemConnector()
	p, err := newPool[*memConn](checkingConnector{mc}, Settings{}, clk)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s := mustAcquire(t, p, keyA)
	dead := s.Conn()
	s.Release(Clean)
	dead.mu.Lock()
	dead.lostPeer = true
	dead.mu.Unlock()
	s = mustAcquire(t, p, keyA)
	if s.Conn() == dead {
		t.Fatal("lent a connection that failed its check")
	}
	waitFor(t, "dead connection closed", dead.isClosed)
	s.Release(Clean)
}

func TestShutdownWaitsForConnectionsInUse(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 2}})
	inUse := mustAcquire(t, f.p, keyA)
	idle := mustAcquire(t, f.p, keyA)
	idle.Release(Clean)
	waiting := goAcquire(context.Background(), f.p, Key{Database: "app", User: "w"})
	done := make(chan error, 1)
	go func() { done <- f.p.Shutdown(context.Background()) }()
	waitFor(t, "idle connection closed at shutdown", idle.Conn().isClosed)
	// The waiter of another key may have got its connection before Shutdown: either way
	// it ends.
	if r := receive(t, waiting); r.err == nil {
		r.s.Release(Clean)
	} else if !errors.Is(r.err, ErrClosed) {
		t.Fatalf("waiter at shutdown: %v", r.err)
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v with a connection in use", err)
	default:
	}
	if _, err := f.p.Acquire(context.Background(), keyA); !errors.Is(err, ErrClosed) {
		t.Fatalf("Acquire after Shutdown: %v", err)
	}
	var pe *Error
	if _, err := f.p.Acquire(context.Background(), keyA); !errors.As(err, &pe) || pe.SQLState() != "57P03" {
		t.Fatalf("Acquire after Shutdown: %v, want 57P03", err)
	}
	inUse.Release(Clean)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !inUse.Conn().isClosed() {
		t.Fatal("Shutdown returned before the connection given back was closed")
	}
}

func TestShutdownHonoursItsContext(t *testing.T) {
	f := newFixture(t, Settings{})
	s := mustAcquire(t, f.p, keyA)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.p.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown = %v", err)
	}
	s.Release(NeedsReset) // given back after the deadline: closed, not reset into the pool
	waitFor(t, "connection closed", s.Conn().isClosed)
}

func TestWaiterWhileShutdownFailsWithErrClosed(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 1}})
	s := mustAcquire(t, f.p, keyA)
	ch := goAcquire(context.Background(), f.p, keyA)
	waitWaiting(t, f.p, keyA, 1)
	f.p.Close()
	if r := receive(t, ch); !errors.Is(r.err, ErrClosed) {
		t.Fatalf("waiter: %v", r.err)
	}
	s.Release(Clean)
	waitFor(t, "connection given back after Close is closed", s.Conn().isClosed)
}

func TestReloadKeepsConnectionsInUse(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 3}})
	var held []*Server[*memConn]
	for range 3 {
		held = append(held, mustAcquire(t, f.p, keyA))
	}
	if err := f.p.Reload(Settings{Limits: Limits{PoolSize: 1}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range held {
		if s.Conn().isClosed() {
			t.Fatal("Reload closed a connection in use")
		}
	}
	for _, s := range held {
		s.Release(Clean)
	}
	waitFor(t, "surplus closed", func() bool { return f.conn.openCount("app") == 1 })
	if st := statsOf(f.p, keyA); st.PoolSize != 1 || st.ServersIdle != 1 {
		t.Fatalf("stats = %+v", st)
	}
	// Growing the pool serves the waiters at once.
	s := mustAcquire(t, f.p, keyA)
	ch := goAcquire(context.Background(), f.p, keyA)
	waitWaiting(t, f.p, keyA, 1)
	if err := f.p.Reload(Settings{Limits: Limits{PoolSize: 2}}); err != nil {
		t.Fatal(err)
	}
	r := receive(t, ch)
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.s.Release(Clean)
	s.Release(Clean)
	if err := f.p.Reload(Settings{Limits: Limits{PoolSize: 1, MinPoolSize: 2}}); !errors.Is(err, ErrSettings) {
		t.Fatalf("Reload with min-pool-size > pool-size: %v", err)
	}
}

func TestPerKeyLimits(t *testing.T) {
	keyB := Key{Database: "app", User: "bob"}
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 1}, PerKey: func(k Key) Limits {
		if k.User == "bob" {
			return Limits{PoolSize: 3}
		}
		return Limits{}
	}})
	for range 3 {
		mustAcquire(t, f.p, keyB)
	}
	mustAcquire(t, f.p, keyA)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := f.p.Acquire(ctx, keyA); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("alice's second Acquire over pool-size 1: %v", err)
	}
}

func TestSettingsValidation(t *testing.T) {
	for _, s := range []Settings{
		{Limits: Limits{PoolSize: -1}},
		{Limits: Limits{PoolSize: 2, MinPoolSize: 3}},
		{MaxDBConnections: -1},
		{ServerConnectTimeout: -time.Second},
	} {
		if _, err := New[*memConn](newMemConnector(), s); !errors.Is(err, ErrSettings) {
			t.Errorf("New(%+v) = %v, want ErrSettings", s, err)
		}
	}
	p, err := New[*memConn](newMemConnector(), Settings{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.set.PoolSize != DefaultPoolSize || p.set.QueryWaitTimeout != DefaultQueryWaitTimeout || p.set.ServerLifetime != DefaultServerLifetime {
		t.Errorf("defaults = %+v", p.set.Limits)
	}
}

func TestStatsCountBorrowers(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 2}})
	a := mustAcquire(t, f.p, keyA)
	b := mustAcquire(t, f.p, keyA)
	ch := goAcquire(context.Background(), f.p, keyA)
	waitWaiting(t, f.p, keyA, 1)
	f.clock.Advance(3 * time.Second)
	st := statsOf(f.p, keyA)
	if st.ClientsActive != 2 || st.ServersActive != 2 || st.ClientsWaiting != 1 || st.MaxWait != 3*time.Second {
		t.Fatalf("stats = %+v", st)
	}
	a.CountTransaction(3)
	a.Release(Clean)
	r := receive(t, ch)
	b.Release(NeedsReset)
	waitFor(t, "reset done", func() bool { return statsOf(f.p, keyA).ServersIdle == 1 })
	r.s.CountTransaction(1)
	r.s.Release(Clean)
	st = statsOf(f.p, keyA)
	if st.Acquires != 3 || st.Transactions != 2 || st.Queries != 4 || st.WaitTime != 3*time.Second || st.ServersIdle != 2 || st.ClientsActive != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestJanitorForgetsUnusedKeys(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{ServerIdleTimeout: time.Minute}})
	for i := range 3 {
		mustAcquire(t, f.p, Key{Database: "app", User: fmt.Sprint("user", i)}).Release(Clean)
	}
	if n := len(f.p.Snapshot()); n != 3 {
		t.Fatalf("%d keys, want 3", n)
	}
	// Idle past the timeout, their connections close; the next rounds forget the keys.
	waitFor(t, "unused keys forgotten", func() bool {
		f.clock.Advance(30 * time.Second)
		return len(f.p.Snapshot()) == 0
	})
	// A forgotten key comes back on demand, the last one used too (which the Pool
	// remembers to spare a lookup).
	mustAcquire(t, f.p, Key{Database: "app", User: "user2"}).Release(Clean)
	if st := f.p.Snapshot(); len(st) != 1 || st[0].Acquires != 1 {
		t.Fatalf("snapshot = %+v", st)
	}
}

func TestPerDatabaseMaxAndReloadLoweringIt(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 10}, MaxDBConnections: 3,
		PerDatabase: func(db string) int {
			if db == "small" {
				return 1
			}
			return 0
		}})
	small := Key{Database: "small", User: "alice"}
	s := mustAcquire(t, f.p, small)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := f.p.Acquire(ctx, Key{Database: "small", User: "bob"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second connection to a database of max 1: %v", err)
	}
	s.Release(Clean)
	var held []*Server[*memConn]
	for range 3 {
		held = append(held, mustAcquire(t, f.p, keyA))
	}
	if err := f.p.Reload(Settings{Limits: Limits{PoolSize: 10}, MaxDBConnections: 1}); err != nil {
		t.Fatal(err)
	}
	for _, h := range held {
		if h.Conn().isClosed() {
			t.Fatal("Reload closed a connection in use")
		}
	}
	for _, h := range held {
		h.Release(Clean)
	}
	waitFor(t, "database down to its new max", func() bool { return f.conn.openCount("app") == 1 })
}
