package pool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// pgConnector opens real PostgreSQL connections with pgconn, all under one
// application_name so that the test can count them in pg_stat_activity.
type pgConnector struct {
	url     string
	appName string
	resets  atomic.Int64
}

func (c *pgConnector) Dial(ctx context.Context, key Key) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(c.url)
	if err != nil {
		return nil, err
	}
	cfg.ConnectTimeout = 30 * time.Second
	cfg.RuntimeParams["application_name"] = c.appName
	return pgconn.ConnectConfig(ctx, cfg)
}

func (c *pgConnector) Reset(ctx context.Context, conn *pgconn.PgConn) error {
	c.resets.Add(1)
	_, err := conn.Exec(ctx, "DISCARD ALL").ReadAll()
	return err
}

func (c *pgConnector) Close(conn *pgconn.PgConn) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn.Close(ctx)
}

// exec runs one simple-protocol query and returns the first column of its first row
// ("" for NULL or no row).
func exec(ctx context.Context, conn *pgconn.PgConn, sql string) (string, error) {
	results, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return "", err
	}
	for _, r := range results {
		if r.Err != nil {
			return "", r.Err
		}
		if len(r.Rows) > 0 && len(r.Rows[0]) > 0 {
			return string(r.Rows[0][0]), nil
		}
	}
	return "", nil
}

// TestPostgresFiftyBorrowersOverFive runs 50 goroutines over a pool of 5 real server
// connections. pg_stat_activity, watched meanwhile, never shows more than 5 backends of
// the pool, and what one borrower SETs on its session never reaches the next one:
// session-mode borrowers give their connection back for a DISCARD ALL, transaction-mode
// borrowers use SET LOCAL and give it back clean.
func TestPostgresFiftyBorrowersOverFive(t *testing.T) {
	url := testenv.PostgresURL(t)
	const (
		poolSize  = 5
		borrowers = 50
		rounds    = 20
	)
	var suffix [4]byte
	rand.Read(suffix[:])
	connector := &pgConnector{url: url, appName: "leafpool_" + hex.EncodeToString(suffix[:])}
	p, err := New[*pgconn.PgConn](connector, Settings{Limits: Limits{PoolSize: poolSize, QueryWaitTimeout: 2 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	monitor, err := pgconn.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer monitor.Close(context.Background())
	countSQL := fmt.Sprintf("SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s'", connector.appName)
	var (
		maxSeen  atomic.Int64
		samples  atomic.Int64
		stopMon  = make(chan struct{})
		monDone  = make(chan error, 1)
		key      = Key{Database: "postgres", User: "postgres"}
		failures = make(chan error, borrowers)
		wg       sync.WaitGroup
	)
	go func() {
		for {
			select {
			case <-stopMon:
				monDone <- nil
				return
			default:
			}
			v, err := exec(ctx, monitor, countSQL)
			if err != nil {
				monDone <- err
				return
			}
			var n int64
			fmt.Sscan(v, &n)
			samples.Add(1)
			if n > maxSeen.Load() {
				maxSeen.Store(n)
			}
		}
	}()

	for g := range borrowers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				if err := borrowOnce(ctx, p, key, fmt.Sprintf("b%d_r%d", g, r), (g+r)%2 == 0); err != nil {
					failures <- fmt.Errorf("borrower %d round %d: %w", g, r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stopMon)
	if err := <-monDone; err != nil {
		t.Fatalf("pg_stat_activity: %v", err)
	}
	close(failures)
	for err := range failures {
		t.Error(err)
	}
	if n := maxSeen.Load(); n > poolSize || n == 0 {
		t.Errorf("pg_stat_activity showed at most %d backends of the pool over %d samples, want 1..%d", n, samples.Load(), poolSize)
	}
	st := p.Snapshot()[0]
	t.Logf("max backends seen %d over %d samples; stats %+v; resets %d", maxSeen.Load(), samples.Load(), st, connector.resets.Load())
	if st.Dials > poolSize || st.Acquires != borrowers*rounds || st.Transactions != borrowers*rounds {
		t.Errorf("stats = %+v", st)
	}
	if connector.resets.Load() == 0 {
		t.Error("no connection was reset")
	}

	shutdownCtx, cancelShutdown := context.WithTimeout(ctx, time.Minute)
	defer cancelShutdown()
	if err := p.Shutdown(shutdownCtx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, err := exec(ctx, monitor, countSQL)
		if err != nil {
			t.Fatal(err)
		}
		if v == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s backends of the pool left after Shutdown", v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// borrowOnce is one borrower's turn: it checks that nothing of the previous borrower is
// visible, leaves its own mark and gives the connection back.
func borrowOnce(ctx context.Context, p *Pool[*pgconn.PgConn], key Key, mark string, sessionMode bool) error {
	s, err := p.Acquire(ctx, key)
	if err != nil {
		return err
	}
	conn := s.Conn()
	seen, err := exec(ctx, conn, "SELECT current_setting('leaf.borrower', true)")
	if err != nil {
		s.Release(Broken)
		return err
	}
	if seen != "" {
		s.Release(Broken)
		return fmt.Errorf("borrower %s sees %q left by another borrower", mark, seen)
	}
	if sessionMode {
		// Session state, and a prepared statement: DISCARD ALL must remove both.
		_, err = exec(ctx, conn, "SET leaf.borrower = '"+mark+"'; PREPARE leaf_p AS SELECT 1; SELECT pg_sleep(0.001)")
	} else {
		_, err = exec(ctx, conn, "BEGIN; SET LOCAL leaf.borrower = '"+mark+"'; SELECT pg_sleep(0.001); COMMIT")
	}
	if err != nil {
		s.Release(Broken)
		return err
	}
	if conn.TxStatus() != 'I' {
		s.Release(Broken)
		return fmt.Errorf("connection left in transaction status %c", conn.TxStatus())
	}
	s.CountTransaction(1)
	if sessionMode {
		s.Release(NeedsReset)
	} else {
		s.Release(Clean)
	}
	return nil
}

// TestDownServerFailsBorrowersQuickly dials a port nobody listens on: the waiters learn
// of it from the failed dial, with 08001, not after query-wait-timeout.
func TestDownServerFailsBorrowersQuickly(t *testing.T) {
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	connector := &pgConnector{
		url:     fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		appName: "leafpool_down",
	}
	p, err := New[*pgconn.PgConn](connector, Settings{
		Limits: Limits{PoolSize: 2, QueryWaitTimeout: 5 * time.Minute},
		Log:    quietLog(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := p.Acquire(context.Background(), Key{Database: "postgres", User: "postgres"})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		var pe *Error
		if !errors.As(err, &pe) || !errors.Is(err, ErrServerDown) || pe.SQLState() != CodeServerDown {
			t.Fatalf("Acquire against a down server: %v, want ErrServerDown with 08001", err)
		}
	}
	if d := time.Since(start); d > time.Minute {
		t.Fatalf("borrowers learnt the server was down after %v", d)
	}
	if st := p.Snapshot()[0]; st.DialErrors == 0 || st.DialErrors > 5 {
		// Two dials at first (pool-size); borrowers that come after the first failure
		// fail without dialling during the 250 ms pause.
		t.Errorf("dial errors = %d for 10 borrowers over pool-size 2", st.DialErrors)
	}
}
