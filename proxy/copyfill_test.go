package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/rewrite"
)

// binaryTuple is a tuple of a COPY BINARY stream; a nil field is NULL.
type binaryTuple [][]byte

// encodeCopy writes a COPY BINARY stream: header (with ext bytes of header extension),
// tuples and, when trailer is set, the trailer.
func encodeCopy(ext []byte, tuples []binaryTuple, trailer bool) []byte {
	b := append([]byte(nil), copySignature...)
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(ext)))
	b = append(b, ext...)
	for _, t := range tuples {
		b = binary.BigEndian.AppendUint16(b, uint16(len(t)))
		for _, f := range t {
			if f == nil {
				b = binary.BigEndian.AppendUint32(b, 0xffffffff)
				continue
			}
			b = binary.BigEndian.AppendUint32(b, uint32(len(f)))
			b = append(b, f...)
		}
	}
	if trailer {
		b = binary.BigEndian.AppendUint16(b, 0xffff)
	}
	return b
}

// int8Field is the binary form of an int8.
func int8Field(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }

// counter hands out IDs 1, 2, … for a copyFiller, and fails at failAt when set.
func counter(failAt int64) func(rewrite.Slot) (int64, error) {
	var n int64
	return func(rewrite.Slot) (int64, error) {
		n++
		if n == failAt {
			return 0, errors.New("no ID at hand")
		}
		return n, nil
	}
}

// fill runs a stream through a copyFiller with k keys, cut into pieces of size step.
func fill(in []byte, k, step int, next func(rewrite.Slot) (int64, error)) ([]byte, error) {
	f := copyFiller{keys: make([]rewrite.Slot, k), nextID: next}
	var out []byte
	for len(in) > 0 {
		n := min(step, len(in))
		var err error
		if out, err = f.feed(out, in[:n]); err != nil {
			return out, err
		}
		in = in[n:]
	}
	return out, nil
}

// TestCopyFiller appends keys to every tuple of a stream with a header extension, NULL
// and empty fields, a tuple without fields and a large field, however the stream is cut
// into messages.
func TestCopyFiller(t *testing.T) {
	big := bytes.Repeat([]byte("z"), 70000)
	tuples := []binaryTuple{
		{[]byte("book"), int8Field(3)},
		{nil, []byte{}},
		{},
		{big, nil},
	}
	in := encodeCopy([]byte("ext!"), tuples, true)
	for _, k := range []int{1, 2} {
		want := make([]binaryTuple, len(tuples))
		id := int64(0)
		for i, tu := range tuples {
			want[i] = append(binaryTuple{}, tu...)
			for range k {
				id++
				want[i] = append(want[i], int8Field(id))
			}
		}
		wantOut := encodeCopy([]byte("ext!"), want, true)
		for _, step := range []int{1, 2, 3, 5, 19, 20, 64, 4096, len(in)} {
			out, err := fill(in, k, step, counter(0))
			if err != nil {
				t.Fatalf("%d keys, pieces of %d: %v", k, step, err)
			}
			if !bytes.Equal(out, wantOut) {
				t.Fatalf("%d keys, pieces of %d: output differs from the stream with keys", k, step)
			}
		}
	}
	// Without a trailer (the server accepts the end of the data instead).
	out, err := fill(encodeCopy(nil, tuples[:1], false), 1, 7, counter(0))
	if err != nil || !bytes.Equal(out, encodeCopy(nil, []binaryTuple{{[]byte("book"), int8Field(3), int8Field(1)}}, false)) {
		t.Fatalf("without a trailer: %v", err)
	}
}

// TestCopyFillerRefuses stops at what it cannot read as COPY BINARY, and when an ID
// cannot be had.
func TestCopyFillerRefuses(t *testing.T) {
	good := encodeCopy(nil, []binaryTuple{{[]byte("a")}, {[]byte("b")}}, true)
	oids := append([]byte(nil), good...)
	binary.BigEndian.PutUint32(oids[11:], copyHasOIDs)
	negative := encodeCopy(nil, nil, false)
	negative = binary.BigEndian.AppendUint16(negative, 1)
	negative = binary.BigEndian.AppendUint32(negative, 0xfffffffe) // -2
	tests := []struct {
		name string
		in   []byte
		next func(rewrite.Slot) (int64, error)
	}{
		{"CSV", []byte("book,3\npen,4\n" + strings.Repeat("x", 20)), counter(0)},
		{"tuples with OIDs", oids, counter(0)},
		{"negative field length", negative, counter(0)},
		{"negative field count", append(encodeCopy(nil, nil, false), 0xff, 0xfe), counter(0)},
		{"no ID for the second tuple", good, counter(2)},
	}
	for _, tt := range tests {
		if _, err := fill(tt.in, 1, 3, tt.next); err == nil {
			t.Errorf("%s: no error", tt.name)
		}
	}
}

