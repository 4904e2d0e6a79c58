package proxy

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/rewrite"
)

// stubIDs hands out predictable IDs: per tag 1000 + 1000*k + n for the tag's index k,
// snowflakes from 1<<40. Tag "unavailable" fails with SQLSTATE 55000, tag "broken" with
// an error that has no SQLSTATE.
type stubIDs struct {
	mu    sync.Mutex
	next  map[string]int64
	tags  []string
	tries atomic.Int64
}

type codedError struct{ code string }

func (e codedError) Error() string    { return "segment for the tag is not loaded" }
func (e codedError) SQLState() string { return e.code }

func (s *stubIDs) Next(_ context.Context, tag string) (int64, error) {
	switch tag {
	case "unavailable":
		return 0, codedError{"55000"}
	case "broken":
		return 0, errors.New("store unreachable")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.next == nil {
		s.next = make(map[string]int64)
	}
	if _, ok := s.next[tag]; !ok {
		s.tags = append(s.tags, tag)
		s.next[tag] = int64(1000 * len(s.tags))
	}
	s.next[tag]++
	return s.next[tag], nil
}

// issued returns how many IDs of tag Next has handed out.
func (s *stubIDs) issued(tag string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, t := range s.tags {
		if t == tag {
			return s.next[tag] - int64(1000*(i+1))
		}
	}
	return 0
}

// NextBatch is n calls of Next.
func (s *stubIDs) NextBatch(ctx context.Context, tag string, n int, dst []int64) ([]int64, error) {
	for range n {
		id, err := s.Next(ctx, tag)
		if err != nil {
			return dst, err
		}
		dst = append(dst, id)
	}
	return dst, nil
}

func (s *stubIDs) NextSnowflake(ctx context.Context) (int64, error) {
	id, err := s.Next(ctx, "\x00snowflake")
	return 1<<40 + id, err
}

// TryNext is Next without waiting. Every fifth call reports no ID at hand, so that
// sessions served by event loops take the path of an ID that must be waited for too
// (see loopSession.detach).
func (s *stubIDs) TryNext(tag string) (int64, bool) {
	if tag == "unavailable" || tag == "broken" || s.tries.Add(1)%5 == 0 {
		return 0, false
	}
	id, err := s.Next(context.Background(), tag)
	return id, err == nil
}

func (s *stubIDs) TryNextSnowflake() (int64, bool) {
	id, ok := s.TryNext("\x00snowflake")
	return 1<<40 + id, ok
}

// rewritingProxy starts a proxy that fills orders.id from tag "order"; configure may set
// further fields.
func rewritingProxy(t *testing.T, db string, configure ...func(*Server)) (*testProxy, *stubIDs) {
	t.Helper()
	rw, err := rewrite.New(rewrite.Settings{Fill: []rewrite.FillRule{{Table: "orders", Column: "id", Tag: "order"}}})
	if err != nil {
		t.Fatal(err)
	}
	ids := &stubIDs{}
	p := startProxy(t, db, append([]func(*Server){func(s *Server) {
		s.Rewriter = rw
		s.IDs = ids
	}}, configure...)...)
	return p, ids
}

var allModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement,
	pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec,
	pgx.QueryExecModeSimpleProtocol,
}

func connectMode(t *testing.T, url string, mode pgx.QueryExecMode) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = mode
	conn, err := pgx.ConnectConfig(testContext(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func TestRewriteLeafNext(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := rewritingProxy(t, db)
	for _, mode := range allModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testContext(t)
			conn := connectMode(t, p.url(db), mode)
			tag := "t_" + strings.ReplaceAll(mode.String(), " ", "_")
			var first, second int64
			if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT leaf_next('%s')", tag)).Scan(&first); err != nil {
				t.Fatal(err)
			}
			if err := conn.QueryRow(ctx, "SELECT leaf_next($1)", tag).Scan(&second); err != nil {
				t.Fatal(err)
			}
			if first%1000 != 1 || second != first+1 {
				t.Fatalf("IDs %d, %d: want the tag's first two", first, second)
			}
			var sf int64
			var label string
			if err := conn.QueryRow(ctx, "SELECT leaf_snowflake(), $1::text", "x").Scan(&sf, &label); err != nil {
				t.Fatal(err)
			}
			if sf < 1<<40 || label != "x" {
				t.Fatalf("snowflake %d, label %q", sf, label)
			}
		})
	}
}

