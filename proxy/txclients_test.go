package proxy

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// TestTxPoolPgbench runs pgbench with 20 clients over 5 server connections in the three
// query modes; prepared is the one a transaction pool without statement tracking fails.
// One thread per client: pgbench prepares a statement with a blocking call, which would
// stall a thread whose other clients hold every server connection in a transaction.
func TestTxPoolPgbench(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode)
	if out, err := runTool(t, "pgbench", "-i", "-s", "1", "-q", db); err != nil {
		t.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	setup := connect(t, db)
	for _, mode := range []string{"simple", "extended", "prepared"} {
		t.Run(mode, func(t *testing.T) {
			out, err := runTool(t, "pgbench", "-n", "-M", mode, "-c", "20", "-j", "20", "-t", "50", p.url(db))
			if err != nil {
				t.Fatalf("pgbench: %v\n%s", err, out)
			}
			if m := pgbenchFailures.FindStringSubmatch(out); m != nil && m[1] != "0" {
				t.Fatalf("%s failed transactions:\n%s", m[1], out)
			}
			if m := pgbenchProcessed.FindStringSubmatch(out); m == nil || m[1] != "1000" {
				t.Fatalf("pgbench did not process 1000 transactions:\n%s", out)
			}
			if n := backends(t, setup, dbName(t, db)); n > txPoolSize {
				t.Fatalf("%d server connections, pool-size %d", n, txPoolSize)
			}
		})
	}
}

