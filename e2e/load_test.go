package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// gotID is one ID a statement returned and the namespace it must be unique in.
type gotID struct {
	ns     string
	id     int64
	origin string
}

// loadOp is one kind of statement the load clients send. Together they cover the fast
// path (a standalone SELECT leaf_next), the rewrite path (several call sites), simple and
// extended protocol, a tag passed as a parameter, and INSERTs whose key the proxy fills.
type loadOp struct {
	name   string
	weight int
	rows   int // rows an INSERT writes, for the uncertain-outcome bookkeeping
	origin string
	run    func(ctx context.Context, c *pgx.Conn, client string) ([]gotID, error)
}

func selectIDs(ctx context.Context, c *pgx.Conn, sql string, ns []string, args ...any) ([]gotID, error) {
	ids := make([]int64, len(ns))
	dst := make([]any, len(ns))
	for i := range ids {
		dst[i] = &ids[i]
	}
	if err := c.QueryRow(ctx, sql, args...).Scan(dst...); err != nil {
		return nil, err
	}
	out := make([]gotID, len(ns))
	for i := range ns {
		out[i] = gotID{ns[i], ids[i], originLeafNext}
	}
	return out, nil
}

func insertIDs(ctx context.Context, c *pgx.Conn, ns, origin string, want int, sql string, args ...any) ([]gotID, error) {
	rows, err := c.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	if len(ids) != want {
		return nil, fmt.Errorf("wrong data: INSERT … RETURNING gave %d rows, want %d", len(ids), want)
	}
	out := make([]gotID, len(ids))
	for i, id := range ids {
		out[i] = gotID{ns, id, origin}
	}
	return out, nil
}

var simple = pgx.QueryExecModeSimpleProtocol

