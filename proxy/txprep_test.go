package proxy

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// deallocFixture is two clients of one server connection (a pool of one), with the
// helpers of the DEALLOCATE tests.
type deallocFixture struct {
	t     *testing.T
	ctx   context.Context
	a, b  *pgconn.PgConn
	other *pgx.Conn // b's pgx connection
}

// newDeallocFixture runs test over two clients of a pool of one, of a relaying proxy and
// of a rewriting one.
func newDeallocFixture(t *testing.T, test func(f *deallocFixture, p *testProxy, db string)) {
	poolOfOne := func(s *Server) { s.Pooling.PoolSize = 1 }
	for _, rewriting := range []bool{false, true} {
		t.Run(map[bool]string{false: "relay", true: "rewriting"}[rewriting], func(t *testing.T) {
			db := testenv.NewDatabase(t)
			var p *testProxy
			if rewriting {
				p, _ = rewritingProxy(t, db, inTransactionMode, poolOfOne)
			} else {
				p = startProxy(t, db, inTransactionMode, poolOfOne)
			}
			other := connect(t, p.url(db))
			f := &deallocFixture{t: t, ctx: testContext(t), a: connect(t, p.url(db)).PgConn(), b: other.PgConn(), other: other}
			test(f, p, db)
		})
	}
}

func (f *deallocFixture) prepare(c *pgconn.PgConn, name, sql string) {
	f.t.Helper()
	if _, err := c.Prepare(f.ctx, name, sql, nil); err != nil {
		f.t.Fatalf("prepare %s: %v", name, err)
	}
}

func (f *deallocFixture) run(c *pgconn.PgConn, name, want string) {
	f.t.Helper()
	res := c.ExecPrepared(f.ctx, name, nil, nil, nil).Read()
	if res.Err != nil || len(res.Rows) != 1 || string(res.Rows[0][0]) != want {
		f.t.Fatalf("execute %s: %v %q, want %s", name, res.Err, res.Rows, want)
	}
}

func (f *deallocFixture) wantTag(rr *pgconn.ResultReader, tag string) {
	f.t.Helper()
	res := rr.Read()
	if res.Err != nil || res.CommandTag.String() != tag {
		f.t.Fatalf("%v %q, want %s", res.Err, res.CommandTag, tag)
	}
}

func (f *deallocFixture) wantState(rr *pgconn.ResultReader, code string) {
	f.t.Helper()
	wantSQLState(f.t, rr.Read().Err, code)
}