// TestTxPoolLibPQAndPsql runs lib/pq (prepared statements, transactions) and psql over
// the transaction pool.
func TestTxPoolLibPQAndPsql(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := rewritingProxy(t, db, inTransactionMode)
	conn, err := sql.Open("postgres", p.url(db))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetMaxOpenConns(12)
	if _, err := conn.Exec("CREATE TABLE orders (id int8 PRIMARY KEY, item text)"); err != nil {
		t.Fatal(err)
	}
	stmt, err := conn.Prepare("INSERT INTO orders (item) VALUES ($1) RETURNING id")
	if err != nil {
		t.Fatal(err)
	}
	defer stmt.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				var id int64
				if err := stmt.QueryRow(fmt.Sprint(i, j)).Scan(&id); err != nil {
					errs <- err
					return
				}
				var next int64
				if err := conn.QueryRow("SELECT leaf_next('order')").Scan(&next); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	tx, err := conn.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("DELETE FROM orders"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow("SELECT count(DISTINCT id) FROM orders").Scan(&n); err != nil || n != 240 {
		t.Fatalf("count %d (%v), want 240", n, err)
	}

	out, err := runTool(t, "psql", "-X", "-v", "ON_ERROR_STOP=0", "-At", "-d", p.url(db), "-c",
		"BEGIN; INSERT INTO orders (item) VALUES ('psql'); SELECT 1/0; COMMIT;")
	if !strings.Contains(out, "division by zero") {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	out, err = runTool(t, "psql", "-X", "-At", "-d", p.url(db), "-c", "SELECT count(*) FROM orders", "-c", "SHOW application_name")
	if err != nil || out != "240\npsql\n" {
		t.Fatalf("psql: %v\n%q", err, out)
	}
}

// TestTxPoolSettingsDoNotLeak: SET application_name and SET search_path of one client
// follow it from server connection to server connection and never reach another
// client, over a pool of one connection that all clients share.
func TestTxPoolSettingsDoNotLeak(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 1 })
	ctx := testContext(t)
	setup := connect(t, db)
	if _, err := setup.Exec(ctx, "CREATE SCHEMA a; CREATE SCHEMA b; CREATE TABLE a.t AS SELECT 'a' AS v; CREATE TABLE b.t AS SELECT 'b' AS v"); err != nil {
		t.Fatal(err)
	}
	ca := connect(t, p.url(db))
	cb := connect(t, p.url(db))
	plain := connect(t, p.url(db))
	for _, c := range []struct {
		conn *pgx.Conn
		name string
	}{{ca, "a"}, {cb, "b"}} {
		if _, err := c.conn.Exec(ctx, "SET application_name = 'app_"+c.name+"'", pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatal(err)
		}
		if _, err := c.conn.Exec(ctx, "SET search_path TO "+c.name+", public", pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		for _, c := range []struct {
			conn *pgx.Conn
			name string
		}{{ca, "a"}, {cb, "b"}, {plain, ""}} {
			var app, v string
			err := c.conn.QueryRow(ctx, "SELECT current_setting('application_name'), coalesce((SELECT v FROM t), '')").Scan(&app, &v)
			if c.name == "" {
				// The plain client has neither setting: no table t on its search_path.
				wantSQLState(t, err, "42P01")
				if err := c.conn.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&app); err != nil {
					t.Fatal(err)
				}
				if app != "" {
					t.Fatalf("plain client has application_name %q", app)
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if app != "app_"+c.name || v != c.name {
				t.Fatalf("client %s sees application_name %q and table t of schema %q", c.name, app, v)
			}
			if ps := c.conn.PgConn().ParameterStatus("application_name"); ps != "app_"+c.name {
				t.Fatalf("client %s was told application_name %q", c.name, ps)
			}
		}
	}
	// RESET brings the client back to the default.
	if _, err := ca.Exec(ctx, "RESET search_path", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	_, err := ca.Exec(ctx, "SELECT v FROM t")
	wantSQLState(t, err, "42P01")
}

// TestTxPoolRefusals: what cannot follow a client across server connections is refused
// with 0A000 and nothing reaches the database; the session goes on.
func TestTxPoolRefusals(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode)
	ctx := testContext(t)
	conn := connect(t, p.url(db))
	for _, sql := range []string{
		"LISTEN channel",
		"SELECT pg_advisory_lock(1)",
		"SELECT pg_try_advisory_lock_shared(2)",
		"CREATE TEMP TABLE tmp (x int)",
		"CREATE TEMPORARY TABLE tmp AS SELECT 1",
		"SELECT 1 INTO TEMP tmp",
		"PREPARE p AS SELECT 1",
		"SELECT 1; LISTEN other",
	} {
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
			if mode == pgx.QueryExecModeExec && strings.Contains(sql, ";") {
				continue
			}
			_, err := conn.Exec(ctx, sql, mode)
			pgErr := wantSQLState(t, err, "0A000")
			if !strings.Contains(pgErr.Hint, "session") {
				t.Fatalf("%s: hint %q does not name session mode", sql, pgErr.Hint)
			}
		}
	}
	// In a transaction block the refusal fails the block, as the server's error would.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "DECLARE c CURSOR WITH HOLD FOR SELECT 1")
	wantSQLState(t, err, "0A000")
	_, err = tx.Exec(ctx, "SELECT 1")
	wantSQLState(t, err, "25P02")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relname = 'tmp'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("tmp tables: %d, %v", n, err)
	}
	// What can be carried is not refused.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_xact_lock(1)"); err != nil {
		t.Fatal(err)
	}
}

// TestTxPoolWaitTimeout: a client that waits longer than query-wait-timeout gets 57014
// and its session stays usable.
func TestTxPoolWaitTimeout(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) {
		s.Pooling.PoolSize = 1
		s.Pooling.QueryWaitTimeout = 300 * time.Millisecond
	})
	ctx := testContext(t)
	holder := connect(t, p.url(db))
	waiter := connect(t, p.url(db))
	tx := holdServer(t, ctx, holder)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
		_, err := waiter.Exec(ctx, "SELECT 2", mode)
		wantSQLState(t, err, pool.CodeWaitTimeout)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := waiter.QueryRow(ctx, "SELECT 3").Scan(&n); err != nil || n != 3 {
		t.Fatalf("after the wait: %d, %v", n, err)
	}
}

// TestTxPoolServerKilled: a server connection killed in the middle of a transaction
// fails that client only; the pool replaces the connection for the others.
func TestTxPoolServerKilled(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 2 })
	ctx := testContext(t)
	setup := connect(t, db)
	victim := connect(t, p.url(db))
	other := connect(t, p.url(db))
	tx, err := victim.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "SELECT 1")
	var pgErr *pgconn.PgError
	if err == nil || (errors.As(err, &pgErr) && pgErr.Code[:2] != "08" && pgErr.Code != "57P01") {
		t.Fatalf("victim after its server connection was killed: %v", err)
	}
	for range 5 {
		var n int
		if err := other.QueryRow(ctx, "SELECT 1").Scan(&n); err != nil {
			t.Fatalf("another client after the kill: %v", err)
		}
	}
	fresh := connect(t, p.url(db))
	if _, err := fresh.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
}

