package proxy

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/sirupsen/logrus/hooks/test"

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

func encodeBackend(msgs ...pgproto3.BackendMessage) []byte {
	var b []byte
	for _, m := range msgs {
		b, _ = m.Encode(b)
	}
	return b
}

// serverScript builds a fake upstream's script (see fakeUpstream.setScript): flags, then
// one chunk per answer.
func serverScript(flags byte, answers ...[]byte) []byte {
	s := []byte{flags}
	for _, a := range answers {
		if len(a) > 255 {
			panic("an answer of a server script holds at most 255 bytes")
		}
		s = append(append(s, byte(len(a))), a...)
	}
	return s
}

// FuzzClientStream feeds arbitrary bytes to the proxy as a client's stream and, when
// server is not empty, answers the proxy's upstream connection with a script made of
// arbitrary bytes too (see fakeUpstream.setScript), so that both the request side and
// the response side of the protocol code get hostile input. Whatever they are, the proxy
// must not panic (its per-connection recover logs the panic, which fails the input) or
// hang: once the client has sent everything and shut its side, and the server has said
// everything and shut its own, the proxy closes the connection within a deadline and lets
// go of it. Each input goes to a relaying proxy, a rewriting proxy on the event loops,
// and a rewriting proxy on goroutines.
func FuzzClientStream(f *testing.F) {
	startup := startupPacket(map[string]string{"user": "postgres", "database": "postgres"})
	sslRequest := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), sslRequestCode)
	after := func(msgs ...pgproto3.FrontendMessage) []byte {
		return append(append([]byte{}, startup...), encode(msgs...)...)
	}
	f.Add([]byte{}, []byte(nil))
	f.Add(startup, []byte(nil))
	f.Add(append(append([]byte{}, sslRequest...), startup...), []byte(nil))
	f.Add(after(&pgproto3.Query{String: "SELECT 1"}, &pgproto3.Terminate{}), []byte(nil))
	extended := after(&pgproto3.Parse{Name: "s", Query: "SELECT $1"}, &pgproto3.Bind{PreparedStatement: "s"},
		&pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{})
	f.Add(extended, []byte(nil))
	f.Add(after(&pgproto3.Query{String: "SELECT leaf_next('t', 3)"}, &pgproto3.Query{String: "SELECT leaf_decode(42)"},
		&pgproto3.Parse{Query: "SELECT leaf_next($1, $2)"}, &pgproto3.Bind{Parameters: [][]byte{[]byte("t"), []byte("2")}},
		&pgproto3.Execute{MaxRows: 1}, &pgproto3.Execute{}, &pgproto3.Sync{},
		&pgproto3.Parse{Query: "SELECT leaf_decode($1)"}, &pgproto3.Bind{Parameters: [][]byte{[]byte("7")}}, &pgproto3.Execute{}, &pgproto3.Sync{}), []byte(nil))
	f.Add(after(&pgproto3.Query{String: "COPY orders (item) FROM STDIN (FORMAT csv, HEADER)"},
		&pgproto3.CopyData{Data: []byte("item\n\"a\nb\",\r\n\\.\n")}, &pgproto3.CopyDone{}), []byte(nil))
	f.Add(append(append([]byte{}, startup...), 'Q', 0xff, 0xff, 0xff, 0xff), []byte(nil))
	f.Add(append(append([]byte{}, startup...), 'Q', 0, 0, 0, 2), []byte(nil))
	f.Add(append(append([]byte{}, startup...), 'd', 0, 0, 0, 100, 1, 2, 3), []byte(nil))
	f.Add([]byte{0, 0, 0, 16, 4, 210, 22, 46, 0, 0, 16, 146, 0, 0, 0, 1}, []byte(nil)) // CancelRequest
	f.Add([]byte{0, 0, 0, 8, 0, 2, 0, 0}, []byte(nil))                                 // protocol 2

	// The response side: what PostgreSQL answers, and what a broken or hostile server might.
	rfq := &pgproto3.ReadyForQuery{TxStatus: 'I'}
	int4Column := &pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("n"), DataTypeOID: 23, DataTypeSize: 4, TypeModifier: -1}}}
	query := after(&pgproto3.Query{String: "SELECT 1"}, &pgproto3.Terminate{})
	f.Add(query, serverScript(0, encodeBackend(int4Column, &pgproto3.DataRow{Values: [][]byte{[]byte("1")}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, rfq)))
	f.Add(query, serverScript(0, encodeBackend(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "42601", Message: "syntax error"}, rfq)))
	f.Add(query, serverScript(0, encodeBackend(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"})))
	f.Add(query, serverScript(0, encodeBackend(&pgproto3.NoticeResponse{Severity: "NOTICE", Code: "00000", Message: "hello"},
		&pgproto3.ParameterStatus{Name: "TimeZone", Value: "Europe/Paris"},
		&pgproto3.NotificationResponse{PID: 1, Channel: "c", Payload: "p"},
		&pgproto3.CommandComplete{CommandTag: []byte("LISTEN")}, rfq)))
	f.Add(query, serverScript(0, encodeBackend(&pgproto3.ReadyForQuery{TxStatus: 'X'})))
	f.Add(query, serverScript(0, []byte{'D', 0x7f, 0xff, 0xff, 0xff, 0, 1}))
	f.Add(query, serverScript(0, []byte{'Z', 0, 0, 0, 3}))
	f.Add(query, serverScript(0, encodeBackend(&pgproto3.CopyOutResponse{OverallFormat: 0, ColumnFormatCodes: []uint16{0}},
		&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}, &pgproto3.CommandComplete{CommandTag: []byte("COPY 1")}, rfq)))
	f.Add(after(&pgproto3.Query{String: "COPY t FROM STDIN"}, &pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}, &pgproto3.Terminate{}),
		serverScript(0, encodeBackend(&pgproto3.CopyInResponse{OverallFormat: 0, ColumnFormatCodes: []uint16{0}}), nil,
			encodeBackend(&pgproto3.CommandComplete{CommandTag: []byte("COPY 1")}, rfq)))
	f.Add(extended, serverScript(0, encodeBackend(&pgproto3.ParseComplete{}), encodeBackend(&pgproto3.BindComplete{}),
		encodeBackend(int4Column), encodeBackend(&pgproto3.DataRow{Values: [][]byte{[]byte("7")}}, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}),
		encodeBackend(rfq)))
	f.Add(extended, serverScript(0, encodeBackend(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "26000", Message: "no such statement"}), nil, nil, nil, encodeBackend(rfq)))
	filled := after(&pgproto3.Query{String: "INSERT INTO orders (item) VALUES ('x') RETURNING id"}, &pgproto3.Terminate{})
	f.Add(filled, serverScript(0, encodeBackend(
		&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("id"), DataTypeOID: 20, DataTypeSize: 8, TypeModifier: -1}}},
		&pgproto3.DataRow{Values: [][]byte{[]byte("1001")}}, &pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")}, rfq)))
	f.Add(filled, serverScript(0, encodeBackend(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "23505", Message: "duplicate key"}, rfq)))
	// The answer to the startup message itself.
	for _, answer := range [][]byte{
		encodeBackend(&pgproto3.AuthenticationCleartextPassword{}),
		encodeBackend(&pgproto3.AuthenticationMD5Password{Salt: [4]byte{1, 2, 3, 4}}),
		encodeBackend(&pgproto3.AuthenticationSASL{AuthMechanisms: []string{"SCRAM-SHA-256"}}),
		encodeBackend(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "28P01", Message: "password authentication failed"}),
		encodeBackend(&pgproto3.NegotiateProtocolVersion{NewestMinorProtocol: 0, UnrecognizedOptions: []string{"_pq_.x"}}),
		encodeBackend(&pgproto3.AuthenticationOk{}, &pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 1}}, rfq),
		encodeBackend(&pgproto3.AuthenticationOk{}, rfq),
		{'R', 0, 0, 0, 8, 0, 0, 0, 99},
		{'E', 0, 0, 0, 4},
	} {
		f.Add(query, serverScript(1, answer))
	}

	up := startFakeUpstream(f, false)
	upstream := "postgres://postgres@" + up.addr() + "/postgres"
	log, logged := test.NewNullLogger()
	limits := func(s *Server) {
		s.StartupTimeout = 2 * time.Second
		s.MaxMessageSize = 1 << 20
		s.Logger = log
	}
	rw, err := rewrite.New(rewrite.Settings{Fill: []rewrite.FillRule{{Table: "orders", Column: "id", Tag: "order"}}})
	if err != nil {
		f.Fatal(err)
	}
	rewriting := func(s *Server) { s.Rewriter, s.IDs = rw, &stubIDs{} }
	proxies := []*testProxy{
		startProxy(f, upstream, limits),
		startProxy(f, upstream, limits, rewriting),
		startProxy(f, upstream, limits, rewriting, func(s *Server) { s.GoroutineRelay = true }),
	}
	f.Fuzz(func(t *testing.T, client, server []byte) {
		up.setScript(server)
		defer up.setScript(nil)
		for _, p := range proxies {
			logged.Reset()
			fuzzOne(t, p, client)
			for _, e := range logged.AllEntries() {
				if v, ok := e.Data["panic"]; ok {
					t.Fatalf("the proxy panicked: %v", v)
				}
			}
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

// TestServerScriptReachesTheClient checks the fuzzer's fake server: a client through the
// proxy gets exactly the answer the script holds, so the fuzzed answers do reach the
// proxy's response side.
func TestServerScriptReachesTheClient(t *testing.T) {
	up := startFakeUpstream(t, false)
	up.setScript(serverScript(0, encodeBackend(
		&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("n"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1}}},
		&pgproto3.DataRow{Values: [][]byte{[]byte("from the script")}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})))
	p := startProxy(t, "postgres://postgres@"+up.addr()+"/postgres")
	ctx := testContext(t)
	conn, err := pgconn.Connect(ctx, "postgres://postgres@"+p.addr+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	results, err := conn.Exec(ctx, "SELECT 'anything'").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 1 || len(results[0].Rows) != 1 || string(results[0].Rows[0][0]) != "from the script" {
		t.Fatalf("the client got %+v, want the script's row", results)
	}
}