// exec runs sql on a in the simple protocol.
func (f *deallocFixture) exec(sql string) {
	f.t.Helper()
	if _, err := f.a.Exec(f.ctx, sql).ReadAll(); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

// params runs sql on a in the extended protocol, as the unnamed statement.
func (f *deallocFixture) params(sql string) *pgconn.ResultReader {
	return f.a.ExecParams(f.ctx, sql, nil, nil, nil, nil)
}

func (f *deallocFixture) prepared(c *pgconn.PgConn, name string) *pgconn.ResultReader {
	return c.ExecPrepared(f.ctx, name, nil, nil, nil)
}

// serverName returns the name of the statement of this text on the one server
// connection, "" when there is none.
func (f *deallocFixture) serverName(text string) string {
	f.t.Helper()
	var name string
	err := f.other.QueryRow(f.ctx, "SELECT coalesce(max(name), '') FROM pg_prepared_statements WHERE statement = '"+text+"'",
		pgx.QueryExecModeSimpleProtocol).Scan(&name)
	if err != nil {
		f.t.Fatal(err)
	}
	return name
}

// TestTxPoolDeallocateNamed: a DEALLOCATE parsed as a named statement (pgx's statement
// cache prepares every query so) is answered per client, each time it runs: not even one
// naming the proxy's server-side name of another client's statement, nor DEALLOCATE ALL,
// removes what another client of the same server connection uses.
func TestTxPoolDeallocateNamed(t *testing.T) {
	newDeallocFixture(t, func(f *deallocFixture, p *testProxy, db string) {
		a, b := f.a, f.b
		f.prepare(a, "s1", "SELECT 1")
		f.prepare(b, "s1", "SELECT 1") // the same server-side statement
		sname := f.serverName("SELECT 1")
		if !strings.HasPrefix(sname, "leafproxy_") {
			t.Fatalf("the server-side name of SELECT 1: %q", sname)
		}
		for _, sql := range []string{"DEALLOCATE " + sname, "DEALLOCATE PREPARE " + sname, "DEALLOCATE ALL"} {
			f.prepare(a, "evil", sql)
			if sql == "DEALLOCATE ALL" {
				f.wantTag(f.prepared(a, "evil"), "DEALLOCATE ALL")
			} else {
				f.wantState(f.prepared(a, "evil"), "26000")
				f.exec("DEALLOCATE evil")
			}
			if f.serverName("SELECT 1") != sname {
				t.Fatalf("%s removed the server's statement of another client", sql)
			}
			f.run(b, "s1", "1")
		}
		f.wantState(f.prepared(a, "s1"), "26000") // gone with DEALLOCATE ALL

		f.prepare(a, "s1", "SELECT 1")
		f.prepare(a, "d1", "DEALLOCATE s1")
		f.wantTag(f.prepared(a, "d1"), "DEALLOCATE")
		f.wantState(f.prepared(a, "s1"), "26000")
		f.wantState(f.prepared(a, "d1"), "26000")
		f.run(b, "s1", "1")
		f.prepare(a, "s1", "SELECT 11")
		f.wantTag(f.prepared(a, "d1"), "DEALLOCATE")
		// Described as PostgreSQL describes a DEALLOCATE: no columns.
		sd, err := a.Prepare(f.ctx, "d2", "DEALLOCATE s2", nil)
		if err != nil || len(sd.Fields) != 0 || len(sd.ParamOIDs) != 0 {
			t.Fatalf("describe of a DEALLOCATE: %+v, %v", sd, err)
		}

		// pgx with its statement cache.
		c := connect(t, p.url(db))
		if _, err := c.Prepare(f.ctx, "mine", "SELECT 7"); err != nil {
			t.Fatal(err)
		}
		for i, want := range []string{"DEALLOCATE", "26000"} {
			rows, _ := c.Query(f.ctx, "DEALLOCATE mine")
			rows.Close()
			if want == "26000" {
				wantSQLState(t, rows.Err(), want)
			} else if rows.Err() != nil || rows.CommandTag().String() != want {
				t.Fatalf("pgx DEALLOCATE %d: %v %q", i, rows.Err(), rows.CommandTag())
			}
		}
		f.run(b, "s1", "1")
	})
}

// TestTxPoolDeallocateInTransaction: a DEALLOCATE parsed as the unnamed statement inside a
// transaction, or pipelined after a statement that takes a server connection, is answered
// per client in order with the server's answers: CommandComplete, 26000 for a name the
// client lacks (failing its transaction, as in PostgreSQL), 25P02 in a failed transaction;
// the next messages of a pipeline see its effect.
func TestTxPoolDeallocateInTransaction(t *testing.T) {
	newDeallocFixture(t, func(f *deallocFixture, p *testProxy, db string) {
		a, b := f.a, f.b
		f.prepare(a, "s1", "SELECT 1")
		f.prepare(b, "s1", "SELECT 1")
		sname := f.serverName("SELECT 1")
		f.exec("BEGIN")
		f.prepare(a, "s3", "SELECT 3")
		f.wantTag(f.params("DEALLOCATE s3"), "DEALLOCATE")
		if a.TxStatus() != 'T' {
			t.Fatalf("transaction status %c after DEALLOCATE, want T", a.TxStatus())
		}
		f.wantState(f.prepared(a, "s3"), "26000")
		f.wantState(f.params("SELECT 1"), "25P02")
		f.exec("ROLLBACK")
		f.exec("BEGIN")
		f.wantState(f.params("DEALLOCATE "+sname), "26000")
		f.wantState(f.params("SELECT 1"), "25P02")
		f.exec("ROLLBACK")
		f.exec("BEGIN")
		f.wantTag(f.params("DEALLOCATE ALL"), "DEALLOCATE ALL")
		f.exec("COMMIT")
		f.wantState(f.prepared(a, "s1"), "26000")
		f.run(b, "s1", "1")
		f.prepare(a, "s5", "SELECT 5")
		f.prepare(a, "d5", "DEALLOCATE s5")
		f.exec("BEGIN")
		f.wantState(f.params("SELECT 1/0"), "22012")
		f.wantState(f.prepared(a, "d5"), "25P02")
		f.exec("ROLLBACK")
		f.run(a, "s5", "5") // the failed DEALLOCATE kept it
		f.run(b, "s1", "1")

		pl := a.StartPipeline(f.ctx)
		pl.SendQueryPrepared("s5", nil, nil, nil)
		pl.SendQueryParams("DEALLOCATE s5", nil, nil, nil, nil)
		pl.SendQueryPrepared("s5", nil, nil, nil)
		pl.SendQueryParams("SELECT 6", nil, nil, nil, nil)
		if err := pl.Sync(); err != nil {
			t.Fatal(err)
		}
		if got := pipelineAnswers(t, pl); got != "SELECT 1:5,DEALLOCATE,26000" {
			t.Fatalf("pipeline answers %q", got)
		}
		// Skipped after an error: not deallocated.
		f.prepare(a, "s5", "SELECT 5")
		pl = a.StartPipeline(f.ctx)
		pl.SendQueryParams("SELECT 1/0", nil, nil, nil, nil)
		pl.SendQueryPrepared("d5", nil, nil, nil)
		if err := pl.Sync(); err != nil {
			t.Fatal(err)
		}
		if got := pipelineAnswers(t, pl); got != "22012" {
			t.Fatalf("pipeline answers %q", got)
		}
		f.run(a, "s5", "5")
		f.run(b, "s1", "1")

		// A DEALLOCATE query between extended-protocol messages and their Sync.
		fe := a.Frontend()
		fe.Send(&pgproto3.Parse{Query: "SELECT 8"})
		fe.Send(&pgproto3.Bind{})
		fe.Send(&pgproto3.Execute{})
		fe.Send(&pgproto3.Query{String: "DEALLOCATE s5"})
		fe.Send(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		if got := receiveUntilReady(t, fe, 2); got != "ParseComplete,BindComplete,8,SELECT 1,DEALLOCATE,I,I" {
			t.Fatalf("answers %q", got)
		}
		f.wantState(f.prepared(a, "s5"), "26000")
		f.run(b, "s1", "1")
	})
}

// receiveUntilReady reads messages up to the ready-th ReadyForQuery: the first column of
// data rows, command tags, SQLSTATEs, transaction statuses and the other messages' names.
func receiveUntilReady(t *testing.T, fe *pgproto3.Frontend, ready int) string {
	t.Helper()
	var got []string
	for ready > 0 {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch msg := msg.(type) {
		case *pgproto3.ErrorResponse:
			got = append(got, msg.Code)
		case *pgproto3.DataRow:
			got = append(got, string(msg.Values[0]))
		case *pgproto3.CommandComplete:
			got = append(got, string(msg.CommandTag))
		case *pgproto3.ReadyForQuery:
			got = append(got, string(msg.TxStatus))
			ready--
		default:
			got = append(got, strings.TrimPrefix(fmt.Sprintf("%T", msg), "*pgproto3."))
		}
	}
	return strings.Join(got, ",")
}

// TestTxPoolDiscardAllPipelined: a DISCARD ALL pipelined before a Parse in the extended
// protocol drops the server connection's statements, but the one parsed after it stays
// the client's, and is known to be prepared there where another client parses the same
// text.
func TestTxPoolDiscardAllPipelined(t *testing.T) {
	newDeallocFixture(t, func(f *deallocFixture, p *testProxy, db string) {
		a, b := f.a, f.b
		f.prepare(b, "s1", "SELECT 1")
		f.prepare(a, "s5", "SELECT 5")
		f.prepare(b, "s9", "SELECT 9")
		pl := a.StartPipeline(f.ctx)
		pl.SendQueryParams("DISCARD ALL", nil, nil, nil, nil)
		pl.SendPrepare("p9", "SELECT 9", nil)
		if err := pl.Sync(); err != nil {
			t.Fatal(err)
		}
		if got := pipelineAnswers(t, pl); got != "DISCARD ALL,prepared" {
			t.Fatalf("pipeline answers %q", got)
		}
		f.run(a, "p9", "9")
		f.run(b, "s9", "9")
		f.run(b, "s1", "1")
		f.prepare(b, "q9", "SELECT 9")
		f.run(b, "q9", "9")
		f.wantState(f.prepared(a, "s5"), "26000") // DISCARD ALL dropped it

		// psql's DEALLOCATE ALL and DISCARD ALL on the same server connection.
		out, err := runTool(t, "psql", "-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", p.url(db), "-c", "DEALLOCATE ALL", "-c", "DISCARD ALL")
		if err != nil || out != "DEALLOCATE ALL\nDISCARD ALL\n" {
			t.Fatalf("psql: %v\n%q", err, out)
		}
		f.run(b, "s1", "1")
		f.run(b, "s9", "9")
		f.run(a, "p9", "9")
	})
}

// TestTxPoolSkippedParseAgain: a Parse of a statement that the server connection already
// has (the proxy closes and parses it again there), skipped by the server after an error
// earlier in its pipeline, leaves the statement known as prepared: the client of the same
// text on that connection (a pool of one) keeps running it, instead of the proxy
// preparing it again and failing with 42P05.
func TestTxPoolSkippedParseAgain(t *testing.T) {
	newDeallocFixture(t, func(f *deallocFixture, p *testProxy, db string) {
		a, b := f.a, f.b
		f.prepare(b, "s1", "SELECT 1")
		pl := a.StartPipeline(f.ctx)
		pl.SendQueryParams("SELECT 1/0", nil, nil, nil, nil)
		pl.SendPrepare("mine", "SELECT 1", nil)
		if err := pl.Sync(); err != nil {
			t.Fatal(err)
		}
		if got := pipelineAnswers(t, pl); got != "22012" {
			t.Fatalf("pipeline answers %q", got)
		}
		f.run(b, "s1", "1")
		f.wantState(f.prepared(a, "mine"), "26000")
		f.prepare(a, "mine", "SELECT 1")
		f.run(a, "mine", "1")
		f.run(b, "s1", "1")
	})
}

// pipelineAnswers reads the answers of a synced pipeline: command tags, the rows of the
// one-row results as tag:value, SQLSTATEs of errors, "prepared" for a statement.
func pipelineAnswers(t *testing.T, pl *pgconn.Pipeline) string {
	t.Helper()
	var got []string
	for {
		r, err := pl.GetResults()
		if err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) {
				got = append(got, pgErr.Code)
				continue
			}
			t.Fatal(err)
		}
		switch r := r.(type) {
		case nil:
			if err := pl.Close(); err != nil {
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) {
					t.Fatal(err)
				}
			}
			return strings.Join(got, ",")
		case *pgconn.ResultReader:
			res := r.Read()
			if res.Err != nil {
				var pgErr *pgconn.PgError
				if !errors.As(res.Err, &pgErr) {
					t.Fatal(res.Err)
				}
				got = append(got, pgErr.Code)
				continue
			}
			a := res.CommandTag.String()
			if len(res.Rows) == 1 {
				a += ":" + string(res.Rows[0][0])
			}
			got = append(got, a)
		case *pgconn.StatementDescription:
			got = append(got, "prepared")
		case *pgconn.PipelineSync:
		}
	}
}