// TestTxPoolClientVanishes: a client gone in the middle of a transaction leaves nothing
// behind for the next borrower of its server connection.
func TestTxPoolClientVanishes(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 1 })
	ctx := testContext(t)
	setup := connect(t, db)
	if _, err := setup.Exec(ctx, "CREATE TABLE items (x int)"); err != nil {
		t.Fatal(err)
	}
	gone, err := pgx.Connect(ctx, p.url(db))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gone.Exec(ctx, "BEGIN; INSERT INTO items VALUES (1)", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	gone.PgConn().Conn().Close() // no Terminate, no ROLLBACK
	next := connect(t, p.url(db))
	var inTx bool
	if err := next.QueryRow(ctx, "SELECT count(*) > 0 FROM items").Scan(&inTx); err != nil {
		t.Fatal(err)
	}
	if inTx {
		t.Fatal("the next client runs inside the vanished client's transaction")
	}
	if _, err := next.Exec(ctx, "INSERT INTO items VALUES (2)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := setup.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n); err != nil || n != 1 {
		t.Fatalf("items: %d rows (%v), want the next client's only", n, err)
	}
}

// TestTxPoolCancel: a cancel with the proxy's key reaches the server connection that
// runs the client's statement.
func TestTxPoolCancel(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode)
	ctx := testContext(t)
	conn := connect(t, p.url(db))
	qctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(qctx, "SELECT pg_sleep(30)")
		done <- err
	}()
	setup := connect(t, db)
	waitFor(t, 20*time.Second, "the sleep to start", func() error {
		var n int
		if err := setup.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)' AND state = 'active'").Scan(&n); err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("%d sleeping", n)
		}
		return nil
	})
	start := time.Now()
	cancel()
	err := <-done
	if err == nil || time.Since(start) > 10*time.Second {
		t.Fatalf("cancelled sleep: %v after %v", err, time.Since(start))
	}
}

// TestTxPoolSessionSettings: settings of the startup packet (options included) and SETs
// of settings the server does not report follow their client only.
func TestTxPoolSessionSettings(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 1 })
	ctx := testContext(t)
	cfg, err := pgx.ParseConfig(p.url(db))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["options"] = "-c work_mem=5MB"
	cfg.RuntimeParams["application_name"] = "started"
	opts, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer opts.Close(context.Background())
	setter := connect(t, p.url(db))
	plain := connect(t, p.url(db))
	if _, err := setter.Exec(ctx, "SET statement_timeout = '1234ms'"); err != nil {
		t.Fatal(err)
	}
	show := func(c *pgx.Conn) string {
		t.Helper()
		var wm, st, app string
		if err := c.QueryRow(ctx, "SELECT current_setting('work_mem'), current_setting('statement_timeout'), current_setting('application_name')").Scan(&wm, &st, &app); err != nil {
			t.Fatal(err)
		}
		return wm + " " + st + " " + app
	}
	for range 2 {
		for _, c := range []struct {
			conn *pgx.Conn
			want string
		}{{opts, "5MB 0 started"}, {setter, "4MB 1234ms "}, {plain, "4MB 0 "}} {
			if got := show(c.conn); got != c.want {
				t.Fatalf("settings %q, want %q", got, c.want)
			}
		}
	}
	// A SET LOCAL ends with its transaction.
	tx, err := plain.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SET LOCAL work_mem = '7MB'"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := show(plain); got != "4MB 0 " {
		t.Fatalf("after SET LOCAL: %q", got)
	}
	if got := show(setter); got != "4MB 1234ms " {
		t.Fatalf("setter after another's SET LOCAL: %q", got)
	}
}

