package filladmin_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/filladmin"
	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/migrations"
)

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func rule(t *testing.T, s string) config.FillRule {
	t.Helper()
	r, err := config.ParseFillRule(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestNoSchema(t *testing.T) {
	db := connect(t, testenv.NewDatabase(t))
	ctx := context.Background()
	if _, err := filladmin.List(ctx, db); !errors.Is(err, filladmin.ErrNoSchema) {
		t.Errorf("List without leaf_fill: %v, want ErrNoSchema", err)
	}
	if err := filladmin.Add(ctx, db, rule(t, "a.id=x")); !errors.Is(err, filladmin.ErrNoSchema) {
		t.Errorf("Add without leaf_fill: %v, want ErrNoSchema", err)
	}
	if _, err := filladmin.Remove(ctx, db, rule(t, "a.id=x")); !errors.Is(err, filladmin.ErrNoSchema) {
		t.Errorf("Remove without leaf_fill: %v, want ErrNoSchema", err)
	}
}

// TestConcurrentAdds adds two key columns for one table at once, many times: the lock
// taken by Add lets exactly one of each pair in.
func TestConcurrentAdds(t *testing.T) {
	dsn := testenv.NewDatabase(t)
	if err := migrations.Up(dsn); err != nil {
		t.Fatal(err)
	}
	a, b := connect(t, dsn), connect(t, dsn)
	ctx := context.Background()
	for round := range 20 {
		table := "t" + string(rune('a'+round))
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, conn := range []*pgx.Conn{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = filladmin.Add(ctx, conn, rule(t, table+".col"+string(rune('0'+i))+"=x"))
			}()
		}
		wg.Wait()
		if (errs[0] == nil) == (errs[1] == nil) {
			t.Fatalf("round %d: errors %v and %v; want exactly one add to succeed", round, errs[0], errs[1])
		}
		for _, err := range errs {
			if err != nil && !errors.Is(err, config.ErrFillConflict) {
				t.Fatalf("round %d: %v, want a conflict", round, err)
			}
		}
	}
	rules, err := filladmin.List(ctx, a)
	if err != nil || len(rules) != 20 {
		t.Fatalf("List: %d rules, %v; want 20", len(rules), err)
	}
	if _, err := config.MergeFillRules(config.Sourced(rules, "store")); err != nil {
		t.Fatalf("the stored rules conflict: %v", err)
	}
}
