package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/proxy/pool"
)

// TestTransactionPoolWiring: serve --pool-mode transaction lends 20 clients 3 server
// connections, and /pools and /metrics show the pool.
func TestTransactionPoolWiring(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := startServe(t, nil, serveArgs(t, dsn, 13, "--pool-mode", "transaction", "--pool-size", "3", "--auth-type", "trust")...)
	waitReady(s)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, proxyURL(t, dsn, s.listen))
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(context.Background())
			for j := range 5 {
				var got int
				if err := conn.QueryRow(ctx, "SELECT $1::int * 2", i+j).Scan(&got); err != nil || got != 2*(i+j) {
					errs <- fmt.Errorf("got %d, %v", got, err)
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
	code, body := s.get("/pools", "")
	var pools struct{ Pools []pool.Stats }
	if err := json.Unmarshal([]byte(body), &pools); code != 200 || err != nil || len(pools.Pools) == 0 {
		t.Fatalf("/pools: %d %v\n%s", code, err, body)
	}
	st := pools.Pools[0]
	if st.PoolSize != 3 || st.Acquires < 100 || st.Dials > 3 {
		t.Fatalf("/pools: %+v; want pool-size 3, every transaction lent, at most 3 dials", st)
	}
	_, body = s.get("/metrics", "")
	series := fmt.Sprintf(`leafproxy_pool_size{database=%q,user=%q}`, st.Database, st.User)
	if v := metricValue(t, body, series); v != 3 {
		t.Fatalf("%s = %v, want 3", series, v)
	}
}
