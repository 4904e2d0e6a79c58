package proxy

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/rewrite"
)

// batchProxy starts a rewriting proxy whose batches are at most 50 IDs.
func batchProxy(t testing.TB, upstreamURL string) (*testProxy, *unknownTagIDs) {
	t.Helper()
	rw, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	ids := &unknownTagIDs{}
	p := startProxy(t, upstreamURL, func(s *Server) { s.Rewriter, s.IDs, s.MaxBatch = rw, ids, 50 })
	return p, ids
}

func int4Param(n int32) []byte { return binary.BigEndian.AppendUint32(nil, uint32(n)) }

// TestBatchExtendedLikeServer sends the same extended-protocol cycles of
// SELECT leaf_next('t', n) twice: at rest, where the proxy answers them itself, and inside
// a transaction block, where PostgreSQL answers the rewritten statement (the IDs as an
// int8[] parameter). The responses must be the same, message for message.
func TestBatchExtendedLikeServer(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := batchProxy(t, db)
	sync := &pgproto3.Sync{}
	parse := func(name, query string, oids ...uint32) *pgproto3.Parse {
		return &pgproto3.Parse{Name: name, Query: query, ParameterOIDs: oids}
	}
	lit := parse("", "SELECT leaf_next('t', 3)")
	tests := []struct {
		name string
		msgs []pgproto3.FrontendMessage
	}{
		{"describe then execute", []pgproto3.FrontendMessage{
			lit, &pgproto3.Describe{ObjectType: 'S'}, sync,
			&pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, sync,
		}},
		{"binary result and alias", []pgproto3.FrontendMessage{
			parse("", "SELECT leaf_next('t', 4) AS id"), &pgproto3.Bind{ResultFormatCodes: []int16{1}},
			&pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, sync,
		}},
		{"max rows", []pgproto3.FrontendMessage{
			lit, &pgproto3.Bind{}, &pgproto3.Execute{MaxRows: 2}, &pgproto3.Execute{MaxRows: 1},
			&pgproto3.Execute{MaxRows: 2}, &pgproto3.Execute{}, sync,
		}},
		{"tag and count as text parameters", []pgproto3.FrontendMessage{
			parse("", "SELECT leaf_next($1, $2)"), &pgproto3.Describe{ObjectType: 'S'},
			&pgproto3.Bind{Parameters: [][]byte{[]byte("t"), []byte("5")}}, &pgproto3.Execute{}, sync,
		}},
		{"count as a binary int4 and int8", []pgproto3.FrontendMessage{
			parse("", "SELECT leaf_next('t', $1)"), &pgproto3.Describe{ObjectType: 'S'},
			&pgproto3.Bind{ParameterFormatCodes: []int16{1}, Parameters: [][]byte{int4Param(2)}, ResultFormatCodes: []int16{1}}, &pgproto3.Execute{}, sync,
			parse("", "SELECT leaf_next('t', $1)", oidInt8), &pgproto3.Describe{ObjectType: 'S'},
			&pgproto3.Bind{ParameterFormatCodes: []int16{1}, Parameters: [][]byte{binary.BigEndian.AppendUint64(nil, 3)}}, &pgproto3.Execute{}, sync,
		}},
		{"one format code per parameter", []pgproto3.FrontendMessage{
			parse("", "SELECT leaf_next($1, $2)", oidText, oidInt4),
			&pgproto3.Bind{ParameterFormatCodes: []int16{0, 1}, Parameters: [][]byte{[]byte("t"), int4Param(2)}}, &pgproto3.Execute{}, sync,
		}},
		{"named statement executed twice", []pgproto3.FrontendMessage{
			parse("b", "SELECT leaf_next($1, $2)"), &pgproto3.Describe{ObjectType: 'S', Name: "b"}, sync,
			&pgproto3.Bind{PreparedStatement: "b", Parameters: [][]byte{[]byte("t"), []byte("2")}}, &pgproto3.Execute{}, sync,
			&pgproto3.Bind{PreparedStatement: "b", Parameters: [][]byte{[]byte("t"), []byte("3")}}, &pgproto3.Execute{}, sync,
			&pgproto3.Close{ObjectType: 'S', Name: "b"}, sync,
		}},
		{"count above the maximum", []pgproto3.FrontendMessage{
			parse("", "SELECT leaf_next('t', $1)"), &pgproto3.Bind{Parameters: [][]byte{[]byte("51")}}, &pgproto3.Execute{}, sync,
		}},
		{"count zero", []pgproto3.FrontendMessage{
			parse("", "SELECT leaf_next('t', $1)"), &pgproto3.Bind{Parameters: [][]byte{[]byte("0")}}, &pgproto3.Execute{}, sync,
		}},
		{"negative literal count", []pgproto3.FrontendMessage{
			parse("", "SELECT leaf_next('t', -1)"), &pgproto3.Bind{}, &pgproto3.Execute{}, sync,
		}},
		{"count not an integer", []pgproto3.FrontendMessage{
			parse("", "SELECT leaf_next('t', $1)"), &pgproto3.Bind{Parameters: [][]byte{[]byte("ten")}}, &pgproto3.Execute{}, sync,
		}},
		{"count NULL", []pgproto3.FrontendMessage{
			parse("", "SELECT leaf_next('t', $1)"), &pgproto3.Bind{Parameters: [][]byte{nil}}, &pgproto3.Execute{}, sync,
		}},
		{"unknown tag", []pgproto3.FrontendMessage{
			parse("", "SELECT leaf_next('missing', 2)"), &pgproto3.Bind{}, &pgproto3.Execute{}, sync,
		}},
		{"wrong number of parameters", []pgproto3.FrontendMessage{
			parse("", "SELECT leaf_next($1, 2)"), &pgproto3.Bind{}, &pgproto3.Execute{}, sync,
		}},
		{"mixed cycle", []pgproto3.FrontendMessage{
			lit, &pgproto3.Bind{}, &pgproto3.Execute{},
			parse("other", "SELECT 'x'"), &pgproto3.Bind{PreparedStatement: "other"}, &pgproto3.Execute{},
			&pgproto3.Bind{}, &pgproto3.Execute{}, sync,
		}},
		{"materialized in a later cycle", []pgproto3.FrontendMessage{
			parse("", "SELECT leaf_next($1, $2)"), &pgproto3.Describe{ObjectType: 'S'}, sync,
			parse("other", "SELECT 'x'"), &pgproto3.Bind{PreparedStatement: "other"}, &pgproto3.Execute{},
			&pgproto3.Bind{Parameters: [][]byte{[]byte("t"), []byte("2")}}, &pgproto3.Execute{}, &pgproto3.Describe{ObjectType: 'S'}, sync,
			&pgproto3.Close{ObjectType: 'S', Name: "other"}, sync,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fe := rawConn(t, p.url(db))
			local := exchange(t, fe, tt.msgs...)
			fe = rawConn(t, p.url(db))
			begin := exchange(t, fe, &pgproto3.Query{String: "BEGIN"})
			upstream := exchange(t, fe, tt.msgs...)
			exchange(t, fe, &pgproto3.Query{String: "ROLLBACK"})
			if len(begin) == 0 || strings.Join(local, " ") != strings.Join(upstream, " ") {
				t.Fatalf("at rest:\n%s\ninside a transaction (the server's answers):\n%s", strings.Join(local, " "), strings.Join(upstream, " "))
			}
		})
	}
}