// pipelinedBatch sends fast-path, rewritten and plain statements in one pipeline: the
// answers must come back in order, each to its own statement.
func pipelinedBatch(ctx context.Context, c *pgx.Conn, client string) ([]gotID, error) {
	b := &pgx.Batch{}
	b.Queue("SELECT leaf_next('" + segA + "')")
	b.Queue("INSERT INTO orders (item, client) VALUES ($1, $2) RETURNING id", "batch", client)
	b.Queue("SELECT 4242::bigint")
	b.Queue("SELECT leaf_next('" + snowOrder + "')")
	br := c.SendBatch(ctx, b)
	var seg, order, plain, snow int64
	for _, dst := range []*int64{&seg, &order, &plain, &snow} {
		if err := br.QueryRow().Scan(dst); err != nil {
			br.Close()
			return nil, err
		}
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	if plain != 4242 {
		return nil, fmt.Errorf("wrong data: the pipeline's plain SELECT answered %d, want 4242", plain)
	}
	return []gotID{{segA, seg, originLeafNext}, {snowflakeNamespace, order, originOrderInsert}, {snowflakeNamespace, snow, originLeafNext}}, nil
}

// transaction fills an INSERT and asks for an ID (the fast path, inside a transaction
// block) and commits or rolls back. A rolled-back ID is spent: it must never come again.
func transaction(ctx context.Context, c *pgx.Conn, client string, commit bool) ([]gotID, error) {
	tx, err := c.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.Background())
	var order, seg int64
	if err := tx.QueryRow(ctx, "INSERT INTO orders (item, client) VALUES ('tx', $1) RETURNING id", client).Scan(&order); err != nil {
		return nil, err
	}
	if err := tx.QueryRow(ctx, "SELECT leaf_next('"+segB+"')").Scan(&seg); err != nil {
		return nil, err
	}
	if !commit {
		if err := tx.Rollback(ctx); err != nil {
			return nil, err
		}
		return []gotID{{snowflakeNamespace, order, originRolledBack}, {segB, seg, originLeafNext}}, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return []gotID{{snowflakeNamespace, order, originOrderInsert}, {segB, seg, originLeafNext}}, nil
}

var loadOps = []loadOp{
	{name: "segment simple", weight: 3, run: func(ctx context.Context, c *pgx.Conn, _ string) ([]gotID, error) {
		return selectIDs(ctx, c, "SELECT leaf_next('"+segA+"')", []string{segA}, simple)
	}},
	{name: "segment extended", weight: 3, run: func(ctx context.Context, c *pgx.Conn, _ string) ([]gotID, error) {
		return selectIDs(ctx, c, "SELECT leaf_next('"+segB+"')", []string{segB})
	}},
	{name: "segment tag as parameter", weight: 1, run: func(ctx context.Context, c *pgx.Conn, _ string) ([]gotID, error) {
		return selectIDs(ctx, c, "SELECT leaf_next($1)", []string{segA}, segA)
	}},
	{name: "snowflake simple", weight: 3, run: func(ctx context.Context, c *pgx.Conn, _ string) ([]gotID, error) {
		return selectIDs(ctx, c, "SELECT leaf_next('"+snowOrder+"')", []string{snowflakeNamespace}, simple)
	}},
	{name: "snowflake extended", weight: 3, run: func(ctx context.Context, c *pgx.Conn, _ string) ([]gotID, error) {
		return selectIDs(ctx, c, "SELECT leaf_next('"+snowPay+"')", []string{snowflakeNamespace})
	}},
	{name: "two call sites", weight: 1, run: func(ctx context.Context, c *pgx.Conn, _ string) ([]gotID, error) {
		return selectIDs(ctx, c, "SELECT leaf_next('"+segB+"') AS a, leaf_next('"+snowOrder+"') AS b",
			[]string{segB, snowflakeNamespace})
	}},
	{name: "filled insert orders", weight: 3, rows: 1, origin: originOrderInsert, run: func(ctx context.Context, c *pgx.Conn, client string) ([]gotID, error) {
		return insertIDs(ctx, c, snowflakeNamespace, originOrderInsert, 1,
			"INSERT INTO orders (item, client) VALUES ($1, $2) RETURNING id", "book", client)
	}},
	{name: "pipelined batch", weight: 1, rows: 1, origin: originOrderInsert, run: pipelinedBatch},
	{name: "transaction commit", weight: 1, rows: 1, origin: originOrderInsert, run: func(ctx context.Context, c *pgx.Conn, client string) ([]gotID, error) {
		return transaction(ctx, c, client, true)
	}},
	{name: "transaction rollback", weight: 1, run: func(ctx context.Context, c *pgx.Conn, client string) ([]gotID, error) {
		return transaction(ctx, c, client, false)
	}},
	{name: "filled insert items", weight: 2, rows: 2, origin: originItemInsert, run: func(ctx context.Context, c *pgx.Conn, _ string) ([]gotID, error) {
		return insertIDs(ctx, c, segItem, originItemInsert, 2,
			"INSERT INTO items (note) VALUES ('a'), ('b') RETURNING id", simple)
	}},
}

// pickOp draws an op by weight.
func pickOp(r *rand.Rand) *loadOp {
	total := 0
	for i := range loadOps {
		total += loadOps[i].weight
	}
	n := r.IntN(total)
	for i := range loadOps {
		if n < loadOps[i].weight {
			return &loadOps[i]
		}
		n -= loadOps[i].weight
	}
	return &loadOps[0]
}

// isConnError reports whether err says the connection (to the proxy, or the proxy's to
// PostgreSQL) broke or could not be made: what a client of a crashed proxy or of a
// restarting database may see. Anything else under load is a real failure.
func isConnError(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03": // shutdown, crash, cannot connect now
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || pgconn.SafeToRetry(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed) || (errors.As(err, &netErr) && !netErr.Timeout()) ||
		strings.Contains(err.Error(), "conn closed")
}

// validateID rejects values no engine should produce: what "wrong data" would look like.
func validateID(g gotID, notBefore time.Time) error {
	if g.id <= 0 {
		return fmt.Errorf("wrong data: %s ID %d is not positive", g.ns, g.id)
	}
	if g.ns == snowflakeNamespace {
		at, _, _ := decodeSnowflake(g.id)
		if at.Before(notBefore.Add(-time.Second)) || at.After(time.Now().Add(2*time.Second)) {
			return fmt.Errorf("wrong data: snowflake ID %d decodes to %v, outside the test's run", g.id, at)
		}
	}
	return nil
}

// loadErr is one failed statement or connection attempt.
type loadErr struct {
	Proxy  string
	Client int
	Op     string
	At     time.Time
	Err    error
	Conn   bool // a connection error (see isConnError)
}

func (e loadErr) String() string {
	return fmt.Sprintf("%s client %d %s at %s: %v", e.Proxy, e.Client, e.Op, e.At.Format("15:04:05.000"), e.Err)
}

// Load drives clients against proxies, recording every ID in a Collector.
type Load struct {
	t       testing.TB
	coll    *Collector
	dbURL   string
	began   time.Time
	phase   atomic.Value // string
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	errs    []loadErr
	okByOp  map[string]int
	success map[string]*atomic.Int64 // proxy name → successful statements
}

// StartLoad starts clientsPer clients on every proxy. Each client owns one connection and
// reconnects after a connection error.
func StartLoad(t testing.TB, coll *Collector, dbURL string, proxies []*Proxy, clientsPer int) *Load {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &Load{t: t, coll: coll, dbURL: dbURL, began: time.Now(), cancel: cancel,
		okByOp: map[string]int{}, success: map[string]*atomic.Int64{}}
	l.phase.Store("before")
	for _, p := range proxies {
		l.success[p.Name] = new(atomic.Int64)
	}
	for _, p := range proxies {
		for i := 0; i < clientsPer; i++ {
			l.wg.Add(1)
			go l.client(ctx, p, i)
		}
	}
	t.Cleanup(l.Stop)
	return l
}

// SetPhase labels the IDs recorded from now on.
func (l *Load) SetPhase(s string) { l.phase.Store(s) }

// Phase is the current label.
func (l *Load) Phase() string { return l.phase.Load().(string) }

// Stop ends the clients and waits for them.
func (l *Load) Stop() {
	l.cancel()
	l.wg.Wait()
}

// Successes returns how many statements the clients of proxy completed.
func (l *Load) Successes(proxy string) int64 { return l.success[proxy].Load() }

// WaitSuccesses waits until the clients of proxy complete n more statements, and returns
// how long it took.
func (l *Load) WaitSuccesses(proxy string, n int64, timeout time.Duration) (time.Duration, error) {
	began := time.Now()
	start := l.Successes(proxy)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if l.Successes(proxy)-start >= n {
			return time.Since(began), nil
		}
		select {
		case <-deadline.C:
			return time.Since(began), fmt.Errorf("clients of %s completed %d statements in %v, want %d", proxy, l.Successes(proxy)-start, timeout, n)
		case <-tick.C:
		}
	}
}

