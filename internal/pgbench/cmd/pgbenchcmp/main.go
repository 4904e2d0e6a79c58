// Command pgbenchcmp measures pass-through throughput: it starts leafproxy's proxy in
// process and a PgBouncer in session mode in front of one PostgreSQL server, and runs
// `pgbench -S` (select-only) against the server directly, through the proxy and through
// PgBouncer, in every protocol mode, printing a markdown table of TPS and ratios to direct.
//
//	go run ./internal/pgbench/cmd/pgbenchcmp -url postgres://postgres@127.0.0.1:5432/postgres -T 10s -rounds 3
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/internal/pgbench"
	"github.com/leafproxy/leafproxy/proxy"
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
	noBouncer := flag.Bool("no-pgbouncer", false, "leave PgBouncer out")
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
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

	proxyURL, stopProxy, err := startProxy(dbURL)
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
	groups := []pgbench.Group{{Name: "select-only", Endpoints: endpoints}}
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

// startProxy serves the proxy on a loopback port in front of the server of dbURL.
func startProxy(dbURL string) (string, func(), error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", nil, err
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	srv := &proxy.Server{Upstream: u.Host, UpstreamSSLMode: proxy.SSLDisable, Logger: log}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	go srv.Serve(l)
	u.Host = l.Addr().String()
	return u.String(), func() { srv.Close() }, nil
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
