package proxy

import (
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/rewrite"
)

// counts records hook calls by key.
type counts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counts) add(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
}

func (c *counts) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

// The metrics hooks see each rewritten statement by kind and each error the proxy answers
// itself by SQLSTATE, and nothing for the database's own errors.
func TestRewriteAndErrorHooks(t *testing.T) {
	db := testenv.NewDatabase(t)
	rw, err := rewrite.New(rewrite.Settings{Fill: []rewrite.FillRule{{Table: "orders", Column: "id", Tag: "order"}}})
	if err != nil {
		t.Fatal(err)
	}
	var rewrites, errs counts
	p := startProxy(t, db, func(s *Server) {
		s.Rewriter = rw
		s.IDs = &stubIDs{}
		s.OnRewrite = rewrites.add
		s.OnError = errs.add
	})
	ctx := testContext(t)
	conn := connectMode(t, p.url(db), pgx.QueryExecModeSimpleProtocol)
	if _, err := conn.Exec(ctx, "create table orders (id bigint primary key, item text)"); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := conn.QueryRow(ctx, "select leaf_next('t')").Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "insert into orders (item) values ('a')"); err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, "update orders set id = leaf_next('t')")
	wantSQLState(t, err, "0A000")
	_, err = conn.Exec(ctx, "select leaf_next('unavailable')")
	wantSQLState(t, err, "55000")
	_, err = conn.Exec(ctx, "select * from no_such_table")
	wantSQLState(t, err, "42P01")

	ext := connectMode(t, p.url(db), pgx.QueryExecModeCacheStatement)
	for i := 0; i < 3; i++ {
		if err := ext.QueryRow(ctx, "insert into orders (item) values ($1) returning id", "b").Scan(&id); err != nil {
			t.Fatal(err)
		}
	}

	for kind, want := range map[string]int{"fast_path": 1, "query": 1, "parse": 1} {
		if got := rewrites.get(kind); got != want {
			t.Errorf("OnRewrite(%q) called %d times, want %d", kind, got, want)
		}
	}
	for code, want := range map[string]int{"0A000": 1, "55000": 1, "42P01": 0} {
		if got := errs.get(code); got != want {
			t.Errorf("OnError(%q) called %d times, want %d", code, got, want)
		}
	}
}
