package proxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// msgCount counts the protocol messages in stream.
func msgCount(stream []byte) int {
	n := 0
	for len(stream) >= 5 {
		stream = stream[1+binary.BigEndian.Uint32(stream[1:]):]
		n++
	}
	return n
}

// passedSession is the outcome of relaying a client's messages and then the server's
// answers through a rewriting session: what each side was sent, and the session's
// bookkeeping afterwards.
type passedSession struct {
	toServer, toClient []byte
	books              bookkeeping
}

// bookkeeping is what a session remembers of its exchanges.
type bookkeeping struct {
	pending    int64
	txStatus   uint32
	cycles     int
	open       bool
	statements int
	unnamedGen uint64
	local      bool
}

// relayThrough relays client, then upstream, through a new session with exchange: a
// rewriting session, or one of a proxy without fill rules or ID functions (no
// Rewriter) when rewriting is false.
func relayThrough(t *testing.T, exchange exchangeFunc, client, upstream []byte, rewriting bool) passedSession {
	t.Helper()
	c := hotPathConn(t, nil, nil)
	if !rewriting {
		c.srv.Rewriter = nil
	}
	c.server.txStatus.Store(txIdle) // as after the startup's ReadyForQuery
	var toServer, toClient bytes.Buffer
	c.cr.br = bufio.NewReaderSize(bytes.NewReader(client), readBufferSize)
	c.server.r.br = bufio.NewReaderSize(bytes.NewReader(upstream), readBufferSize)
	c.cw = bufio.NewWriterSize(&toClient, writeBufferSize)
	c.server.w = bufio.NewWriterSize(&toServer, writeBufferSize)
	exchange(t, c, msgCount(client), msgCount(upstream))
	_ = c.cw.Flush()
	_ = c.server.w.Flush()
	ss := &c.sess
	return passedSession{toServer: toServer.Bytes(), toClient: toClient.Bytes(), books: bookkeeping{
		pending: c.pending.Load(), txStatus: c.server.txStatus.Load(),
		cycles: len(ss.queue), open: ss.cur != nil, statements: len(ss.stmts),
		unnamedGen: ss.unnamedGen, local: ss.local != nil || ss.localStmt != nil,
	}}
}

