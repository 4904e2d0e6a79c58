// Command pgbenchcmp measures throughput with pgbench and prints markdown tables of TPS
// and ratios to a baseline, for every protocol mode and client count:
//
//   - select-only: `pgbench -S` against the server directly, through the leafproxy binary
//     started as the README's production example starts it (`leafproxy serve` with a
//     store, snowflake tags and fill rules) plus `--auth-type trust`, as PgBouncer
//     authenticates, so that both keep their server connections from one run to the
//     next; the same binary relaying the login (the production example as it is, a
//     backend per session: -passthrough); PgBouncer in session mode; and
//     through a bare relay (a proxy.Server in this process with no rewriter, no ID source
//     and no metrics: a lower bound, not what users run), each hop reaching the server
//     over TCP;
//
//   - select-only-unix: the same with the hops reaching the server over its Unix socket,
//     as when they run on the database host;
//
//   - select-only-tls: the same with TLS on every leg: pgbench to the server or the hop,
//     and the hops to the server;
//
//   - connect: `pgbench -C -S`, one client, a new connection per transaction, over TCP:
//     the CPU per transaction is the cost of a connection, PostgreSQL's own (the
//     postmaster and its ended backends) beside the hops'; and the same through
//     leafproxy and PgBouncer in transaction mode, each authenticating clients itself
//     (md5, and SCRAM for a user with a SCRAM secret), where no backend starts;
//
//   - tx-logins: `pgbench -C -c 200 -t 5 -S` (-tx-clients) through leafproxy and PgBouncer
//     in transaction mode with md5 at the hop: 200 clients at once, each logging in for
//     every one of its transactions, so that the CPU per transaction is the cost of a
//     login in a crowd;
//
//   - tx-pool: `pgbench -S` with 200 clients (-tx-clients) against the server directly (a
//     backend per client), through leafproxy in transaction mode with a pool of 20 server
//     connections (-pool-size) and SCRAM authentication at the proxy from an auth-file,
//     and through PgBouncer in transaction mode with the same pool size and
//     authentication; PgBouncer's prepared row says it cannot run it;
//
//   - next-id: SELECT leaf_next('bench') through leafproxy (segment engine), against
//     SELECT nextval('bench_seq') on the server;
//
//   - insert: an INSERT whose key leafproxy fills, against one with a bigserial default;
//
//   - insert-durable: the same on a server with PostgreSQL's default durability
//     (fsync, synchronous_commit and full_page_writes on) instead of the test server's.
//
// -other-bin adds to the select-only and tx-pool groups (and a session-mode login row to
// the connect group) a second leafproxy binary started
// the same way, run interleaved with this module's build: an A/B comparison of two builds, with
// -direct=false and -bare=false leaving out the columns such a comparison does not need.
//
// For every hop a column gives the CPU time the hop's process spent per transaction
// (/proc/PID/stat read before and after each pgbench run, divided by the transactions
// pgbench reports; for the bare relay, this process's own), a cost that does not depend
// on how many cores the machine has left it.
//
//	go run ./internal/pgbench/cmd/pgbenchcmp -url postgres://postgres@127.0.0.1:5432/postgres -T 10s -rounds 3
package main

