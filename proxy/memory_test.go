package proxy

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/rewrite"
)

// maxIdleConnMemory is the design's budget of proxy memory per idle client connection.
const maxIdleConnMemory = 64 << 10

// TestIdleConnectionMemory opens 1,000 idle sessions through the proxy and measures what
// they cost the proxy: the growth of live heap plus goroutine stacks (runtime.MemStats
// HeapAlloc + StackInuse after a forced GC) divided by the number of sessions. The
// upstream is the fake server in hold mode and the clients are bare sockets, so neither
// spends a goroutine or buffer per connection and the figure is the proxy's own: its
// buffers and connection state for the client and the upstream leg. TLS clients run in
// a child process, so that their own TLS state stays out of the figure.
func TestIdleConnectionMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 1,000 connections")
	}
	rw, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := proxyCertificate(t)
	tests := []struct {
		name      string
		configure func(*Server)
		open      func(t *testing.T, addr string, n int) (closeAll func())
	}{
		{"pass-through", func(*Server) {}, openPlainClients},
		{"rewriting", func(s *Server) { s.Rewriter, s.IDs = rw, &stubIDs{} }, openPlainClients},
		{"TLS", func(s *Server) { s.TLSConfig = cfg }, openTLSClients},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			perConn := idleConnectionMemory(t, 1000, tt.configure, tt.open)
			t.Logf("proxy memory per idle connection: %d bytes (%.1f KiB)", perConn, float64(perConn)/1024)
			if perConn > maxIdleConnMemory {
				t.Fatalf("%d bytes per idle connection, budget %d", perConn, maxIdleConnMemory)
			}
		})
	}
}

// idleConnectionMemory opens conns idle sessions through a new proxy and returns the
// growth of live memory per session.
func idleConnectionMemory(t *testing.T, conns int, configure func(*Server), open func(t *testing.T, addr string, n int) func()) int64 {
	up := startFakeUpstream(t, true)
	p := startProxy(t, "postgres://postgres@"+up.addr()+"/postgres", configure)
	// One session first, so that what the runtime sets up once is not counted.
	closeWarm := open(t, p.addr, 1)
	defer closeWarm()
	before := liveMemory()
	closeAll := open(t, p.addr, conns)
	defer closeAll()
	after := liveMemory()
	return (int64(after) - int64(before)) / int64(conns)
}

// idleStartup is the startup packet of the idle sessions.
var idleStartup = startupPacket(map[string]string{"user": "postgres", "database": "postgres"})

// openPlainClients opens n sessions to addr and leaves them idle.
func openPlainClients(t *testing.T, addr string, n int) func() {
	t.Helper()
	clients := make([]net.Conn, 0, n)
	closeAll := func() {
		for _, c := range clients {
			c.Close()
		}
	}
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			closeAll()
			t.Fatal(err)
		}
		clients = append(clients, c)
		if err := awaitReady(c, idleStartup); err != nil {
			closeAll()
			t.Fatal(err)
		}
	}
	return closeAll
}

// Environment of the child process of openTLSClients.
const (
	idleTLSAddrEnv  = "LEAFPROXY_IDLE_TLS_ADDR"
	idleTLSCountEnv = "LEAFPROXY_IDLE_TLS_COUNT"
)

// openTLSClients opens n TLS sessions to addr from a child process, this test binary
// running TestIdleTLSClients, and leaves them idle until the returned function ends it.
func openTLSClients(t *testing.T, addr string, n int) func() {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestIdleTLSClients$", "-test.v")
	cmd.Env = append(os.Environ(), idleTLSAddrEnv+"="+addr, idleTLSCountEnv+"="+strconv.Itoa(n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	end := func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("TLS client process: %v", err)
		}
	}
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if lines.Text() == "idle sessions ready" {
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			return end
		}
	}
	end()
	t.Fatal("the TLS client process ended before its sessions were ready")
	return nil
}

// TestIdleTLSClients is the child process of openTLSClients: it opens the sessions, says
// so, and holds them until its standard input closes. Run by itself, it does nothing.
func TestIdleTLSClients(t *testing.T) {
	addr := os.Getenv(idleTLSAddrEnv)
	if addr == "" {
		return // run by itself: only the child process of TestIdleConnectionMemory has work
	}
	n, err := strconv.Atoi(os.Getenv(idleTLSCountEnv))
	if err != nil {
		t.Fatal(err)
	}
	sslRequest := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), sslRequestCode)
	clients := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		var answer [1]byte
		if _, err := c.Write(sslRequest); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, answer[:]); err != nil || answer[0] != 'S' {
			t.Fatalf("SSLRequest answered %q, %v", answer[0], err)
		}
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true}) // the proxy's test certificate
		if err := awaitReady(tc, idleStartup); err != nil {
			t.Fatal(err)
		}
		clients[len(clients)-1] = tc
	}
	fmt.Println("idle sessions ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// awaitReady sends a startup packet and reads until the first ReadyForQuery.
func awaitReady(c net.Conn, startup []byte) error {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(noDeadline)
	if _, err := c.Write(startup); err != nil {
		return err
	}
	fe := pgproto3.NewFrontend(bufio.NewReaderSize(c, 512), c)
	for {
		msg, err := fe.Receive()
		if err != nil {
			return err
		}
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			return nil
		}
	}
}

// liveMemory returns live heap plus goroutine stack memory after a full collection.
func liveMemory() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc + m.StackInuse
}
