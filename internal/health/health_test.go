package health

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

func TestProbeStates(t *testing.T) {
	var fail error
	var changes []State
	p := &Probe{Name: "upstream", Target: "db:5432",
		Check:    func(context.Context) error { return fail },
		OnChange: func(s State) { changes = append(changes, s) }}
	if got := p.State().Problem(); got != "upstream db:5432 not checked yet" {
		t.Errorf("before the first check: %q", got)
	}
	ctx := context.Background()
	fail = errors.New("dial tcp db:5432: connect: connection refused\n\tsecond line")
	p.CheckNow(ctx)
	p.CheckNow(ctx)
	st := p.State()
	if st.OK || !st.Checked || st.LastError != "dial tcp db:5432: connect: connection refused second line" {
		t.Errorf("after a failure: %+v", st)
	}
	if got := st.Problem(); !strings.HasPrefix(got, "upstream db:5432 unreachable since ") || !strings.HasSuffix(got, ": "+st.LastError) {
		t.Errorf("problem %q", got)
	}
	fail = nil
	p.CheckNow(ctx)
	st = p.State()
	if !st.OK || st.Problem() != "" || st.LastError == "" {
		t.Errorf("after recovery (the last error is kept): %+v", st)
	}
	if len(changes) != 2 || changes[0].OK || !changes[1].OK {
		t.Errorf("OnChange calls %+v, want a failure then a recovery", changes)
	}
	// A check cut short by shutdown records nothing.
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	fail = errors.New("canceled")
	p.CheckNow(canceled)
	if !p.State().OK {
		t.Error("a canceled check changed the state")
	}
}

// listen serves each connection to a new loopback listener with serve, until the test
// ends, and returns its address.
func listen(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// answerSSLRequest reads the SSLRequest and answers with b.
func answerSSLRequest(c net.Conn, b byte) error {
	buf := make([]byte, 8)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	_, err := c.Write([]byte{b})
	return err
}

// serveOnce answers the SSLRequest of a connection with b.
func serveOnce(t *testing.T, b byte) string {
	return listen(t, func(c net.Conn) { _ = answerSSLRequest(c, b) })
}

func TestDialPostgres(t *testing.T) {
	ctx := context.Background()
	if err := DialPostgres(ctx, serveOnce(t, 'N')); err != nil {
		t.Errorf("a server answering N: %v", err)
	}
	if err := DialPostgres(ctx, serveOnce(t, 'H')); err == nil || !strings.Contains(err.Error(), "not a PostgreSQL server") {
		t.Errorf("a server answering H: %v", err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	if err := DialPostgres(ctx, addr); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("a closed port: %v", err)
	}
}

// TestDialPostgresLeavesNoTrace probes a real PostgreSQL (with TLS on) repeatedly and
// checks that its log has no line about the probes: a probe every 2 s must not flood it.
func TestDialPostgresLeavesNoTrace(t *testing.T) {
	pg := testenv.NewPostgres(t)
	addr := fmt.Sprintf("127.0.0.1:%d", pg.Port)
	logFile := filepath.Join(pg.Dir, "postgres.log")
	before, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 5 {
		if err := DialPostgres(ctx, addr); err != nil {
			t.Fatalf("probe: %v", err)
		}
	}
	// A session that ends after the probes: its log line (if any) proves the server has
	// written what the probes caused before we read the log.
	conn, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	after, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if added := strings.TrimSpace(string(after[len(before):])); added != "" {
		t.Errorf("the probes made the server log:\n%s", added)
	}
}

// TestDialPostgresKeyExchange checks that probes of a PostgreSQL server offer, after the
// first, the key exchange it chose alone, so that they need no second first message (a
// HelloRetryRequest) from a server that takes only P-256, as PostgreSQL up to 17 does by
// default; and that a server which changes its choice is still probed successfully.
func TestDialPostgresKeyExchange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pg := testenv.NewPostgres(t)
	addr := fmt.Sprintf("127.0.0.1:%d", pg.Port)
	var first tls.CurveID
	for i := range 3 {
		st, err := dialPostgres(ctx, addr)
		switch {
		case err != nil:
			t.Fatalf("probe %d: %v", i, err)
		case st == nil:
			t.Fatal("the test server answered the SSLRequest with N: it runs with TLS on")
		case i == 0:
			first = st.CurveID
		case st.HelloRetryRequest || st.CurveID != first:
			t.Errorf("PostgreSQL, probe %d: key exchange %v, HelloRetryRequest %v; want %v at the first try", i, st.CurveID, st.HelloRetryRequest, first)
		}
	}

	certs, err := testenv.WriteCertificates(t.TempDir(), "server")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(certs.CertFile, certs.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	srv := &tlsServer{cert: cert}
	srv.curve.Store(uint32(tls.CurveP384))
	addr = srv.start(t)
	probe := func(want tls.CurveID, wantRetry bool) {
		t.Helper()
		st, err := dialPostgres(ctx, addr)
		if err != nil {
			t.Fatalf("a server taking %v alone: %v", want, err)
		}
		if st.CurveID != want || st.HelloRetryRequest != wantRetry {
			t.Errorf("a server taking %v alone: key exchange %v, HelloRetryRequest %v", want, st.CurveID, st.HelloRetryRequest)
		}
	}
	probe(tls.CurveP384, true) // offered all, P-384 is not among Go's first key shares
	probe(tls.CurveP384, false)
	srv.curve.Store(uint32(tls.X25519))
	// Offered P-384 alone, which fails; then all, with X25519's share among the first.
	probe(tls.X25519, false)
	if got := srv.accepted.Load(); got != 4 {
		t.Errorf("the server accepted %d connections, want 4 (the failed handshake and the one after it)", got)
	}
}

// tlsServer answers each connection's SSLRequest with S and completes a TLS handshake,
// taking only the key exchange in curve.
type tlsServer struct {
	cert     tls.Certificate
	curve    atomic.Uint32
	accepted atomic.Int32
}

func (srv *tlsServer) start(t *testing.T) string {
	return listen(t, func(c net.Conn) {
		srv.accepted.Add(1)
		cfg := &tls.Config{Certificates: []tls.Certificate{srv.cert},
			CurvePreferences: []tls.CurveID{tls.CurveID(srv.curve.Load())}}
		if answerSSLRequest(c, 'S') != nil {
			return
		}
		tc := tls.Server(c, cfg)
		if tc.Handshake() == nil {
			_, _ = io.Copy(io.Discard, tc) // until the probe's close_notify
		}
	})
}
