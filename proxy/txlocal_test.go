package proxy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// TestTxPoolDeallocate: SQL-level DEALLOCATE of a client's protocol-level statements is
// answered per client, in and out of transactions, and never drops the server's
// statement another client of the same connection uses (a pool of one).
// With the rewriter, statements without IDs are answered alike.
func TestTxPoolDeallocate(t *testing.T) {
	poolOfOne := func(s *Server) { s.Pooling.PoolSize = 1 }
	t.Run("relay", func(t *testing.T) {
		db := testenv.NewDatabase(t)
		testTxPoolDeallocate(t, db, startProxy(t, db, inTransactionMode, poolOfOne))
	})
	t.Run("rewriting", func(t *testing.T) {
		db := testenv.NewDatabase(t)
		p, _ := rewritingProxy(t, db, inTransactionMode, poolOfOne)
		testTxPoolDeallocate(t, db, p)
	})
}

func testTxPoolDeallocate(t *testing.T, db string, p *testProxy) {
	ctx := testContext(t)
	a := connect(t, p.url(db)).PgConn()
	b := connect(t, p.url(db)).PgConn()
	prepare := func(c *pgconn.PgConn, name, sql string) {
		t.Helper()
		if _, err := c.Prepare(ctx, name, sql, nil); err != nil {
			t.Fatalf("prepare %s: %v", name, err)
		}
	}
	run := func(c *pgconn.PgConn, name, want string) {
		t.Helper()
		res := c.ExecPrepared(ctx, name, nil, nil, nil).Read()
		if res.Err != nil || len(res.Rows) != 1 || string(res.Rows[0][0]) != want {
			t.Fatalf("execute %s: %v %q, want %s", name, res.Err, res.Rows, want)
		}
	}
	exec := func(c *pgconn.PgConn, sql string) ([]*pgconn.Result, error) {
		t.Helper()
		return c.Exec(ctx, sql).ReadAll()
	}
	wantTag := func(sql, tag string) {
		t.Helper()
		res, err := exec(a, sql)
		if err != nil || len(res) != 1 || res[0].CommandTag.String() != tag {
			t.Fatalf("%s: %v, want %s", sql, err, tag)
		}
	}
	prepare(a, "s1", "SELECT 1")
	prepare(b, "s1", "SELECT 1") // the same server-side statement
	wantTag("DEALLOCATE s1", "DEALLOCATE")
	run(b, "s1", "1")
	prepare(a, "s1", "SELECT 2") // the name is free again
	run(a, "s1", "2")
	wantTag("DEALLOCATE PREPARE s1", "DEALLOCATE")
	_, err := exec(a, "DEALLOCATE s1")
	pgErr := wantSQLState(t, err, "26000")
	if pgErr.Message != `prepared statement "s1" does not exist` {
		t.Fatalf("message %q", pgErr.Message)
	}
	prepare(a, "s1", "SELECT 1")
	prepare(a, "S2", "SELECT 2")
	wantTag(`DEALLOCATE "S2"`, "DEALLOCATE")
	prepare(a, "S2", "SELECT 3")
	wantTag("DEALLOCATE ALL", "DEALLOCATE ALL")
	prepare(a, "s1", "SELECT 4")
	prepare(a, "S2", "SELECT 5")
	run(a, "s1", "4")
	run(b, "s1", "1")
	_, err = exec(a, "SELECT 1; DEALLOCATE s1")
	wantSQLState(t, err, "0A000")
	run(a, "s1", "4")

	// In the extended protocol (psycopg), alone and followed by another statement in
	// the same pipeline.
	prepare(a, "x1", "SELECT 10")
	rr := a.ExecParams(ctx, "DEALLOCATE x1", nil, nil, nil, nil).Read()
	if rr.Err != nil || rr.CommandTag.String() != "DEALLOCATE" {
		t.Fatalf("extended DEALLOCATE: %v %q", rr.Err, rr.CommandTag)
	}
	rr = a.ExecParams(ctx, "DEALLOCATE x1", nil, nil, nil, nil).Read()
	wantSQLState(t, rr.Err, "26000")
	prepare(a, "x1", "SELECT 11")
	run(a, "x1", "11")
	pl := a.StartPipeline(ctx)
	pl.SendQueryParams("DEALLOCATE x1", nil, nil, nil, nil)
	pl.SendQueryParams("SELECT 12", nil, nil, nil, nil)
	if err := pl.Sync(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		r, err := pl.GetResults()
		if err != nil {
			t.Fatal(err)
		}
		if r == nil {
			break
		}
		if rr, ok := r.(*pgconn.ResultReader); ok {
			res := rr.Read()
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			got = append(got, res.CommandTag.String())
			if len(res.Rows) == 1 {
				got = append(got, string(res.Rows[0][0]))
			}
		}
	}
	if err := pl.Close(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "DEALLOCATE,SELECT 1,12" {
		t.Fatalf("pipeline answers %q", got)
	}
	prepare(a, "x1", "SELECT 13")
	run(a, "x1", "13")

	// In a transaction block: after the statements the server still owes, in order; a
	// name the client lacks fails the block, as in PostgreSQL.
	res, err := a.Exec(ctx, "BEGIN; SELECT 7").ReadAll()
	if err != nil || len(res) != 2 {
		t.Fatalf("BEGIN: %v", err)
	}
	mrr := a.ExecParams(ctx, "SELECT 8", nil, nil, nil, nil).Read()
	if mrr.Err != nil {
		t.Fatal(mrr.Err)
	}
	wantTag("DEALLOCATE s1", "DEALLOCATE")
	if a.TxStatus() != 'T' {
		t.Fatalf("transaction status %c after DEALLOCATE, want T", a.TxStatus())
	}
	prepare(a, "s1", "SELECT 9")
	run(a, "s1", "9")
	_, err = exec(a, "DEALLOCATE nosuch")
	wantSQLState(t, err, "26000")
	_, err = exec(a, "SELECT 1")
	wantSQLState(t, err, "25P02")
	_, err = exec(a, "DEALLOCATE s1")
	wantSQLState(t, err, "25P02")
	if _, err := exec(a, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	run(a, "s1", "9") // the failed DEALLOCATE kept it
	run(b, "s1", "1")
	if _, err := exec(a, "BEGIN; DEALLOCATE ALL; COMMIT"); err == nil {
		t.Fatal("DEALLOCATE among other statements was not refused")
	}
	wantTag("DEALLOCATE ALL", "DEALLOCATE ALL")
	run(b, "s1", "1")
}

// TestTxPoolRefusalWithoutServer: a refused statement outside a transaction is answered
// without a server connection: with the only one of the pool held by another client's
// transaction it comes back at once with 0A000, in both protocols, and so do DEALLOCATE
// and its error; nothing waits for the pool.
func TestTxPoolRefusalWithoutServer(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) {
		s.Pooling.PoolSize = 1
		s.Pooling.QueryWaitTimeout = 5 * time.Minute
	})
	ctx := testContext(t)
	holder := connect(t, p.url(db))
	client := connect(t, p.url(db))
	if _, err := client.PgConn().Prepare(ctx, "s1", "SELECT 1", nil); err != nil {
		t.Fatal(err)
	}
	tx := holdServer(t, ctx, holder)
	acquires := p.srv.PoolStats()[0].Acquires
	// Without the answer of its own, the statement would wait for the holder's
	// transaction, which lasts until the end of the test.
	quick, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for _, sql := range []string{"LISTEN channel", "SELECT pg_advisory_lock(1)", "SET SESSION AUTHORIZATION DEFAULT"} {
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
			_, err := client.Exec(quick, sql, mode)
			wantSQLState(t, err, "0A000")
		}
	}
	// A refused Parse among other messages of its cycle: the error, then ReadyForQuery.
	if _, err := client.PgConn().Prepare(quick, "", "SELECT pg_advisory_lock(2)", nil); err == nil {
		t.Fatal("Prepare of a session advisory lock was not refused")
	}
	res := client.PgConn().Exec(quick, "DEALLOCATE s1")
	if _, err := res.ReadAll(); err != nil {
		t.Fatal(err)
	}
	_, err := client.PgConn().Exec(quick, "DEALLOCATE s1").ReadAll()
	wantSQLState(t, err, "26000")
	if client.PgConn().TxStatus() != 'I' {
		t.Fatalf("transaction status %c, want I", client.PgConn().TxStatus())
	}
	st := p.srv.PoolStats()[0]
	if st.Acquires != acquires || st.ClientsWaiting != 0 {
		t.Fatalf("the refusals asked the pool for a connection: %+v (acquires before: %d)", st, acquires)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := client.PgConn().Prepare(ctx, "s1", "SELECT 2", nil); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := client.QueryRow(ctx, "SELECT 3").Scan(&n); err != nil || n != 3 {
		t.Fatalf("after the refusals: %d, %v", n, err)
	}
}

