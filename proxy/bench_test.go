package proxy

import (
	"bufio"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/rewrite"
)

// BenchmarkQueryRoundTrip measures one simple-query round trip through the proxy in front
// of the fake upstream, so that the figure is the proxy's cost plus loopback latency.
// Compare with the "direct" case, which skips the proxy.
func BenchmarkQueryRoundTrip(b *testing.B) {
	rw, err := rewrite.New(rewrite.Settings{Fill: []rewrite.FillRule{{Table: "orders", Column: "id", Tag: "order"}}})
	if err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name      string
		sql       string
		direct    bool
		configure func(*Server)
	}{
		{"direct", "SELECT 1", true, nil},
		{"pass-through", "SELECT 1", false, func(*Server) {}},
		{"rewriting", "SELECT 1", false, func(s *Server) { s.Rewriter, s.IDs = rw, &stubIDs{} }},
		{"fast path", "SELECT leaf_next('order')", false, func(s *Server) { s.Rewriter, s.IDs = rw, &stubIDs{} }},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			up := startFakeUpstream(b, false)
			addr := up.addr()
			if !bc.direct {
				addr = startProxy(b, "postgres://postgres@"+up.addr()+"/postgres", bc.configure).addr
			}
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			if err := awaitReady(c, startupPacket(map[string]string{"user": "postgres"})); err != nil {
				b.Fatal(err)
			}
			query, _ := (&pgproto3.Query{String: bc.sql}).Encode(nil)
			fe := pgproto3.NewFrontend(bufio.NewReader(c), c)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(query); err != nil {
					b.Fatal(err)
				}
				for {
					msg, err := fe.Receive()
					if err != nil {
						b.Fatal(err)
					}
					if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
						break
					}
				}
			}
		})
	}
}

// BenchmarkCopyFiller measures the key filling of a binary COPY stream: rows of an order
// as pgx encodes them (text, int4, a 40-byte bytea), in 64 KiB messages as pgx sends
// them, with IDs from a counter. It reports rows per second and the stream's MB/s.
func BenchmarkCopyFiller(b *testing.B) {
	row := binaryTuple{[]byte("item 123456"), []byte{0, 1, 226, 64}, make([]byte, 40)}
	tuples := make([]binaryTuple, 1000)
	for i := range tuples {
		tuples[i] = row
	}
	stream := encodeCopy(nil, tuples, false)
	b.SetBytes(int64(len(stream)))
	f := copyFiller{keys: []rewrite.Slot{{Kind: rewrite.SlotTag, Tag: "order"}}, nextID: counter(0)}
	out := make([]byte, 0, 80<<10)
	b.ResetTimer()
	for range b.N {
		for in := stream; len(in) > 0; {
			n := min(64<<10, len(in))
			var err error
			if out, err = f.feed(out[:0], in[:n]); err != nil {
				b.Fatal(err)
			}
			in = in[n:]
		}
		f.state = copyHeader
	}
	b.ReportMetric(float64(b.N*len(tuples))/b.Elapsed().Seconds(), "rows/s")
}
