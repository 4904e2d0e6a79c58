package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/internal/keyexchange"
	"github.com/leafproxy/leafproxy/proxy/pool"
	"github.com/leafproxy/leafproxy/rewrite"
)

// Defaults for the zero values of Server's fields.
const (
	DefaultAddr           = "127.0.0.1:6432"
	DefaultStartupTimeout = 30 * time.Second
	DefaultDialTimeout    = 10 * time.Second
	// DefaultMaxMessageSize is PostgreSQL's own limit on a message (MaxAllocSize, 1 GB).
	DefaultMaxMessageSize = defaultMaxBodySize
)

// ErrServerClosed is returned by Serve and ListenAndServe after Shutdown or Close.
var ErrServerClosed = errors.New("proxy: server closed")

// noDeadline clears a connection deadline.
var noDeadline time.Time

// Server accepts PostgreSQL clients and relays each one, in session mode, to its own
// connection to the upstream database. Its exported fields are its configuration; set them
// before Serve and do not change them afterwards.
type Server struct {
	// Addr is the TCP address ListenAndServe listens on (DefaultAddr when empty).
	Addr string

	// Upstream is the database's address: host:port, or the path of a Unix socket.
	Upstream string
	// UpstreamSSLMode says how the upstream connection is encrypted (SSLPrefer when empty).
	UpstreamSSLMode SSLMode
	// UpstreamRootCAs verifies the upstream's certificate under SSLVerifyFull; nil means
	// the system's roots.
	UpstreamRootCAs *x509.CertPool
	// UpstreamServerName is the name expected in the upstream's certificate under
	// SSLVerifyFull; empty means the host part of Upstream.
	UpstreamServerName string
	// DialTimeout bounds connecting to the upstream, TLS included (DefaultDialTimeout).
	DialTimeout time.Duration

	// TLSConfig, when it holds a certificate, lets clients encrypt their connection
	// (SSLRequest is answered sslAccepted, 'S'); nil refuses TLS (sslRefused, 'N').
	TLSConfig *tls.Config

	// Auth, when its Type is not passthrough, makes the proxy authenticate clients
	// itself; nil relays authentication to the upstream.
	Auth *ClientAuth

	// MaxClientConns is the most client sessions served at once; past it a client gets
	// FATAL 53300 "sorry, too many clients already". Zero means no limit.
	MaxClientConns int
	// StartupTimeout bounds the whole startup of a client, from accept to the first
	// ReadyForQuery (TLS, authentication and the upstream's startup included), so that a
	// silent socket cannot hold a session slot (DefaultStartupTimeout).
	StartupTimeout time.Duration
	// MaxMessageSize is the largest message body accepted from either side
	// (DefaultMaxMessageSize). A larger message ends the session with a FATAL error.
	MaxMessageSize int

	// Rewriter, when set, rewrites SQL so that leaf_next/leaf_snowflake calls and filled
	// INSERTs receive IDs from IDs; nil relays all SQL unchanged. SetRewriter replaces it
	// while the server runs.
	Rewriter *rewrite.Rewriter
	// IDs supplies the IDs the rewritten statements need; required with Rewriter.
	IDs IDSource
	// MaxBatch is the largest n of SELECT leaf_next('tag', n) (DefaultMaxBatch); a larger
	// one, or one below 1, is refused with 22023.
	MaxBatch int

	// GoroutineRelay serves every session with a pair of goroutines, one per direction.
	// By default a session whose two connections are TCP or Unix sockets, with or
	// without TLS, is served by an event loop, which costs less CPU per message; a
	// rewriting proxy's sessions are, when its IDs is an IDProber. A session moves to
	// goroutines for good when it meets a message over 1 MiB other than a DataRow or
	// CopyData from the upstream, which the loop streams.
	GoroutineRelay bool
	// EventLoops is the number of event loops; zero means one per four processors
	// (GOMAXPROCS), at least one. A loop sleeps and wakes less often the more sessions
	// it serves, which is where it saves CPU; one loop relays tens of thousands of
	// transactions a second.
	EventLoops int
	// PlainSends makes the event loops send each write, and make each receive, with a
	// system call of its own. By default a loop sends the last writes of the sessions it
	// served in one turn together, in one call over an io_uring, and receives from the
	// sockets a wait reported readable together, in another, where the kernel has one
	// (Linux 5.6 or later, not turned off by kernel.io_uring_disabled or a seccomp
	// profile); see sendBatch and recvBatch.
	PlainSends bool

	// PoolMode is PoolSession (the default: a server connection per session) or
	// PoolTransaction (a server connection of a pool per transaction; see txsession.go).
	PoolMode PoolMode
	// Pooling configures the pools of server connections in transaction mode, and the
	// idle server connections of session mode (ReuseSessionServers).
	Pooling pool.Settings
	// ReuseSessionServers lets a server connection in session mode serve later sessions
	// when the proxy authenticates clients itself (Auth): a session the client leaves
	// between transactions gives it back, DISCARD ALL resets it, and it waits for the
	// next session of the same upstream and startup packet, up to Pooling's pool-size
	// idle per (database, user), for its server-idle-timeout and within its
	// server-lifetime (see sessionreuse.go).
	ReuseSessionServers bool
	// MaxPreparedStatements is the most statements the proxy keeps prepared on a server
	// connection in transaction mode; past it, the least recently used ones are closed
	// there as others are prepared (see txstmts.go). Zero means no limit.
	MaxPreparedStatements int

	// Logger receives connection-level events (never per-query ones at Info or above);
	// nil means logrus's standard logger.
	Logger logrus.FieldLogger

	// Optional hooks, typically for metrics. They are called from connection goroutines
	// and must be quick and safe for concurrent use.
	OnConnOpen  func()            // a client connection was accepted
	OnConnClose func()            // a client connection was closed
	OnReject    func(code string) // a client was refused with this SQLSTATE by the proxy itself
	// OnRewrite is called once per statement the proxy rewrote or answered itself: kind
	// is "query" (a rewritten Query), "parse" (a rewritten Parse) or "fast_path" (a
	// leaf_next answered without the database).
	OnRewrite func(kind string)
	// OnError is called with the SQLSTATE of every error the proxy answers a statement
	// with itself (refusals, ID failures); the database's own errors are not counted.
	OnError func(code string)

	mu         sync.Mutex
	listeners  map[*net.Listener]struct{}
	conns      map[*conn]struct{}
	inShutdown atomic.Bool
	swapped    atomic.Pointer[rewrite.Rewriter] // set by SetRewriter; wins over Rewriter
	sessions   atomic.Int64                     // clients past the startup packet, counted against MaxClientConns
	nextID     atomic.Uint64
	cancels    cancelRegistry
	routing    routing // see SetRoutes
	loops      loopGroup
	pooling    pooling
	welcomes   sync.Map  // pool.Key → *welcome: what new clients of a pool are told (txstartup.go)
	authConns  authConns // idle connections of the auth query (authquery.go)
	// sessionPool counts session mode's server connections and keeps those between
	// sessions.
	sessionPool sessionPool
	// keyExchanges remembers the key exchange each upstream chose.
	keyExchanges keyexchange.Memory

	// Goroutines that wait for a new connection to serve (see startConn).
	workersOnce, stopOnce sync.Once
	workers               chan *conn
	workersDone           chan struct{}
	idleWorkers           atomic.Int64
}