// TestTxPoolMaxPreparedStatements: with max-prepared-statements, a server connection
// shared by pgx (statement cache on) and lib/pq clients (a pool of one) holds no more
// statements than the cap once the borrower that prepared the last one is done; the
// least recently used are closed there and prepared again when a client needs them; and
// none that the borrower uses is closed during its transaction.
func TestTxPoolMaxPreparedStatements(t *testing.T) {
	const limit = 4
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) {
		s.Pooling.PoolSize = 1
		s.MaxPreparedStatements = limit
	})
	ctx := testContext(t)
	observer := connect(t, p.url(db))
	// held counts the proxy's statements on the one server connection, and those of
	// texts that contain like.
	held := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, like string) (all, matching int) {
		t.Helper()
		err := q.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE position('"+like+"' in statement) > 0) FROM pg_prepared_statements WHERE name LIKE 'leafproxy%'",
			pgx.QueryExecModeSimpleProtocol).Scan(&all, &matching)
		if err != nil {
			t.Fatal(err)
		}
		return all, matching
	}

	c := connect(t, p.url(db))
	for round := range 3 {
		for k := range 12 {
			var n int
			if err := c.QueryRow(ctx, fmt.Sprintf("SELECT $1::int + %d", k), round).Scan(&n); err != nil || n != round+k {
				t.Fatalf("round %d, statement %d: %d, %v", round, k, n, err)
			}
			if all, _ := held(observer, ""); all > limit {
				t.Fatalf("round %d, statement %d: %d statements on the server connection, cap %d", round, k, all, limit)
			}
		}
	}

	pq, err := sql.Open("postgres", p.url(db))
	if err != nil {
		t.Fatal(err)
	}
	defer pq.Close()
	pq.SetMaxOpenConns(1)
	var stmts []*sql.Stmt
	for k := range 8 {
		st, err := pq.Prepare(fmt.Sprintf("SELECT $1::int * %d", k+2))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		stmts = append(stmts, st)
	}
	for round := range 2 {
		for k, st := range stmts {
			var n int
			if err := st.QueryRow(round + 1).Scan(&n); err != nil || n != (round+1)*(k+2) {
				t.Fatalf("lib/pq round %d, statement %d: %d, %v", round, k, n, err)
			}
			if all, _ := held(observer, ""); all > limit {
				t.Fatalf("lib/pq round %d, statement %d: %d statements on the server connection, cap %d", round, k, all, limit)
			}
		}
	}

	// In one transaction, more statements than the cap: none is closed before its end.
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for k := range limit + 3 {
		var n int
		if err := tx.QueryRow(ctx, fmt.Sprintf("SELECT $1::int - %d", k), 100).Scan(&n); err != nil || n != 100-k {
			t.Fatalf("in the transaction, statement %d: %d, %v", k, n, err)
		}
	}
	if _, mine := held(tx, "::int - "); mine != limit+3 {
		t.Fatalf("%d of the transaction's %d statements are still prepared", mine, limit+3)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := c.QueryRow(ctx, "SELECT $1::int + 100", 1).Scan(&n); err != nil || n != 101 {
		t.Fatalf("after the transaction: %d, %v", n, err)
	}
	if all, _ := held(observer, ""); all > limit {
		t.Fatalf("%d statements on the server connection after the transaction, cap %d", all, limit)
	}
}