// TestBatchIsLocal runs batches against an upstream that answers a Sync or a Query with
// nothing but ReadyForQuery: only the proxy can have sent the rows, in the simple and the
// extended protocol.
func TestBatchIsLocal(t *testing.T) {
	up := startFakeUpstream(t, false)
	url := "postgres://postgres@" + up.addr() + "/postgres"
	p, ids := batchProxy(t, url)
	fe := rawConn(t, p.url(url))
	got := exchange(t, fe,
		&pgproto3.Query{String: "SELECT leaf_next('t', 3)"},
		&pgproto3.Parse{Query: "SELECT leaf_next($1, $2)"}, &pgproto3.Describe{ObjectType: 'S'}, &pgproto3.Sync{},
		&pgproto3.Bind{Parameters: [][]byte{[]byte("t"), []byte("2")}, ResultFormatCodes: []int16{1}}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{},
	)
	want := "row(leaf_next/0/0/20/8/-1/0) data(text) data(text) data(text) complete:SELECT 3 ready " +
		"parse params[25 23] row(leaf_next/0/0/20/8/-1/0) ready " +
		"bind row(leaf_next/0/0/20/8/-1/1) data(binary) data(binary) complete:SELECT 2 ready"
	if strings.Join(got, " ") != want {
		t.Fatalf("responses\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
	if n := ids.issued("t"); n != 5 {
		t.Fatalf("%d IDs drawn, want 5", n)
	}
	// Bad counts are 22023 and the session goes on; nothing is drawn for them.
	got = exchange(t, fe,
		&pgproto3.Query{String: "SELECT leaf_next('t', 51)"},
		&pgproto3.Query{String: "SELECT leaf_next('t', 0)"},
		&pgproto3.Query{String: "SELECT leaf_next($1, 2)"},
		&pgproto3.Query{String: "SELECT leaf_next('t', 1)"},
	)
	want = "error:22023 ready error:22023 ready error:42P02 ready row(leaf_next/0/0/20/8/-1/0) data(text) complete:SELECT 1 ready"
	if strings.Join(got, " ") != want {
		t.Fatalf("responses\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
	if n := ids.issued("t"); n != 6 {
		t.Fatalf("%d IDs drawn, want 6", n)
	}
}

// TestBatchSimpleLikeServer: a batch Query answered by the proxy at rest gives the
// messages the server gives for the rewritten statement inside a transaction block, or
// behind another Query still outstanding.
func TestBatchSimpleLikeServer(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := batchProxy(t, db)
	q := &pgproto3.Query{String: "SELECT leaf_next('t', 4) AS ids"}
	fe := rawConn(t, p.url(db))
	local := exchange(t, fe, q)
	exchange(t, fe, &pgproto3.Query{String: "BEGIN"})
	inBlock := exchange(t, fe, q)
	pipelined := exchange(t, fe, &pgproto3.Query{String: "SELECT pg_sleep(0.05)"}, q)[4:] // the sleep's four messages first
	failed := exchange(t, fe, &pgproto3.Query{String: "SELECT 1/0"}, q, &pgproto3.Query{String: "ROLLBACK"})
	want := "row(ids/0/0/20/8/-1/0) data(text) data(text) data(text) data(text) complete:SELECT 4 ready"
	for _, got := range [][]string{local, inBlock, pipelined} {
		if strings.Join(got, " ") != want {
			t.Fatalf("responses\n%s\nwant\n%s", strings.Join(got, " "), want)
		}
	}
	if got := strings.Join(failed, " "); got != "error:22012 ready error:25P02 ready complete:ROLLBACK ready" {
		t.Fatalf("in a failed transaction: %s", got)
	}
}

// TestBatchPgx asks for batches with pgx in every query mode, at rest and inside a
// transaction: n distinct IDs, increasing, in one bigint column named leaf_next.
func TestBatchPgx(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := batchProxy(t, db)
	for _, mode := range allModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testContext(t)
			conn := connectMode(t, p.url(db), mode)
			seen := map[int64]bool{}
			check := func(rows pgx.Rows, n int) {
				t.Helper()
				if f := rows.FieldDescriptions(); len(f) != 1 || f[0].Name != "leaf_next" || f[0].DataTypeOID != oidInt8 {
					t.Fatalf("columns %+v", f)
				}
				got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != n || !slices.IsSorted(got) {
					t.Fatalf("%d IDs %v, want %d increasing", len(got), got, n)
				}
				for _, id := range got {
					if seen[id] {
						t.Fatalf("ID %d issued twice", id)
					}
					seen[id] = true
				}
			}
			rows, _ := conn.Query(ctx, "SELECT leaf_next('t', 7)")
			check(rows, 7)
			if mode != pgx.QueryExecModeSimpleProtocol {
				rows, _ = conn.Query(ctx, "SELECT leaf_next($1, $2)", "t", 9)
				check(rows, 9)
				rows, _ = conn.Query(ctx, "SELECT leaf_next('t', $1::int8)", int64(4))
				check(rows, 4)
			}
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rows, _ = tx.Query(ctx, "SELECT leaf_next('t', 5)")
			check(rows, 5)
			if mode != pgx.QueryExecModeSimpleProtocol {
				rows, _ = tx.Query(ctx, "SELECT leaf_next($1, $2)", "t", 6)
				check(rows, 6)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			_, err = conn.Exec(ctx, "SELECT leaf_next('t', 51)")
			wantSQLState(t, err, "22023")
			_, err = conn.Exec(ctx, "SELECT leaf_next('t', 2), 1")
			wantSQLState(t, err, "0A000")
			rows, _ = conn.Query(ctx, "SELECT leaf_next('t', 1)")
			check(rows, 1)
		})
	}
}

// TestBatchPsql runs a batch through psql: the simple protocol, and where psql has them
// the extended protocol (\bind, psql 16) and a prepared statement (\parse and
// \bind_named, psql 18).
func TestBatchPsql(t *testing.T) {
	psql, err := exec.LookPath("psql")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("psql not found")
		}
		t.Skip("psql not found")
	}
	db := testenv.NewDatabase(t)
	p, _ := batchProxy(t, db)
	run := func(script string) string {
		t.Helper()
		cmd := exec.Command(psql, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", p.url(db))
		cmd.Stdin = strings.NewReader(script)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("psql: %v\n%s", err, out)
		}
		return string(out)
	}
	count := func(out string) int {
		n := 0
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if _, err := fmt.Sscan(l, new(int64)); err == nil {
				n++
			}
		}
		return n
	}
	if n := count(run("SELECT leaf_next('t', 12);\n")); n != 12 {
		t.Fatalf("simple: %d IDs", n)
	}
	if n := count(run("BEGIN;\nSELECT leaf_next('t', 11);\nCOMMIT;\n")); n != 11 {
		t.Fatalf("simple in a transaction: %d IDs", n)
	}
	ver, _ := exec.Command(psql, "--version").Output()
	var major int
	fmt.Sscanf(strings.TrimPrefix(string(ver), "psql (PostgreSQL) "), "%d", &major)
	if major >= 16 { // \bind: the extended protocol
		if n := count(run("SELECT leaf_next($1, $2) \\bind t 13 \\g\n")); n != 13 {
			t.Fatalf("extended: %d IDs", n)
		}
		if n := count(run("BEGIN;\nSELECT leaf_next($1, $2) \\bind t 14 \\g\nCOMMIT;\n")); n != 14 {
			t.Fatalf("extended in a transaction: %d IDs", n)
		}
	}
	if major >= 18 { // \parse and \bind_named: a prepared statement
		if n := count(run("SELECT leaf_next($1, $2) \\parse b\n\\bind_named b t 15 \\g\n\\bind_named b t 1 \\g\n")); n != 16 {
			t.Fatalf("prepared: %d IDs", n)
		}
	}
}