func (s *Server) logger() logrus.FieldLogger {
	if s.Logger != nil {
		return s.Logger
	}
	return logrus.StandardLogger()
}

func (s *Server) startupTimeout() time.Duration {
	if s.StartupTimeout > 0 {
		return s.StartupTimeout
	}
	return DefaultStartupTimeout
}

func (s *Server) dialTimeout() time.Duration {
	if s.DialTimeout > 0 {
		return s.DialTimeout
	}
	return DefaultDialTimeout
}

func (s *Server) maxMessageSize() int {
	if s.MaxMessageSize > 0 {
		return s.MaxMessageSize
	}
	return DefaultMaxMessageSize
}

// ListenAndServe listens on Addr and serves clients until Shutdown or Close.
func (s *Server) ListenAndServe() error {
	if s.inShutdown.Load() {
		return ErrServerClosed
	}
	addr := s.Addr
	if addr == "" {
		addr = DefaultAddr
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return s.Serve(l)
}

// Serve accepts clients on l, starting each in its own goroutine, until Shutdown or Close,
// after which it returns ErrServerClosed. Serve closes l when it returns.
func (s *Server) Serve(l net.Listener) error {
	if !s.trackListener(&l, true) {
		l.Close()
		return ErrServerClosed
	}
	defer s.trackListener(&l, false)
	defer l.Close()
	if s.Upstream == "" {
		return errors.New("proxy: Server.Upstream is not set")
	}
	if _, err := ParseSSLMode(string(s.UpstreamSSLMode)); err != nil {
		return err
	}
	if s.Rewriter != nil && s.IDs == nil {
		return errors.New("proxy: Server.Rewriter is set but Server.IDs is not")
	}
	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.inShutdown.Load() {
				return ErrServerClosed
			}
			if isTemporary(err) {
				// Out of descriptors and the like: wait for connections to end rather
				// than spinning.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.logger().WithError(err).WithField("retry_in", backoff).Warn("accept failed")
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		c := s.newConn(nc)
		if c == nil {
			nc.Close()
			return ErrServerClosed
		}
		s.startConn(c)
	}
}

// Goroutines of connections that have ended wait for workerIdle for a new connection to
// serve, maxIdleWorkers of them at most.
const (
	workerIdle     = time.Second
	maxIdleWorkers = 64
)

// startConn serves c on a goroutine: one that has served a connection before and waits
// for the next, if there is one, else a new one. A client that connects for every
// transaction thus does not cost a goroutine started, its stack grown by copying as the
// startup goes deeper, and ended, per connection.
func (s *Server) startConn(c *conn) {
	s.initWorkers()
	select {
	case s.workers <- c:
	default:
		go s.work(c)
	}
}

// work serves c, then the connections startConn hands it, until it has waited
// workerIdle for one, too many others wait already, or the server closes.
func (s *Server) work(c *conn) {
	var idle *time.Timer
	defer func() {
		if idle != nil {
			idle.Stop()
		}
	}()
	for {
		c.serve()
		if s.idleWorkers.Add(1) > maxIdleWorkers {
			s.idleWorkers.Add(-1)
			return
		}
		if idle == nil {
			idle = time.NewTimer(workerIdle)
		} else {
			idle.Reset(workerIdle)
		}
		select {
		case c = <-s.workers:
			s.idleWorkers.Add(-1)
		case <-idle.C:
			s.idleWorkers.Add(-1)
			return
		case <-s.workersDone:
			s.idleWorkers.Add(-1)
			return
		}
	}
}

func (s *Server) initWorkers() {
	s.workersOnce.Do(func() {
		s.workers = make(chan *conn)
		s.workersDone = make(chan struct{})
	})
}

// stopWorkers ends the goroutines waiting for a connection to serve.
func (s *Server) stopWorkers() {
	s.initWorkers()
	s.stopOnce.Do(func() { close(s.workersDone) })
}

func isTemporary(err error) bool {
	var te interface{ Temporary() bool }
	return errors.As(err, &te) && te.Temporary()
}

func (s *Server) trackListener(l *net.Listener, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if add {
		if s.inShutdown.Load() {
			return false
		}
		if s.listeners == nil {
			s.listeners = make(map[*net.Listener]struct{})
		}
		s.listeners[l] = struct{}{}
		return true
	}
	delete(s.listeners, l)
	return true
}

// newConn registers an accepted connection; nil means the server is shutting down.
func (s *Server) newConn(nc net.Conn) *conn {
	c := newConnState(s, nc)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inShutdown.Load() {
		return nil
	}
	if s.conns == nil {
		s.conns = make(map[*conn]struct{})
	}
	s.conns[c] = struct{}{}
	if s.OnConnOpen != nil {
		s.OnConnOpen()
	}
	return c
}

func (s *Server) forgetConn(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	if s.OnConnClose != nil {
		s.OnConnClose()
	}
}

func (s *Server) closeListeners() {
	for l := range s.listeners {
		(*l).Close()
	}
}

// Shutdown stops the server gracefully: it closes the listeners, ends each session as soon
// as it is idle (outside a transaction with no request outstanding; the client is told
// FATAL 57P01, as PostgreSQL's own shutdown does), and waits for the others to finish their
// transactions. When ctx ends first, the remaining connections are closed and ctx's error
// is returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.inShutdown.Store(true)
	s.closeListeners()
	s.mu.Unlock()
	s.loops.close()
	s.stopWorkers()
	s.sessionPool.refuse() // sessions waiting for a server connection end now

	wait := time.Millisecond
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		if s.closeIdleConns() {
			s.closePooling()
			return nil
		}
		select {
		case <-ctx.Done():
			s.closeAllConns()
			s.closePooling()
			return ctx.Err()
		case <-timer.C:
			wait = min(2*wait, 100*time.Millisecond)
			timer.Reset(wait)
		}
	}
}