// TestTxPoolCustomSettingsDoNotLeak: a custom setting (SET app.tenant = …, which
// pg_settings does not list) follows its client and never reaches another client of the
// same server connection (a pool of one), in both protocols.
func TestTxPoolCustomSettingsDoNotLeak(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 1 })
	ctx := testContext(t)
	setter := connect(t, p.url(db))
	other := connect(t, p.url(db))
	tenant := func(c *pgx.Conn) string {
		t.Helper()
		var v *string
		if err := c.QueryRow(ctx, "SELECT current_setting('app.tenant', true)").Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v == nil {
			return ""
		}
		return *v
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
		want := "t-" + mode.String()
		if _, err := setter.Exec(ctx, "SET app.tenant = '"+want+"'", mode); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if v := tenant(other); v != "" {
				t.Fatalf("%s: another client's app.tenant %q reached this one", mode, v)
			}
			if v := tenant(setter); v != want {
				t.Fatalf("%s: app.tenant %q did not follow its client (want %q)", mode, v, want)
			}
		}
	}
	// set_config from the client, with a literal name, in both protocols; and of a
	// setting pg_settings lists.
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
		want := "sc-" + mode.String()
		if _, err := setter.Exec(ctx, "SELECT pg_catalog.set_config('app.tenant', $1, false), set_config('search_path', 'nowhere', false)", mode, want); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if v := tenant(other); v != "" {
				t.Fatalf("%s: another client's set_config('app.tenant') %q reached this one", mode, v)
			}
			if v := tenant(setter); v != want {
				t.Fatalf("%s: set_config('app.tenant') %q did not follow its client (want %q)", mode, v, want)
			}
			var path string
			if err := other.QueryRow(ctx, "SHOW search_path").Scan(&path); err != nil || path == "nowhere" {
				t.Fatalf("%s: another client's set_config('search_path') reached this one: %q, %v", mode, path, err)
			}
		}
	}
	if _, err := setter.Exec(ctx, "RESET app.tenant"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*pgx.Conn{setter, other, setter} {
		if v := tenant(c); v != "" {
			t.Fatalf("after RESET: app.tenant %q", v)
		}
	}
}