func TestRewriteFastPathMessages(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := rewritingProxy(t, db)
	ctx := testContext(t)
	conn := connect(t, p.url(db))
	pg := conn.PgConn()
	results, err := pg.Exec(ctx, "SELECT leaf_next('fast')").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	r := results[0]
	if len(r.FieldDescriptions) != 1 {
		t.Fatalf("%d columns", len(r.FieldDescriptions))
	}
	f := r.FieldDescriptions[0]
	if f.Name != "leaf_next" || f.DataTypeOID != 20 || f.DataTypeSize != 8 || f.TypeModifier != -1 || f.Format != 0 {
		t.Fatalf("field %+v", f)
	}
	if r.CommandTag.String() != "SELECT 1" || len(r.Rows) != 1 || string(r.Rows[0][0]) != "1001" {
		t.Fatalf("tag %q rows %q", r.CommandTag, r.Rows)
	}
	// Inside a transaction the status is carried through; in a failed one the query goes
	// to the server, which refuses it.
	if _, err := pg.Exec(ctx, "BEGIN").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Exec(ctx, "SELECT leaf_next('fast') AS id").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if pg.TxStatus() != 'T' {
		t.Fatalf("tx status %q inside a transaction", pg.TxStatus())
	}
	_, err = pg.Exec(ctx, "SELECT 1/0").ReadAll()
	wantSQLState(t, err, "22012")
	_, err = pg.Exec(ctx, "SELECT leaf_next('fast')").ReadAll()
	wantSQLState(t, err, "25P02")
	if _, err := pg.Exec(ctx, "ROLLBACK").ReadAll(); err != nil {
		t.Fatal(err)
	}
	// A multi-statement Query is rewritten and forwarded, not answered locally.
	results, err = pg.Exec(ctx, "SELECT leaf_next('fast'); SELECT 2").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 || string(results[0].Rows[0][0]) != "1004" {
		t.Fatalf("results %+v", results)
	}
}

func TestRewriteInsertFill(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := rewritingProxy(t, db)
	setup := connect(t, db)
	if _, err := setup.Exec(testContext(t), "CREATE TABLE orders (id int8 PRIMARY KEY, item text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	seen := make(map[int64]bool)
	for _, mode := range allModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testContext(t)
			conn := connectMode(t, p.url(db), mode)
			for i := range 3 {
				var id int64
				if err := conn.QueryRow(ctx, "INSERT INTO orders (item) VALUES ($1) RETURNING id", fmt.Sprint("book", i)).Scan(&id); err != nil {
					t.Fatal(err)
				}
				if id <= 1000 || seen[id] {
					t.Fatalf("id %d: not a fresh ID of tag order", id)
				}
				seen[id] = true
			}
			// Describe shows the client's parameters only, not the hidden ones.
			sd, err := conn.Prepare(ctx, "", "INSERT INTO orders (item) VALUES ($1)")
			if mode != pgx.QueryExecModeSimpleProtocol {
				if err != nil {
					t.Fatal(err)
				}
				if len(sd.ParamOIDs) != 1 {
					t.Fatalf("described %d parameters, want 1", len(sd.ParamOIDs))
				}
			}
		})
	}
	t.Run("batch", func(t *testing.T) {
		ctx := testContext(t)
		conn := connect(t, p.url(db))
		batch := &pgx.Batch{}
		for i := range 100 {
			batch.Queue("INSERT INTO orders (item) VALUES ($1) RETURNING id", fmt.Sprint("batch", i))
		}
		br := conn.SendBatch(ctx, batch)
		for range 100 {
			var id int64
			if err := br.QueryRow().Scan(&id); err != nil {
				t.Fatal(err)
			}
			if seen[id] {
				t.Fatalf("id %d twice", id)
			}
			seen[id] = true
		}
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
	})
	var n int
	if err := setup.QueryRow(testContext(t), "SELECT count(DISTINCT id) FROM orders").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != len(seen) {
		t.Fatalf("%d distinct ids in the table, %d handed out", n, len(seen))
	}
}