// TestTxPoolExtendedErrorsAndClose: an error in the middle of a pipelined batch, a
// statement closed by its client, and a COPY with filled keys, over one server
// connection shared by two clients.
func TestTxPoolExtendedErrorsAndClose(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, _ := rewritingProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 1 })
	ctx := testContext(t)
	setup := connect(t, db)
	if _, err := setup.Exec(ctx, "CREATE TABLE orders (id int8 PRIMARY KEY, item text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	a := connect(t, p.url(db))
	b := connect(t, p.url(db))
	batch := &pgx.Batch{}
	batch.Queue("INSERT INTO orders (item) VALUES ($1)", "one")
	batch.Queue("SELECT 1/$1::int", 0)
	batch.Queue("INSERT INTO orders (item) VALUES ($1)", "skipped")
	err := a.SendBatch(ctx, batch).Close()
	wantSQLState(t, err, "22012")
	var n int
	for _, c := range []*pgx.Conn{a, b, a} {
		if err := c.QueryRow(ctx, "SELECT count(*) FROM orders").Scan(&n); err != nil || n != 0 {
			t.Fatalf("after the failed batch: %d rows, %v (a batch is one transaction)", n, err)
		}
	}
	if _, err := a.Prepare(ctx, "mine", "SELECT $1::int + 1"); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRow(ctx, "SELECT 5").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if err := a.QueryRow(ctx, "mine", 1).Scan(&n); err != nil || n != 2 {
		t.Fatalf("prepared statement: %d, %v", n, err)
	}
	if err := a.Deallocate(ctx, "mine"); err != nil {
		t.Fatal(err)
	}
	_, err = a.Exec(ctx, "mine", 1)
	if err == nil {
		t.Fatal("a closed statement still runs")
	}
	// Another client's statement of the same text is not affected.
	if _, err := b.Prepare(ctx, "theirs", "SELECT $1::int + 1"); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRow(ctx, "theirs", 2).Scan(&n); err != nil || n != 3 {
		t.Fatalf("other client's statement: %d, %v", n, err)
	}
	rows := [][]any{{"c1"}, {"c2"}, {"c3"}}
	if got, err := a.CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"item"}, pgx.CopyFromRows(rows)); err != nil || got != 3 {
		t.Fatalf("CopyFrom: %d, %v", got, err)
	}
	if err := b.QueryRow(ctx, "SELECT count(DISTINCT id) FROM orders WHERE id IS NOT NULL").Scan(&n); err != nil || n != 3 {
		t.Fatalf("after COPY: %d filled rows, %v", n, err)
	}
}

