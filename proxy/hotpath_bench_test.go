package proxy

import (
	"bufio"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/rewrite"
)

// cyclicReader returns the same bytes over and over, so that a benchmark can feed a
// session an endless stream of one exchange without allocating.
type cyclicReader struct {
	data []byte
	off  int
}

func (r *cyclicReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m := copy(p[n:], r.data[r.off:])
		n += m
		r.off = (r.off + m) % len(r.data)
	}
	return n, nil
}

// encodeAll encodes protocol messages back to back.
func encodeAll(tb testing.TB, msgs ...interface{ Encode([]byte) ([]byte, error) }) []byte {
	tb.Helper()
	var out []byte
	for _, m := range msgs {
		var err error
		if out, err = m.Encode(out); err != nil {
			tb.Fatal(err)
		}
	}
	return out
}

// hotPathConn is a session of a rewriting proxy (a fill rule, an ID source) whose client
// sends client over and over and whose upstream answers upstream over and over; what the
// session writes is discarded. Nothing but the session's own message handling runs.
func hotPathConn(tb testing.TB, client, upstream []byte) *conn {
	tb.Helper()
	rw, err := rewrite.New(rewrite.Settings{Fill: []rewrite.FillRule{{Table: "orders", Column: "id", Tag: "order"}}})
	if err != nil {
		tb.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	srv := &Server{Rewriter: rw, IDs: &stubIDs{}, Logger: log,
		OnRewrite: func(string) {}, OnError: func(string) {}}
	c := &conn{srv: srv, log: log}
	c.cr = msgReader{br: bufio.NewReaderSize(&cyclicReader{data: client}, readBufferSize), maxBody: defaultMaxBodySize}
	c.server = &serverConn{r: msgReader{br: bufio.NewReaderSize(&cyclicReader{data: upstream}, readBufferSize), maxBody: defaultMaxBodySize}}
	c.cw = bufio.NewWriterSize(io.Discard, writeBufferSize)
	c.server.w = bufio.NewWriterSize(io.Discard, writeBufferSize)
	c.singleGoroutine(true) // as an event loop serves it, the engine of the shipped binary
	return c
}

// relayExchange relays clientMsgs messages from the client and upstreamMsgs from the upstream.
func relayExchange(b testing.TB, c *conn, clientMsgs, upstreamMsgs int) {
	for range clientMsgs {
		if done, err := c.clientStep(); done || err != nil {
			b.Fatalf("client step: done %v, %v", done, err)
		}
	}
	for range upstreamMsgs {
		if done, err := c.upstreamStep(); done || err != nil {
			b.Fatalf("upstream step: done %v, %v", done, err)
		}
	}
}

// passExchange relays clientMsgs messages from the client and upstreamMsgs from the
// upstream as an event loop does: the messages that cross unchanged go out together
// (passClientRun, passUpstreamRun, relayRun), the others through their handlers.
func passExchange(b testing.TB, c *conn, clientMsgs, upstreamMsgs int) {
	for left := clientMsgs; left > 0; {
		// A loop has read the socket (whole) before it passes messages on.
		_, _ = c.cr.br.Peek(5)
		run, k, _ := c.passClientRun(left, &benchMemo)
		relayRun(&c.cr, c.server.w, run)
		if k > 0 {
			left -= k
			continue
		}
		if done, err := c.clientStep(); done || err != nil {
			b.Fatalf("client step: done %v, %v", done, err)
		}
		left--
	}
	for left := upstreamMsgs; left > 0; {
		_, _ = c.server.r.br.Peek(5)
		run, k := c.passUpstreamRun(left)
		c.cwMu.Lock()
		relayRun(&c.server.r, c.cw, run)
		c.cwMu.Unlock()
		if k > 0 {
			left -= k
			continue
		}
		if done, err := c.upstreamStep(); done || err != nil {
			b.Fatalf("upstream step: done %v, %v", done, err)
		}
		left--
	}
}

// benchMemo is passExchange's plainMemo, as an event loop's.
var benchMemo plainMemo

// exchangeFunc is relayExchange or passExchange.
type exchangeFunc func(b testing.TB, c *conn, clientMsgs, upstreamMsgs int)

// selectOneResponse is the server's answer to pgbench -S's SELECT, without the messages
// that open it (RowDescription or BindComplete).
func selectOneResponse() []interface{ Encode([]byte) ([]byte, error) } {
	return []interface{ Encode([]byte) ([]byte, error) }{
		&pgproto3.DataRow{Values: [][]byte{[]byte("12345")}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	}
}

// BenchmarkHotPathQuery is a simple-protocol Query that needs no rewrite (pgbench -S -M
// simple) through a rewriting session: the Query, then RowDescription, DataRow,
// CommandComplete and ReadyForQuery. It should allocate nothing.
func BenchmarkHotPathQuery(b *testing.B) { benchHotPathQuery(b, relayExchange) }

// BenchmarkHotPathQueryLoop is BenchmarkHotPathQuery as an event loop relays it.
func BenchmarkHotPathQueryLoop(b *testing.B) { benchHotPathQuery(b, passExchange) }

func benchHotPathQuery(b *testing.B, relayExchange exchangeFunc) {
	const sql = "SELECT abalance FROM pgbench_accounts WHERE aid = 48213;"
	client := encodeAll(b, &pgproto3.Query{String: sql})
	upstream := encodeAll(b, append([]interface{ Encode([]byte) ([]byte, error) }{
		&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("abalance"), DataTypeOID: 23, DataTypeSize: 4, TypeModifier: -1}}},
	}, selectOneResponse()...)...)
	c := hotPathConn(b, client, upstream)
	relayExchange(b, c, 1, 4) // warm the buffers and caches
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		relayExchange(b, c, 1, 4)
	}
}

