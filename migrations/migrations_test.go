package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/migrations"
)

func tableExists(t *testing.T, dsn, table string) bool {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestUpDownUp(t *testing.T) {
	dsn := testenv.NewDatabase(t)
	latest, err := migrations.Latest()
	if err != nil || latest < 3 {
		t.Fatalf("Latest() = %d, %v; want ≥ 3", latest, err)
	}
	if v, dirty, err := migrations.Version(dsn); err != nil || v != 0 || dirty {
		t.Fatalf("fresh Version() = %d, %v, %v; want 0, false, nil", v, dirty, err)
	}
	for round := 0; round < 2; round++ {
		if err := migrations.Up(dsn); err != nil {
			t.Fatalf("round %d: Up: %v", round, err)
		}
		if err := migrations.Up(dsn); err != nil {
			t.Fatalf("round %d: second Up must be a no-op, got %v", round, err)
		}
		if v, dirty, err := migrations.Version(dsn); err != nil || v != latest || dirty {
			t.Fatalf("round %d: Version() = %d, %v, %v; want %d", round, v, dirty, err, latest)
		}
		for _, table := range []string{"leaf_alloc", "leaf_worker_lease", "leaf_fill"} {
			if !tableExists(t, dsn, table) {
				t.Fatalf("round %d: %s missing after Up", round, table)
			}
		}
		if round == 0 {
			if err := migrations.Down(dsn); err != nil {
				t.Fatalf("Down: %v", err)
			}
			if tableExists(t, dsn, "leaf_alloc") || tableExists(t, dsn, "leaf_worker_lease") || tableExists(t, dsn, "leaf_fill") {
				t.Fatal("tables left after Down")
			}
		}
	}
}

func TestLeaseRowsAndStepCheck(t *testing.T) {
	dsn := testenv.NewDatabase(t)
	if err := migrations.Up(dsn); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n, lo, hi int
	if err := conn.QueryRow(ctx, "SELECT count(*), min(worker_id), max(worker_id) FROM leaf_worker_lease").Scan(&n, &lo, &hi); err != nil {
		t.Fatal(err)
	}
	if n != 1024 || lo != 0 || hi != 1023 {
		t.Fatalf("lease rows: count %d, ids %d..%d; want 1024 rows 0..1023", n, lo, hi)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO leaf_alloc (biz_tag, step) VALUES ('bad', 0)"); err == nil {
		t.Fatal("a step of 0 was accepted")
	}
}

func TestBadDSN(t *testing.T) {
	for _, dsn := range []string{"host=localhost dbname=x", "mysql://u@h/db"} {
		if err := migrations.Up(dsn); err == nil {
			t.Errorf("Up(%q) succeeded", dsn)
		}
	}
}

// TestFillTable checks that migration 3 adds leaf_fill, one row per table and column, and
// that stepping back one version drops it and nothing else.
func TestFillTable(t *testing.T) {
	dsn := testenv.NewDatabase(t)
	if err := migrations.Steps(dsn, 2); err != nil {
		t.Fatal(err)
	}
	if tableExists(t, dsn, "leaf_fill") {
		t.Fatal("leaf_fill exists at version 2")
	}
	if err := migrations.Steps(dsn, 1); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO leaf_fill (table_name, column_name, tag) VALUES ('orders', 'id', 'order')`); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{
		`INSERT INTO leaf_fill (table_name, column_name, tag) VALUES ('orders', 'id', 'other')`, // same table and column
		`INSERT INTO leaf_fill (table_name, column_name, tag) VALUES ('orders', 'no', '')`,      // empty tag
		`INSERT INTO leaf_fill (table_name, column_name, tag) VALUES ('', 'id', 'x')`,
	} {
		if _, err := conn.Exec(ctx, bad); err == nil {
			t.Errorf("accepted: %s", bad)
		}
	}
	if err := migrations.Steps(dsn, -1); err != nil {
		t.Fatal(err)
	}
	if tableExists(t, dsn, "leaf_fill") || !tableExists(t, dsn, "leaf_alloc") || !tableExists(t, dsn, "leaf_worker_lease") {
		t.Fatal("stepping back from version 3 must drop leaf_fill only")
	}
	if v, _, err := migrations.Version(dsn); err != nil || v != 2 {
		t.Fatalf("Version() = %d, %v; want 2", v, err)
	}
}