// FuzzCopyFiller feeds arbitrary streams in two pieces: the filler must not panic, and
// where it cuts the stream must not change what it makes of it.
func FuzzCopyFiller(f *testing.F) {
	f.Add(encodeCopy([]byte("x"), []binaryTuple{{[]byte("book"), nil}, {}}, true), 7)
	f.Add(encodeCopy(nil, []binaryTuple{{bytes.Repeat([]byte("y"), 300)}}, false), 100)
	f.Add([]byte("PGCOPY\n\xff\r\n\x00"), 3)
	f.Fuzz(func(t *testing.T, in []byte, cut int) {
		whole, errWhole := fill(in, 1, len(in)+1, counter(0))
		if cut < 0 {
			cut = -cut
		}
		cut = cut%(len(in)+1) + 1
		split, errSplit := fill(in, 1, cut, counter(0))
		if (errWhole == nil) != (errSplit == nil) || (errWhole == nil && !bytes.Equal(whole, split)) {
			t.Fatalf("whole: %v; in pieces of %d: %v, or different output", errWhole, cut, errSplit)
		}
	})
}

// TestCopyFromFillsKeys loads rows with pgx's CopyFrom, which sends COPY BINARY, into a
// filled table without the key column: every row gets its own ID, over an event loop
// and over goroutines, a row over 1 MiB included.
func TestCopyFromFillsKeys(t *testing.T) {
	db := testenv.NewDatabase(t)
	for _, relay := range []bool{false, true} {
		t.Run(fmt.Sprintf("goroutine relay %v", relay), func(t *testing.T) {
			p, ids := rewritingProxy(t, db, func(s *Server) { s.GoroutineRelay = relay })
			ctx := testContext(t)
			conn := connect(t, p.url(db))
			if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS orders; CREATE TABLE orders (id int8 PRIMARY KEY, item text NOT NULL, qty int4, note bytea)"); err != nil {
				t.Fatal(err)
			}
			const rows = 100000
			big := bytes.Repeat([]byte("n"), 3<<20)
			n, err := conn.CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"item", "qty", "note"},
				pgx.CopyFromSlice(rows, func(i int) ([]any, error) {
					var note []byte
					switch {
					case i == 777:
						note = big
					case i%3 == 0:
						note = []byte(fmt.Sprint(i))
					}
					return []any{fmt.Sprintf("item %d", i), int32(i), note}, nil
				}))
			if err != nil || n != rows {
				t.Fatalf("CopyFrom: %d rows, %v", n, err)
			}
			var count, distinct, bigLen int64
			var badRows int
			if err := conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT id),
				count(*) FILTER (WHERE item <> 'item ' || qty OR (qty % 3 = 0 AND qty <> 777 AND note <> convert_to(qty::text, 'UTF8')))
				FROM orders`).Scan(&count, &distinct, &badRows); err != nil {
				t.Fatal(err)
			}
			if err := conn.QueryRow(ctx, "SELECT length(note) FROM orders WHERE qty = 777").Scan(&bigLen); err != nil {
				t.Fatal(err)
			}
			if count != rows || distinct != rows || badRows != 0 || bigLen != int64(len(big)) {
				t.Fatalf("%d rows, %d distinct IDs, %d rows not as sent, large note of %d bytes", count, distinct, badRows, bigLen)
			}
			var minID, maxID int64
			if err := conn.QueryRow(ctx, "SELECT min(id), max(id) FROM orders").Scan(&minID, &maxID); err != nil {
				t.Fatal(err)
			}
			if issued := ids.issued("order"); minID <= 1000 || maxID > 1000+issued || issued != rows {
				t.Fatalf("IDs %d…%d, %d issued for tag order", minID, maxID, issued)
			}
			// A COPY that names the key column passes untouched.
			if _, err := conn.CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"id", "item"},
				pgx.CopyFromRows([][]any{{int64(-5), "keyed"}})); err != nil {
				t.Fatal(err)
			}
			var item string
			if err := conn.QueryRow(ctx, "SELECT item FROM orders WHERE id = -5").Scan(&item); err != nil || item != "keyed" {
				t.Fatalf("keyed row: %q, %v", item, err)
			}
		})
	}
}

// TestCopyFromFailures fails a filled COPY three ways: the client gives up (CopyFail), an
// ID cannot be had (the proxy fails the COPY and reports the ID source's SQLSTATE), and
// the server refuses a row. Nothing of the COPY is kept, and the session goes on.
func TestCopyFromFailures(t *testing.T) {
	url, direct := refusalProxy(t)
	ctx := testContext(t)
	conn := connect(t, url)
	tests := []struct {
		name    string
		table   string
		src     pgx.CopyFromSource
		code    string // SQLSTATE of the error
		message string // in the error's message
	}{
		{"client gives up", "orders", pgx.CopyFromFunc(func() func() ([]any, error) {
			i := 0
			return func() ([]any, error) {
				if i++; i > 1000 {
					return nil, errors.New("the source broke")
				}
				return []any{"row"}, nil
			}
		}()), "57014", "the source broke"},
		{"no ID for the tag", "lost", pgx.CopyFromRows([][]any{{"a"}, {"b"}}), "42704", ""},
		{"row refused by the server", "orders", pgx.CopyFromRows([][]any{{"a"}, {nil}}), "23502", ""},
	}
	for _, tt := range tests {
		_, err := conn.CopyFrom(ctx, pgx.Identifier{tt.table}, []string{"item"}, tt.src)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != tt.code || !strings.Contains(pgErr.Message, tt.message) {
			t.Fatalf("%s: %v, want SQLSTATE %s and %q", tt.name, err, tt.code, tt.message)
		}
		var n int
		if err := conn.QueryRow(ctx, "SELECT 41 + 1").Scan(&n); err != nil || n != 42 {
			t.Fatalf("%s: the session after the failed COPY: %d, %v", tt.name, n, err)
		}
	}
	var kept int
	if err := direct.QueryRow(context.Background(), "SELECT (SELECT count(*) FROM orders) + (SELECT count(*) FROM lost)").Scan(&kept); err != nil || kept != 0 {
		t.Fatalf("%d rows kept, %v", kept, err)
	}
}

// ordersProxy starts a proxy that fills orders.id, in front of a fresh database whose
// orders table has the given columns besides the key; it returns the database's URL, the
// proxy and a direct connection.
func ordersProxy(t *testing.T, columns string) (string, *testProxy, *pgx.Conn) {
	t.Helper()
	db := testenv.NewDatabase(t)
	p, _ := rewritingProxy(t, db)
	direct := connect(t, db)
	if _, err := direct.Exec(testContext(t), "CREATE TABLE orders (id int8 PRIMARY KEY, "+columns+")"); err != nil {
		t.Fatal(err)
	}
	return db, p, direct
}

// startCopy sends a COPY … FROM STDIN and returns the CopyInResponse that answers it.
func startCopy(t *testing.T, fe *pgproto3.Frontend, sql string) *pgproto3.CopyInResponse {
	t.Helper()
	fe.Send(&pgproto3.Query{String: sql})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	msg, err := fe.Receive()
	if err != nil {
		t.Fatal(err)
	}
	in, ok := msg.(*pgproto3.CopyInResponse)
	if !ok {
		t.Fatalf("got %#v, want CopyInResponse", msg)
	}
	return in
}

// untilReady flushes what fe holds and returns the summaries of the responses up to the
// n-th ReadyForQuery.
func untilReady(t *testing.T, fe *pgproto3.Frontend, n int) string {
	t.Helper()
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for ready := 0; ready < n; {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		got = append(got, summarize(msg))
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			ready++
		}
	}
	return strings.Join(got, " ")
}

// TestCopyInResponseShowsClientColumns checks what a client sees of a filled COPY on the
// wire: a CopyInResponse with the columns it listed (the server's has the key too), and
// the server's count of the rows loaded.
func TestCopyInResponseShowsClientColumns(t *testing.T) {
	db, p, direct := ordersProxy(t, "item text, qty int4")
	fe := rawConn(t, p.url(db))
	in := startCopy(t, fe, "COPY orders (item, qty) FROM STDIN (FORMAT binary)")
	if in.OverallFormat != 1 || len(in.ColumnFormatCodes) != 2 {
		t.Fatalf("got %#v, want a binary CopyInResponse of 2 columns", in)
	}
	data := encodeCopy(nil, []binaryTuple{{[]byte("pen"), []byte{0, 0, 0, 2}}, {nil, nil}}, true)
	fe.Send(&pgproto3.CopyData{Data: data[:10]})
	fe.Send(&pgproto3.CopyData{Data: data[10:]})
	fe.Send(&pgproto3.CopyDone{})
	if got := untilReady(t, fe, 1); got != "complete:COPY 2 ready" {
		t.Fatalf("after the data: %s", got)
	}
	var rows, keyed int
	if err := direct.QueryRow(testContext(t), "SELECT count(*), count(id) FROM orders").Scan(&rows, &keyed); err != nil || rows != 2 || keyed != 2 {
		t.Fatalf("%d rows, %d with a key, %v", rows, keyed, err)
	}
}

// TestCopyFillRefusedInExtendedProtocol refuses a filled COPY sent through Parse: the
// proxy fills keys only in a COPY sent as a simple query.
func TestCopyFillRefusedInExtendedProtocol(t *testing.T) {
	db, p, _ := ordersProxy(t, "item text")
	fe := rawConn(t, p.url(db))
	got := strings.Join(exchange(t, fe,
		&pgproto3.Parse{Query: "COPY orders (item) FROM STDIN (FORMAT binary)"}, &pgproto3.Sync{},
		&pgproto3.Query{String: "SELECT 1"}), " ")
	if !strings.HasPrefix(got, "error:0A000 ready") || !strings.HasSuffix(got, "complete:SELECT 1 ready") {
		t.Fatalf("got %s", got)
	}
}

// TestCopyFillFailsOnTextData sends text-format data to a filled binary COPY: the proxy
// fails the COPY with 22P04, nothing is kept, and the session goes on.
func TestCopyFillFailsOnTextData(t *testing.T) {
	db, p, direct := ordersProxy(t, "item text")
	fe := rawConn(t, p.url(db))
	startCopy(t, fe, "COPY orders (item) FROM STDIN (FORMAT binary)")
	fe.Send(&pgproto3.CopyData{Data: []byte("book\npen\nlamp, with a longer line than a binary header\n")})
	fe.Send(&pgproto3.CopyDone{})
	fe.Send(&pgproto3.Query{String: "SELECT 1"})
	if got := untilReady(t, fe, 2); !strings.HasPrefix(got, "error:22P04 ready") || !strings.HasSuffix(got, "complete:SELECT 1 ready") {
		t.Fatalf("got %s", got)
	}
	var rows int
	if err := direct.QueryRow(testContext(t), "SELECT count(*) FROM orders").Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d rows kept, %v", rows, err)
	}
}

// TestCopyFillPsql loads a binary file with psql's \copy into a filled table: psql
// streams the file in chunks of its own, and every row gets its key.
func TestCopyFillPsql(t *testing.T) {
	db, p, direct := ordersProxy(t, "item text, qty int4")
	file := filepath.Join(t.TempDir(), "orders.bin")
	out, err := runTool(t, "psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", db, "-c",
		`\copy (SELECT 'item ' || i, i FROM generate_series(1, 20000) AS i) to '`+file+`' with (format binary)`)
	if err != nil {
		t.Fatalf("export: %v\n%s", err, out)
	}
	out, err = runTool(t, "psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", p.url(db), "-c",
		`\copy orders (item, qty) from '`+file+`' with (format binary)`)
	if err != nil || !strings.Contains(out, "COPY 20000") {
		t.Fatalf("\\copy through the proxy: %v\n%s", err, out)
	}
	var rows, keys, wrong int
	if err := direct.QueryRow(testContext(t), "SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE item <> 'item ' || qty) FROM orders").Scan(&rows, &keys, &wrong); err != nil {
		t.Fatal(err)
	}
	if rows != 20000 || keys != 20000 || wrong != 0 {
		t.Fatalf("%d rows, %d distinct keys, %d rows not as exported", rows, keys, wrong)
	}
}
