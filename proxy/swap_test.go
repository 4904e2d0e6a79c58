package proxy

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/rewrite"
)

func newFillRewriter(t *testing.T, rules ...rewrite.FillRule) *rewrite.Rewriter {
	t.Helper()
	rw, err := rewrite.New(rewrite.Settings{Fill: rules})
	if err != nil {
		t.Fatal(err)
	}
	return rw
}

// TestSetRewriter swaps the rewriter under open sessions: the same text, planned and
// cached under the old rules, is planned under the new ones right after the swap.
func TestSetRewriter(t *testing.T) {
	db := testenv.NewDatabase(t)
	none := newFillRewriter(t)
	fillA := newFillRewriter(t, rewrite.FillRule{Table: "swap_t", Column: "id", Tag: "a"})
	fillB := newFillRewriter(t, rewrite.FillRule{Table: "swap_t", Column: "id", Tag: "b"})
	ids := &stubIDs{}
	p := startProxy(t, db, func(s *Server) { s.Rewriter, s.IDs = none, ids })
	if err := p.srv.SetRewriter(nil); err == nil {
		t.Error("SetRewriter(nil) accepted")
	}
	if err := (&Server{}).SetRewriter(fillA); err == nil {
		t.Error("SetRewriter on a server without Rewriter accepted")
	}
	setup := connectMode(t, db, pgx.QueryExecModeSimpleProtocol)
	if _, err := setup.Exec(testContext(t), "CREATE TABLE swap_t (id bigint, v int)"); err != nil {
		t.Fatal(err)
	}
	// Modes that plan every execution; a statement prepared before a swap keeps its plan.
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testContext(t)
			conn := connectMode(t, p.url(db), mode)
			insert := func() *int64 {
				t.Helper()
				var id *int64
				if err := conn.QueryRow(ctx, "INSERT INTO swap_t (v) VALUES (1) RETURNING id").Scan(&id); err != nil {
					t.Fatal(err)
				}
				return id
			}
			if err := p.srv.SetRewriter(none); err != nil {
				t.Fatal(err)
			}
			for range 2 { // the second one is served from the cache
				if id := insert(); id != nil {
					t.Fatalf("without a rule the key was filled: %d", *id)
				}
			}
			if err := p.srv.SetRewriter(fillA); err != nil {
				t.Fatal(err)
			}
			before := ids.issued("a")
			if id := insert(); id == nil || ids.issued("a") != before+1 {
				t.Fatalf("after the swap to a rule, id = %v; %d IDs of a issued, want %d", id, ids.issued("a"), before+1)
			}
			if err := p.srv.SetRewriter(fillB); err != nil {
				t.Fatal(err)
			}
			beforeA, beforeB := ids.issued("a"), ids.issued("b")
			if id := insert(); id == nil || ids.issued("b") != beforeB+1 || ids.issued("a") != beforeA {
				t.Fatalf("after the swap to tag b, id = %v; issued a %d→%d, b %d→%d", id, beforeA, ids.issued("a"), beforeB, ids.issued("b"))
			}
		})
	}
}

// TestSetRewriterConcurrent swaps rewriters while sessions insert: every statement is
// planned by one rewriter or the other, never fails, and the race detector sees no race.
func TestSetRewriterConcurrent(t *testing.T) {
	db := testenv.NewDatabase(t)
	fillA := newFillRewriter(t, rewrite.FillRule{Table: "swap_c", Column: "id", Tag: "a"})
	fillB := newFillRewriter(t, rewrite.FillRule{Table: "swap_c", Column: "id", Tag: "b"})
	ids := &stubIDs{}
	p := startProxy(t, db, func(s *Server) { s.Rewriter, s.IDs = fillA, ids })
	setup := connectMode(t, db, pgx.QueryExecModeSimpleProtocol)
	if _, err := setup.Exec(testContext(t), "CREATE TABLE swap_c (id bigint NOT NULL, v int)"); err != nil {
		t.Fatal(err)
	}
	const sessions, inserts = 4, 50
	conns := make([]*pgx.Conn, sessions)
	for i := range conns {
		conns[i] = connectMode(t, p.url(db), allModes[i%len(allModes)])
	}
	ctx := testContext(t)
	stop := make(chan struct{})
	swapped := make(chan struct{})
	go func() {
		defer close(swapped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			rw := fillA
			if i%2 == 1 {
				rw = fillB
			}
			if err := p.srv.SetRewriter(rw); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	for _, conn := range conns {
		wg.Add(1)
		go func(conn *pgx.Conn) {
			defer wg.Done()
			for range inserts {
				if _, err := conn.Exec(ctx, "INSERT INTO swap_c (v) VALUES (1)"); err != nil {
					errs <- err
					return
				}
			}
		}(conn)
	}
	wg.Wait()
	close(stop)
	<-swapped
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var n, distinct int
	if err := setup.QueryRow(context.Background(), "SELECT count(*), count(DISTINCT id) FROM swap_c").Scan(&n, &distinct); err != nil {
		t.Fatal(err)
	}
	if n != sessions*inserts || distinct != n || ids.issued("a")+ids.issued("b") != int64(n) {
		t.Fatalf("%d rows, %d distinct IDs, %d+%d issued; want %d of each", n, distinct, ids.issued("a"), ids.issued("b"), sessions*inserts)
	}
}