func TestRewriteErrors(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := rewritingProxy(t, db)
	tests := []struct {
		sql  string
		code string
	}{
		{"SELECT leaf_next('x') FROM generate_series(1, 3)", "0A000"},
		{"SELECT leaf_next('unavailable')", "55000"},
		{"SELECT leaf_next('broken')", "58000"},
		{"SELECT leaf_next('unavailable'), 1", "55000"},
	}
	for _, mode := range allModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testContext(t)
			conn := connectMode(t, p.url(db), mode)
			for _, tt := range tests {
				_, err := conn.Exec(ctx, tt.sql)
				pgErr := wantSQLState(t, err, tt.code)
				if tt.code == "0A000" && pgErr.Hint == "" {
					t.Errorf("%s: refusal without a hint", tt.sql)
				}
				// The session is in step afterwards.
				var one int
				if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
					t.Fatalf("after %q: %v", tt.sql, err)
				}
			}
		})
	}
	t.Run("pipeline", func(t *testing.T) {
		ctx := testContext(t)
		conn := connect(t, p.url(db))
		pl := conn.PgConn().StartPipeline(ctx)
		pl.SendQueryParams("SELECT 1", nil, nil, nil, nil)
		pl.SendQueryParams("SELECT leaf_next('x') FROM generate_series(1, 3)", nil, nil, nil, nil)
		pl.SendQueryParams("SELECT 3", nil, nil, nil, nil)
		if err := pl.Sync(); err != nil {
			t.Fatal(err)
		}
		pl.SendQueryParams("SELECT 4", nil, nil, nil, nil)
		if err := pl.Sync(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			res, err := pl.GetResults()
			if err != nil {
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) {
					t.Fatal(err)
				}
				got = append(got, pgErr.Code)
				continue
			}
			if res == nil {
				break
			}
			switch r := res.(type) {
			case *pgconn.ResultReader:
				rr := r.Read()
				if rr.Err != nil {
					t.Fatal(rr.Err)
				}
				got = append(got, string(rr.Rows[0][0]))
			case *pgconn.PipelineSync:
				got = append(got, "sync")
			}
		}
		if err := pl.Close(); err != nil {
			t.Fatal(err)
		}
		want := "1 0A000 sync 4 sync"
		if strings.Join(got, " ") != want {
			t.Fatalf("pipeline results %q, want %q", strings.Join(got, " "), want)
		}
	})
}

func TestRewriteSQLPrepare(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := rewritingProxy(t, db)
	ctx := testContext(t)
	conn := connectMode(t, p.url(db), pgx.QueryExecModeSimpleProtocol)
	if _, err := conn.Exec(ctx, "CREATE TABLE orders (id int8 PRIMARY KEY, item text)"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "PREPARE ins AS INSERT INTO orders (item) VALUES ($1) RETURNING id"); err != nil {
		t.Fatal(err)
	}
	var a, b int64
	if err := conn.QueryRow(ctx, "EXECUTE ins('a')").Scan(&a); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "EXECUTE ins('b')").Scan(&b); err != nil {
		t.Fatal(err)
	}
	if a <= 1000 || b != a+1 {
		t.Fatalf("ids %d, %d", a, b)
	}
	if _, err := conn.Exec(ctx, "DEALLOCATE ins"); err != nil {
		t.Fatal(err)
	}
	// PREPARE sent through the extended protocol is rewritten the same way.
	if err := conn.PgConn().ExecParams(ctx, "PREPARE ins2 AS INSERT INTO orders (item) VALUES ($1) RETURNING id", nil, nil, nil, nil).Read().Err; err != nil {
		t.Fatal(err)
	}
	var c int64
	if err := conn.QueryRow(ctx, "EXECUTE ins2('c')").Scan(&c); err != nil {
		t.Fatal(err)
	}
	if c != b+1 {
		t.Fatalf("id %d after %d", c, b)
	}
	// A failed PREPARE leaves nothing behind: EXECUTE of the name is the server's error.
	_, err := conn.Exec(ctx, "PREPARE bad AS INSERT INTO orders (item, nope) VALUES ($1, 1)")
	wantSQLState(t, err, "42703")
	_, err = conn.Exec(ctx, "EXECUTE bad('x')")
	wantSQLState(t, err, "26000")
}

