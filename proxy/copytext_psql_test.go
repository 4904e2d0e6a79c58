package proxy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
)

// copyTextRows are rows with what makes text and CSV hard: quotes, delimiters, line ends
// and backslashes inside fields, NULLs, empty strings and multibyte UTF-8.
func copyTextRows(n int) [][3]*string {
	s := func(v string) *string { return &v }
	special := [][3]*string{
		{s("plain"), s("note"), s("1")},
		{s(`say "hi"`), s("a,b;c|d"), s("2")},
		{s("line one\nline two"), s("cr\rlf\r\nend"), s("3")},
		{s(`back\slash \N \. \\`), nil, s("4")},
		{s(""), s(""), nil},
		{s("żółw 🐢 ü€"), s("tab\there"), s("6")},
		{s(`\.`), s("\\."), s("7")},
		{s("'single' and \"double\""), s(`"`), s("8")},
	}
	var rows [][3]*string
	for i := range n {
		r := special[i%len(special)]
		item := *r[0] + fmt.Sprint(" #", i)
		rows = append(rows, [3]*string{&item, r[1], r[2]})
	}
	return rows
}

// csvField renders a CSV field with quote q (escape esc) and NULL as null.
func csvField(v *string, delim, q, esc byte, null string) string {
	if v == nil {
		return null
	}
	var b strings.Builder
	b.WriteByte(q)
	for i := 0; i < len(*v); i++ {
		c := (*v)[i]
		if c == q || c == esc {
			b.WriteByte(esc)
		}
		b.WriteByte(c)
	}
	b.WriteByte(q)
	return b.String()
}

