package segment_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leafproxy/leafproxy/idgen/segment"
	"github.com/leafproxy/leafproxy/internal/testenv"
)

// cutRelay sits between an engine's pool and PostgreSQL. It forwards everything, but
// holds back the server's messages until each ReadyForQuery, so that it sees a whole
// response before the client does. Once armed, the first response that carries a row and
// "UPDATE 1" (a reservation: PostgreSQL committed it before it sent ReadyForQuery) is
// never delivered: the relay closes both connections instead, as a network failure at
// that moment would. The client is left not knowing whether its UPDATE happened.
type cutRelay struct {
	t      testing.TB
	l      net.Listener
	target string

	mode atomic.Int32 // relayPass, relayCutOnce or relayCutAll
	cut  chan int64   // the max_id of the first reservation never delivered

	mu      sync.Mutex
	conns   []net.Conn
	lostMax int64 // the highest max_id of the reservations never delivered
	wg      sync.WaitGroup
}

// What a cutRelay does with a reservation's reply.
const (
	relayPass    int32 = iota // deliver it
	relayCutOnce              // cut the next one, then deliver again
	relayCutAll               // cut every one
)

// startCutRelay starts a relay to the PostgreSQL server of dsn.
func startCutRelay(t testing.TB, dsn string) *cutRelay {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &cutRelay{t: t, l: l, target: u.Host, cut: make(chan int64, 1)}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.close)
	return r
}

// url returns dsn pointed at the relay, without TLS so that the relay can read the replies.
func (r *cutRelay) url(t testing.TB, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = r.l.Addr().String()
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	return u.String()
}

func (r *cutRelay) close() {
	r.l.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *cutRelay) track(c net.Conn) {
	r.mu.Lock()
	r.conns = append(r.conns, c)
	r.mu.Unlock()
}

func (r *cutRelay) accept() {
	defer r.wg.Done()
	for {
		client, err := r.l.Accept()
		if err != nil {
			return
		}
		server, err := net.DialTimeout("tcp", r.target, 15*time.Second)
		if err != nil {
			client.Close()
			continue
		}
		r.track(client)
		r.track(server)
		r.wg.Add(2)
		go func() {
			defer r.wg.Done()
			_, _ = io.Copy(server, client)
			server.Close()
		}()
		go func() {
			defer r.wg.Done()
			r.replies(client, server)
			client.Close()
			server.Close()
		}()
	}
}

// replies forwards the server's messages response by response (up to each ReadyForQuery).
func (r *cutRelay) replies(client, server net.Conn) {
	var pending []byte
	var row []int64
	var updated bool
	header := make([]byte, 5)
	for {
		if _, err := io.ReadFull(server, header); err != nil {
			return
		}
		body := make([]byte, int(binary.BigEndian.Uint32(header[1:]))-4)
		if _, err := io.ReadFull(server, body); err != nil {
			return
		}
		pending = append(append(pending, header...), body...)
		switch header[0] {
		case 'D': // DataRow
			row = dataRowInts(body)
		case 'C': // CommandComplete
			updated = bytes.Equal(body, []byte("UPDATE 1\x00"))
		case 'Z': // ReadyForQuery: the statement's transaction is over, committed
			if row != nil && updated && r.cutThis(row) {
				return
			}
			if _, err := client.Write(pending); err != nil {
				return
			}
			pending, row, updated = pending[:0], nil, false
		}
	}
}

// cutThis decides whether the reservation that returned row is cut, and records it.
func (r *cutRelay) cutThis(row []int64) bool {
	if !r.mode.CompareAndSwap(relayCutOnce, relayPass) && r.mode.Load() != relayCutAll {
		return false
	}
	r.mu.Lock()
	r.lostMax = max(r.lostMax, row[0])
	r.mu.Unlock()
	select {
	case r.cut <- row[0]:
	default:
	}
	return true
}

// highestLost returns the highest max_id a reservation whose reply was cut set.
func (r *cutRelay) highestLost() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lostMax
}

// dataRowInts decodes a DataRow of integers, sent as text or as binary int4/int8.
func dataRowInts(body []byte) []int64 {
	n := int(binary.BigEndian.Uint16(body))
	body = body[2:]
	out := make([]int64, 0, n)
	for range n {
		size := int(int32(binary.BigEndian.Uint32(body)))
		body = body[4:]
		if size < 0 {
			out = append(out, 0)
			continue
		}
		v := body[:size]
		body = body[size:]
		if i, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			out = append(out, i)
			continue
		}
		switch size {
		case 8:
			out = append(out, int64(binary.BigEndian.Uint64(v)))
		case 4:
			out = append(out, int64(int32(binary.BigEndian.Uint32(v))))
		default:
			out = append(out, -1)
		}
	}
	return out
}