// TestTxPoolUnnamedStatementIsTheClients: a Bind of the unnamed statement from a client
// that parsed none gets 26000, as from PostgreSQL, and never runs the unnamed statement
// another client left on the same server connection (a pool of one).
func TestTxPoolUnnamedStatementIsTheClients(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 1 })
	ctx := testContext(t)
	a := connect(t, p.url(db)).PgConn()
	b := connect(t, p.url(db)).PgConn()
	res := a.ExecParams(ctx, "SELECT 'secret of a'", nil, nil, nil, nil).Read()
	if res.Err != nil || len(res.Rows) != 1 {
		t.Fatalf("a: %v", res.Err)
	}
	for range 2 {
		fe := b.Frontend()
		fe.Send(&pgproto3.Bind{})
		fe.Send(&pgproto3.Describe{ObjectType: 'P'})
		fe.Send(&pgproto3.Execute{})
		fe.Send(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		if got := receiveUntilReady(t, fe, 1); got != "26000,I" {
			t.Fatalf("b's Bind of an unnamed statement it never parsed: %q", got)
		}
	}
	res = a.ExecParams(ctx, "SELECT 2", nil, nil, nil, nil).Read()
	if res.Err != nil || len(res.Rows) != 1 || string(res.Rows[0][0]) != "2" {
		t.Fatalf("a afterwards: %v %q", res.Err, res.Rows)
	}
}