// TestRewritingPassThrough runs ordinary traffic through a rewriting proxy: the session
// bookkeeping must not disturb what it does not rewrite.
func TestRewritingPassThrough(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := rewritingProxy(t, db)
	url := p.url(db)
	if out, err := runTool(t, "pgbench", "-i", "-s", "1", "-q", url); err != nil {
		t.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	for _, mode := range []string{"simple", "extended", "prepared"} {
		t.Run("pgbench "+mode, func(t *testing.T) {
			out, err := runTool(t, "pgbench", "-n", "-M", mode, "-c", "4", "-j", "2", "-t", "100", url)
			if err != nil {
				t.Fatalf("pgbench: %v\n%s", err, out)
			}
			if m := pgbenchProcessed.FindStringSubmatch(out); m == nil || m[1] != "400" {
				t.Fatalf("pgbench did not process 400 transactions:\n%s", out)
			}
		})
	}
	t.Run("copy and statements", func(t *testing.T) {
		ctx := testContext(t)
		conn := connect(t, url)
		if _, err := conn.Exec(ctx, "CREATE TABLE plain (id int8, name text)"); err != nil {
			t.Fatal(err)
		}
		n, err := conn.CopyFrom(ctx, pgx.Identifier{"plain"}, []string{"id", "name"},
			pgx.CopyFromSlice(10000, func(i int) ([]any, error) { return []any{int64(i), "x"}, nil }))
		if err != nil || n != 10000 {
			t.Fatalf("CopyFrom: %d rows, %v", n, err)
		}
		// Statements with and without hidden parameters side by side, closed and
		// re-prepared under the same names.
		for i := range 3 {
			if _, err := conn.Prepare(ctx, "s1", "SELECT count(*) FROM plain WHERE id > $1"); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Prepare(ctx, "s2", "SELECT leaf_next('plain'), $1::int"); err != nil {
				t.Fatal(err)
			}
			var count, id int64
			var echo int
			if err := conn.QueryRow(ctx, "s1", 9000).Scan(&count); err != nil || count != 999 {
				t.Fatalf("round %d: count %d, %v", i, count, err)
			}
			if err := conn.QueryRow(ctx, "s2", 7).Scan(&id, &echo); err != nil || echo != 7 || id <= 1000 {
				t.Fatalf("round %d: id %d echo %d, %v", i, id, echo, err)
			}
			if err := conn.Deallocate(ctx, "s1"); err != nil {
				t.Fatal(err)
			}
			if err := conn.Deallocate(ctx, "s2"); err != nil {
				t.Fatal(err)
			}
		}
		// Format codes: one per parameter (binary int, text string) gets one text code
		// per hidden parameter appended; one code for all (binary) gets binary IDs.
		var id, id2 int64
		var num int
		var txt string
		if err := conn.QueryRow(ctx, "SELECT leaf_next('plain'), $1::int, $2::text", 5, "five").Scan(&id, &num, &txt); err != nil || num != 5 || txt != "five" || id <= 1000 {
			t.Fatalf("per-parameter codes: id %d, %d, %q, %v", id, num, txt, err)
		}
		if err := conn.QueryRow(ctx, "SELECT leaf_next('plain') + $1::int8", int64(0)).Scan(&id2); err != nil || id2 != id+1 {
			t.Fatalf("binary code for all: id %d after %d, %v", id2, id, err)
		}
	})
}

// TestRewriteOrderUnderPipelining sends simple Queries back to back without waiting: the
// proxy's own answers (a refusal, the fast path) must come after the server's answers to
// the queries before them.
func TestRewriteOrderUnderPipelining(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := rewritingProxy(t, db)
	hc := hijacked(t, p.url(db))
	fe := hc.Frontend
	fe.Send(&pgproto3.Query{String: "SELECT pg_sleep(0.2)::text || 'slow'"})
	fe.Send(&pgproto3.Query{String: "SELECT leaf_next('x') FROM generate_series(1, 2)"})
	fe.Send(&pgproto3.Query{String: "SELECT leaf_next('x')"})
	fe.Send(&pgproto3.Parse{Query: "SELECT 'extended'"})
	fe.Send(&pgproto3.Bind{})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Sync{})
	fe.Send(&pgproto3.Query{String: "SELECT 1 FROM generate_series(1, 2) WHERE leaf_next('x') > 0"})
	fe.Send(&pgproto3.Query{String: "SELECT 'last'"})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	_ = hc.Conn.SetDeadline(time.Now().Add(10 * time.Second))
	var got []string
	for len(got) < 12 {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			got = append(got, "row:"+string(m.Values[0]))
		case *pgproto3.ErrorResponse:
			got = append(got, "error:"+m.Code)
		case *pgproto3.ReadyForQuery:
			got = append(got, "ready")
		}
	}
	want := "row:slow ready error:0A000 ready row:1001 ready row:extended ready error:0A000 ready row:last ready"
	if strings.Join(got, " ") != want {
		t.Fatalf("responses\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
}

// TestRewriteLibPQ uses database/sql with lib/pq, which checks the number of parameters a
// prepared statement describes against the arguments it is given.
func TestRewriteLibPQ(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := rewritingProxy(t, db)
	conn, err := sql.Open("postgres", p.url(db))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Exec("CREATE TABLE orders (id int8 PRIMARY KEY, item text)"); err != nil {
		t.Fatal(err)
	}
	stmt, err := conn.Prepare("INSERT INTO orders (item) VALUES ($1) RETURNING id")
	if err != nil {
		t.Fatal(err)
	}
	defer stmt.Close()
	var last int64
	for i := range 20 {
		var id int64
		if err := stmt.QueryRow(fmt.Sprint("item", i)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if id <= last {
			t.Fatalf("id %d after %d", id, last)
		}
		last = id
	}
	var id int64
	var tag string
	if err := conn.QueryRow("SELECT leaf_next($1), $2::text", "other", "t").Scan(&id, &tag); err != nil {
		t.Fatal(err)
	}
	if id <= 1000 || tag != "t" {
		t.Fatalf("id %d tag %q", id, tag)
	}
}

// TestRewriteStatementBookkeeping checks that the statement map follows what the server
// did, not what the client asked for: a Parse or Close the server skipped or refused must
// leave the hidden parameters of the existing statement in place.
func TestRewriteStatementBookkeeping(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := rewritingProxy(t, db)
	ctx := testContext(t)
	conn := connect(t, p.url(db))
	if _, err := conn.Exec(ctx, "CREATE TABLE orders (id int8 PRIMARY KEY, item text)"); err != nil {
		t.Fatal(err)
	}
	pg := conn.PgConn()
	insert := func() int64 {
		t.Helper()
		res := pg.ExecPrepared(ctx, "ins", [][]byte{[]byte("book")}, nil, nil).Read()
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		id, err := strconv.ParseInt(string(res.Rows[0][0]), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	sd, err := pg.Prepare(ctx, "ins", "INSERT INTO orders (item) VALUES ($1) RETURNING id", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(sd.ParamOIDs) != 1 {
		t.Fatalf("described %d parameters", len(sd.ParamOIDs))
	}
	first := insert()

	// The server refuses a second statement of the same name.
	_, err = pg.Prepare(ctx, "ins", "SELECT 1", nil)
	wantSQLState(t, err, "42P05")
	if id := insert(); id != first+1 {
		t.Fatalf("after the refused Parse: id %d, want %d", id, first+1)
	}

	// A Close skipped after an error in the same cycle does not happen either.
	pl := pg.StartPipeline(ctx)
	pl.SendQueryParams("SELECT 1/0", nil, nil, nil, nil)
	pl.SendDeallocate("ins")
	if err := pl.Sync(); err != nil {
		t.Fatal(err)
	}
	for {
		res, err := pl.GetResults()
		if err != nil {
			wantSQLState(t, err, "22012")
			continue
		}
		if res == nil {
			break
		}
		if rr, ok := res.(*pgconn.ResultReader); ok {
			_, _ = rr.Close()
		}
		if _, ok := res.(*pgconn.PipelineSync); ok {
			break
		}
	}
	if err := pl.Close(); err != nil {
		t.Fatal(err)
	}
	if id := insert(); id != first+2 {
		t.Fatalf("after the skipped Close: id %d, want %d", id, first+2)
	}

	// A real Close forgets the statement: a new one under the name has no hidden
	// parameters.
	if err := pg.Deallocate(ctx, "ins"); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Prepare(ctx, "ins", "SELECT $1::text", nil); err != nil {
		t.Fatal(err)
	}
	res := pg.ExecPrepared(ctx, "ins", [][]byte{[]byte("plain")}, nil, nil).Read()
	if res.Err != nil || string(res.Rows[0][0]) != "plain" {
		t.Fatalf("plain statement: %v %q", res.Err, res.Rows)
	}
}
