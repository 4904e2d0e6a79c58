package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/segment"
	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/health"
	"github.com/leafproxy/leafproxy/internal/httpapi"
	"github.com/leafproxy/leafproxy/internal/metrics"
	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/migrations"
	"github.com/leafproxy/leafproxy/proxy"
	"github.com/leafproxy/leafproxy/rewrite"
)

const serveSynopsis = `serve [--config FILE] [flags]

Runs the PostgreSQL proxy, the segment and snowflake ID engines, and the admin HTTP server.
Every setting can come from the YAML file (key = flag name), from LEAFPROXY_<NAME>
(upper case, '-' → '_'), or from a flag; a flag wins over the environment, which wins over
the file. SIGTERM or SIGINT shuts down gracefully: the proxy stops accepting and lets
sessions finish for up to shutdown-timeout, and the segment engine gives unused IDs back.
SIGHUP reads the fill rules of the store (leaf_fill) at once, as every fill-refresh does, and
reads the configuration again to apply its databases and upstream to new sessions.`

func serveCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", serveSynopsis, stderr)
	flags := config.RegisterFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("serve: unexpected arguments %q", fs.Args())
	}
	cfg, err := config.Load(flags, os.LookupEnv)
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("configuration:\n%w", err)}
	}
	log := newLogger(cfg, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	a := &app{cfg: cfg, log: log, started: time.Now()}
	a.dbs.load = reloadFrom(flags)
	if err := a.run(ctx); err != nil {
		err = withSchemaHint(startError(err, cfg))
		// Said once, in the configured log format, so JSON log pipelines see why we exited.
		log.WithError(err).Error("leafproxy stopped")
		return &exitError{code: 1, err: err, printed: true}
	}
	log.Info("leafproxy stopped")
	return nil
}

// withSchemaHint adds what to do when the store lacks the Leaf tables.
func withSchemaHint(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == sqlstate.UndefinedTable {
		return fmt.Errorf("%w (the store has no Leaf schema: run `leafproxy migrate up --dsn URL`, or set migrate-on-start)", err)
	}
	return err
}

func newLogger(cfg *config.Config, w io.Writer) *logrus.Logger {
	log := logrus.New()
	log.SetOutput(w)
	level, _ := logrus.ParseLevel(cfg.LogLevel) // validated by config
	log.SetLevel(level)
	if cfg.LogFormat == "json" {
		log.SetFormatter(&logrus.JSONFormatter{})
	} else {
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, DisableColors: true})
	}
	return log
}

// newTestClock is set only in binaries built with -tags leafproxy_testclock (see
// testclock.go): it returns a clock for the snowflake engine and the worker sources, and
// admin handlers that move it.
var newTestClock func() (snowflake.Clock, func() time.Time, map[string]http.Handler, error)

// app is one running `leafproxy serve`.
type app struct {
	cfg     *config.Config
	log     *logrus.Logger
	started time.Time

	pool      *pgxpool.Pool
	metrics   *metrics.Metrics
	rates     *metrics.RateMeter
	runway    *metrics.Runway // runway figures, read from the store in the background
	segment   *segment.Engine
	segReady  atomic.Bool // the segment engine's Start returned
	stopping  atomic.Bool // shutdown began: /readyz fails so load balancers drain us
	serving   atomic.Bool // the proxy serves its listener, with its rules loaded
	snowflake *snowflake.Engine
	segGen    idgen.Generator // segment, counted by the metrics
	snowGen   idgen.Generator // snowflake, counted by the metrics
	router    *idgen.Router
	clock     snowflake.Clock  // nil: the system clock
	now       func() time.Time // the clock of the worker sources (the engine's); nil: time.Now
	debug     map[string]http.Handler
	proxy     *proxy.Server
	pools     poolFigures // the figures of proxy's pools (transaction mode)
	http      *http.Server
	catalog   *catalog // columns of the filled tables; nil without fill rules

	upstreamProbe *health.Probe
	storeProbe    *health.Probe
	history       *metrics.History
	events        leaseEvents

	fill fillRules // the fill rules in use, config and store merged

	dbs databaseRoutes // the databases routed to, reloaded on SIGHUP

	mu        sync.Mutex
	conflicts []string             // tags both in snowflake-tags and leaf_alloc
	lease     *httpapi.LeaseStatus // the lease row as last read
	rewriter  *rewrite.Rewriter    // the proxy's, told when the catalog changes
}