// BenchmarkHotPathBindExecute is an execution of a prepared statement that needs no
// rewrite (pgbench -S -M prepared) through a rewriting session: Bind, Execute and Sync,
// then BindComplete, DataRow, CommandComplete and ReadyForQuery. It should allocate
// nothing.
func BenchmarkHotPathBindExecute(b *testing.B) { benchHotPathBindExecute(b, relayExchange) }

// BenchmarkHotPathBindExecuteLoop is BenchmarkHotPathBindExecute as an event loop relays
// it.
func BenchmarkHotPathBindExecuteLoop(b *testing.B) { benchHotPathBindExecute(b, passExchange) }

func benchHotPathBindExecute(b *testing.B, relayExchange exchangeFunc) {
	const sql = "SELECT abalance FROM pgbench_accounts WHERE aid = $1;"
	prepare := encodeAll(b,
		&pgproto3.Parse{Name: "P0_1", Query: sql, ParameterOIDs: []uint32{23}},
		&pgproto3.Sync{})
	prepared := encodeAll(b, &pgproto3.ParseComplete{}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	client := encodeAll(b,
		&pgproto3.Bind{PreparedStatement: "P0_1", ParameterFormatCodes: []int16{0}, Parameters: [][]byte{[]byte("48213")}},
		&pgproto3.Execute{},
		&pgproto3.Sync{})
	upstream := encodeAll(b, append([]interface{ Encode([]byte) ([]byte, error) }{&pgproto3.BindComplete{}}, selectOneResponse()...)...)
	// The stream starts with the Parse and its answer, then repeats the execution.
	c := hotPathConn(b, prepare, prepared)
	relayExchange(b, c, 2, 2)
	c.cr.br.Reset(&cyclicReader{data: client})
	c.server.r.br.Reset(&cyclicReader{data: upstream})
	relayExchange(b, c, 3, 4)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		relayExchange(b, c, 3, 4)
	}
}

// BenchmarkHotPathExtended is pgbench -S -M extended through a rewriting session: an
// unnamed Parse, Bind, Describe, Execute and Sync of a statement that needs no rewrite,
// then ParseComplete, BindComplete, RowDescription, DataRow, CommandComplete and
// ReadyForQuery.
func BenchmarkHotPathExtended(b *testing.B) { benchHotPathExtended(b, relayExchange) }

// BenchmarkHotPathExtendedLoop is BenchmarkHotPathExtended as an event loop relays it.
func BenchmarkHotPathExtendedLoop(b *testing.B) { benchHotPathExtended(b, passExchange) }

func benchHotPathExtended(b *testing.B, relayExchange exchangeFunc) {
	const sql = "SELECT abalance FROM pgbench_accounts WHERE aid = $1;"
	client := encodeAll(b,
		&pgproto3.Parse{Query: sql, ParameterOIDs: []uint32{23}},
		&pgproto3.Bind{ParameterFormatCodes: []int16{0}, Parameters: [][]byte{[]byte("48213")}},
		&pgproto3.Describe{ObjectType: 'P'},
		&pgproto3.Execute{},
		&pgproto3.Sync{})
	upstream := encodeAll(b, append([]interface{ Encode([]byte) ([]byte, error) }{
		&pgproto3.ParseComplete{}, &pgproto3.BindComplete{},
		&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("abalance"), DataTypeOID: 23, DataTypeSize: 4, TypeModifier: -1}}},
	}, selectOneResponse()...)...)
	c := hotPathConn(b, client, upstream)
	relayExchange(b, c, 5, 6)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		relayExchange(b, c, 5, 6)
	}
}
