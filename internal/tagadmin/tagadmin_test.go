package tagadmin_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/tagadmin"
	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/migrations"
)

func connect(t *testing.T, migrate bool) *pgx.Conn {
	t.Helper()
	dsn := testenv.NewDatabase(t)
	if migrate {
		if err := migrations.Up(dsn); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func TestLifecycle(t *testing.T) {
	db := connect(t, true)
	ctx := context.Background()
	if err := tagadmin.Add(ctx, db, "order", 1000, 0, "orders"); err != nil {
		t.Fatal(err)
	}
	if err := tagadmin.Add(ctx, db, "audit", 10, 500, ""); err != nil {
		t.Fatal(err)
	}
	tags, err := tagadmin.List(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if len(tags) != 2 || tags[0].Name != "audit" || tags[0].MaxID != 500 || tags[0].Step != 10 ||
		tags[1].Name != "order" || tags[1].Description != "orders" || tags[1].Step != 1000 {
		t.Fatalf("List = %+v", tags)
	}
	if err := tagadmin.SetStep(ctx, db, "order", 50); err != nil {
		t.Fatal(err)
	}
	if err := tagadmin.SetMaxID(ctx, db, "order", 7000); err != nil {
		t.Fatal(err)
	}
	if err := tagadmin.SetMaxID(ctx, db, "order", 7000); err != nil {
		t.Fatalf("SetMaxID to the same value: %v", err)
	}
	got, err := tagadmin.Get(ctx, db, "order")
	if err != nil || got.Step != 50 || got.MaxID != 7000 {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if err := tagadmin.Remove(ctx, db, "order"); err != nil {
		t.Fatal(err)
	}
	if _, err := tagadmin.Get(ctx, db, "order"); !errors.Is(err, tagadmin.ErrNotFound) {
		t.Fatalf("Get after Remove: %v", err)
	}
}

func TestRefusals(t *testing.T) {
	db := connect(t, true)
	ctx := context.Background()
	if err := tagadmin.Add(ctx, db, "order", 100, 1000, ""); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"add duplicate", tagadmin.Add(ctx, db, "order", 100, 0, ""), tagadmin.ErrExists},
		{"add step 0", tagadmin.Add(ctx, db, "x", 0, 0, ""), tagadmin.ErrBadStep},
		{"add step negative", tagadmin.Add(ctx, db, "x", -5, 0, ""), tagadmin.ErrBadStep},
		{"add step too big", tagadmin.Add(ctx, db, "x", 1<<31, 0, ""), tagadmin.ErrBadStep},
		{"add negative max", tagadmin.Add(ctx, db, "x", 1, -1, ""), tagadmin.ErrBadMaxID},
		{"add empty name", tagadmin.Add(ctx, db, "", 1, 0, ""), tagadmin.ErrBadName},
		{"add name with space", tagadmin.Add(ctx, db, "a b", 1, 0, ""), tagadmin.ErrBadName},
		{"set-step 0", tagadmin.SetStep(ctx, db, "order", 0), tagadmin.ErrBadStep},
		{"set-step unknown", tagadmin.SetStep(ctx, db, "nope", 5), tagadmin.ErrNotFound},
		{"set-max-id lower", tagadmin.SetMaxID(ctx, db, "order", 999), tagadmin.ErrMaxIDDown},
		{"set-max-id negative", tagadmin.SetMaxID(ctx, db, "order", -1), tagadmin.ErrBadMaxID},
		{"set-max-id unknown", tagadmin.SetMaxID(ctx, db, "nope", 5), tagadmin.ErrNotFound},
		{"remove unknown", tagadmin.Remove(ctx, db, "nope"), tagadmin.ErrNotFound},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: error %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	got, err := tagadmin.Get(ctx, db, "order")
	if err != nil || got.MaxID != 1000 || got.Step != 100 {
		t.Errorf("refused changes altered the row: %+v, %v", got, err)
	}
	if _, err := tagadmin.Get(ctx, db, "x"); !errors.Is(err, tagadmin.ErrNotFound) {
		t.Errorf("a refused add created the row: %v", err)
	}
}

func TestWithoutSchema(t *testing.T) {
	db := connect(t, false)
	ctx := context.Background()
	if _, err := tagadmin.List(ctx, db); !errors.Is(err, tagadmin.ErrNoSchema) {
		t.Errorf("List without schema: %v", err)
	}
	if err := tagadmin.Add(ctx, db, "a", 1, 0, ""); !errors.Is(err, tagadmin.ErrNoSchema) {
		t.Errorf("Add without schema: %v", err)
	}
}
