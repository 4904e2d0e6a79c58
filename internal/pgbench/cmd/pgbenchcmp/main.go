// Command pgbenchcmp measures throughput with pgbench and prints markdown tables of TPS
// and ratios to a baseline, for every protocol mode and client count:
//
//   - select-only: `pgbench -S` against the server directly, through leafproxy's proxy
//     (pass-through, started in process) and through PgBouncer in session mode;
//
//   - next-id: SELECT leaf_next('bench') through a rewriting proxy whose IDs come from the
//     segment engine, against SELECT nextval('bench_seq') on the server;
//
//   - insert: an INSERT whose key the proxy fills, against one with a bigserial default.
//
//     go run ./internal/pgbench/cmd/pgbenchcmp -url postgres://postgres@127.0.0.1:5432/postgres -T 10s -rounds 3
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/pgbench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pgbenchcmp:", err)
		os.Exit(1)
	}
}

func run() error {
	serverURL := flag.String("url", os.Getenv("LEAF_TEST_PG"), "PostgreSQL superuser URL (default $LEAF_TEST_PG)")
	duration := flag.Duration("T", 10*time.Second, "duration of each pgbench run")
	clientList := flag.String("c", "1,8", "comma-separated client counts")
	modeList := flag.String("M", strings.Join(pgbench.Modes, ","), "comma-separated protocol modes")
	scale := flag.Int("s", 10, "pgbench scale factor of the test database")
	rounds := flag.Int("rounds", 3, "runs per row, endpoints interleaved; the median is reported")
	leaf := flag.Bool("leaf", true, "add the ID rows: leaf_next vs nextval, filled INSERT vs bigserial")
	noBouncer := flag.Bool("no-pgbouncer", false, "leave PgBouncer out")
	only := flag.String("groups", "", "comma-separated groups to run (select-only, next-id, insert); empty runs all")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (the proxy's relay) to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *serverURL == "" {
		return fmt.Errorf("no server: pass -url or set LEAF_TEST_PG")
	}
	var clients []int
	for _, s := range strings.Split(*clientList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("bad client count %q", s)
		}
		clients = append(clients, n)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	dbURL, drop, err := createDatabase(ctx, *serverURL)
	if err != nil {
		return err
	}
	defer drop()
	fmt.Fprintf(os.Stderr, "initialising pgbench tables (scale %d)\n", *scale)
	if out, err := exec.CommandContext(ctx, "pgbench", "-i", "-q", "-s", strconv.Itoa(*scale), dbURL).CombinedOutput(); err != nil {
		return fmt.Errorf("pgbench -i: %w\n%s", err, out)
	}

	proxyURL, stopProxy, err := serveProxy(dbURL, nil)
	if err != nil {
		return err
	}
	defer stopProxy()
	endpoints := []pgbench.Endpoint{
		{Name: "direct", URL: dbURL, Args: []string{"-S"}},
		{Name: "proxy", URL: proxyURL, Args: []string{"-S"}},
	}
	if !*noBouncer {
		bouncer, err := pgbench.StartPgBouncer(ctx, dbURL)
		if err != nil {
			return err
		}
		defer bouncer.Close()
		endpoints = append(endpoints, pgbench.Endpoint{Name: "pgbouncer", URL: bouncer.URL(dbURL), Args: []string{"-S"}})
	}
	var leafURL string
	if *leaf {
		u, stopLeaf, err := leafSetup(ctx, dbURL)
		if err != nil {
			return err
		}
		defer stopLeaf()
		leafURL = u
		// The proxy as leafproxy serve runs it, rewriter on, on traffic it does not rewrite.
		endpoints = append(endpoints, pgbench.Endpoint{Name: "proxy rewriting", URL: leafURL, Args: []string{"-S"}})
	}
	groups := []pgbench.Group{{Name: "select-only", Endpoints: endpoints}}
	if *leaf {
		groups = append(groups, leafGroups(dbURL, leafURL)...)
	}
	if *only != "" {
		groups = selectGroups(groups, strings.Split(*only, ","))
	}
	results, err := pgbench.Run(ctx, pgbench.Config{
		Duration: *duration,
		Clients:  clients,
		Modes:    strings.Split(*modeList, ","),
		Rounds:   *rounds,
		Log:      func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) },
	}, groups)
	fmt.Print(pgbench.Table(groups, results))
	return err
}

// selectGroups keeps the groups whose names are listed.
func selectGroups(groups []pgbench.Group, names []string) []pgbench.Group {
	var kept []pgbench.Group
	for _, g := range groups {
		for _, n := range names {
			if strings.TrimSpace(n) == g.Name {
				kept = append(kept, g)
				break
			}
		}
	}
	return kept
}

// createDatabase creates a scratch database and returns its URL and a function dropping it.
func createDatabase(ctx context.Context, serverURL string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return "", nil, err
	}
	defer conn.Close(ctx)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "leafbench_" + hex.EncodeToString(b)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", nil, err
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, serverURL)
		if err != nil {
			fmt.Fprintln(os.Stderr, "drop database:", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			fmt.Fprintln(os.Stderr, "drop database:", err)
		}
	}
	return u.String(), drop, nil
}