import (
	"cmp"
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
	"slices"
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
	passthrough := flag.Bool("passthrough", true, "add a select-only column for leafproxy as the production example runs it, relaying the login, so that each session opens a backend (the leafproxy column authenticates with trust at the proxy, as PgBouncer does, and reuses server connections)")
	goroutines := flag.Bool("goroutine-relay", false, "add a select-only column for leafproxy with its event loops turned off (a goroutine pair per session)")
	otherBin := flag.String("other-bin", "", "add a select-only and a tx-pool column, and a session-mode login row to the connect group, for another leafproxy binary started the same way, run interleaved with this module's build: an A/B comparison of two builds")
	bare := flag.Bool("bare", true, "add the select-only column of the bare relay")
	direct := flag.Bool("direct", true, "add the select-only column of the server itself (without it, leafproxy is the baseline of the ratios)")
	only := flag.String("groups", "", "comma-separated groups to run (select-only, select-only-unix, select-only-tls, connect, tx-logins, tx-pool, next-id, next-batch, insert, insert-durable); empty runs all")
	unixSocket := flag.Bool("unix", true, "add a select-only group in which the proxy and PgBouncer reach the server over its Unix socket")
	withTLS := flag.Bool("tls", true, "add a select-only group with TLS on every leg (the server must accept TLS)")
	durable := flag.Bool("durable", true, "add an insert group on a server with fsync, synchronous_commit and full_page_writes on (changed with ALTER SYSTEM for the group, then reset)")
	connect := flag.Bool("connect", true, "add a connect group: pgbench -C -S, one client, a new connection per transaction, with PostgreSQL's CPU per connection (the postmaster and its ended backends) beside the proxy's and PgBouncer's")
	txPool := flag.Bool("tx-pool", true, "add a tx-pool group: pgbench -S with -tx-clients clients direct, through leafproxy in transaction mode and through PgBouncer in transaction mode, both with pools of -pool-size server connections")
	txClients := flag.Int("tx-clients", 200, "clients of the tx-pool and tx-logins groups")
	txLogins := flag.Bool("tx-logins", true, "add a tx-logins group: pgbench -C -c -tx-clients -t 5 -S through leafproxy and PgBouncer in transaction mode, md5 at the hop, every client logging in for each of its transactions")
	poolSize := flag.Int("pool-size", 20, "server connections of the tx-pool group's pools")
	txDuration := flag.Duration("tx-T", 0, "duration of each tx-pool run (default: -T, at least 10s, as pgbench opens its connections within the run and 200 new backends take seconds on a loaded machine)")
	pprofDir := flag.String("pprof-dir", "", "write a CPU profile of leafproxy over each of its tx-pool, tx-logins and connect runs with auth at the proxy to this directory, named after the endpoint and the run (the profiling adds a little to its CPU figures)")
	userCPU := flag.Bool("user-cpu", false, "the CPU columns of the select-only and tx-pool groups count the hops' user time only (utime), steadier than the total for changes to a hop's own code; the bare relay's stays its total")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of this process (the bare relay) to this file")
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

	if err := prepareLeaf(ctx, dbURL); err != nil {
		return err
	}
	binDir, err := os.MkdirTemp("", "leafproxy-bench-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(binDir)
	fmt.Fprintln(os.Stderr, "building leafproxy")
	bin, err := pgbench.BuildLeafproxy(ctx, binDir)
	if err != nil {
		return err
	}
	h := hops{bin: bin, otherBin: *otherBin, dbURL: dbURL, bouncer: !*noBouncer, goroutines: *goroutines, passthrough: *passthrough, bare: *bare, direct: *direct, userCPU: *userCPU}

	tcp, err := h.selectOnly(ctx, "select-only", "", nil)
	if err != nil {
		return err
	}
	defer tcp.stop()
	groups := []pgbench.Group{tcp.group}
	// want says whether a group is to run, so that hops of groups left out are not
	// started (the TCP select-only group always is: the ID groups use its leafproxy).
	want := func(name string) bool {
		return *only == "" || len(selectGroups([]pgbench.Group{{Name: name}}, strings.Split(*only, ","))) > 0
	}
	var txConnect *txConnectHops
	if (*connect && want("connect")) || (*txLogins && want("tx-logins")) {
		txConnect, err = startTxConnect(ctx, h, txConnectOptions{poolSize: *poolSize, clients: *txClients, pprofDir: *pprofDir})
		if err != nil {
			return err
		}
		defer txConnect.stop()
	}
	if *connect {
		g, stopConnect, err := connectGroup(ctx, h, dbURL, tcp.group)
		if err != nil {
			return err
		}
		defer stopConnect()
		if txConnect != nil {
			g.Endpoints = append(g.Endpoints, txConnect.connect...)
		}
		groups = append(groups, g)
	}
	if *txLogins && txConnect != nil {
		groups = append(groups, txConnect.logins)
	}
	if *unixSocket && want("select-only-unix") {
		dir, err := socketDir(ctx, dbURL)
		if err != nil {
			return err
		}
		unix, err := h.selectOnly(ctx, "select-only-unix", dir, nil)
		if err != nil {
			return err
		}
		defer unix.stop()
		groups = append(groups, unix.group)
	}
	if *withTLS && want("select-only-tls") {
		dir, err := os.MkdirTemp("", "leafproxy-bench-tls-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		certs, err := testenv.WriteCertificates(dir, "bench")
		if err != nil {
			return err
		}
		tlsHops, err := h.selectOnly(ctx, "select-only-tls", "", &pgbench.TLSFiles{CertFile: certs.CertFile, KeyFile: certs.KeyFile})
		if err != nil {
			return err
		}
		defer tlsHops.stop()
		groups = append(groups, tlsHops.group)
	}
	if *txPool && want("tx-pool") {
		g, stopTx, err := txPoolGroup(ctx, h, txPoolOptions{clients: *txClients, poolSize: *poolSize, pprofDir: *pprofDir, duration: cmp.Or(*txDuration, max(*duration, 10*time.Second))})
		defer stopTx()
		if err != nil {
			return err
		}
		groups = append(groups, g)
	}
	if *leaf {
		groups = append(groups, leafGroups(dbURL, tcp.leafproxy)...)
		if *durable {
			groups = append(groups, durableInsertGroup(*serverURL, dbURL, tcp.leafproxy))
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
	if *userCPU {
		fmt.Println("CPU columns of the select-only and tx-pool groups: user time only.")
	}
	fmt.Print(pgbench.Table(groups, results))
	return err
}

// hops starts what a select-only group compares: leafproxy, PgBouncer and the bare relay.
type hops struct {
	bin         string // the leafproxy binary
	dbURL       string
	bouncer     bool   // add PgBouncer
	goroutines  bool   // add leafproxy with its event loops off
	passthrough bool   // add leafproxy relaying the login (the production example as it is)
	otherBin    string // add leafproxy from this binary too (empty: none)
	bare        bool   // add the bare relay
	direct      bool   // add the server itself
	userCPU     bool   // the select-only and tx-pool CPU meters count user time only
}

// cpuMeters is a hop's process, which leafproxy's and PgBouncer's both are.
type cpuMeters interface {
	CPU() (time.Duration, error)
	UserCPU() (time.Duration, error)
}

// meter is the CPU meter of a hop of the select-only and tx-pool groups: its total CPU
// time, or its user time with -user-cpu.
func (h hops) meter(p cpuMeters) func() (time.Duration, error) {
	if h.userCPU {
		return p.UserCPU
	}
	return p.CPU
}

// selectOnlyGroup is a started select-only group.
type selectOnlyGroup struct {
	group     pgbench.Group
	leafproxy pgbench.Endpoint // the leafproxy endpoint, for the ID workloads
	stop      func()
}

// selectOnly starts the hops of a select-only group in front of the database and returns
// the group, the database itself first, then leafproxy as the README's production
// example runs it, PgBouncer in session mode, and the bare relay (a proxy.Server in this
// process with no rewriter, no ID source and no metrics: a lower bound of the proxy's
// cost, not what users run). A non-empty socketDir makes the hops reach the server
// through its Unix socket there. With tlsFiles every leg uses TLS: pgbench requires it,
// the hops offer that certificate and require TLS from the server.
func (h hops) selectOnly(ctx context.Context, name, socketDir string, tlsFiles *pgbench.TLSFiles) (selectOnlyGroup, error) {
	g := selectOnlyGroup{group: pgbench.Group{Name: name}}
	var stops []func()
	g.stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	upstream, err := hostOf(h.dbURL)
	if err != nil {
		return g, err
	}
	if socketDir != "" {
		port, err := serverPort(h.dbURL)
		if err != nil {
			return g, err
		}
		upstream = filepath.Join(socketDir, ".s.PGSQL."+port)
	}
	clientURL := func(u string) string { return u }
	if tlsFiles != nil {
		clientURL = func(u string) string { return withSSLMode(u, "require") }
	}
	add := func(e pgbench.Endpoint) {
		e.URL = clientURL(e.URL)
		e.Args = []string{"-S"}
		g.group.Endpoints = append(g.group.Endpoints, e)
	}
	if h.direct {
		add(pgbench.Endpoint{Name: "direct", URL: h.dbURL})
	}

	// PgBouncer authenticates its clients (trust) and keeps its server connections from
	// one pgbench run to the next; the proxy gets the same arrangement, which turns its
	// session reuse on. Relaying the login instead, as the production example does, gives
	// every run's sessions new backends, which cost PostgreSQL more per transaction for
	// a while than PgBouncer's warm ones (the passthrough column shows it).
	production := productionArgs(h.dbURL, upstream, tlsFiles)
	args := append(slices.Clone(production), "--auth-type", "trust")
	lp, err := pgbench.StartLeafproxy(ctx, h.bin, args...)
	if err != nil {
		return g, err
	}
	stops = append(stops, func() { _ = lp.Close() })
	g.leafproxy = pgbench.Endpoint{Name: "leafproxy", URL: lp.URL(h.dbURL), CPU: h.meter(lp)}
	if h.bouncer {
		g.leafproxy.Rival = "pgbouncer"
	}
	add(g.leafproxy)
	// another adds a column for one more leafproxy, from bin with args.
	another := func(name, bin string, args ...string) error {
		l, err := pgbench.StartLeafproxy(ctx, bin, args...)
		if err != nil {
			g.stop()
			return err
		}
		stops = append(stops, func() { _ = l.Close() })
		add(pgbench.Endpoint{Name: name, URL: l.URL(h.dbURL), CPU: h.meter(l)})
		return nil
	}
	if h.passthrough {
		if err := another("leafproxy passthrough", h.bin, production...); err != nil {
			return g, err
		}
	}
	if h.goroutines {
		if err := another("leafproxy goroutines", h.bin, append(slices.Clone(args), "--event-loops", "-1")...); err != nil {
			return g, err
		}
	}
	if h.otherBin != "" {
		if err := another("leafproxy other", h.otherBin, args...); err != nil {
			return g, err
		}
	}
	if h.bouncer {
		b, err := pgbench.StartPgBouncer(ctx, h.dbURL, pgbench.BouncerOptions{SocketDir: socketDir, TLS: tlsFiles})
		if err != nil {
			g.stop()
			return g, err
		}
		stops = append(stops, func() { _ = b.Close() })
		add(pgbench.Endpoint{Name: "pgbouncer", URL: b.URL(h.dbURL), CPU: h.meter(b)})
	}
	if !h.bare {
		return g, nil
	}
	bareURL, stopBare, err := serveBareRelay(h.dbURL, upstream, tlsFiles)
	if err != nil {
		g.stop()
		return g, err
	}
	stops = append(stops, stopBare)
	add(pgbench.Endpoint{Name: "bare relay (lower bound)", URL: bareURL, CPU: pgbench.SelfCPU})
	return g, nil
}

// productionArgs are the serve arguments of the README's production example (a store,
// snowflake tags, fill rules, the default worker source) in front of upstream. The
// upstream leg is TLS exactly when the group's is: sslmode disable otherwise, so that
// the proxy is compared with a PgBouncer that talks plaintext to the server.
func productionArgs(dbURL, upstream string, tlsFiles *pgbench.TLSFiles) []string {
	args := []string{"--upstream", upstream, "--store", dbURL,
		"--snowflake-tags", snowflakeTags, "--fill", "orders.id=order", "--fill", benchFilled + ".id=" + benchTag}
	if tlsFiles == nil {
		return append(args, "--upstream-sslmode", "disable")
	}
	return append(args, "--upstream-sslmode", "require", "--tls-cert", tlsFiles.CertFile, "--tls-key", tlsFiles.KeyFile)
}

// serveBareRelay serves an in-process proxy.Server with nothing but the relay in front
// of upstream.
func serveBareRelay(dbURL, upstream string, tlsFiles *pgbench.TLSFiles) (string, func(), error) {
	var cfg *tls.Config
	if tlsFiles != nil {
		cert, err := tls.LoadX509KeyPair(tlsFiles.CertFile, tlsFiles.KeyFile)
		if err != nil {
			return "", nil, err
		}
		cfg = &tls.Config{Certificates: []tls.Certificate{cert}}
	}
	return serveProxy(dbURL, func(s *proxy.Server) {
		s.Upstream = upstream
		if cfg != nil {
			s.TLSConfig = cfg
			s.UpstreamSSLMode = proxy.SSLRequire
		}
	})
}

// hostOf returns the host:port of rawURL.
func hostOf(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	return u.Host, nil
}

// connectGroup is pgbench -C -S with one client in simple mode against the endpoints of
// the TCP select-only group (the bare relay left out): every transaction opens a new
// connection, so the CPU per transaction is the cost of a connection. Direct, the meter
// is the postmaster with its ended children: what PostgreSQL spends starting, serving
// and ending a backend. Two endpoints are added for the upstream TLS that users get by
// default: leafproxy as the README's production example runs it, upstream-sslmode left
// at prefer (so TLS to a server that offers it), and PostgreSQL's own figure with TLS
// (pgbench with sslmode=require, direct), the backend's side of that handshake.
func connectGroup(ctx context.Context, h hops, dbURL string, tcp pgbench.Group) (pgbench.Group, func(), error) {
	pid, err := postmasterPID(ctx, dbURL)
	if err != nil {
		return pgbench.Group{}, nil, err
	}
	upstream, err := hostOf(dbURL)
	if err != nil {
		return pgbench.Group{}, nil, err
	}
	g := pgbench.Group{Name: "connect", Clients: []int{1}, Modes: []string{"simple"}}
	for _, e := range tcp.Endpoints {
		switch {
		case e.Name == "direct":
			e.CPU = pgbench.ProcessTreeCPU(pid)
		case strings.HasPrefix(e.Name, "bare relay"):
			continue
		}
		e.Args = []string{"-C", "-S"}
		g.Endpoints = append(g.Endpoints, e)
	}
	// The last --upstream-sslmode given wins.
	lp, err := pgbench.StartLeafproxy(ctx, h.bin, append(productionArgs(h.dbURL, upstream, nil), "--upstream-sslmode", "prefer")...)
	if err != nil {
		return pgbench.Group{}, nil, err
	}
	g.Endpoints = append(g.Endpoints,
		pgbench.Endpoint{Name: "leafproxy upstream TLS (prefer)", URL: lp.URL(h.dbURL), CPU: lp.CPU, Args: []string{"-C", "-S"}},
		pgbench.Endpoint{Name: "direct TLS", URL: withSSLMode(dbURL, "require"), CPU: pgbench.ProcessTreeCPU(pid), Args: []string{"-C", "-S"}})
	return g, func() { _ = lp.Close() }, nil
}

// postmasterPID reads the process ID of the server's postmaster from postmaster.pid in
// its data directory.
func postmasterPID(ctx context.Context, dbURL string) (int, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var dir string
	if err := conn.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dir); err != nil {
		return 0, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(first))
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
