package proxy

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/rewrite"
)

// unknownTagIDs is stubIDs, except that tags "missing" and "nope" do not exist (42704), as
// the segment engine reports an unknown tag.
type unknownTagIDs struct{ stubIDs }

func (u *unknownTagIDs) Next(ctx context.Context, tag string) (int64, error) {
	if tag == "missing" || tag == "nope" {
		return 0, codedError{"42704"}
	}
	return u.stubIDs.Next(ctx, tag)
}

func (u *unknownTagIDs) NextBatch(ctx context.Context, tag string, n int, dst []int64) ([]int64, error) {
	if tag == "missing" || tag == "nope" {
		return dst, codedError{"42704"}
	}
	return u.stubIDs.NextBatch(ctx, tag, n, dst)
}

func (u *unknownTagIDs) TryNext(tag string) (int64, bool) {
	if tag == "missing" || tag == "nope" {
		return 0, false
	}
	return u.stubIDs.TryNext(tag)
}

// fastPathProxy starts a rewriting proxy in front of upstreamURL with unknownTagIDs.
func fastPathProxy(t testing.TB, upstreamURL string) (*testProxy, *unknownTagIDs) {
	t.Helper()
	rw, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	ids := &unknownTagIDs{}
	p := startProxy(t, upstreamURL, func(s *Server) { s.Rewriter, s.IDs = rw, ids })
	return p, ids
}

// rawConn opens a protocol-level connection to url.
func rawConn(t testing.TB, url string) *pgproto3.Frontend {
	t.Helper()
	hc := hijacked(t, url)
	_ = hc.Conn.SetDeadline(time.Now().Add(30 * time.Second))
	return hc.Frontend
}

// hijacked connects to url and takes the connection over from pgconn, after the startup;
// the connection is closed when the test ends.
func hijacked(t testing.TB, url string) *pgconn.HijackedConn {
	t.Helper()
	pg, err := pgconn.Connect(testContext(t), url)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := pg.Hijack()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hc.Conn.Close() })
	return hc
}

// exchange sends msgs in one write and returns the responses, summarized, up to the
// ReadyForQuery answering each Sync and Query. ID values are summarized by their format
// (text digits or 8 binary bytes) since they differ from run to run.
func exchange(t testing.TB, fe *pgproto3.Frontend, msgs ...pgproto3.FrontendMessage) []string {
	t.Helper()
	return exchangeWith(t, fe, summarize, msgs...)
}

// exchangeWith is exchange with a summary of one's own: sum returns a response's summary,
// or "" to leave the response out.
func exchangeWith(t testing.TB, fe *pgproto3.Frontend, sum func(pgproto3.BackendMessage) string, msgs ...pgproto3.FrontendMessage) []string {
	t.Helper()
	want := 0
	for _, m := range msgs {
		switch m.(type) {
		case *pgproto3.Sync, *pgproto3.Query:
			want++
		}
		fe.Send(m)
	}
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for want > 0 {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		if s := sum(msg); s != "" {
			got = append(got, s)
		}
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			want--
		}
	}
	return got
}

func summarize(msg pgproto3.BackendMessage) string {
	switch m := msg.(type) {
	case *pgproto3.ParseComplete:
		return "parse"
	case *pgproto3.BindComplete:
		return "bind"
	case *pgproto3.CloseComplete:
		return "close"
	case *pgproto3.NoData:
		return "nodata"
	case *pgproto3.PortalSuspended:
		return "suspended"
	case *pgproto3.ParameterDescription:
		return fmt.Sprintf("params%v", m.ParameterOIDs)
	case *pgproto3.RowDescription:
		var fs []string
		for _, f := range m.Fields {
			fs = append(fs, fmt.Sprintf("%s/%d/%d/%d/%d/%d/%d", f.Name, f.TableOID, f.TableAttributeNumber, f.DataTypeOID, f.DataTypeSize, f.TypeModifier, f.Format))
		}
		return "row(" + strings.Join(fs, ",") + ")"
	case *pgproto3.DataRow:
		var vs []string
		for _, v := range m.Values {
			if _, err := strconv.ParseInt(string(v), 10, 64); err == nil {
				vs = append(vs, "text")
			} else if len(v) == 8 && binary.BigEndian.Uint64(v) > 0 {
				vs = append(vs, "binary")
			} else {
				vs = append(vs, string(v))
			}
		}
		return "data(" + strings.Join(vs, ",") + ")"
	case *pgproto3.CommandComplete:
		return "complete:" + string(m.CommandTag)
	case *pgproto3.ErrorResponse:
		return "error:" + m.Code
	case *pgproto3.ReadyForQuery:
		return "ready"
	}
	return fmt.Sprintf("%T", msg)
}