// TestTxPoolPreparedStatementsChurn: 12 pgx clients (statement cache on) over 3 server
// connections with max-prepared-statements 4 run 16 distinct statements in batches and
// transactions, so that statements are closed and prepared again all the time, in the
// middle of pipelines: every answer is right.
func TestTxPoolPreparedStatementsChurn(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) {
		s.Pooling.PoolSize = 3
		s.MaxPreparedStatements = 4
	})
	ctx := testContext(t)
	errs := make(chan error, 12)
	for c := range 12 {
		go func() {
			errs <- func() error {
				conn, err := pgx.Connect(ctx, p.url(db))
				if err != nil {
					return err
				}
				defer conn.Close(context.Background())
				query := func(k int) string { return fmt.Sprintf("SELECT $1::int + %d", k%16) }
				for i := range 30 {
					batch := &pgx.Batch{}
					for j := range 3 {
						k := c*5 + i*3 + j
						batch.Queue(query(k), i).QueryRow(func(row pgx.Row) error {
							var n int
							if err := row.Scan(&n); err != nil {
								return err
							}
							if n != i+k%16 {
								return fmt.Errorf("client %d, batch %d: %s gave %d", c, i, query(k), n)
							}
							return nil
						})
					}
					if err := conn.SendBatch(ctx, batch).Close(); err != nil {
						return err
					}
					if i%5 != 0 {
						continue
					}
					err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
						for k := range 6 {
							var n int
							if err := tx.QueryRow(ctx, query(c+i+k), -1).Scan(&n); err != nil {
								return err
							}
							if n != -1+(c+i+k)%16 {
								return fmt.Errorf("client %d, transaction %d: %s gave %d", c, i, query(c+i+k), n)
							}
						}
						return nil
					})
					if err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	for range 12 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestTxPoolPreparedStatementsServerMemory measures what max-prepared-statements saves the
// server: a pgx client (statement cache on) runs 2,000 distinct statements over a pool of
// one, and the memory of the server connection's backend (pg_backend_memory_contexts) is
// read before and after, without a cap and with the default cap of 200. The cap must keep
// at least half of what the statements cost without it from piling up.
func TestTxPoolPreparedStatementsServerMemory(t *testing.T) {
	grown := map[int]int64{}
	for _, limit := range []int{0, 200} {
		db := testenv.NewDatabase(t)
		p := startProxy(t, db, inTransactionMode, func(s *Server) {
			s.Pooling.PoolSize = 1
			s.MaxPreparedStatements = limit
		})
		ctx := testContext(t)
		if _, err := connect(t, db).Exec(ctx, "CREATE TABLE orders (id int8 PRIMARY KEY, item text, qty int)"); err != nil {
			t.Fatal(err)
		}
		c := connect(t, p.url(db))
		backend := func() (bytes int64, statements int) {
			t.Helper()
			err := c.QueryRow(ctx, "SELECT (SELECT sum(total_bytes) FROM pg_backend_memory_contexts), (SELECT count(*) FROM pg_prepared_statements)",
				pgx.QueryExecModeSimpleProtocol).Scan(&bytes, &statements)
			if err != nil {
				t.Fatal(err)
			}
			return bytes, statements
		}
		before, _ := backend()
		for k := range 2000 {
			var n int
			q := fmt.Sprintf("SELECT count(*) FROM orders WHERE id = $1 AND qty > %d AND item <> 'x'", k)
			if err := c.QueryRow(ctx, q, int64(k)).Scan(&n); err != nil {
				t.Fatal(err)
			}
		}
		after, statements := backend()
		grown[limit] = after - before
		t.Logf("max-prepared-statements %d: backend memory %d KiB before, %d KiB after 2000 distinct statements, %d of them prepared",
			limit, before/1024, after/1024, statements)
		want := 2000
		if limit > 0 {
			want = limit
		}
		if statements != want {
			t.Fatalf("%d statements prepared on the server connection, want %d", statements, want)
		}
	}
	if grown[200] > grown[0]/2 {
		t.Fatalf("backend memory grew by %d KiB with the cap, %d KiB without", grown[200]/1024, grown[0]/1024)
	}
}