// run starts leafproxy and serves until ctx ends, then shuts down gracefully. Its start-up
// steps, in order: catch SIGHUP; bind the proxy's and the admin server's sockets
// (listen); apply the migrations (migrateOnStart); connect to the store (connectStore);
// set up metrics and health probes (observe); build the ID engines (buildEngines); start
// the admin server (serveHTTP) and the background work (startBackground); start the
// snowflake engine (startSnowflake) and the segment engine (startSegment); configure the
// proxy (newProxy) and its rule watchers; serve clients (serve).
func (a *app) run(ctx context.Context) error {
	// Caught from the start: SIGHUP's default action would end the process.
	hup, stopHup := notifyHangup()
	defer stopHup()
	a.log.WithFields(logrus.Fields{"version": buildVersion(), "listen": a.cfg.Listen, "upstream": a.cfg.Upstream,
		"http": a.cfg.HTTP, "worker_source": a.cfg.WorkerSource}).Info("starting leafproxy")

	proxyLn, httpLn, err := a.listen()
	if err != nil {
		return err
	}
	defer proxyLn.Close()
	if httpLn != nil {
		defer httpLn.Close()
	}
	if err := a.migrateOnStart(); err != nil {
		return err
	}
	if err := a.connectStore(ctx); err != nil {
		return err
	}
	defer a.pool.Close()
	if err := a.observe(); err != nil {
		return err
	}
	if err := a.buildEngines(); err != nil {
		return err
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	// Deferred after wg.Wait, so it runs before it: ends the helper goroutines on any return.
	ctx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	// The admin server comes up first, so that /healthz answers and /readyz says what the
	// engines are waiting for while they start.
	if httpLn != nil {
		a.serveHTTP(httpLn, &wg)
		defer a.shutdownHTTP()
	}
	a.startBackground(ctx, &wg)
	if err := a.startSnowflake(ctx); err != nil {
		return err
	}
	defer a.closeEngine("snowflake", a.snowflake.Close)
	a.startSegment(ctx, &wg)
	defer a.closeEngine("segment", a.segment.Close)

	if a.proxy, err = a.newProxy(); err != nil {
		return err
	}
	wg.Go(func() { a.refreshCatalog(ctx, catalogRefresh) })
	wg.Go(func() { a.watchFill(ctx, hup) })
	return a.serve(ctx, proxyLn)
}

// listen binds the proxy's socket and, when http is set, the admin server's, before
// anything else, so that a taken port fails the start at once. httpLn is nil without http.
func (a *app) listen() (proxyLn, httpLn net.Listener, err error) {
	cfg := a.cfg
	if proxyLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, nil, fmt.Errorf("listen: %w", err)
	}
	if cfg.HTTP == "" {
		return proxyLn, nil, nil
	}
	if httpLn, err = net.Listen("tcp", cfg.HTTP); err != nil {
		proxyLn.Close()
		return nil, nil, fmt.Errorf("http: %w", err)
	}
	if !isLoopback(httpLn.Addr()) && cfg.HTTPToken == "" {
		a.log.WithField("http", httpLn.Addr().String()).Warn("the admin HTTP server is reachable from other hosts and has no http-token: anyone who reaches it can take IDs and read internals")
	}
	return proxyLn, httpLn, nil
}

// migrateOnStart applies the embedded migrations to the store when migrate-on-start is set.
func (a *app) migrateOnStart() error {
	if !a.cfg.MigrateOnStart {
		return nil
	}
	if err := migrations.Up(a.cfg.Store); err != nil {
		return fmt.Errorf("migrate-on-start: %w", err)
	}
	a.log.Info("migrations applied")
	return nil
}

