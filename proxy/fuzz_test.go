package proxy

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/rewrite"
)

// startupPacket encodes a protocol 3.0 StartupMessage.
func startupPacket(params map[string]string) []byte {
	b, _ := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: params}).Encode(nil)
	return b
}

func encode(msgs ...pgproto3.FrontendMessage) []byte {
	var b []byte
	for _, m := range msgs {
		b, _ = m.Encode(b)
	}
	return b
}

// FuzzClientStream feeds arbitrary bytes to the proxy as a client's stream. Whatever they
// are, the proxy must not panic or hang: once the client has sent everything and shut its
// side, the proxy closes the connection within a deadline and lets go of it.
func FuzzClientStream(f *testing.F) {
	startup := startupPacket(map[string]string{"user": "postgres", "database": "postgres"})
	sslRequest := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), sslRequestCode)
	f.Add([]byte{})
	f.Add(startup)
	f.Add(append(append([]byte{}, sslRequest...), startup...))
	f.Add(append(append([]byte{}, startup...), encode(&pgproto3.Query{String: "SELECT 1"}, &pgproto3.Terminate{})...))
	f.Add(append(append([]byte{}, startup...), encode(
		&pgproto3.Parse{Name: "s", Query: "SELECT $1"}, &pgproto3.Bind{PreparedStatement: "s"},
		&pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{})...))
	f.Add(append(append([]byte{}, startup...), encode(
		&pgproto3.Query{String: "SELECT leaf_next('t', 3)"}, &pgproto3.Query{String: "SELECT leaf_decode(42)"},
		&pgproto3.Parse{Query: "SELECT leaf_next($1, $2)"}, &pgproto3.Bind{Parameters: [][]byte{[]byte("t"), []byte("2")}},
		&pgproto3.Execute{MaxRows: 1}, &pgproto3.Execute{}, &pgproto3.Sync{},
		&pgproto3.Parse{Query: "SELECT leaf_decode($1)"}, &pgproto3.Bind{Parameters: [][]byte{[]byte("7")}}, &pgproto3.Execute{}, &pgproto3.Sync{})...))
	f.Add(append(append([]byte{}, startup...), encode(
		&pgproto3.Query{String: "COPY orders (item) FROM STDIN (FORMAT csv, HEADER)"},
		&pgproto3.CopyData{Data: []byte("item\n\"a\nb\",\r\n\\.\n")}, &pgproto3.CopyDone{})...))
	f.Add(append(append([]byte{}, startup...), 'Q', 0xff, 0xff, 0xff, 0xff))
	f.Add(append(append([]byte{}, startup...), 'Q', 0, 0, 0, 2))
	f.Add(append(append([]byte{}, startup...), 'd', 0, 0, 0, 100, 1, 2, 3))
	f.Add([]byte{0, 0, 0, 16, 4, 210, 22, 46, 0, 0, 16, 146, 0, 0, 0, 1}) // CancelRequest
	f.Add([]byte{0, 0, 0, 8, 0, 2, 0, 0})                                 // protocol 2

	up := startFakeUpstream(f, false)
	upstream := "postgres://postgres@" + up.addr() + "/postgres"
	limits := func(s *Server) {
		s.StartupTimeout = 2 * time.Second
		s.MaxMessageSize = 1 << 20
	}
	rw, err := rewrite.New(rewrite.Settings{Fill: []rewrite.FillRule{{Table: "orders", Column: "id", Tag: "order"}}})
	if err != nil {
		f.Fatal(err)
	}
	proxies := []*testProxy{
		startProxy(f, upstream, limits),
		startProxy(f, upstream, limits, func(s *Server) { s.Rewriter, s.IDs = rw, &stubIDs{} }),
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, p := range proxies {
			fuzzOne(t, p, data)
		}
	})
}

// fuzzOne sends data as a client stream to p and checks that the connection ends.
func fuzzOne(t *testing.T, p *testProxy, data []byte) {
	t.Helper()
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	done := make(chan error, 1)
	go func() {
		// Read concurrently: the proxy may answer (or refuse) before all is sent.
		_, err := io.Copy(io.Discard, c)
		done <- err
	}()
	if _, err := c.Write(data); err == nil {
		_ = c.(*net.TCPConn).CloseWrite()
	}
	// A reset is a valid way for the proxy to end the connection; a timeout is not.
	var ne net.Error
	if err := <-done; errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the proxy did not close the connection: %v", err)
	}
	if !waitIdle(p.srv, 10*time.Second) {
		t.Fatal("the proxy still holds the connection")
	}
}
