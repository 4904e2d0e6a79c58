package proxy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/rewrite"
)

// refusalProxy starts a rewriting proxy that fills orders.id from tag "order" and lost.id
// from the unknown tag "nope", in front of a fresh database with both tables. It returns
// the proxy's URL and a direct connection to the database.
func refusalProxy(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	db := testenv.NewDatabase(t)
	rw, err := rewrite.New(rewrite.Settings{Fill: []rewrite.FillRule{
		{Table: "orders", Column: "id", Tag: "order"},
		{Table: "lost", Column: "id", Tag: "nope"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, db, func(s *Server) { s.Rewriter, s.IDs = rw, &unknownTagIDs{} })
	direct := connect(t, db)
	if _, err := direct.Exec(testContext(t), `CREATE TABLE orders (id int8 PRIMARY KEY, item text NOT NULL);
		CREATE TABLE lost (id int8 PRIMARY KEY, item text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return p.url(db), direct
}

// refusedStatements are statements the proxy answers with an error of its own, one of
// each kind: a rewrite refusal, a bad argument, an unknown tag through the fast path and
// through a rewritten statement, and an unknown tag of a fill rule.
var refusedStatements = []struct {
	sql  string
	code string
}{
	{"INSERT INTO orders (item) SELECT 'x'", "0A000"},
	{"COPY orders (item) FROM '/nonexistent/orders.csv' (FORMAT csv)", "0A000"},
	{"SELECT leaf_next(1)", "22023"},
	{"SELECT leaf_next('order', 2), 1", "0A000"},
	{"SELECT leaf_next('order', 0)", "22023"},
	{"SELECT leaf_next('nope', 2)", "42704"},
	{"SELECT leaf_next('nope')", "42704"},
	{"SELECT leaf_next('nope'), 1", "42704"},
	{"INSERT INTO lost (item) VALUES ('x')", "42704"},
}

// items returns the items of orders, in order.
func items(t *testing.T, direct *pgx.Conn) string {
	t.Helper()
	rows, err := direct.Query(testContext(t), "SELECT item FROM orders ORDER BY item")
	if err != nil {
		t.Fatal(err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(list, " ")
}

// exchangeTx is exchange with the transaction status in each ReadyForQuery, leaving out
// RowDescription and NoData.
func exchangeTx(t *testing.T, fe *pgproto3.Frontend, msgs ...pgproto3.FrontendMessage) string {
	t.Helper()
	return strings.Join(exchangeWith(t, fe, summarizeTx, msgs...), " ")
}

func summarizeTx(msg pgproto3.BackendMessage) string {
	switch m := msg.(type) {
	case *pgproto3.ReadyForQuery:
		return "ready:" + string(m.TxStatus)
	case *pgproto3.RowDescription, *pgproto3.NoData:
		return ""
	}
	return summarize(msg)
}

func query(sql string) *pgproto3.Query { return &pgproto3.Query{String: sql} }

// TestRefusalFailsTransaction sends what psql sends for
// BEGIN; INSERT a; <refused>; INSERT b; COMMIT; without ON_ERROR_STOP, one Query at a
// time: as in PostgreSQL, the refusal aborts the transaction, INSERT b gets 25P02 and
// COMMIT rolls back.
func TestRefusalFailsTransaction(t *testing.T) {
	url, direct := refusalProxy(t)
	for _, rs := range refusedStatements {
		t.Run(rs.sql, func(t *testing.T) {
			fe := rawConn(t, url)
			steps := []struct{ sql, want string }{
				{"BEGIN", "complete:BEGIN ready:T"},
				{"INSERT INTO orders (item) VALUES ('a')", "complete:INSERT 0 1 ready:T"},
				{rs.sql, "error:" + rs.code + " ready:E"},
				{"INSERT INTO orders (item) VALUES ('b')", "error:25P02 ready:E"},
				{"COMMIT", "complete:ROLLBACK ready:I"},
			}
			for _, st := range steps {
				if got := exchangeTx(t, fe, query(st.sql)); got != st.want {
					t.Fatalf("%s: %s, want %s", st.sql, got, st.want)
				}
			}
			if got := items(t, direct); got != "" {
				t.Fatalf("committed %q", got)
			}
		})
	}
}

// TestRefusalOutsideTransaction refuses a statement at rest: nothing changes at the
// server, the status stays idle, and the session goes on with ordinary work.
func TestRefusalOutsideTransaction(t *testing.T) {
	url, direct := refusalProxy(t)
	fe := rawConn(t, url)
	for i, rs := range refusedStatements {
		if got, want := exchangeTx(t, fe, query(rs.sql)), "error:"+rs.code+" ready:I"; got != want {
			t.Fatalf("%s: %s, want %s", rs.sql, got, want)
		}
		insert := fmt.Sprintf("INSERT INTO orders (item) VALUES ('%d')", i)
		if got, want := exchangeTx(t, fe, query(insert)), "complete:INSERT 0 1 ready:I"; got != want {
			t.Fatalf("after %s: %s, want %s", rs.sql, got, want)
		}
	}
	if got := items(t, direct); got != "0 1 2 3 4 5 6 7 8" {
		t.Fatalf("items %q", got)
	}
}

// TestRefusalPgxTransaction runs the same sequence through pgx in every query mode: the
// refused statement fails the transaction, and Commit reports that it rolled back.
func TestRefusalPgxTransaction(t *testing.T) {
	url, direct := refusalProxy(t)
	refused := []struct {
		sql  string
		args []any
		code string
	}{
		{"INSERT INTO orders (item) SELECT $1::text", []any{"x"}, "0A000"},
		{"SELECT leaf_next('nope')", nil, "42704"},
		{"SELECT leaf_next($1)", []any{"nope"}, "42704"},             // at Bind
		{"INSERT INTO lost (item) VALUES ($1)", []any{"x"}, "42704"}, // at Bind
	}
	for _, mode := range allModes {
		for _, rs := range refused {
			t.Run(mode.String()+"/"+rs.sql, func(t *testing.T) {
				ctx := testContext(t)
				conn := connectMode(t, url, mode)
				tx, err := conn.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Exec(ctx, "INSERT INTO orders (item) VALUES ($1)", "a"); err != nil {
					t.Fatal(err)
				}
				_, err = tx.Exec(ctx, rs.sql, rs.args...)
				wantSQLState(t, err, rs.code)
				if s := conn.PgConn().TxStatus(); s != 'E' {
					t.Fatalf("transaction status %q after the refusal, want E", s)
				}
				_, err = tx.Exec(ctx, "INSERT INTO orders (item) VALUES ($1)", "b")
				wantSQLState(t, err, "25P02")
				if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
					t.Fatalf("Commit: %v, want %v", err, pgx.ErrTxCommitRollback)
				}
				if got := items(t, direct); got != "" {
					t.Fatalf("committed %q", got)
				}
				// The session goes on.
				var id int64
				if err := conn.QueryRow(ctx, "SELECT leaf_next('t')").Scan(&id); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestRefusalPipelined sends the refusal together with what comes before and after it in
// one write, so that the proxy cannot know the transaction status when it refuses: the
// server's answers decide it.
func TestRefusalPipelined(t *testing.T) {
	url, direct := refusalProxy(t)
	insert := func(item string) []pgproto3.FrontendMessage {
		return []pgproto3.FrontendMessage{
			&pgproto3.Parse{Query: "INSERT INTO orders (item) VALUES ($1)"},
			&pgproto3.Bind{Parameters: [][]byte{[]byte(item)}}, &pgproto3.Execute{},
		}
	}
	bindIns := &pgproto3.Bind{PreparedStatement: "ins", Parameters: [][]byte{[]byte("x")}}
	sync := &pgproto3.Sync{}
	tests := []struct {
		name string
		msgs []pgproto3.FrontendMessage
		want string
	}{
		{"simple", flat(
			query("BEGIN"), query("INSERT INTO orders (item) VALUES ('a')"),
			query("SELECT leaf_next('nope')"), query("INSERT INTO orders (item) VALUES ('b')"), query("COMMIT"),
		), "complete:BEGIN ready:T complete:INSERT 0 1 ready:T error:42704 ready:E error:25P02 ready:E complete:ROLLBACK ready:I"},
		{"extended, BEGIN in the refusal's cycle", flat(
			&pgproto3.Parse{Query: "BEGIN"}, &pgproto3.Bind{}, &pgproto3.Execute{}, insert("a"),
			&pgproto3.Parse{Query: "INSERT INTO orders (item) SELECT 'x'"}, &pgproto3.Bind{}, &pgproto3.Execute{}, sync,
			insert("b"), sync, query("COMMIT"),
		), "parse bind complete:BEGIN parse bind complete:INSERT 0 1 error:0A000 ready:E error:25P02 ready:E complete:ROLLBACK ready:I"},
		{"extended, a cycle each", flat(
			query("BEGIN"), insert("a"), sync,
			&pgproto3.Parse{Name: "ins", Query: "INSERT INTO lost (item) VALUES ($1)"}, sync,
			bindIns, &pgproto3.Execute{}, sync,
			bindIns, &pgproto3.Execute{}, sync,
			query("ROLLBACK"), &pgproto3.Close{ObjectType: 'S', Name: "ins"}, sync,
		), "complete:BEGIN ready:T parse bind complete:INSERT 0 1 ready:T parse ready:T error:42704 ready:E error:25P02 ready:E complete:ROLLBACK ready:I close ready:I"},
		{"a Query inside an open extended cycle", flat(insert("a"), query("SELECT leaf_next(1)"), sync),
			"parse bind complete:INSERT 0 1 error:22023 ready:I ready:I"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fe := rawConn(t, url)
			if got := exchangeTx(t, fe, tt.msgs...); got != tt.want {
				t.Fatalf("responses\n%s\nwant\n%s", got, tt.want)
			}
			if got := items(t, direct); got != "" {
				t.Fatalf("committed %q", got)
			}
		})
	}
}

// flat makes one message list of messages and message lists.
func flat(parts ...any) []pgproto3.FrontendMessage {
	var msgs []pgproto3.FrontendMessage
	for _, p := range parts {
		switch p := p.(type) {
		case pgproto3.FrontendMessage:
			msgs = append(msgs, p)
		case []pgproto3.FrontendMessage:
			msgs = append(msgs, p...)
		default:
			panic(fmt.Sprintf("flat: %T", p))
		}
	}
	return msgs
}

// TestRefusalSavepoint rolls back to a savepoint after a refusal: the transaction
// recovers exactly as in PostgreSQL, and what came before the savepoint commits.
func TestRefusalSavepoint(t *testing.T) {
	url, direct := refusalProxy(t)
	fe := rawConn(t, url)
	steps := []struct {
		msgs []pgproto3.FrontendMessage
		want string
	}{
		{[]pgproto3.FrontendMessage{query("BEGIN"), query("INSERT INTO orders (item) VALUES ('a')"), query("SAVEPOINT s")},
			"complete:BEGIN ready:T complete:INSERT 0 1 ready:T complete:SAVEPOINT ready:T"},
		{[]pgproto3.FrontendMessage{query("INSERT INTO orders (item) VALUES ('lost')"), query("SELECT leaf_next('x') FROM generate_series(1, 2)")},
			"complete:INSERT 0 1 ready:T error:0A000 ready:E"},
		{[]pgproto3.FrontendMessage{query("SELECT leaf_next('t')")}, "error:25P02 ready:E"},
		{[]pgproto3.FrontendMessage{query("ROLLBACK TO SAVEPOINT s")}, "complete:ROLLBACK ready:T"},
		{[]pgproto3.FrontendMessage{
			&pgproto3.Parse{Query: "INSERT INTO orders (item) VALUES ($1)"}, &pgproto3.Bind{Parameters: [][]byte{[]byte("b")}}, &pgproto3.Execute{},
			&pgproto3.Parse{Query: "SELECT leaf_next($1)"}, &pgproto3.Bind{Parameters: [][]byte{[]byte("nope")}}, &pgproto3.Execute{}, &pgproto3.Sync{},
		}, "parse bind complete:INSERT 0 1 parse error:42704 ready:E"},
		{[]pgproto3.FrontendMessage{query("ROLLBACK TO SAVEPOINT s"), query("INSERT INTO orders (item) VALUES ('c')"), query("COMMIT")},
			"complete:ROLLBACK ready:T complete:INSERT 0 1 ready:T complete:COMMIT ready:I"},
	}
	for i, st := range steps {
		if got := exchangeTx(t, fe, st.msgs...); got != st.want {
			t.Fatalf("step %d: %s, want %s", i, got, st.want)
		}
	}
	if got := items(t, direct); got != "a c" {
		t.Fatalf("committed %q, want a c", got)
	}
}

// TestRefusalInFailedTransaction refuses statements in a transaction that has already
// failed: the client gets the server's 25P02, as PostgreSQL would answer them.
func TestRefusalInFailedTransaction(t *testing.T) {
	url, _ := refusalProxy(t)
	fe := rawConn(t, url)
	if got, want := exchangeTx(t, fe, query("BEGIN"), query("SELECT 1/0")), "complete:BEGIN ready:T error:22012 ready:E"; got != want {
		t.Fatalf("%s, want %s", got, want)
	}
	for _, rs := range refusedStatements {
		if got, want := exchangeTx(t, fe, query(rs.sql)), "error:25P02 ready:E"; got != want {
			t.Fatalf("%s: %s, want %s", rs.sql, got, want)
		}
		msgs := []pgproto3.FrontendMessage{&pgproto3.Parse{Query: rs.sql}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}}
		if got, want := exchangeTx(t, fe, msgs...), "error:25P02 ready:E"; got != want {
			t.Fatalf("extended %s: %s, want %s", rs.sql, got, want)
		}
	}
	if got, want := exchangeTx(t, fe, query("ROLLBACK"), query("SELECT leaf_next('t')")), "complete:ROLLBACK ready:I data(text) complete:SELECT 1 ready:I"; got != want {
		t.Fatalf("%s, want %s", got, want)
	}
}

// TestRefusalStatements checks what a refused message does to prepared statements, as
// PostgreSQL does for a failed one: a refused Parse of the unnamed statement drops the
// unnamed statement, a refused named Parse or Bind leaves every statement in place.
func TestRefusalStatements(t *testing.T) {
	url, _ := refusalProxy(t)
	fe := rawConn(t, url)
	bindUnnamed := []pgproto3.FrontendMessage{&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}}
	steps := []struct {
		msgs []pgproto3.FrontendMessage
		want string
	}{
		{[]pgproto3.FrontendMessage{&pgproto3.Parse{Query: "SELECT 'kept'"}, &pgproto3.Sync{}}, "parse ready:I"},
		{[]pgproto3.FrontendMessage{&pgproto3.Parse{Name: "named", Query: "SELECT leaf_next(1)"}, &pgproto3.Sync{}}, "error:22023 ready:I"},
		{bindUnnamed, "bind data(kept) complete:SELECT 1 ready:I"},
		{[]pgproto3.FrontendMessage{
			&pgproto3.Parse{Name: "ins", Query: "INSERT INTO lost (item) VALUES ($1)"}, &pgproto3.Sync{},
			&pgproto3.Bind{PreparedStatement: "ins", Parameters: [][]byte{[]byte("x")}}, &pgproto3.Sync{},
		}, "parse ready:I error:42704 ready:I"},
		{bindUnnamed, "bind data(kept) complete:SELECT 1 ready:I"},
		{[]pgproto3.FrontendMessage{&pgproto3.Describe{ObjectType: 'S', Name: "ins"}, &pgproto3.Sync{}}, "params[25] ready:I"},
		{[]pgproto3.FrontendMessage{&pgproto3.Parse{Query: "SELECT leaf_next(1)"}, &pgproto3.Sync{}}, "error:22023 ready:I"},
		{bindUnnamed, "error:26000 ready:I"},
	}
	for i, st := range steps {
		if got := exchangeTx(t, fe, st.msgs...); got != st.want {
			t.Fatalf("step %d: %s, want %s", i, got, st.want)
		}
	}
	// A Flush brings the refusal before any Sync, as it would bring the server's error.
	fe.Send(&pgproto3.Parse{Name: "flushed", Query: "SELECT leaf_next(1)"})
	fe.Send(&pgproto3.Flush{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	msg, err := fe.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if got := summarize(msg); got != "error:22023" {
		t.Fatalf("after Flush: %s, want error:22023", got)
	}
	if got := exchangeTx(t, fe, &pgproto3.Sync{}); got != "ready:I" {
		t.Fatalf("Sync after the flushed refusal: %s", got)
	}
}

// TestRefusalPsql runs BEGIN; INSERT a; <refused>; INSERT b; COMMIT; through psql, which
// goes on after an error unless told to stop: COMMIT rolls back and nothing is committed.
func TestRefusalPsql(t *testing.T) {
	url, direct := refusalProxy(t)
	script := filepath.Join(t.TempDir(), "refusal.sql")
	if err := os.WriteFile(script, []byte(`BEGIN;
INSERT INTO orders (item) VALUES ('a');
INSERT INTO orders (item) SELECT 'x';
INSERT INTO orders (item) VALUES ('b');
COMMIT;
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runTool(t, "psql", "-X", "-v", "VERBOSITY=verbose", "-d", url, "-f", script)
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	for _, want := range []string{"INSERT 0 1\n", "ERROR:  0A000:", "ERROR:  25P02:", "ROLLBACK\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("psql output lacks %q:\n%s", want, out)
		}
	}
	if got := items(t, direct); got != "" {
		t.Fatalf("committed %q\n%s", got, out)
	}
}

// TestRefusalPsqlCopy loads a file with psql's \copy: without the key column the load
// is refused before the server sees it, so no row gets a key from elsewhere; with the
// key column listed the rows pass through as they are.
func TestRefusalPsqlCopy(t *testing.T) {
	url, direct := refusalProxy(t)
	dir := t.TempDir()
	items := filepath.Join(dir, "items.csv")
	keyed := filepath.Join(dir, "keyed.csv")
	if err := os.WriteFile(items, []byte("book\npen\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyed, []byte("7,lamp\n8,desk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runTool(t, "psql", "-X", "-v", "VERBOSITY=verbose", "-d", url,
		"-c", `COPY orders (item) FROM '`+items+`' WITH (format csv)`)
	if err == nil || !strings.Contains(out, "ERROR:  0A000:") {
		t.Fatalf("server-side COPY without the key: %v\n%s", err, out)
	}
	out, err = runTool(t, "psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", url,
		"-c", `\copy orders (id, item) from '`+keyed+`' with (format csv)`)
	if err != nil || !strings.Contains(out, "COPY 2") {
		t.Fatalf("\\copy with the key: %v\n%s", err, out)
	}
	var got string
	if err := direct.QueryRow(testContext(t), "SELECT string_agg(id || ':' || item, ' ' ORDER BY id) FROM orders").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != "7:lamp 8:desk" {
		t.Fatalf("orders hold %q", got)
	}
}

// TestRefusalInQueryString refuses one statement of a Query string of several: the
// statements before it run, the rest do not, as when PostgreSQL fails that statement.
func TestRefusalInQueryString(t *testing.T) {
	url, direct := refusalProxy(t)
	tests := []struct {
		name  string
		steps []struct{ sql, want string }
		items string
	}{
		{"BEGIN in the string", []struct{ sql, want string }{
			{"BEGIN; INSERT INTO orders (item) VALUES ('a'); INSERT INTO orders (item) SELECT 'x'; INSERT INTO orders (item) VALUES ('b'); COMMIT",
				"complete:BEGIN complete:INSERT 0 1 error:0A000 ready:E"},
			{"INSERT INTO orders (item) VALUES ('c')", "error:25P02 ready:E"},
			{"COMMIT", "complete:ROLLBACK ready:I"},
		}, ""},
		{"implicit transaction", []struct{ sql, want string }{
			{"INSERT INTO orders (item) VALUES ('a'); SELECT leaf_next('nope'); INSERT INTO orders (item) VALUES ('b')",
				"complete:INSERT 0 1 error:42704 ready:I"},
		}, ""},
		{"COMMIT in the string", []struct{ sql, want string }{
			{"INSERT INTO orders (item) VALUES ('a');\nCOMMIT; -- a comment\nINSERT INTO lost (item) VALUES ('x'); INSERT INTO orders (item) VALUES ('b')",
				"complete:INSERT 0 1 *pgproto3.NoticeResponse complete:COMMIT error:42704 ready:I"},
		}, "a"},
		{"savepoint in the string", []struct{ sql, want string }{
			{"BEGIN; INSERT INTO orders (item) VALUES ('a'); SAVEPOINT s; INSERT INTO orders (item) VALUES ('lost'); SELECT leaf_next('x') FROM generate_series(1, 2)",
				"complete:BEGIN complete:INSERT 0 1 complete:SAVEPOINT complete:INSERT 0 1 error:0A000 ready:E"},
			{"ROLLBACK TO SAVEPOINT s; INSERT INTO orders (item) VALUES ('b'); COMMIT",
				"complete:ROLLBACK complete:INSERT 0 1 complete:COMMIT ready:I"},
		}, "a b"},
		{"IDs before the refusal", []struct{ sql, want string }{
			{"SELECT leaf_next('t'); SELECT leaf_next(1)", "data(text) complete:SELECT 1 error:22023 ready:I"},
		}, ""},
		{"a statement before it fails", []struct{ sql, want string }{
			{"SELECT 1/0; SELECT leaf_next(1)", "error:22012 ready:I"},
			{"SELECT no_such_column; SELECT leaf_next(1)", "error:42703 ready:I"},
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := direct.Exec(testContext(t), "TRUNCATE orders"); err != nil {
				t.Fatal(err)
			}
			fe := rawConn(t, url)
			for _, st := range tt.steps {
				if got := exchangeTx(t, fe, query(st.sql)); got != st.want {
					t.Fatalf("%s:\n%s\nwant\n%s", st.sql, got, st.want)
				}
			}
			if got := items(t, direct); got != tt.items {
				t.Fatalf("committed %q, want %q", got, tt.items)
			}
		})
	}
}
