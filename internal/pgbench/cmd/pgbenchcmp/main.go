// Command pgbenchcmp measures throughput with pgbench and prints markdown tables of TPS
// and ratios to a baseline, for every protocol mode and client count:
//
//   - select-only: `pgbench -S` against the server directly, through leafproxy's proxy
//     (pass-through, started in process) and through PgBouncer in session mode, each hop
//     reaching the server over TCP;
//
//   - select-only-unix: the same with the proxy and PgBouncer reaching the server over
//     its Unix socket, as when they run on the database host;
//
//   - select-only-tls: the same with TLS on every leg: pgbench to the server, the proxy
//     or PgBouncer, and the hops to the server;
//
//   - next-id: SELECT leaf_next('bench') through a rewriting proxy whose IDs come from the
//     segment engine, against SELECT nextval('bench_seq') on the server;
//
//   - insert: an INSERT whose key the proxy fills, against one with a bigserial default;
//
//   - insert-durable: the same on a server with PostgreSQL's default durability
//     (fsync, synchronous_commit and full_page_writes on) instead of the test server's.
//
// For the proxy and PgBouncer, a column gives the CPU time the hop itself spent per
// transaction, a cost that does not depend on how many cores the machine has left it.
//
//	go run ./internal/pgbench/cmd/pgbenchcmp -url postgres://postgres@127.0.0.1:5432/postgres -T 10s -rounds 3
package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/pgbench"
	"github.com/leafproxy/leafproxy/internal/testenv"
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
	leaf := flag.Bool("leaf", true, "add the ID rows: leaf_next vs nextval, filled INSERT vs bigserial")
	noBouncer := flag.Bool("no-pgbouncer", false, "leave PgBouncer out")
	goroutines := flag.Bool("goroutine-relay", false, "add a select-only row for the proxy with an event loop turned off (a goroutine pair per session)")
	only := flag.String("groups", "", "comma-separated groups to run (select-only, select-only-unix, select-only-tls, next-id, insert, insert-durable); empty runs all")
	unixSocket := flag.Bool("unix", true, "add a select-only group in which the proxy and PgBouncer reach the server over its Unix socket")
	withTLS := flag.Bool("tls", true, "add a select-only group with TLS on every leg (the server must accept TLS)")
	durable := flag.Bool("durable", true, "add an insert group on a server with fsync, synchronous_commit and full_page_writes on (changed with ALTER SYSTEM for the group, then reset)")
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

	endpoints, stopHops, err := selectOnly(ctx, dbURL, "", nil, !*noBouncer, *goroutines)
	if err != nil {
		return err
	}
	defer stopHops()
	groups := []pgbench.Group{{Name: "select-only", Endpoints: endpoints}}
	if *unixSocket {
		dir, err := socketDir(ctx, dbURL)
		if err != nil {
			return err
		}
		unixEndpoints, stopUnix, err := selectOnly(ctx, dbURL, dir, nil, !*noBouncer, *goroutines)
		if err != nil {
			return err
		}
		defer stopUnix()
		groups = append(groups, pgbench.Group{Name: "select-only-unix", Endpoints: unixEndpoints})
	}
	if *withTLS {
		dir, err := os.MkdirTemp("", "leafproxy-bench-tls-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		certs, err := testenv.WriteCertificates(dir, "bench")
		if err != nil {
			return err
		}
		tlsEndpoints, stopTLS, err := selectOnly(ctx, dbURL, "", &pgbench.TLSFiles{CertFile: certs.CertFile, KeyFile: certs.KeyFile}, !*noBouncer, *goroutines)
		if err != nil {
			return err
		}
		defer stopTLS()
		groups = append(groups, pgbench.Group{Name: "select-only-tls", Endpoints: tlsEndpoints})
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
		groups[0].Endpoints = append(groups[0].Endpoints, pgbench.Endpoint{Name: "proxy rewriting", URL: leafURL, Args: []string{"-S"}, CPU: pgbench.SelfCPU})
	}
	if *leaf {
		groups = append(groups, leafGroups(dbURL, leafURL)...)
		if *durable {
			groups = append(groups, durableInsertGroup(*serverURL, dbURL, leafURL))
		}
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

// selectOnly starts the hops of a select-only group (the proxy and, with bouncer, PgBouncer)
// in front of the database of dbURL and returns the group's endpoints, the database
// itself first. A non-empty socketDir makes the hops reach the server through its Unix
// socket there. With tlsFiles every leg uses TLS: pgbench requires it, the hops offer
// that certificate and require TLS from the server.
func selectOnly(ctx context.Context, dbURL, socketDir string, tlsFiles *pgbench.TLSFiles, bouncer, goroutines bool) ([]pgbench.Endpoint, func(), error) {
	upstream := ""
	if socketDir != "" {
		port, err := serverPort(dbURL)
		if err != nil {
			return nil, nil, err
		}
		upstream = filepath.Join(socketDir, ".s.PGSQL."+port)
	}
	var certs []tls.Certificate
	if tlsFiles != nil {
		cert, err := tls.LoadX509KeyPair(tlsFiles.CertFile, tlsFiles.KeyFile)
		if err != nil {
			return nil, nil, err
		}
		certs = []tls.Certificate{cert}
	}
	hop := func(goroutines bool) func(s *proxy.Server) {
		return func(s *proxy.Server) {
			s.GoroutineRelay = goroutines
			if upstream != "" {
				s.Upstream = upstream
			}
			if certs != nil {
				s.TLSConfig = &tls.Config{Certificates: certs}
				s.UpstreamSSLMode = proxy.SSLRequire
			}
		}
	}
	clientURL := func(u string) string { return u }
	if tlsFiles != nil {
		clientURL = func(u string) string { return withSSLMode(u, "require") }
	}
	proxyURL, stopProxy, err := serveProxy(dbURL, hop(false))
	if err != nil {
		return nil, nil, err
	}
	endpoints := []pgbench.Endpoint{
		{Name: "direct", URL: clientURL(dbURL), Args: []string{"-S"}},
		{Name: "proxy", URL: clientURL(proxyURL), Args: []string{"-S"}, CPU: pgbench.SelfCPU},
	}
	if goroutines {
		url, stop, err := serveProxy(dbURL, hop(true))
		if err != nil {
			stopProxy()
			return nil, nil, err
		}
		prev := stopProxy
		stopProxy = func() { stop(); prev() }
		endpoints = append(endpoints, pgbench.Endpoint{Name: "proxy goroutines", URL: clientURL(url), Args: []string{"-S"}, CPU: pgbench.SelfCPU})
	}
	if !bouncer {
		return endpoints, stopProxy, nil
	}
	b, err := pgbench.StartPgBouncer(ctx, dbURL, socketDir, tlsFiles)
	if err != nil {
		stopProxy()
		return nil, nil, err
	}
	endpoints = append(endpoints, pgbench.Endpoint{Name: "pgbouncer", URL: clientURL(b.URL(dbURL)), Args: []string{"-S"}, CPU: b.CPU})
	return endpoints, func() { b.Close(); stopProxy() }, nil
}

// withSSLMode returns rawURL with its sslmode set.
func withSSLMode(rawURL, mode string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL
	}
	q := u.Query()
	q.Set("sslmode", mode)
	u.RawQuery = q.Encode()
	return u.String()
}

// socketDir asks the server for the first directory of its Unix socket.
func socketDir(ctx context.Context, dbURL string) (string, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var dirs string
	if err := conn.QueryRow(ctx, "SELECT current_setting('unix_socket_directories')").Scan(&dirs); err != nil {
		return "", err
	}
	dir := strings.TrimSpace(strings.Split(dirs, ",")[0])
	if dir == "" {
		return "", fmt.Errorf("the server listens on no Unix socket; run with -unix=false")
	}
	return dir, nil
}

// serverPort returns the port of dbURL's server.
func serverPort(dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", err
	}
	if p := u.Port(); p != "" {
		return p, nil
	}
	return "5432", nil
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
