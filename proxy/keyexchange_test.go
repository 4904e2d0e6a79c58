package proxy

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// tlsOnlyServer answers SSLRequest with 'S' and completes a TLS handshake, as
// PostgreSQL does, taking only the key exchanges in curves (changed by setCurves); it
// counts the ClientHello messages of each connection.
type tlsOnlyServer struct {
	l    net.Listener
	cert tls.Certificate

	mu     sync.Mutex
	curves []tls.CurveID
	hellos []int // per connection accepted, its ClientHellos
}

func startTLSOnlyServer(t *testing.T, curves ...tls.CurveID) *tlsOnlyServer {
	t.Helper()
	cfg, _ := proxyCertificate(t)
	cert := cfg.Certificates[0]
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &tlsOnlyServer{l: l, cert: cert, curves: curves}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go srv.serve(c)
		}
	}()
	return srv
}

func (srv *tlsOnlyServer) setCurves(curves ...tls.CurveID) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	srv.curves = curves
}

// counts returns the ClientHellos of each connection so far.
func (srv *tlsOnlyServer) counts() []int {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return append([]int(nil), srv.hellos...)
}

func (srv *tlsOnlyServer) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	var req [8]byte
	if _, err := io.ReadFull(c, req[:]); err != nil || binary.BigEndian.Uint32(req[4:]) != sslRequestCode {
		return
	}
	if _, err := c.Write([]byte{sslAccepted}); err != nil {
		return
	}
	srv.mu.Lock()
	i := len(srv.hellos)
	srv.hellos = append(srv.hellos, 0)
	cfg := &tls.Config{Certificates: []tls.Certificate{srv.cert}, CurvePreferences: srv.curves}
	srv.mu.Unlock()
	counter := &helloCounter{Conn: c, count: func() {
		srv.mu.Lock()
		srv.hellos[i]++
		srv.mu.Unlock()
	}}
	tc := tls.Server(counter, cfg)
	if tc.Handshake() != nil {
		return
	}
	_, _ = io.Copy(io.Discard, tc) // until the client closes
}

// helloCounter calls count for each ClientHello in the TLS records read through it, up to
// the first encrypted record: TLS 1.3 encrypts what follows the hellos. A client that is
// asked to start again sends a change_cipher_spec record before its second ClientHello.
type helloCounter struct {
	net.Conn
	count func()
	buf   []byte
	done  bool
}

func (h *helloCounter) Read(p []byte) (int, error) {
	n, err := h.Conn.Read(p)
	if !h.done {
		h.buf = append(h.buf, p[:n]...)
		for len(h.buf) >= 6 && !h.done {
			length := int(binary.BigEndian.Uint16(h.buf[3:5]))
			if len(h.buf) < 5+length {
				break
			}
			const recordChangeCipherSpec, recordHandshake, clientHello = 20, 22, 1
			switch {
			case h.buf[0] == recordHandshake && h.buf[5] == clientHello:
				h.count()
			case h.buf[0] != recordHandshake && h.buf[0] != recordChangeCipherSpec:
				h.done = true
			}
			h.buf = h.buf[5+length:]
		}
	}
	return n, err
}

// TestUpstreamKeyExchangeLearned: against a server that takes only P-256, as PostgreSQL
// up to 17 does by default, the first connection offers Go's key exchanges and is asked
// to start again (two ClientHellos); the next ones offer P-256 alone (one). When the
// server then takes only X25519, the connection that offers P-256 fails its handshake and
// a new one offers them all, so that the client gets its connection all the same; so do
// the connections after it, for a while.
func TestUpstreamKeyExchangeLearned(t *testing.T) {
	srv := startTLSOnlyServer(t, tls.CurveP256)
	addr := srv.l.Addr().String()
	s := &Server{Upstream: addr, UpstreamSSLMode: SSLRequire}
	ctx := testContext(t)
	dial := func() tls.CurveID {
		t.Helper()
		c, err := s.dialUpstream(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		tc, ok := c.(*tls.Conn)
		if !ok {
			t.Fatalf("upstream connection is %T, want *tls.Conn", c)
		}
		return tc.ConnectionState().CurveID
	}
	for range 3 {
		if got := dial(); got != tls.CurveP256 {
			t.Fatalf("key exchange %v, want P-256", got)
		}
	}
	if got, want := srv.counts(), []int{2, 1, 1}; !slices.Equal(got, want) {
		t.Fatalf("ClientHellos per connection: %v, want %v", got, want)
	}

	srv.setCurves(tls.X25519)
	if got := dial(); got != tls.X25519 {
		t.Fatalf("after the server's change: key exchange %v, want X25519", got)
	}
	if got := dial(); got != tls.X25519 {
		t.Fatalf("key exchange %v, want X25519", got)
	}
	// The failed connection offered P-256 alone; its successor offered all, of which
	// X25519 first: no new start.
	if got, want := srv.counts()[3:], []int{1, 1, 1}; !slices.Equal(got, want) {
		t.Fatalf("ClientHellos per connection after the change: %v, want %v", got, want)
	}
}

// TestUpstreamKeyExchangeWithPostgres: the test server (TLS on, its ssl_ecdh_curve as
// configured) takes the key exchange the proxy learned from its first connection, on
// every connection after it.
func TestUpstreamKeyExchangeWithPostgres(t *testing.T) {
	db := testenv.NewDatabase(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Upstream: u.Host, UpstreamSSLMode: SSLRequire}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var first tls.CurveID
	for i := range 3 {
		c, err := s.dialUpstream(ctx, u.Host)
		if err != nil {
			t.Fatal(err)
		}
		id := c.(*tls.Conn).ConnectionState().CurveID
		c.Close()
		if i == 0 {
			first = id
			if got := s.keyExchanges.Offer(u.Host, time.Now()); got != id || id == 0 {
				t.Fatalf("after a handshake with %v, the proxy offers %v alone", id, got)
			}
		} else if id != first {
			t.Fatalf("connection %d: key exchange %v, want %v as the first", i, id, first)
		}
	}
}