func fastParse(name string) *pgproto3.Parse {
	return &pgproto3.Parse{Name: name, Query: "SELECT leaf_next('t')"}
}

// TestFastPathExtendedLikeServer sends the same extended-protocol cycles twice through a
// rewriting proxy: at rest, where the proxy answers them itself, and inside a transaction
// block, where they go to PostgreSQL rewritten. The responses must be the same.
func TestFastPathExtendedLikeServer(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := fastPathProxy(t, db)
	sync := &pgproto3.Sync{}
	bind := func(stmt string, format int16) *pgproto3.Bind {
		b := &pgproto3.Bind{PreparedStatement: stmt}
		if format >= 0 {
			b.ResultFormatCodes = []int16{format}
		}
		return b
	}
	tests := []struct {
		name string
		msgs []pgproto3.FrontendMessage
	}{
		{"describe then execute", []pgproto3.FrontendMessage{
			fastParse(""), &pgproto3.Describe{ObjectType: 'S'}, sync,
			bind("", -1), &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, sync,
		}},
		{"binary result", []pgproto3.FrontendMessage{
			fastParse(""), bind("", 1), &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, sync,
		}},
		{"text result code", []pgproto3.FrontendMessage{
			fastParse(""), bind("", 0), &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, sync,
		}},
		{"max rows", []pgproto3.FrontendMessage{
			fastParse(""), bind("", -1), &pgproto3.Execute{MaxRows: 1}, &pgproto3.Execute{MaxRows: 1}, &pgproto3.Execute{}, sync,
		}},
		{"max rows above one", []pgproto3.FrontendMessage{
			fastParse(""), bind("", -1), &pgproto3.Execute{MaxRows: 2}, &pgproto3.Execute{}, sync,
		}},
		{"alias and snowflake", []pgproto3.FrontendMessage{
			&pgproto3.Parse{Query: "SELECT leaf_next('t') AS id"}, bind("", -1), &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, sync,
			&pgproto3.Parse{Query: "SELECT leaf_snowflake()"}, &pgproto3.Describe{ObjectType: 'S'}, bind("", -1), &pgproto3.Execute{}, sync,
		}},
		{"close statement then reuse", []pgproto3.FrontendMessage{
			fastParse(""), &pgproto3.Close{ObjectType: 'S'}, sync,
			fastParse(""), bind("", -1), &pgproto3.Execute{}, sync,
			&pgproto3.Close{ObjectType: 'S'}, bind("", -1), &pgproto3.Execute{}, sync, // 26000
		}},
		{"a query drops the unnamed statement", []pgproto3.FrontendMessage{
			fastParse(""), sync, &pgproto3.Query{String: "SELECT 1"},
			bind("", -1), &pgproto3.Execute{}, sync, // 26000
		}},
		{"flush", []pgproto3.FrontendMessage{
			fastParse(""), &pgproto3.Flush{}, bind("", -1), &pgproto3.Execute{}, sync,
		}},
		// The refusal fails the transaction block, so whatever follows it gets 25P02
		// there; the cycle after it is left out. The unnamed statement is gone, as
		// after a failed Parse of it.
		{"refusal after local messages", []pgproto3.FrontendMessage{
			fastParse(""), bind("", -1), &pgproto3.Execute{},
			&pgproto3.Parse{Query: "SELECT leaf_next('t') FROM generate_series(1, 2)"}, bind("", -1), &pgproto3.Execute{}, sync,
			&pgproto3.Describe{ObjectType: 'S'}, sync, // 26000
		}},
		{"close portal", []pgproto3.FrontendMessage{
			fastParse(""), bind("", -1), &pgproto3.Close{ObjectType: 'P'}, &pgproto3.Execute{}, sync,
		}},
		{"bind with a parameter", []pgproto3.FrontendMessage{
			fastParse(""), &pgproto3.Bind{Parameters: [][]byte{[]byte("1")}}, &pgproto3.Execute{}, sync,
		}},
		{"mixed cycle", []pgproto3.FrontendMessage{
			fastParse(""), bind("", -1), &pgproto3.Execute{},
			&pgproto3.Parse{Name: "other", Query: "SELECT 'x'"}, bind("other", -1), &pgproto3.Execute{},
			bind("", 1), &pgproto3.Execute{}, sync,
		}},
		{"materialized in a later cycle", []pgproto3.FrontendMessage{
			fastParse(""), &pgproto3.Describe{ObjectType: 'S'}, sync,
			&pgproto3.Parse{Name: "other", Query: "SELECT 'x'"}, bind("other", -1), &pgproto3.Execute{},
			bind("", -1), &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Describe{ObjectType: 'S'}, sync,
			&pgproto3.Close{ObjectType: 'S', Name: "other"}, sync,
		}},
		{"named statement", []pgproto3.FrontendMessage{
			fastParse("named"), sync,
			&pgproto3.Describe{ObjectType: 'S', Name: "named"}, sync,
			bind("named", 1), &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, sync,
			bind("named", -1), &pgproto3.Execute{}, sync,
			fastParse("named"), sync, // already exists: 42P05 from the server
			&pgproto3.Close{ObjectType: 'S', Name: "named"}, sync,
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

// TestFastPathExtendedIsLocal runs fast-path cycles against an upstream that answers a
// Sync with nothing but ReadyForQuery: only the proxy can have sent the rest.
func TestFastPathExtendedIsLocal(t *testing.T) {
	up := startFakeUpstream(t, false)
	url := "postgres://postgres@" + up.addr() + "/postgres"
	p, ids := fastPathProxy(t, url)
	fe := rawConn(t, p.url(url))
	got := exchange(t, fe,
		fastParse(""), &pgproto3.Describe{ObjectType: 'S'}, &pgproto3.Sync{},
		&pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{},
		&pgproto3.Bind{ResultFormatCodes: []int16{1}}, &pgproto3.Execute{}, &pgproto3.Sync{},
	)
	want := "parse params[] row(leaf_next/0/0/20/8/-1/0) ready bind row(leaf_next/0/0/20/8/-1/0) data(text) complete:SELECT 1 ready bind data(binary) complete:SELECT 1 ready"
	if strings.Join(got, " ") != want {
		t.Fatalf("responses\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
	ids.mu.Lock()
	n := ids.next["t"]
	ids.mu.Unlock()
	if n != 1002 {
		t.Fatalf("last ID drawn %d, want 1002", n)
	}
	// An unknown tag: the error, then nothing up to Sync, and the session goes on.
	got = exchange(t, fe,
		&pgproto3.Parse{Query: "SELECT leaf_next('missing')"}, &pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{},
		&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
		fastParse(""), &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
	)
	want = "parse bind row(leaf_next/0/0/20/8/-1/0) error:42704 ready parse bind data(text) complete:SELECT 1 ready"
	if strings.Join(got, " ") != want {
		t.Fatalf("responses\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
}

// TestFastPathPipeline mixes local fast-path cycles with ordinary ones in one write: every
// answer arrives in order, and a failed transaction gets the server's 25P02.
func TestFastPathPipeline(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := fastPathProxy(t, db)
	fe := rawConn(t, p.url(db))
	fast := []pgproto3.FrontendMessage{fastParse(""), &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}}
	var msgs []pgproto3.FrontendMessage
	msgs = append(msgs, fast...)
	msgs = append(msgs, &pgproto3.Parse{Query: "SELECT 'slow' FROM pg_sleep(0.1)"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
	msgs = append(msgs, fast...)
	msgs = append(msgs, &pgproto3.Query{String: "SELECT 'simple'"})
	msgs = append(msgs, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}) // the unnamed statement was dropped
	msgs = append(msgs, fast...)
	msgs = append(msgs, &pgproto3.Parse{Name: "begin", Query: "BEGIN"}, &pgproto3.Bind{PreparedStatement: "begin"}, &pgproto3.Execute{}, &pgproto3.Sync{})
	msgs = append(msgs, &pgproto3.Parse{Query: "SELECT 1/0"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
	msgs = append(msgs, fast...)
	msgs = append(msgs, &pgproto3.Query{String: "ROLLBACK"})
	msgs = append(msgs, fast...)
	got := exchange(t, fe, msgs...)
	want := []string{
		"parse bind data(text) complete:SELECT 1 ready",
		"parse bind data(slow) complete:SELECT 1 ready",
		"parse bind data(text) complete:SELECT 1 ready",
		"row(?column?/0/0/25/-1/-1/0) data(simple) complete:SELECT 1 ready",
		"error:26000 ready",
		"parse bind data(text) complete:SELECT 1 ready",
		"parse bind complete:BEGIN ready",
		"parse error:22012 ready", // at Bind, which folds the constant
		"error:25P02 ready",
		"complete:ROLLBACK ready",
		"parse bind data(text) complete:SELECT 1 ready",
	}
	if g, w := strings.Join(got, " "), strings.Join(want, " "); g != w {
		t.Fatalf("responses\n%s\nwant\n%s", g, w)
	}
}

// TestFastPathPgx reads leaf_next through pgx in every query mode: distinct IDs, int8.
func TestFastPathPgx(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := fastPathProxy(t, db)
	for _, mode := range allModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testContext(t)
			conn := connectMode(t, p.url(db), mode)
			seen := make(map[int64]bool)
			for range 20 {
				var id int64
				if err := conn.QueryRow(ctx, "SELECT leaf_next('pgx')").Scan(&id); err != nil {
					t.Fatal(err)
				}
				if id <= 1000 || seen[id] {
					t.Fatalf("ID %d (seen: %v)", id, seen[id])
				}
				seen[id] = true
			}
			rows, err := conn.Query(ctx, "SELECT leaf_next('pgx') AS id")
			if err != nil {
				t.Fatal(err)
			}
			values, err := pgx.CollectRows(rows, pgx.RowTo[any])
			if err != nil {
				t.Fatal(err)
			}
			fd := rows.FieldDescriptions()
			if len(values) != 1 || len(fd) != 1 || fd[0].Name != "id" || fd[0].DataTypeOID != oidInt8 {
				t.Fatalf("values %v fields %+v", values, fd)
			}
			if _, ok := values[0].(int64); !ok {
				t.Fatalf("value %T, want int64", values[0])
			}
			err = conn.QueryRow(ctx, "SELECT leaf_next('missing')").Scan(new(int64))
			wantSQLState(t, err, "42704")
			var id int64
			if err := conn.QueryRow(ctx, "SELECT leaf_next('pgx')").Scan(&id); err != nil || seen[id] {
				t.Fatalf("after the error: %d, %v", id, err)
			}
		})
	}
}

// TestFastPathPgbench runs pgbench's extended and prepared modes through the proxy: each
// transaction draws exactly one ID and none fails.
func TestFastPathPgbench(t *testing.T) {
	bin := needTool(t, "pgbench")
	up := startFakeUpstream(t, false)
	db := "postgres://postgres@" + up.addr() + "/postgres"
	p, ids := fastPathProxy(t, db)
	for i, mode := range []string{"extended", "prepared"} {
		t.Run(mode, func(t *testing.T) {
			tag := "bench" + strconv.Itoa(i)
			script := t.TempDir() + "/next.sql"
			if err := os.WriteFile(script, []byte("SELECT leaf_next('"+tag+"');\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, "-n", "-M", mode, "-c", "2", "-t", "200", "-f", script, p.url(db)).CombinedOutput()
			if err != nil {
				t.Fatalf("pgbench: %v\n%s", err, out)
			}
			if !strings.Contains(string(out), "actually processed: 400/400") {
				t.Fatalf("pgbench did not complete every transaction:\n%s", out)
			}
			ids.mu.Lock()
			last := ids.next[tag]
			first := int64(1000 * (indexOf(ids.tags, tag) + 1))
			ids.mu.Unlock()
			if last-first != 400 {
				t.Fatalf("%d IDs drawn for 400 transactions\n%s", last-first, out)
			}
		})
	}
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

// TestFastPathMaterializeInFailedTransaction uses a locally parsed unnamed statement in a
// failed transaction: the server refuses the materialization with 25P02, the statement
// stays the proxy's, and after ROLLBACK it works as it would at the server.
func TestFastPathMaterializeInFailedTransaction(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := fastPathProxy(t, db)
	fe := rawConn(t, p.url(db))
	steps := []struct {
		msgs []pgproto3.FrontendMessage
		want string
	}{
		{[]pgproto3.FrontendMessage{fastParse(""), &pgproto3.Sync{}}, "parse ready"},
		{[]pgproto3.FrontendMessage{
			&pgproto3.Parse{Name: "b", Query: "BEGIN"}, &pgproto3.Bind{PreparedStatement: "b"}, &pgproto3.Execute{},
			&pgproto3.Parse{Name: "e", Query: "SELECT 1/0"}, &pgproto3.Bind{PreparedStatement: "e"}, &pgproto3.Execute{}, &pgproto3.Sync{},
			&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
			&pgproto3.Parse{Name: "r", Query: "ROLLBACK"}, &pgproto3.Bind{PreparedStatement: "r"}, &pgproto3.Execute{}, &pgproto3.Sync{},
		}, "parse bind complete:BEGIN parse error:22012 ready error:25P02 ready parse bind complete:ROLLBACK ready"},
		{[]pgproto3.FrontendMessage{&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}}, "bind data(text) complete:SELECT 1 ready"},
		// Materialized by a mixed cycle; then the server has it.
		{[]pgproto3.FrontendMessage{
			&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Parse{Name: "x", Query: "SELECT 'x'"}, &pgproto3.Sync{},
			&pgproto3.Describe{ObjectType: 'S'}, &pgproto3.Sync{},
		}, "bind data(text) complete:SELECT 1 parse ready params[] row(leaf_next/0/0/20/8/-1/0) ready"},
	}
	for i, st := range steps {
		if got := strings.Join(exchange(t, fe, st.msgs...), " "); got != st.want {
			t.Fatalf("step %d: responses\n%s\nwant\n%s", i, got, st.want)
		}
	}
}