// awaitCut waits for the relay to have swallowed a committed reservation and returns the
// max_id that reservation set.
func (r *cutRelay) awaitCut(t testing.TB) int64 {
	t.Helper()
	select {
	case m := <-r.cut:
		if m <= 0 {
			t.Fatalf("the swallowed reply has no max_id: %d", m)
		}
		return m
	case <-time.After(30 * time.Second):
		t.Fatal("no reservation reply was cut")
		return 0
	}
}

// relayedPool returns a pool whose connections pass through r.
func relayedPool(t testing.TB, r *cutRelay, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(r.url(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = 15 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// drawUntilLoading hands out IDs of tag until a load of the next segment has begun.
func drawUntilLoading(t *testing.T, e *segment.Engine, tag string, ids *[]int64) {
	t.Helper()
	for s := snapshotOf(t, e, tag); !s.Loading && !s.NextReady; s = snapshotOf(t, e, tag) {
		*ids = append(*ids, mustNext(t, e, tag))
	}
}

// TestReservationReplyLost cuts an engine's store connection after PostgreSQL committed a
// reservation but before the reply reached the engine. The range that reservation took is
// a gap: neither this engine nor another one sharing the table ever hands out an ID in it,
// the engine's next load succeeds with a range above it, and the two engines never hand
// out the same ID.
func TestReservationReplyLost(t *testing.T) {
	const step = 100
	dsn := testenv.NewDatabase(t)
	pool := newPool(t, dsn)
	insertTag(t, pool, "t", step, 0)
	relay := startCutRelay(t, dsn)
	settings := segment.Settings{MaxStep: step, LoadTimeout: 15 * time.Second}
	a := startEngine(t, segment.NewPostgresStore(relayedPool(t, relay, dsn)), settings)
	b := startEngine(t, segment.NewPostgresStore(newPool(t, dsn)), settings)

	fromA := []int64{mustNext(t, a, "t")} // (0, 100], through the relay untouched
	const firstHi = step
	relay.mode.Store(relayCutOnce)
	drawUntilLoading(t, a, "t", &fromA) // the preload's reply is swallowed
	lostMax := relay.awaitCut(t)
	lostLo := lostMax - step
	if lostLo < firstHi {
		t.Fatalf("lost range (%d, %d] overlaps the first segment (0, %d]", lostLo, lostMax, firstHi)
	}

	// A's retry goes through the relay again, now untouched. (Until it succeeds, a Next
	// that finds A's buffers empty fails fast, as during any store outage.)
	eventually(t, "engine A's retry", func() bool { return snapshotOf(t, a, "t").Loads >= 2 })
	// Both engines keep drawing across several segments.
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	var fromB []int64
	for _, d := range []struct {
		e   *segment.Engine
		ids *[]int64
	}{{a, &fromA}, {b, &fromB}} {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for range 5 * step {
				id, err := d.e.Next(ctx, "t")
				if err != nil {
					errs <- err
					return
				}
				*d.ids = append(*d.ids, id)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Next after the cut: %v", err)
	}
	if s := snapshotOf(t, a, "t"); s.Loads < 2 {
		t.Fatalf("engine A made %d loads, want a successful one after the cut", s.Loads)
	}

	seen := map[int64]string{}
	for name, ids := range map[string][]int64{"A": fromA, "B": fromB} {
		for _, id := range ids {
			if id > lostLo && id <= lostMax {
				t.Fatalf("engine %s handed out %d, inside the range (%d, %d] whose reply was lost", name, id, lostLo, lostMax)
			}
			if other, dup := seen[id]; dup {
				t.Fatalf("ID %d handed out by engine %s and engine %s", id, other, name)
			}
			seen[id] = name
		}
	}
	for _, id := range fromA {
		if id > firstHi && id <= lostMax {
			t.Fatalf("engine A handed out %d after its first segment, not above the lost range's %d", id, lostMax)
		}
	}
	if got := maxIDOf(t, pool, "t"); got < lostMax {
		t.Fatalf("max_id = %d, below the lost reservation's %d", got, lostMax)
	}
}

// TestGiveBackAfterLostReply: an engine whose reservations' replies were lost believes its
// newest range ends where its last delivered one did, while max_id is higher. Its
// give-back at Close reaches PostgreSQL and must not lower max_id: the lost ranges stay a
// gap, and the next engine continues above them.
func TestGiveBackAfterLostReply(t *testing.T) {
	const step = 100
	dsn := testenv.NewDatabase(t)
	pool := newPool(t, dsn)
	insertTag(t, pool, "t", step, 0)
	relay := startCutRelay(t, dsn)
	var gaveBack atomic.Int64
	a, err := segment.New(segment.Settings{
		Store: segment.NewPostgresStore(relayedPool(t, relay, dsn)), Logger: quietLogger(),
		MaxStep: step, LoadTimeout: 15 * time.Second,
		RetryBackoff: 20 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond,
		Hooks: segment.Hooks{OnGiveBack: func(_ string, _ int64, err error) {
			if err == nil {
				gaveBack.Add(1) // the compare-and-set reached PostgreSQL
			}
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	ids := []int64{mustNext(t, a, "t")}
	relay.mode.Store(relayCutAll) // every reservation from now on commits, unseen
	drawUntilLoading(t, a, "t", &ids)
	relay.awaitCut(t)
	if err := a.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if gaveBack.Load() != 1 {
		t.Fatal("the give-back did not reach PostgreSQL")
	}
	lostMax := relay.highestLost()
	if got := maxIDOf(t, pool, "t"); got != lostMax {
		t.Fatalf("max_id after Close = %d, want %d: the give-back moved it although replies were lost", got, lostMax)
	}
	b := startEngine(t, segment.NewPostgresStore(pool), segment.Settings{MaxStep: step})
	if first := mustNext(t, b, "t"); first != lostMax+1 {
		t.Fatalf("the next engine starts at %d, want %d", first, lostMax+1)
	}
}

// TestGiveBackWhileAnotherEngineLoads closes engine A while engine B, sharing the table,
// keeps drawing and reserving ranges after A's. A's give-back must leave every range B
// holds below max_id, and a third engine started afterwards never meets B's IDs.
func TestGiveBackWhileAnotherEngineLoads(t *testing.T) {
	const step = 50
	dsn := testenv.NewDatabase(t)
	pool := newPool(t, dsn)
	insertTag(t, pool, "t", step, 0)
	settings := segment.Settings{MaxStep: step}
	a := startEngine(t, segment.NewPostgresStore(newPool(t, dsn)), settings)
	b := startEngine(t, segment.NewPostgresStore(newPool(t, dsn)), settings)
	fromA := []int64{mustNext(t, a, "t"), mustNext(t, a, "t")}

	var mu sync.Mutex
	var fromB []int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for {
			select {
			case <-stop:
				return
			default:
			}
			id, err := b.Next(ctx, "t")
			if err != nil {
				t.Errorf("engine B: %v", err)
				return
			}
			mu.Lock()
			fromB = append(fromB, id)
			mu.Unlock()
		}
	})
	stopB := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	defer stopB()
	eventually(t, "engine B to reserve after A", func() bool { return snapshotOf(t, b, "t").Loads >= 2 })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Close(ctx); err != nil {
		t.Fatalf("Close A: %v", err)
	}
	// B keeps drawing: take its IDs before reading max_id, so that every ID checked was
	// handed out, and its range committed, before that read. (Read the other way round,
	// B can load and hand out a new range in between, which says nothing of A.)
	mu.Lock()
	drawnByB := slices.Clone(fromB)
	mu.Unlock()
	top := maxIDOf(t, pool, "t")
	for _, id := range drawnByB {
		if id > top {
			t.Fatalf("after A's give-back max_id = %d, below ID %d engine B handed out", top, id)
		}
	}

	c := startEngine(t, segment.NewPostgresStore(newPool(t, dsn)), settings)
	var fromC []int64
	for range 4 * step {
		fromC = append(fromC, mustNext(t, c, "t"))
	}
	stopB()
	seen := map[int64]string{}
	for name, ids := range map[string][]int64{"A": fromA, "B": fromB, "C": fromC} {
		for _, id := range ids {
			if other, dup := seen[id]; dup {
				t.Fatalf("ID %d handed out by engine %s and engine %s", id, other, name)
			}
			seen[id] = name
		}
	}
}