// TestTxPoolShutdownWaits: Shutdown lets a transaction in flight finish.
func TestTxPoolShutdownWaits(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode)
	ctx := testContext(t)
	conn := connect(t, p.url(db))
	idle := connect(t, p.url(db))
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.srv.Shutdown(ctx) }()
	waitFor(t, 20*time.Second, "the idle client to be ended", func() error {
		if err := idle.Ping(ctx); err == nil {
			return errors.New("still served")
		}
		return nil
	})
	if _, err := tx.Exec(ctx, "SELECT 2"); err != nil {
		t.Fatalf("the transaction in flight was cut: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestTxPoolRefusesReplication: a replication connection cannot be pooled.
func TestTxPoolRefusesReplication(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode)
	cfg, err := pgconn.ParseConfig(p.url(db))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	_, err = pgconn.ConnectConfig(testContext(t), cfg)
	wantSQLState(t, err, "0A000")
}

// TestTxPoolStatementNames: a statement name the client has is refused again with 42P05,
// as PostgreSQL does, and a Parse that fails leaves no statement behind; over one server
// connection shared with a client that prepares the same text.
func TestTxPoolStatementNames(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 1 })
	ctx := testContext(t)
	a := connect(t, p.url(db)).PgConn()
	b := connect(t, p.url(db)).PgConn()
	if _, err := a.Prepare(ctx, "s", "SELECT $1::int", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Prepare(ctx, "s", "SELECT $1::int", nil); err != nil {
		t.Fatalf("another client's statement of the same name and text: %v", err)
	}
	_, err := a.Prepare(ctx, "s", "SELECT 2", nil)
	wantSQLState(t, err, "42P05")
	_, err = a.Prepare(ctx, "bad", "SELECT FROM WHERE", nil)
	wantSQLState(t, err, "42601")
	if _, err := a.Prepare(ctx, "bad", "SELECT 3", nil); err != nil {
		t.Fatalf("the name of a failed Parse: %v", err)
	}
	// Close is per client: b's statement of the same text keeps working.
	if err := a.Deallocate(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	res := b.ExecPrepared(ctx, "s", [][]byte{[]byte("7")}, nil, nil).Read()
	if res.Err != nil || len(res.Rows) != 1 || string(res.Rows[0][0]) != "7" {
		t.Fatalf("b's statement after a closed its own: %v %v", res.Rows, res.Err)
	}
	res = a.ExecPrepared(ctx, "s", [][]byte{[]byte("7")}, nil, nil).Read()
	wantSQLState(t, res.Err, "26000")
	if _, err := a.Prepare(ctx, "s", "SELECT $1::int * 2", nil); err != nil {
		t.Fatalf("a name closed by its client: %v", err)
	}
	res = a.ExecPrepared(ctx, "s", [][]byte{[]byte("7")}, nil, nil).Read()
	if res.Err != nil || string(res.Rows[0][0]) != "14" {
		t.Fatalf("re-prepared statement: %v %v", res.Rows, res.Err)
	}
}

// TestTxPoolAuthAtProxy: with the proxy authenticating clients (SCRAM and md5 users whose
// upstream logins need a password), the pool logs in with what the clients proved; a
// wrong password gets 28P01 and never a pooled connection.
func TestTxPoolAuthAtProxy(t *testing.T) {
	db := testenv.NewDatabase(t)
	file := writeAuthFile(t,
		testenv.SCRAMUser, storedSecret(t, db, testenv.SCRAMUser),
		testenv.MD5User, storedSecret(t, db, testenv.MD5User))
	p := startProxy(t, db, inTransactionMode, func(s *Server) {
		s.Pooling.PoolSize = 2
		s.Auth = &ClientAuth{Type: AuthMD5, File: file}
	})
	ctx := testContext(t)
	for _, u := range []struct{ user, password string }{
		{testenv.SCRAMUser, testenv.SCRAMPassword}, {testenv.MD5User, testenv.MD5Password},
	} {
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conn, err := pgx.Connect(ctx, p.url(testenv.WithUser(db, u.user, u.password)))
				if err != nil {
					errs <- err
					return
				}
				defer conn.Close(context.Background())
				var who string
				if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&who); err != nil || who != u.user {
					errs <- fmt.Errorf("current_user %q, %v; want %s", who, err, u.user)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		_, err := pgx.Connect(ctx, p.url(testenv.WithUser(db, u.user, "wrong")))
		wantSQLState(t, err, "28P01")
	}
	for _, st := range p.srv.PoolStats() {
		if st.Dials > 2 {
			t.Fatalf("pool %s/%s dialled %d connections, pool-size 2", st.Database, st.User, st.Dials)
		}
	}
}

// TestTxPoolRoutes: pools are keyed by the database as routed, so two names routed to one
// database share a pool, and each client lands in its routed database.
func TestTxPoolRoutes(t *testing.T) {
	first := testenv.NewDatabase(t)
	second := testenv.NewDatabase(t)
	p := startProxy(t, first, inTransactionMode)
	p.srv.SetRoutes(NewRoutes(map[string]Route{
		"app":   {Database: dbName(t, first)},
		"alias": {Database: dbName(t, first)},
		"other": {Database: dbName(t, second)},
	}, nil))
	for name, want := range map[string]string{"app": dbName(t, first), "alias": dbName(t, first), "other": dbName(t, second)} {
		conn := connect(t, p.url(withPath(t, first, name)))
		if got := currentDatabase(t, conn); got != want {
			t.Fatalf("%s: in database %s, want %s", name, got, want)
		}
	}
	_, err := pgx.Connect(testContext(t), p.url(withPath(t, first, "nowhere")))
	wantSQLState(t, err, "3D000")
	pools := map[string]bool{}
	for _, st := range p.srv.PoolStats() {
		pools[st.Database] = true
	}
	if len(pools) != 2 || !pools[dbName(t, first)] || !pools[dbName(t, second)] {
		t.Fatalf("pools %v, want one per routed database", pools)
	}
}

// TestTxPoolCancelWhileWaiting: a cancel request ends a client's wait for a server
// connection with 57014, and the session goes on.
func TestTxPoolCancelWhileWaiting(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 1 })
	ctx := testContext(t)
	holder := connect(t, p.url(db))
	waiter := connect(t, p.url(db))
	tx := holdServer(t, ctx, holder)
	res := waiter.PgConn().Exec(ctx, "SELECT 2")
	waitFor(t, 20*time.Second, "the waiter to queue", func() error {
		if st := p.srv.PoolStats(); len(st) != 1 || st[0].ClientsWaiting != 1 {
			return fmt.Errorf("pool figures %+v", st)
		}
		return nil
	})
	if err := waiter.PgConn().CancelRequest(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := res.ReadAll()
	wantSQLState(t, err, "57014")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := waiter.QueryRow(ctx, "SELECT 3").Scan(&n); err != nil || n != 3 {
		t.Fatalf("after the cancelled wait: %d, %v", n, err)
	}
}

