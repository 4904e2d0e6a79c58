package proxy

import (
	"bufio"
	"net"
	"runtime"
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
// spends a goroutine or buffer per connection and the figure is the proxy's own: its two
// goroutines, four buffers and connection state for the client and the upstream leg.
func TestIdleConnectionMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 1,000 connections")
	}
	rw, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		configure func(*Server)
	}{
		{"pass-through", func(*Server) {}},
		{"rewriting", func(s *Server) { s.Rewriter, s.IDs = rw, &stubIDs{} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			perConn := idleConnectionMemory(t, 1000, tt.configure)
			t.Logf("proxy memory per idle connection: %d bytes (%.1f KiB)", perConn, float64(perConn)/1024)
			if perConn > maxIdleConnMemory {
				t.Fatalf("%d bytes per idle connection, budget %d", perConn, maxIdleConnMemory)
			}
		})
	}
}

// idleConnectionMemory opens conns idle sessions through a new proxy and returns the
// growth of live memory per session.
func idleConnectionMemory(t *testing.T, conns int, configure func(*Server)) int64 {
	up := startFakeUpstream(t, true)
	p := startProxy(t, "postgres://postgres@"+up.addr()+"/postgres", configure)
	startup := startupPacket(map[string]string{"user": "postgres", "database": "postgres"})
	// One session first, so that what the runtime sets up once is not counted.
	warm, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Close()
	if err := awaitReady(warm, startup); err != nil {
		t.Fatal(err)
	}

	before := liveMemory()
	clients := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for range conns {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		if err := awaitReady(c, startup); err != nil {
			t.Fatal(err)
		}
	}
	after := liveMemory()
	return (int64(after) - int64(before)) / int64(conns)
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
