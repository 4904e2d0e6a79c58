package proxy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/rewrite"
)

// copyTextStream returns n rows of an order in the text or CSV format, with a quoted
// field in CSV, as psql sends a file.
func copyTextStream(n int, csv bool) []byte {
	var b bytes.Buffer
	for i := range n {
		if csv {
			fmt.Fprintf(&b, "\"item %d, blue\",%d,\"a note of some length, \"\"quoted\"\"\"\n", i, i%1000)
		} else {
			fmt.Fprintf(&b, "item %d\\tblue\t%d\ta note of some length, \\\\ escaped\n", i, i%1000)
		}
	}
	return b.Bytes()
}

// BenchmarkTextFiller measures the key filling of a text and a CSV COPY stream in 64 KiB
// messages, with IDs from a counter: the stream's MB/s.
func BenchmarkTextFiller(b *testing.B) {
	for _, csv := range []bool{false, true} {
		name := map[bool]string{false: "text", true: "csv"}[csv]
		b.Run(name, func(b *testing.B) {
			stream := copyTextStream(10000, csv)
			format := textFormat
			if csv {
				format = csvFormat
			}
			fill := &rewrite.CopyFill{Format: format, Columns: []string{"id"}, Keys: []rewrite.Slot{{Kind: rewrite.SlotTag, Tag: "order"}}}
			out := make([]byte, 0, 80<<10)
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				f := newTextFiller(fill, counter(0))
				for in := stream; len(in) > 0; {
					n := min(64<<10, len(in))
					var err error
					if out, err = f.feed(out[:0], in[:n]); err != nil {
						b.Fatal(err)
					}
					in = in[n:]
				}
			}
		})
	}
}

// BenchmarkCopyTextThroughProxy loads text and CSV data through a rewriting proxy into a
// table whose key the proxy fills, and the same data through the same proxy into a table
// whose bigserial key the server fills: MB/s of client data for each. The ratio is the
// cost of filling (README: ≥ 0.9× is the target).
func BenchmarkCopyTextThroughProxy(b *testing.B) {
	db := os.Getenv("LEAF_TEST_PG")
	if db == "" {
		b.Skip("LEAF_TEST_PG is not set")
	}
	db = testenv.NewDatabase(b)
	rw, err := rewrite.New(rewrite.Settings{Fill: []rewrite.FillRule{{Table: "orders", Column: "id", Tag: "order"}}})
	if err != nil {
		b.Fatal(err)
	}
	p := startProxy(b, db, func(s *Server) { s.Rewriter, s.IDs = rw, &stubIDs{} })
	ctx := context.Background()
	conn, err := pgconn.Connect(ctx, p.url(db))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, sql := range []string{
		"CREATE UNLOGGED TABLE orders (id int8 PRIMARY KEY, item text, qty int4, note text)",
		"CREATE UNLOGGED TABLE serial_orders (id bigserial PRIMARY KEY, item text, qty int4, note text)",
	} {
		if err := conn.Exec(ctx, sql).Close(); err != nil {
			b.Fatal(err)
		}
	}
	for _, csv := range []bool{false, true} {
		stream := copyTextStream(20000, csv)
		options := ""
		if csv {
			options = " (FORMAT csv)"
		}
		for _, table := range []string{"orders", "serial_orders"} {
			name := map[bool]string{false: "text", true: "csv"}[csv] + "/" + map[string]string{"orders": "filled", "serial_orders": "unfilled"}[table]
			b.Run(name, func(b *testing.B) {
				b.SetBytes(int64(len(stream)))
				for range b.N {
					b.StopTimer()
					if err := conn.Exec(ctx, "TRUNCATE "+table).Close(); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					tag, err := conn.CopyFrom(ctx, bytes.NewReader(stream), "COPY "+table+" (item, qty, note) FROM STDIN"+options)
					if err != nil || !strings.HasSuffix(tag.String(), " 20000") {
						b.Fatalf("%v %v", tag, err)
					}
				}
			})
		}
	}
}