// textField renders a text-format field.
func textField(v *string, delim byte, null string) string {
	if v == nil {
		return null
	}
	r := strings.NewReplacer(`\`, `\\`, "\n", `\n`, "\r", `\r`, "\t", `\t`, string(delim), `\`+string(delim))
	return r.Replace(*v)
}

// TestCopyFillTextPsql loads files in the text and CSV formats with psql's \copy through
// the proxy into a filled table, and the same files straight into a table with a
// bigserial key: row for row, in order, the data must be the same, and every row of the
// filled table must have its own key.
func TestCopyFillTextPsql(t *testing.T) {
	db, p, direct := ordersProxy(t, "item text, note text, qty int4")
	ctx := testContext(t)
	if _, err := direct.Exec(ctx, "CREATE TABLE serial_orders (id bigserial PRIMARY KEY, item text, note text, qty int4)"); err != nil {
		t.Fatal(err)
	}
	rows := copyTextRows(3000)
	type format struct {
		name, options string
		render        func(w *strings.Builder)
	}
	csvWith := func(delim, q, esc byte, null, eol string, header bool) func(w *strings.Builder) {
		return func(w *strings.Builder) {
			if header {
				fmt.Fprintf(w, "%s%c%s%c%s%s", csvField(ptr("it\nem"), delim, q, esc, null), delim, "note", delim, "qty", eol)
			}
			for _, r := range rows {
				fmt.Fprintf(w, "%s%c%s%c%s%s", csvField(r[0], delim, q, esc, null), delim, csvField(r[1], delim, q, esc, null), delim, csvField(r[2], delim, q, esc, null), eol)
			}
		}
	}
	textWith := func(delim byte, null, eol string, header bool) func(w *strings.Builder) {
		return func(w *strings.Builder) {
			if header {
				fmt.Fprintf(w, "item%cnote%cqty%s", delim, delim, eol)
			}
			for _, r := range rows {
				fmt.Fprintf(w, "%s%c%s%c%s%s", textField(r[0], delim, null), delim, textField(r[1], delim, null), delim, textField(r[2], delim, null), eol)
			}
		}
	}
	formats := []format{
		{"csv", "csv", csvWith(',', '"', '"', "", "\n", false)},
		{"csv header crlf", "csv header", csvWith(',', '"', '"', "", "\r\n", true)},
		{"csv custom", "with (format csv, delimiter ';', quote '''', escape '\\', null 'NULL')", csvWith(';', '\'', '\\', "NULL", "\n", false)},
		{"text", "", textWith('\t', `\N`, "\n", false)},
		{"text crlf custom", "with (format text, delimiter '|', null 'NIL')", textWith('|', "NIL", "\r\n", false)},
		{"text header", "with (format text, header)", textWith('\t', `\N`, "\n", true)},
	}
	dir := t.TempDir()
	for _, f := range formats {
		t.Run(f.name, func(t *testing.T) {
			var w strings.Builder
			f.render(&w)
			file := filepath.Join(dir, strings.ReplaceAll(f.name, " ", "_"))
			if err := os.WriteFile(file, []byte(w.String()), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct{ url, table string }{{p.url(db), "orders"}, {db, "serial_orders"}} {
				if _, err := direct.Exec(ctx, "TRUNCATE "+tc.table); err != nil {
					t.Fatal(err)
				}
				out, err := runTool(t, "psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", tc.url, "-c",
					`\copy `+tc.table+` (item, note, qty) from '`+file+`' `+f.options)
				if err != nil || !strings.Contains(out, fmt.Sprintf("COPY %d", len(rows))) {
					t.Fatalf("\\copy into %s: %v\n%s", tc.table, err, out)
				}
			}
			filled := tableRows(t, direct, "orders")
			serial := tableRows(t, direct, "serial_orders")
			if len(filled) != len(rows) || len(serial) != len(rows) {
				t.Fatalf("%d rows filled, %d with bigserial, want %d", len(filled), len(serial), len(rows))
			}
			for i := range filled {
				if filled[i] != serial[i] {
					t.Fatalf("row %d differs:\nfilled %q\nserial %q", i, filled[i], serial[i])
				}
			}
			var keys int
			if err := direct.QueryRow(ctx, "SELECT count(DISTINCT id) FROM orders").Scan(&keys); err != nil || keys != len(rows) {
				t.Fatalf("%d distinct keys, %v", keys, err)
			}
		})
	}
}

func ptr(s string) *string { return &s }

// tableRows returns a table's rows in key order, rendered so that NULL differs from every
// string.
func tableRows(t *testing.T, conn *pgx.Conn, table string) []string {
	t.Helper()
	rows, err := conn.Query(testContext(t), "SELECT format('%L|%L|%L', item, note, qty) FROM "+table+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCopyFillTextRefusedEncoding: with a client_encoding whose multibyte characters may
// hold ASCII bytes, a text or CSV COPY into a filled table is refused with 0A000 before
// any of its data reaches the server: at once when the encoding is known, and at its
// first data when the COPY was pipelined behind the change. UTF8 goes on.
func TestCopyFillTextRefusedEncoding(t *testing.T) {
	db, p, direct := ordersProxy(t, "item text")
	fe := rawConn(t, p.url(db))
	for _, enc := range []string{"SJIS", "BIG5", "GBK", "GB18030", "UHC", "JOHAB"} {
		exchange(t, fe, &pgproto3.Query{String: "SET client_encoding TO '" + enc + "'"})
		got := strings.Join(exchange(t, fe,
			&pgproto3.Query{String: "COPY orders (item) FROM STDIN (FORMAT csv)"},
			&pgproto3.Query{String: "COPY orders (item) FROM STDIN"},
		), " ")
		if got != "error:0A000 ready error:0A000 ready" {
			t.Fatalf("%s: %s", enc, got)
		}
		exchange(t, fe, &pgproto3.Query{String: "SET client_encoding TO 'UTF8'"})
	}
	// Pipelined: the COPY passes the proxy before the server reports the new encoding.
	fe.Send(&pgproto3.Query{String: "SELECT pg_sleep(0.1)"})
	fe.Send(&pgproto3.Query{String: "SET client_encoding TO 'BIG5'"})
	startCopyAfter(t, fe, 2, "COPY orders (item) FROM STDIN (FORMAT csv)")
	fe.Send(&pgproto3.CopyData{Data: []byte("book\n")})
	fe.Send(&pgproto3.CopyDone{})
	if got := untilReady(t, fe, 1); got != "error:0A000 ready" {
		t.Fatalf("pipelined: %s", got)
	}
	exchange(t, fe, &pgproto3.Query{String: "SET client_encoding TO 'UTF8'"})
	startCopy(t, fe, "COPY orders (item) FROM STDIN (FORMAT csv)")
	fe.Send(&pgproto3.CopyData{Data: []byte("book\n")})
	fe.Send(&pgproto3.CopyDone{})
	if got := untilReady(t, fe, 1); got != "complete:COPY 1 ready" {
		t.Fatalf("in UTF8: %s", got)
	}
	var n int
	if err := direct.QueryRow(testContext(t), "SELECT count(*) FROM orders WHERE id IS NOT NULL").Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows, %v", n, err)
	}
}

// startCopyAfter sends a COPY behind queries already sent, skipping the answers of the
// ready ReadyForQuery messages before its CopyInResponse.
func startCopyAfter(t *testing.T, fe *pgproto3.Frontend, ready int, sql string) {
	t.Helper()
	fe.Send(&pgproto3.Query{String: sql})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch msg.(type) {
		case *pgproto3.ReadyForQuery:
			ready--
		case *pgproto3.CopyInResponse:
			if ready != 0 {
				t.Fatalf("CopyInResponse with %d answers still due", ready)
			}
			return
		case *pgproto3.ErrorResponse:
			t.Fatalf("error before the COPY started: %+v", msg)
		}
	}
}

// TestCopyFillHeaderMatch: with HEADER MATCH the server checks the header line against
// the column list, which the proxy extended with the key: the proxy names the key column
// in the header line too, quoted or escaped as the format wants.
func TestCopyFillHeaderMatch(t *testing.T) {
	db, p, direct := ordersProxy(t, "item text")
	fe := rawConn(t, p.url(db))
	for _, c := range []struct{ options, data string }{
		{"FORMAT csv, HEADER match", "item\r\nbook\r\n"},
		{"FORMAT text, HEADER match", "item\npen\n"},
		{"FORMAT csv, HEADER match, DELIMITER ';', QUOTE '''', ESCAPE '\\'", "'item'\nlamp"},
	} {
		startCopy(t, fe, "COPY orders (item) FROM STDIN ("+c.options+")")
		fe.Send(&pgproto3.CopyData{Data: []byte(c.data)})
		fe.Send(&pgproto3.CopyDone{})
		if got := untilReady(t, fe, 1); got != "complete:COPY 1 ready" {
			t.Fatalf("%s: %s", c.options, got)
		}
	}
	if got := items(t, direct); got != "book lamp pen" {
		t.Fatalf("items %q", got)
	}
}
