package proxy

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// txPoolSize is the pool of the transaction-mode tests: far fewer server connections
// than clients.
const txPoolSize = 5

// inTransactionMode makes a test proxy pool server connections per transaction.
func inTransactionMode(s *Server) {
	s.PoolMode = PoolTransaction
	s.Pooling = pool.Settings{Limits: pool.Limits{PoolSize: txPoolSize, QueryWaitTimeout: 60 * time.Second}}
}

// backends counts the server connections of a database other than the observer's own;
// an autovacuum worker busy with the database is not one.
func backends(t testing.TB, observer *pgx.Conn, database string) int {
	t.Helper()
	var n int
	err := observer.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'", database).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTxPoolManyClients runs 50 pgx clients, statement cache on, over 5 server
// connections: transactions, prepared statements re-prepared on whichever connection
// runs them, batches, filled INSERTs and leaf_next in every query mode; the database
// never sees more than the pool's connections.
func TestTxPoolManyClients(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := rewritingProxy(t, db, inTransactionMode)
	setup := connect(t, db)
	ctx := testContext(t)
	if _, err := setup.Exec(ctx, "CREATE TABLE orders (id int8 PRIMARY KEY, item text NOT NULL, client int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	const clients = 50
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	stop := make(chan struct{})
	maxSeen := 0
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			maxSeen = max(maxSeen, backends(t, setup, dbName(t, db)))
		}
	}()
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- txClient(ctx, p.url(db), i, allModes[i%len(allModes)])
		}()
	}
	wg.Wait()
	close(stop)
	watch.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	stats := p.srv.PoolStats()
	if len(stats) != 1 || stats[0].Acquires < clients*10*3 {
		t.Fatalf("pool figures %+v: want one pool lent for every transaction", stats)
	}
	t.Logf("pool: %+v; at most %d server connections seen", stats[0], maxSeen)
	if maxSeen > txPoolSize {
		t.Fatalf("pg_stat_activity showed %d server connections, pool-size is %d", maxSeen, txPoolSize)
	}
	var rows, distinct int
	if err := setup.QueryRow(ctx, "SELECT count(*), count(DISTINCT id) FROM orders").Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != clients*10*3 || distinct != rows {
		t.Fatalf("%d rows, %d distinct IDs; want %d", rows, distinct, clients*10*3)
	}
}

// txClient is one client of TestTxPoolManyClients.
func txClient(ctx context.Context, connURL string, client int, mode pgx.QueryExecMode) error {
	cfg, err := pgx.ParseConfig(connURL)
	if err != nil {
		return err
	}
	cfg.DefaultQueryExecMode = mode
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("client %d: connect: %w", client, err)
	}
	defer conn.Close(context.Background())
	for round := range 10 {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return fmt.Errorf("client %d (%s): begin: %w", client, mode, err)
		}
		var id int64
		if err := tx.QueryRow(ctx, "INSERT INTO orders (item, client) VALUES ($1, $2) RETURNING id", "tx", client).Scan(&id); err != nil {
			return fmt.Errorf("client %d (%s): insert: %w", client, mode, err)
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM orders WHERE client = $1", client).Scan(&n); err != nil {
			return fmt.Errorf("client %d (%s): count: %w", client, mode, err)
		}
		if n != round*3+1 {
			return fmt.Errorf("client %d (%s): sees %d of its rows in its transaction, want %d", client, mode, n, round*3+1)
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("client %d (%s): commit: %w", client, mode, err)
		}
		// Outside a transaction: a statement is a transaction.
		if _, err := conn.Exec(ctx, "INSERT INTO orders (item, client) VALUES ($1, $2)", "single", client); err != nil {
			return fmt.Errorf("client %d (%s): insert: %w", client, mode, err)
		}
		if err := conn.QueryRow(ctx, "SELECT leaf_next('order')").Scan(&id); err != nil || id <= 0 {
			return fmt.Errorf("client %d (%s): leaf_next: %d, %v", client, mode, id, err)
		}
		batch := &pgx.Batch{}
		batch.Queue("INSERT INTO orders (item, client) VALUES ($1, $2) RETURNING id", "batch", client)
		batch.Queue("SELECT count(*) FROM orders WHERE client = $1", client)
		br := conn.SendBatch(ctx, batch)
		if err := br.QueryRow().Scan(&id); err != nil {
			return fmt.Errorf("client %d (%s): batch insert: %w", client, mode, err)
		}
		if err := br.QueryRow().Scan(&n); err != nil {
			return fmt.Errorf("client %d (%s): batch count: %w", client, mode, err)
		}
		if err := br.Close(); err != nil {
			return fmt.Errorf("client %d (%s): batch: %w", client, mode, err)
		}
	}
	return nil
}

// TestTxPoolPgxPool uses pgxpool, statement cache on, over the transaction pool.
func TestTxPoolPgxPool(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode)
	ctx := testContext(t)
	cfg, err := pgxpool.ParseConfig(p.url(db))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 20
	pp, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pp.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				var got int
				if err := pp.QueryRow(ctx, "SELECT $1::int + $2::int", i, j).Scan(&got); err != nil {
					errs <- err
					return
				}
				if got != i+j {
					errs <- fmt.Errorf("got %d, want %d", got, i+j)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
