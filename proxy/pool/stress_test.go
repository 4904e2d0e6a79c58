package pool

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// exclusiveConnector is a memConnector whose connections notice being used by two
// borrowers at once, and that counts connections per key.
type exclusiveConnector struct {
	*memConnector
	mu      sync.Mutex
	perKey  map[Key]int
	maxKey  map[Key]int
	inUse   sync.Map // *memConn -> *atomic.Bool
	overlap atomic.Int64
}

func (e *exclusiveConnector) Dial(ctx context.Context, key Key) (*memConn, error) {
	c, err := e.memConnector.Dial(ctx, key)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.perKey[key]++
	e.maxKey[key] = max(e.maxKey[key], e.perKey[key])
	e.mu.Unlock()
	e.inUse.Store(c, new(atomic.Bool))
	return c, nil
}

func (e *exclusiveConnector) Close(c *memConn) {
	e.mu.Lock()
	e.perKey[c.key]--
	e.mu.Unlock()
	e.memConnector.Close(c)
}

func (e *exclusiveConnector) use(c *memConn) {
	v, _ := e.inUse.Load(c)
	flag := v.(*atomic.Bool)
	if !flag.CompareAndSwap(false, true) {
		e.overlap.Add(1)
		return
	}
	if c.isClosed() {
		e.overlap.Add(1)
	}
	flag.Store(false)
}

// TestStressInvariants runs many borrowers that cancel, break and dirty connections at
// random over two users of one database, on the real clock, and checks what must hold
// whatever the interleaving: no connection is used by two borrowers at once or after it
// was closed, no key exceeds pool-size, the database never exceeds max-db-connections,
// and Shutdown closes everything.
func TestStressInvariants(t *testing.T) {
	conn := &exclusiveConnector{memConnector: newMemConnector(), perKey: map[Key]int{}, maxKey: map[Key]int{}}
	p, err := New[*memConn](conn, Settings{
		Limits:           Limits{PoolSize: 3, ServerLifetime: 20 * time.Millisecond, ServerIdleTimeout: 5 * time.Millisecond},
		MaxDBConnections: 4,
		JanitorInterval:  time.Millisecond,
		Log:              quietLog(),
	})
	if err != nil {
		t.Fatal(err)
	}
	keys := []Key{{Database: "app", User: "alice"}, {Database: "app", User: "bob"}}
	var wg sync.WaitGroup
	var lent, cancelled atomic.Int64
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 300 {
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(8) == 0 {
					go cancel()
				}
				s, err := p.Acquire(ctx, keys[rng.IntN(len(keys))])
				cancel()
				if err != nil {
					if !errors.Is(err, context.Canceled) {
						t.Errorf("Acquire: %v", err)
						return
					}
					cancelled.Add(1)
					continue
				}
				lent.Add(1)
				conn.use(s.Conn())
				s.Release(State(rng.IntN(3)))
			}
		}()
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("lent %d, cancelled %d, dials %d", lent.Load(), cancelled.Load(), conn.dialCount())
	if n := conn.overlap.Load(); n != 0 {
		t.Errorf("%d uses of a connection lent twice or already closed", n)
	}
	for _, k := range keys {
		if conn.maxKey[k] > 3 {
			t.Errorf("%v had %d connections at once, pool-size is 3", k, conn.maxKey[k])
		}
	}
	if n := conn.maxOpenCount("app"); n > 4 {
		t.Errorf("database had %d connections at once, max-db-connections is 4", n)
	}
	if n := conn.openCount("app"); n != 0 {
		t.Errorf("%d connections open after Shutdown", n)
	}
}

func TestCollectorExportsSnapshot(t *testing.T) {
	f := newFixture(t, Settings{Limits: Limits{PoolSize: 2}})
	a := mustAcquire(t, f.p, keyA)
	mustAcquire(t, f.p, keyA).Release(Clean)
	a.CountTransaction(2)
	mfs := gather(t, NewCollector(f.p.Snapshot))
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["database"] != "app" || labels["user"] != "alice" {
				t.Errorf("%s has labels %v", mf.GetName(), labels)
			}
			switch {
			case m.GetGauge() != nil:
				got[mf.GetName()] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				got[mf.GetName()] = m.GetCounter().GetValue()
			}
		}
	}
	for name, want := range map[string]float64{
		"leafproxy_pool_servers_active":     1,
		"leafproxy_pool_clients_active":     1,
		"leafproxy_pool_servers_idle":       1,
		"leafproxy_pool_size":               2,
		"leafproxy_pool_acquires_total":     2,
		"leafproxy_pool_transactions_total": 1,
		"leafproxy_pool_queries_total":      2,
		"leafproxy_pool_dials_total":        2,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}
	if len(mfs) != 16 {
		t.Errorf("gathered %d metric families, want 16", len(mfs))
	}
	a.Release(Clean)
}

// TestCollectorOfNamedFigures: NewCollectorOf exports only the figures named, under its
// prefix.
func TestCollectorOfNamedFigures(t *testing.T) {
	snapshot := func() []Stats {
		return []Stats{{Database: "app", User: "alice", ServersIdle: 3, WaitTimeouts: 2, Transactions: 9}}
	}
	got := map[string]float64{}
	for _, mf := range gather(t, NewCollectorOf("x_", snapshot, "servers_idle", "wait_timeouts_total")) {
		for _, m := range mf.GetMetric() {
			got[mf.GetName()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	if len(got) != 2 || got["x_servers_idle"] != 3 || got["x_wait_timeouts_total"] != 2 {
		t.Fatalf("gathered %v, want x_servers_idle 3 and x_wait_timeouts_total 2 only", got)
	}
}

// gather registers c alone in a pedantic registry and gathers it.
func gather(t *testing.T, c prometheus.Collector) []*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}
