package driversuite

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/idgen/worker"
	"github.com/leafproxy/leafproxy/proxy"
	"github.com/leafproxy/leafproxy/rewrite"
)

// Fill rule of the rewriting proxy: on a table the suite never touches, so that the
// rewriter is active (every statement goes through its prefilter) without changing what
// the suite expects.
const (
	fillTable    = "driversuite_orders"
	fillTag      = "driversuite"
	fillWorkerID = 7
)

// runningProxy is a proxy.Server serving a run of the suite on TCP and on a Unix socket.
type runningProxy struct {
	Endpoint endpoint
	log      *logLines
	// Clients accepted on TCP and on the Unix socket: proof that the run went through
	// the proxy.
	tcpClients, unixClients atomic.Int64
}

// startProxy starts a proxy.Server in front of s, listening on a loopback TCP port and, as
// PostgreSQL does, on a Unix socket named after the server's port. When the server has
// TLS, the proxy presents the server's own certificate: clients verify it against the same
// CA, and SCRAM channel binding, which binds to that certificate, passes the proxy.
// configure may set further fields. The server is closed when the test ends.
func startProxy(t *testing.T, s *server, configure func(*proxy.Server)) *runningProxy {
	t.Helper()
	rp := &runningProxy{log: &logLines{}}
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	log.SetOutput(rp.log)
	srv := &proxy.Server{Upstream: s.Addr, UpstreamSSLMode: proxy.SSLPrefer, Logger: log}
	if s.Cert != nil {
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{*s.Cert}, MinVersion: tls.VersionTLS12}
		rp.Endpoint.TLS = true
	}
	if configure != nil {
		configure(srv)
	}

	listeners := []net.Listener{countingListener{listen(t, "tcp", "127.0.0.1:0"), &rp.tcpClients}}
	rp.Endpoint.Addr = listeners[0].Addr().String()
	if s.SocketDir != "" {
		// A short path of our own: t.TempDir's can pass the 107 bytes a socket path may have.
		dir, err := os.MkdirTemp("", "leafproxy-sock-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		listeners = append(listeners, countingListener{listen(t, "unix", filepath.Join(dir, ".s.PGSQL."+s.Port)), &rp.unixClients})
		rp.Endpoint.SocketDir = dir
	}

	done := make(chan error, len(listeners))
	for _, l := range listeners {
		go func() { done <- srv.Serve(l) }()
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("close the proxy: %v", err)
		}
		for range listeners {
			select {
			case err := <-done:
				if !errors.Is(err, proxy.ErrServerClosed) {
					t.Errorf("Serve returned %v, want ErrServerClosed", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("Serve did not return after Close")
				return
			}
		}
	})
	return rp
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func listen(t *testing.T, network, addr string) net.Listener {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatalf("listen on %s %s: %v", network, addr, err)
	}
	return l
}

// rewritingProxy configures a proxy with a Rewriter filling fillTable.id with snowflake
// IDs of fillTag, issued by a real snowflake engine with a static worker ID.
// It returns the configuration and the engine.
func rewritingProxy(ctx context.Context, t *testing.T) (func(*proxy.Server), *snowflake.Engine) {
	t.Helper()
	rw, err := rewrite.New(rewrite.Settings{Fill: []rewrite.FillRule{{Table: fillTable, Column: "id", Tag: fillTag}}})
	if err != nil {
		t.Fatal(err)
	}
	engine, err := snowflake.New(snowflake.Settings{Source: worker.Static{ID: fillWorkerID}})
	if err != nil {
		t.Fatal(err)
	}
	if err := engine.Start(ctx); err != nil {
		t.Fatalf("start the snowflake engine: %v", err)
	}
	t.Cleanup(func() {
		if err := engine.Close(context.Background()); err != nil {
			t.Errorf("close the snowflake engine: %v", err)
		}
	})
	ids := idgen.NewRouter(nil, engine, []string{fillTag})
	return func(s *proxy.Server) {
		s.Rewriter = rw
		s.IDs = ids
	}, engine
}

// checkFill proves that the rewriting proxy at ep rewrote: an INSERT leaving out the key
// of fillTable, which has no default, gets a snowflake ID of the proxy's worker.
func checkFill(ctx context.Context, t *testing.T, s *server, ep endpoint, db string, engine *snowflake.Engine) {
	t.Helper()
	dbURL := suiteEnv(s, ep, db)["PGX_TEST_DATABASE"]
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect through the rewriting proxy: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE "+fillTable+" (id bigint PRIMARY KEY, item text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := conn.QueryRow(ctx, "INSERT INTO "+fillTable+" (item) VALUES ($1) RETURNING id", "book").Scan(&id); err != nil {
		t.Fatalf("INSERT through the rewriting proxy: %v", err)
	}
	if w := engine.Decompose(id).Worker; w != fillWorkerID {
		t.Errorf("filled id %d has worker %d, want %d: the proxy did not fill it", id, w, fillWorkerID)
	}
}

// logLines collects the proxy's log lines (warnings and errors only).
type logLines struct {
	mu    sync.Mutex
	lines []string
	count int
}

// maxLogLines is how many of the proxy's log lines are kept for the summary.
const maxLogLines = 20

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		l.count++
		if len(l.lines) < maxLogLines {
			l.lines = append(l.lines, string(line))
		}
	}
	return len(p), nil
}

func (l *logLines) snapshot() (count int, first []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.count, append([]string(nil), l.lines...)
}
