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
SIGHUP reads the fill rules of the store (leaf_fill) at once, as every fill-refresh does.`

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
	if errors.As(err, &pg) && pg.Code == "42P01" {
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
	router    *idgen.Router
	clock     snowflake.Clock  // nil: the system clock
	now       func() time.Time // the clock of the worker sources (the engine's); nil: time.Now
	debug     map[string]http.Handler
	proxy     *proxy.Server
	http      *http.Server
	catalog   *catalog // columns of the filled tables; nil without fill rules

	upstreamProbe *health.Probe
	storeProbe    *health.Probe
	history       *metrics.History
	events        leaseEvents

	fill fillRules // the fill rules in use, config and store merged

	mu        sync.Mutex
	conflicts []string             // tags both in snowflake-tags and leaf_alloc
	lease     *httpapi.LeaseStatus // the lease row as last read
	rewriter  *rewrite.Rewriter    // the proxy's, told when the catalog changes
}

func (a *app) run(ctx context.Context) (err error) {
	cfg, log := a.cfg, a.log
	// Caught from the start: SIGHUP's default action would end the process.
	hup, stopHup := notifyHangup()
	defer stopHup()
	log.WithFields(logrus.Fields{"version": buildVersion(), "listen": cfg.Listen, "upstream": cfg.Upstream,
		"http": cfg.HTTP, "worker_source": cfg.WorkerSource}).Info("starting leafproxy")

	// Bind both sockets first, so that a taken port fails the start at once.
	proxyLn, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer proxyLn.Close()
	var httpLn net.Listener
	if cfg.HTTP != "" {
		if httpLn, err = net.Listen("tcp", cfg.HTTP); err != nil {
			return fmt.Errorf("http: %w", err)
		}
		defer httpLn.Close()
		if !isLoopback(httpLn.Addr()) && cfg.HTTPToken == "" {
			log.WithField("http", httpLn.Addr().String()).Warn("the admin HTTP server is reachable from other hosts and has no http-token: anyone who reaches it can take IDs and read internals")
		}
	}

	if cfg.MigrateOnStart {
		if err := migrations.Up(cfg.Store); err != nil {
			return fmt.Errorf("migrate-on-start: %w", err)
		}
		log.Info("migrations applied")
	}

	poolCfg, err := pgxpool.ParseConfig(cfg.Store)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	poolCfg.MaxConns = 8
	poolCfg.ConnConfig.ConnectTimeout = 5 * time.Second
	poolCfg.ConnConfig.RuntimeParams["application_name"] = "leafproxy"
	if a.pool, err = pgxpool.NewWithConfig(ctx, poolCfg); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer a.pool.Close()

	if newTestClock != nil {
		if a.clock, a.now, a.debug, err = newTestClock(); err != nil {
			return err
		}
		log.Warn("test build: the snowflake clock can be moved through POST /debug/clock")
	}
	if cfg.HTTPPprof {
		a.debug = withPprof(a.debug)
	}
	a.metrics = metrics.New(buildVersion(), a.bufferLevels)
	a.rates = a.metrics.NewRateMeter(10 * time.Second)
	a.history = metrics.NewHistory(historySamples)
	a.newProbes()

	if a.segment, err = segment.New(segment.Settings{
		Store:            segment.NewPostgresStore(a.pool),
		PreloadThreshold: cfg.SegmentPreload,
		Logger:           log,
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
		Logger:       log,
		Hooks: snowflake.Hooks{
			OnClockBackwards:    a.metrics.ClockBackwards,
			OnSequenceExhausted: a.metrics.SequenceExhausted,
			OnWorkerLost:        func(id int64) { a.events.record("lost"); a.metrics.WorkerLost(id) },
			OnWorkerAcquired:    func(id int64) { a.events.record("acquired"); a.metrics.WorkerAcquired(id) },
		},
	}); err != nil {
		return err
	}
	segGen := a.metrics.Counting("segment", a.segment)
	snowGen := a.metrics.Counting("snowflake", a.snowflake)
	a.router = idgen.NewRouter(segGen, snowGen, cfg.SnowflakeTags)
	a.runway = a.newRunway()

	// The admin server comes up first, so that /healthz answers and /readyz says what the
	// engines are waiting for while they start.
	var wg sync.WaitGroup
	defer wg.Wait()
	// Deferred after wg.Wait, so it runs before it: ends the helper goroutines on any return.
	ctx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.runway.Run(ctx) // reads the store in the background for the runway gauges
	}()
	if httpLn != nil {
		a.http = &http.Server{
			Handler: httpapi.New(httpapi.Options{
				Segment:        segGen,
				Snowflake:      snowGen,
				MaxBatch:       cfg.MaxBatch,
				Decode:         func(id int64) httpapi.Decoded { return decoded(a.snowflake.Codec(), id) },
				Cache:          a.segment.Snapshot,
				Status:         a.status,
				History:        a.historyNow,
				Rates:          a.rates.Rates,
				IsSnowflakeTag: a.router.IsSnowflake,
				Totals:         a.metrics.IssuedTotals,
				Ready:          a.ready,
				Metrics:        a.metrics.Handler(),
				Token:          cfg.HTTPToken,
				Logger:         log,
				Extra:          a.debug,
			}),
			ReadHeaderTimeout: 10 * time.Second,
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.http.Serve(httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.WithError(err).Error("admin HTTP server stopped")
			}
		}()
		defer a.shutdownHTTP()
	}
	for _, chore := range []func(context.Context){a.sampleRates, a.watch, a.upstreamProbe.Run, a.storeProbe.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			chore(ctx)
		}()
	}

	// The snowflake engine must hold a worker ID before it may issue; a worker source
	// that refuses (IDs exhausted, clock behind the recorded high-water mark) fails the
	// start with its reason.
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = a.snowflake.Start(startCtx)
	cancel()
	if err != nil {
		return fmt.Errorf("snowflake engine: %w", err)
	}
	defer a.closeEngine("snowflake", a.snowflake.Close)

	// The segment engine retries loading the tag list until the store answers; meanwhile
	// the proxy already relays queries and /readyz explains the wait.
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := a.segment.Start(ctx); err != nil {
			if ctx.Err() == nil {
				log.WithError(err).Error("segment engine did not start")
			}
			return
		}
		a.segReady.Store(true)
		log.WithField("tags", len(a.segment.Tags())).Info("segment engine started")
		a.checkTags()
	}()
	defer a.closeEngine("segment", a.segment.Close)

	if a.proxy, err = a.newProxy(); err != nil {
		return err
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		a.refreshCatalog(ctx, catalogRefresh)
	}()
	go func() {
		defer wg.Done()
		a.watchFill(ctx, hup)
	}()
	serveErr := make(chan error, 1)
	go func() { serveErr <- a.proxy.Serve(proxyLn) }()
	a.serving.Store(true)
	log.WithField("listen", proxyLn.Addr().String()).Info("proxy accepting connections")

	select {
	case err := <-serveErr:
		return fmt.Errorf("proxy stopped: %w", err)
	case <-ctx.Done():
	}
	a.stopping.Store(true)
	log.Info("shutting down: no new connections; waiting for sessions to finish")
	shutCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := a.proxy.Shutdown(shutCtx); err != nil {
		log.WithError(err).Warn("sessions still open at the shutdown deadline; closing them")
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
	mode, err := proxy.ParseSSLMode(cfg.UpstreamSSLMode)
	if err != nil {
		return nil, fmt.Errorf("upstream-sslmode: %w", err)
	}
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
		UpstreamSSLMode: mode,
		Auth:            clientAuth(cfg),
		MaxClientConns:  cfg.MaxClientConns,
		MaxMessageSize:  cfg.MaxMessageSize,
		MaxBatch:        cfg.MaxBatch,
		EventLoops:      max(cfg.EventLoops, 0),
		GoroutineRelay:  cfg.EventLoops < 0,
		Logger:          a.log,
		OnConnOpen:      a.metrics.ConnOpened,
		OnConnClose:     a.metrics.ConnClosed,
		OnReject:        a.metrics.Rejected,
		OnRewrite:       a.metrics.Rewrite,
		OnError:         a.metrics.Error,
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
	return s, nil
}

func isLoopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}