// closeIdleConns ends idle sessions and reports whether no connection is left.
func (s *Server) closeIdleConns() bool {
	s.mu.Lock()
	idle := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		idle = append(idle, c)
	}
	s.mu.Unlock()
	for _, c := range idle {
		c.closeIfIdle()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns) == 0
}

// Close stops the server at once: listeners and every client connection are closed.
// Serve returns ErrServerClosed.
func (s *Server) Close() error {
	s.mu.Lock()
	s.inShutdown.Store(true)
	s.closeListeners()
	s.mu.Unlock()
	s.loops.close()
	s.stopWorkers()
	s.closeAllConns()
	s.closePooling()
	return nil
}

func (s *Server) closeAllConns() {
	s.mu.Lock()
	all := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		all = append(all, c)
	}
	s.mu.Unlock()
	for _, c := range all {
		c.close()
	}
}

// closePooling closes the pool of server connections, session mode's idle server
// connections, the parking lot and the auth query's connections.
func (s *Server) closePooling() {
	s.closePool()
	s.sessionPool.close()
	s.authConns.close()
	if lot := s.existingParkLot(); lot != nil {
		lot.close()
	}
}

// acquireSession takes a session slot, reporting false when MaxClientConns is reached.
func (s *Server) acquireSession() bool {
	n := s.sessions.Add(1)
	if s.MaxClientConns > 0 && n > int64(s.MaxClientConns) {
		s.sessions.Add(-1)
		return false
	}
	return true
}

func (s *Server) releaseSession() { s.sessions.Add(-1) }

func (s *Server) reject(code string) {
	if s.OnReject != nil {
		s.OnReject(code)
	}
}

// connCount returns the number of client connections the server holds.
func (s *Server) connCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *Server) eventLoops() int {
	if s.EventLoops > 0 {
		return s.EventLoops
	}
	return max(1, runtime.GOMAXPROCS(0)/4)
}