// TestPassedMessagesAsHandled relays exchanges through a session twice, once
// through the handler of each message (as goroutines do) and once as an event loop does,
// where the runs of messages that cross unchanged go out together (passClientRun,
// passUpstreamRun): both must send the same bytes each way and leave the same bookkeeping.
// The exchanges mix messages that may pass with ones that need their handler in the
// middle of a run: a Query to rewrite, a leaf_next answered by the proxy, the server's
// ParameterStatus, notice and error. The exchanges the proxy takes no part in run through
// a session without a Rewriter too, whose pass keeps a bookkeeping of its own.
func TestPassedMessagesAsHandled(t *testing.T) {
	type encoder = interface{ Encode([]byte) ([]byte, error) }
	rowDesc := &pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("abalance"), DataTypeOID: 23, DataTypeSize: 4, TypeModifier: -1}}}
	row := &pgproto3.DataRow{Values: [][]byte{[]byte("12345")}}
	selected := &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}
	inserted := &pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")}
	idle := &pgproto3.ReadyForQuery{TxStatus: 'I'}
	inTx := &pgproto3.ReadyForQuery{TxStatus: 'T'}
	const plain = "SELECT abalance FROM pgbench_accounts WHERE aid = 1"
	const param = "SELECT abalance FROM pgbench_accounts WHERE aid = $1"
	for _, tc := range []struct {
		name             string
		client, upstream []encoder
		rewrites         bool // the proxy rewrites or answers some of it: rewriting sessions only
	}{
		{"simple queries",
			[]encoder{&pgproto3.Query{String: plain}, &pgproto3.Query{String: "BEGIN"}, &pgproto3.Query{String: plain}},
			[]encoder{rowDesc, row, selected, idle, &pgproto3.CommandComplete{CommandTag: []byte("BEGIN")}, inTx, rowDesc, row, selected, inTx}, false},
		{"a query to rewrite between plain ones",
			[]encoder{&pgproto3.Query{String: plain}, &pgproto3.Query{String: "INSERT INTO orders (item) VALUES ('book')"}, &pgproto3.Query{String: plain}},
			[]encoder{rowDesc, row, selected, idle, inserted, idle, rowDesc, row, selected, idle}, true},
		{"a leaf_next the proxy answers between plain queries",
			[]encoder{&pgproto3.Query{String: plain}, &pgproto3.Query{String: "SELECT leaf_next('order')"}, &pgproto3.Query{String: plain}},
			[]encoder{rowDesc, row, selected, idle, rowDesc, row, selected, idle, rowDesc, row, selected, idle}, true},
		{"a leaf_next the proxy answers, then a plain cycle",
			[]encoder{&pgproto3.Parse{Query: "SELECT leaf_next('order')"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
				&pgproto3.Parse{Query: param, ParameterOIDs: []uint32{23}},
				&pgproto3.Bind{ParameterFormatCodes: []int16{0}, Parameters: [][]byte{[]byte("1")}},
				&pgproto3.Execute{}, &pgproto3.Sync{}, &pgproto3.Query{String: plain}},
			[]encoder{&pgproto3.ParseComplete{}, &pgproto3.BindComplete{}, row, selected, idle, rowDesc, row, selected, idle}, true},
		{"a statement the proxy parsed, then materialized at the server",
			[]encoder{&pgproto3.Parse{Query: "SELECT leaf_next('order')"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
				&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Parse{Name: "s2", Query: param}, &pgproto3.Sync{},
				&pgproto3.Query{String: plain}},
			[]encoder{&pgproto3.ParseComplete{}, &pgproto3.BindComplete{}, row, selected, &pgproto3.ParseComplete{}, idle,
				rowDesc, row, selected, idle}, true},
		{"prepared statement",
			[]encoder{&pgproto3.Parse{Name: "P0_1", Query: param, ParameterOIDs: []uint32{23}}, &pgproto3.Sync{},
				&pgproto3.Bind{PreparedStatement: "P0_1", ParameterFormatCodes: []int16{0}, Parameters: [][]byte{[]byte("1")}},
				&pgproto3.Execute{}, &pgproto3.Sync{},
				&pgproto3.Bind{PreparedStatement: "P0_1", ParameterFormatCodes: []int16{0}, Parameters: [][]byte{[]byte("2")}},
				&pgproto3.Describe{ObjectType: 'S', Name: "P0_1"}, &pgproto3.Execute{}, &pgproto3.Flush{}, &pgproto3.Sync{}},
			[]encoder{&pgproto3.ParseComplete{}, idle,
				&pgproto3.BindComplete{}, row, selected, idle,
				&pgproto3.BindComplete{}, &pgproto3.ParameterDescription{ParameterOIDs: []uint32{23}}, rowDesc, row, selected, idle}, false},
		{"unnamed statements, the second answered by the proxy",
			[]encoder{&pgproto3.Parse{Query: param, ParameterOIDs: []uint32{23}},
				&pgproto3.Bind{ParameterFormatCodes: []int16{0}, Parameters: [][]byte{[]byte("1")}},
				&pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{},
				&pgproto3.Parse{Query: "SELECT leaf_next('order')"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
				&pgproto3.Parse{Query: param, ParameterOIDs: []uint32{23}},
				&pgproto3.Bind{ParameterFormatCodes: []int16{0}, Parameters: [][]byte{[]byte("2")}},
				&pgproto3.Execute{}, &pgproto3.Sync{}},
			[]encoder{&pgproto3.ParseComplete{}, &pgproto3.BindComplete{}, rowDesc, row, selected, idle,
				&pgproto3.ParseComplete{}, &pgproto3.BindComplete{}, row, selected, idle,
				&pgproto3.ParseComplete{}, &pgproto3.BindComplete{}, row, selected, idle}, true},
		{"server messages that need their handler in a run",
			[]encoder{&pgproto3.Query{String: plain}, &pgproto3.Query{String: plain}, &pgproto3.Query{String: plain}},
			[]encoder{rowDesc, &pgproto3.NoticeResponse{Severity: "NOTICE", Code: "00000", Message: "hello"}, row,
				&pgproto3.ParameterStatus{Name: "TimeZone", Value: "UTC"}, row, selected, idle,
				&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "42P01", Message: "no such table"}, idle,
				rowDesc, row, selected, idle}, false},
	} {
		for _, rewriting := range []bool{true, false} {
			if tc.rewrites && !rewriting {
				continue
			}
			name := tc.name
			if !rewriting {
				name += ", no rewriter"
			}
			t.Run(name, func(t *testing.T) {
				client, upstream := encodeAll(t, tc.client...), encodeAll(t, tc.upstream...)
				handled := relayThrough(t, relayExchange, client, upstream, rewriting)
				passed := relayThrough(t, passExchange, client, upstream, rewriting)
				if !bytes.Equal(passed.toServer, handled.toServer) {
					t.Errorf("to the server:\npassed  %q\nhandled %q", passed.toServer, handled.toServer)
				}
				if !bytes.Equal(passed.toClient, handled.toClient) {
					t.Errorf("to the client:\npassed  %q\nhandled %q", passed.toClient, handled.toClient)
				}
				if passed.books != handled.books {
					t.Errorf("bookkeeping: passed %+v, handled %+v", passed.books, handled.books)
				}
				if b := handled.books; b.pending != 0 || b.cycles != 0 {
					t.Errorf("after every answer: %d ReadyForQuery pending, %d cycles", b.pending, b.cycles)
				}
			})
		}
	}
}