// connectStore opens the pool of connections to the store, which the segment engine, the
// worker lease, the probes and the fill rules share.
func (a *app) connectStore(ctx context.Context) error {
	poolCfg, err := pgxpool.ParseConfig(a.cfg.Store)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	poolCfg.MaxConns = 8
	poolCfg.ConnConfig.ConnectTimeout = 5 * time.Second
	poolCfg.ConnConfig.RuntimeParams["application_name"] = "leafproxy"
	if a.pool, err = pgxpool.NewWithConfig(ctx, poolCfg); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// observe sets up what watches the proxy: the test clock of a test build, the profiler,
// metrics, rates, history and the health probes.
func (a *app) observe() error {
	if newTestClock != nil {
		var err error
		if a.clock, a.now, a.debug, err = newTestClock(); err != nil {
			return err
		}
		a.log.Warn("test build: the snowflake clock can be moved through POST /debug/clock")
	}
	if a.cfg.HTTPPprof {
		a.debug = withPprof(a.debug)
	}
	a.metrics = metrics.New(buildVersion(), a.bufferLevels)
	a.rates = a.metrics.NewRateMeter(10 * time.Second)
	a.history = metrics.NewHistory(historySamples)
	a.newProbes()
	return nil
}

// buildEngines builds the segment and snowflake engines (not started yet), the router
// between them and the runway figures.
func (a *app) buildEngines() error {
	cfg := a.cfg
	var err error
	if a.segment, err = segment.New(segment.Settings{
		Store:            segment.NewPostgresStore(a.pool),
		PreloadThreshold: cfg.SegmentPreload,
		Logger:           a.log,
		Hooks: segment.Hooks{
			OnLoad:        a.metrics.SegmentLoad,
			OnUnavailable: a.metrics.SegmentUnavailable,
			OnRefresh:     a.metrics.TagRefresh,
			OnGiveBack:    a.metrics.GiveBack,
		},
	}); err != nil {
		return err
	}
	src, err := a.workerSource()
	if err != nil {
		return err
	}
	if a.snowflake, err = snowflake.New(snowflake.Settings{
		Epoch:        time.UnixMilli(cfg.SnowflakeEpoch),
		Source:       src,
		MaxBackwards: cfg.MaxBackwards,
		Clock:        a.clock,
		Logger:       a.log,
		Hooks: snowflake.Hooks{
			OnClockBackwards:    a.metrics.ClockBackwards,
			OnSequenceExhausted: a.metrics.SequenceExhausted,
			OnWorkerLost:        func(id int64) { a.events.record("lost"); a.metrics.WorkerLost(id) },
			OnWorkerAcquired:    func(id int64) { a.events.record("acquired"); a.metrics.WorkerAcquired(id) },
		},
	}); err != nil {
		return err
	}
	a.segGen = a.metrics.Counting("segment", a.segment)
	a.snowGen = a.metrics.Counting("snowflake", a.snowflake)
	a.router = idgen.NewRouter(a.segGen, a.snowGen, cfg.SnowflakeTags)
	a.runway = a.newRunway()
	return nil
}

// serveHTTP starts the admin server on ln.
func (a *app) serveHTTP(ln net.Listener, wg *sync.WaitGroup) {
	a.http = &http.Server{
		Handler: httpapi.New(httpapi.Options{
			Segment:        a.segGen,
			Snowflake:      a.snowGen,
			MaxBatch:       a.cfg.MaxBatch,
			Decode:         func(id int64) httpapi.Decoded { return decoded(a.snowflake.Codec(), id) },
			Cache:          a.segment.Snapshot,
			Status:         a.status,
			History:        a.historyNow,
			Rates:          a.rates.Rates,
			IsSnowflakeTag: a.router.IsSnowflake,
			Totals:         a.metrics.IssuedTotals,
			Ready:          a.ready,
			Pools:          a.pools.all,
			Metrics:        a.metrics.Handler(),
			Token:          a.cfg.HTTPToken,
			Logger:         a.log,
			Extra:          a.debug,
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	wg.Go(func() {
		if err := a.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.WithError(err).Error("admin HTTP server stopped")
		}
	})
}

// startBackground starts the periodic work that runs until ctx ends: the runway figures
// (read from the store), the rates, the watch on tags and workers, and the probes.
func (a *app) startBackground(ctx context.Context, wg *sync.WaitGroup) {
	for _, chore := range []func(context.Context){a.runway.Run, a.sampleRates, a.watch, a.upstreamProbe.Run, a.storeProbe.Run} {
		wg.Go(func() { chore(ctx) })
	}
}

// startSnowflake starts the snowflake engine, which must hold a worker ID before it may
// issue; a worker source that refuses (IDs exhausted, clock behind the recorded
// high-water mark) fails the start with its reason.
func (a *app) startSnowflake(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := a.snowflake.Start(ctx); err != nil {
		return fmt.Errorf("snowflake engine: %w", err)
	}
	return nil
}

// startSegment starts the segment engine in the background: it retries loading the tag
// list until the store answers; meanwhile the proxy already relays queries and /readyz
// explains the wait.
func (a *app) startSegment(ctx context.Context, wg *sync.WaitGroup) {
	wg.Go(func() {
		if err := a.segment.Start(ctx); err != nil {
			if ctx.Err() == nil {
				a.log.WithError(err).Error("segment engine did not start")
			}
			return
		}
		a.segReady.Store(true)
		a.log.WithField("tags", len(a.segment.Tags())).Info("segment engine started")
		a.checkTags()
	})
}

// serve serves clients on ln until the proxy fails or ctx ends; then it stops taking new
// clients and waits up to shutdown-timeout for the sessions to end before closing them.
func (a *app) serve(ctx context.Context, ln net.Listener) error {
	serveErr := make(chan error, 1)
	go func() { serveErr <- a.proxy.Serve(ln) }()
	a.serving.Store(true)
	a.log.WithField("listen", ln.Addr().String()).Info("proxy accepting connections")
	if a.cfg.IOUring && a.cfg.EventLoops >= 0 {
		if err := proxy.SendBatchSupport(); err != nil {
			a.log.WithError(err).Info("event loops send each write and make each receive with a system call of its own (io-uring)")
		}
	}

	select {
	case err := <-serveErr:
		return fmt.Errorf("proxy stopped: %w", err)
	case <-ctx.Done():
	}
	a.stopping.Store(true)
	a.log.Info("shutting down: no new connections; waiting for sessions to finish")
	shutCtx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	if err := a.proxy.Shutdown(shutCtx); err != nil {
		a.log.WithError(err).Warn("sessions still open at the shutdown deadline; closing them")
		a.proxy.Close()
	}
	<-serveErr
	return nil
}

// closeEngine closes an engine with a deadline, logging what it says.
func (a *app) closeEngine(name string, closeFn func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := closeFn(ctx); err != nil {
		a.log.WithError(err).WithField("engine", name).Warn("engine close")
		return
	}
	a.log.WithField("engine", name).Info("engine closed")
}

func (a *app) shutdownHTTP() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = a.http.Shutdown(ctx)
}

func (a *app) sampleRates(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	a.rates.Sample(time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			a.rates.Sample(now)
		}
	}
}

// newProxy configures the wire-protocol server from the configuration.
func (a *app) newProxy() (*proxy.Server, error) {
	cfg := a.cfg
	rw, err := a.newRewriter(a.initialFillRules(context.Background()))
	if err != nil {
		return nil, fmt.Errorf("fill: %w", err)
	}
	a.mu.Lock()
	a.rewriter = rw
	a.mu.Unlock()
	s := &proxy.Server{
		Rewriter:        rw,
		IDs:             &idSource{router: a.router},
		Upstream:        cfg.Upstream,
		UpstreamSSLMode: cfg.UpstreamSSL,
		Auth:            clientAuth(cfg),
		MaxClientConns:  cfg.MaxClientConns,
		MaxMessageSize:  cfg.MaxMessageSize,
		MaxBatch:        cfg.MaxBatch,
		EventLoops:      max(cfg.EventLoops, 0),
		GoroutineRelay:  cfg.EventLoops < 0,
		PlainSends:      !cfg.IOUring,
		Logger:          a.log,
		OnConnOpen:      a.metrics.ConnOpened,
		OnConnClose:     a.metrics.ConnClosed,
		OnReject:        a.metrics.Rejected,
		OnRewrite:       a.metrics.Rewrite,
		OnError:         a.metrics.Error,
	}
	if err := a.configurePooling(s); err != nil {
		return nil, fmt.Errorf("pooling: %w", err)
	}
	if cfg.UpstreamCA != "" {
		pem, err := os.ReadFile(cfg.UpstreamCA)
		if err != nil {
			return nil, fmt.Errorf("upstream-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("upstream-ca: %s holds no PEM certificate", cfg.UpstreamCA)
		}
		s.UpstreamRootCAs = pool
	}
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("tls-cert: %w", err)
		}
		s.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	s.SetRoutes(routesOf(a.routingConfig()))
	return s, nil
}

func isLoopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}