func TestTxWordsCustomSet(t *testing.T) {
	for sql, want := range map[string]bool{
		"SET app.tenant = 1":                     true,
		"set  session\tmyapp.x TO 'a'":           true,
		"BEGIN; SET LOCAL app.x = 1":             true,
		`RESET "App".x`:                          true,
		"SET search_path = a, b.c":               false,
		"UPDATE public.t SET x = 1":              false,
		"UPDATE t SET x = s.y FROM s":            false,
		"SELECT offset.x FROM t":                 false,
		"SELECT set_config('app.x', '1', false)": false,
	} {
		if got := scanTxWords(sql).set; got != want {
			t.Errorf("scanTxWords(%q).set = %v, want %v", sql, got, want)
		}
	}
}

// TestTxPoolReadOnlyDefaultDoesNotLeak: SET default_transaction_read_only (and SET
// SESSION CHARACTERISTICS AS TRANSACTION READ ONLY) follows its client and never makes
// another client's transactions read-only (a pool of one).
func TestTxPoolReadOnlyDefaultDoesNotLeak(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 1 })
	ctx := testContext(t)
	setter := connect(t, p.url(db))
	other := connect(t, p.url(db))
	readOnly := func(c *pgx.Conn) string {
		t.Helper()
		var v string
		if err := c.QueryRow(ctx, "SHOW transaction_read_only").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, sql := range []string{"SET default_transaction_read_only = on", "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"} {
		if _, err := setter.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if v := readOnly(other); v != "off" {
				t.Fatalf("after another client's %s: transaction_read_only %s", sql, v)
			}
			if v := readOnly(setter); v != "on" {
				t.Fatalf("%s did not follow its client: transaction_read_only %s", sql, v)
			}
		}
		if got := other.PgConn().ParameterStatus("default_transaction_read_only"); got != "off" {
			t.Fatalf("ParameterStatus default_transaction_read_only %q for the other client", got)
		}
		if _, err := setter.Exec(ctx, "RESET default_transaction_read_only"); err != nil {
			t.Fatal(err)
		}
		if v := readOnly(setter); v != "off" {
			t.Fatalf("after RESET: transaction_read_only %s", v)
		}
	}
}