// Errors returns every error recorded so far.
func (l *Load) Errors() []loadErr {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]loadErr(nil), l.errs...)
}

// OpCounts renders successful statements per op.
func (l *Load) OpCounts() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	names := make([]string, 0, len(l.okByOp))
	for n := range l.okByOp {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, " [%s]=%d", n, l.okByOp[n])
	}
	return b.String()
}

// Total is the number of successful statements.
func (l *Load) Total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.okByOp {
		n += c
	}
	return n
}

func (l *Load) fail(e loadErr) {
	l.mu.Lock()
	l.errs = append(l.errs, e)
	l.mu.Unlock()
}

func (l *Load) client(ctx context.Context, p *Proxy, n int) {
	defer l.wg.Done()
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(n)))
	name := fmt.Sprintf("%s/%d", p.Name, n)
	url := p.URL(l.dbURL, "postgres", "")
	var conn *pgx.Conn
	run := 0 // the proxy's run the connection reached
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	ok := map[string]int{}
	defer func() {
		l.mu.Lock()
		for k, v := range ok {
			l.okByOp[k] += v
		}
		l.mu.Unlock()
	}()
	for ctx.Err() == nil {
		if conn == nil || conn.IsClosed() {
			cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			c, err := pgx.Connect(cctx, url)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				l.fail(loadErr{p.Name, n, "connect", time.Now(), err, isConnError(err)})
				select { // retry pace while the proxy is down, not a wait for a condition
				case <-ctx.Done():
					return
				case <-time.After(50 * time.Millisecond):
				}
				continue
			}
			conn, run = c, p.Starts()
		}
		op := pickOp(r)
		// Stopping the load never cancels a statement: an INSERT cut off mid-flight
		// would leave a row whose ID nobody heard of.
		sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		got, err := op.run(sctx, conn, name)
		cancel()
		if err != nil {
			conn.Close(context.Background())
			conn = nil
			isConn := isConnError(err)
			if op.rows > 0 {
				l.coll.Uncertain(op.origin, op.rows)
			}
			l.fail(loadErr{p.Name, n, op.name, time.Now(), err, isConn})
			continue
		}
		phase := l.Phase()
		for _, g := range got {
			if verr := validateID(g, l.began); verr != nil {
				l.fail(loadErr{p.Name, n, op.name, time.Now(), verr, false})
			}
			l.coll.Add(IDRow{Namespace: g.ns, ID: g.id, Origin: g.origin, Proxy: p.Name, Run: run, Phase: phase})
		}
		ok[op.name]++
		l.success[p.Name].Add(1)
	}
}

// requireNoDuplicates fails the test for every duplicate the collector saw.
func requireNoDuplicates(t testing.TB, coll *Collector) {
	t.Helper()
	dups := coll.Duplicates()
	for i, d := range dups {
		if i == 20 {
			t.Errorf("… and %d more duplicates", len(dups)-20)
			break
		}
		t.Errorf("duplicate: %s", d)
	}
}

// reportErrors fails the test with the errors keep selects, at most 20 of them.
func reportErrors(t testing.TB, what string, errs []loadErr, keep func(loadErr) bool) int {
	t.Helper()
	n := 0
	for _, e := range errs {
		if !keep(e) {
			continue
		}
		n++
		if n <= 20 {
			t.Errorf("%s: %s", what, e)
		}
	}
	if n > 20 {
		t.Errorf("%s: … %d in all", what, n)
	}
	return n
}
