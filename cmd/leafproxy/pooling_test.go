package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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

// TestPoolSettingsReloadOnSIGHUP: a changed pool-size applies to the running pools on
// SIGHUP.
func TestPoolSettingsReloadOnSIGHUP(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	file := filepath.Join(t.TempDir(), "leafproxy.yaml")
	write := func(size int) {
		t.Helper()
		text := fmt.Sprintf("pool-mode: transaction\nauth-type: trust\npool-size: %d\n", size)
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(3)
	s := startServe(t, nil, serveArgs(t, dsn, 14, "--config", file)...)
	waitReady(s)
	conn, err := pgx.Connect(ctx, proxyURL(t, dsn, s.listen))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	poolSize := func() int {
		_, body := s.get("/pools", "")
		var pools struct{ Pools []pool.Stats }
		if err := json.Unmarshal([]byte(body), &pools); err != nil || len(pools.Pools) != 1 {
			t.Fatalf("/pools: %v\n%s", err, body)
		}
		return pools.Pools[0].PoolSize
	}
	if n := poolSize(); n != 3 {
		t.Fatalf("pool_size %d, want 3", n)
	}
	write(1)
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	s.waitFor("the pool settings to be reloaded", func() bool {
		return strings.Contains(s.log.String(), "pool settings reloaded")
	})
	if n := poolSize(); n != 1 {
		t.Fatalf("pool_size %d after the reload, want 1", n)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("a session across the reload: %v", err)
	}
}