// TestTxPoolLargeMessages: rows and parameters far larger than the buffers cross a
// pooled connection whole, in both protocols; so do a notice and an error far larger than
// a buffer, which the proxy holds whole as they arrive piece by piece, and the session
// goes on after them.
func TestTxPoolLargeMessages(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 1 })
	ctx := testContext(t)
	a := connect(t, p.url(db))
	b := connect(t, p.url(db))
	big := strings.Repeat("0123456789", 300_000) // 3 MB
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		for _, c := range []*pgx.Conn{a, b} {
			var got string
			if err := c.QueryRow(ctx, "SELECT $1::text || repeat('x', 100000)", mode, big).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != big+strings.Repeat("x", 100000) {
				t.Fatalf("%s: a row of %d bytes came back as %d bytes", mode, len(big)+100000, len(got))
			}
		}
	}
	for _, c := range []*pgx.Conn{a, b} {
		if _, err := c.Exec(ctx, "DO $$ BEGIN RAISE NOTICE '%', repeat('n', 300000); END $$"); err != nil {
			t.Fatal(err)
		}
		_, err := c.Exec(ctx, "DO $$ BEGIN RAISE EXCEPTION '%', repeat('e', 300000); END $$")
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Message != strings.Repeat("e", 300000) {
			t.Fatalf("an error of 300,000 bytes: %v", err)
		}
		var n int
		if err := c.QueryRow(ctx, "SELECT 4").Scan(&n); err != nil || n != 4 {
			t.Fatalf("after the large notice and error: %d, %v", n, err)
		}
	}
}

// TestTxPoolSetRoleDoesNotLeak: SET ROLE follows its client and never reaches another
// over a pool of one connection. pg_settings does not list role, so the proxy reads it
// back on its own.
func TestTxPoolSetRoleDoesNotLeak(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode, func(s *Server) { s.Pooling.PoolSize = 1 })
	ctx := testContext(t)
	setup := connect(t, db)
	role := dbName(t, db) + "_role"
	if _, err := setup.Exec(ctx, "CREATE ROLE "+role+" NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = setup.Exec(context.Background(), "DROP ROLE "+role) })
	setter := connect(t, p.url(db))
	plain := connect(t, p.url(db))
	var session string
	if err := plain.QueryRow(ctx, "SELECT current_user").Scan(&session); err != nil {
		t.Fatal(err)
	}
	if _, err := setter.Exec(ctx, "SET ROLE "+role, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	user := func(c *pgx.Conn) string {
		t.Helper()
		var u string
		if err := c.QueryRow(ctx, "SELECT current_user").Scan(&u); err != nil {
			t.Fatal(err)
		}
		return u
	}
	for range 3 {
		if u := user(plain); u != session {
			t.Fatalf("another client's SET ROLE reached this one: current_user %s, want %s", u, session)
		}
		if u := user(setter); u != role {
			t.Fatalf("SET ROLE did not follow its client: current_user %s, want %s", u, role)
		}
	}
	if _, err := setter.Exec(ctx, "RESET ROLE", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*pgx.Conn{setter, plain, setter} {
		if u := user(c); u != session {
			t.Fatalf("after RESET ROLE: current_user %s, want %s", u, session)
		}
	}
}
