// Package tagadmin manages the rows of leaf_alloc, one per segment tag, for the `leafproxy
// tag` commands. Every change that could make a tag hand out an ID twice is refused: a step
// below 1, a max_id lower than the current one, a tag created twice.
package tagadmin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// Errors the commands report; test them with errors.Is.
var (
	ErrExists    = errors.New("tag already exists")
	ErrNotFound  = errors.New("no such tag")
	ErrBadStep   = errors.New("step must be at least 1")
	ErrBadMaxID  = errors.New("max-id must not be negative")
	ErrMaxIDDown = errors.New("max-id may only grow")
	ErrBadName   = errors.New("bad tag name")
	ErrNoSchema  = errors.New("leaf_alloc does not exist (run `leafproxy migrate up` first)")
)

// MaxStep is the largest step the integer step column holds.
const MaxStep = 1<<31 - 1

// DB is what the functions need from a connection or a pool.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Tag is one row of leaf_alloc.
type Tag struct {
	Name        string    `json:"tag"`
	MaxID       int64     `json:"max_id"`
	Step        int64     `json:"step"`
	Description string    `json:"description"`
	UpdateTime  time.Time `json:"update_time"`
}

func checkStep(step int64) error {
	if step < 1 || step > MaxStep {
		return fmt.Errorf("%w (and at most %d), got %d", ErrBadStep, MaxStep, step)
	}
	return nil
}

// schemaError turns "relation leaf_alloc does not exist" into ErrNoSchema.
func schemaError(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == sqlstate.UndefinedTable {
		return ErrNoSchema
	}
	return err
}

// Add creates a tag whose first segment starts after maxID.
func Add(ctx context.Context, db DB, name string, step, maxID int64, description string) error {
	if err := config.CheckTagName(name); err != nil {
		return fmt.Errorf("%w: %v", ErrBadName, err)
	}
	if err := checkStep(step); err != nil {
		return err
	}
	if maxID < 0 {
		return fmt.Errorf("%w, got %d", ErrBadMaxID, maxID)
	}
	tag, err := db.Exec(ctx, `INSERT INTO leaf_alloc (biz_tag, max_id, step, description)
		VALUES ($1, $2, $3, NULLIF($4, '')) ON CONFLICT (biz_tag) DO NOTHING`, name, maxID, step, description)
	if err != nil {
		return schemaError(err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %q (change it with set-step or set-max-id)", ErrExists, name)
	}
	return nil
}

// List returns every tag ordered by name.
func List(ctx context.Context, db DB) ([]Tag, error) {
	rows, err := db.Query(ctx, `SELECT biz_tag, max_id, step, coalesce(description, ''), update_time
		FROM leaf_alloc ORDER BY biz_tag`)
	if err != nil {
		return nil, schemaError(err)
	}
	tags, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Tag, error) {
		var t Tag
		err := r.Scan(&t.Name, &t.MaxID, &t.Step, &t.Description, &t.UpdateTime)
		return t, err
	})
	return tags, schemaError(err)
}

// Get returns one tag.
func Get(ctx context.Context, db DB, name string) (Tag, error) {
	t := Tag{Name: name}
	err := db.QueryRow(ctx, `SELECT max_id, step, coalesce(description, ''), update_time
		FROM leaf_alloc WHERE biz_tag = $1`, name).Scan(&t.MaxID, &t.Step, &t.Description, &t.UpdateTime)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return t, schemaError(err)
}

// SetStep changes the minimum step of a tag; running proxies use it from their next load.
func SetStep(ctx context.Context, db DB, name string, step int64) error {
	if err := checkStep(step); err != nil {
		return err
	}
	tag, err := db.Exec(ctx, `UPDATE leaf_alloc SET step = $2, update_time = now() WHERE biz_tag = $1`, name, step)
	if err != nil {
		return schemaError(err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return nil
}

// SetMaxID raises a tag's max_id, so that the next segment starts after maxID (to move a
// tag past IDs issued elsewhere). Lowering it would hand out IDs again and is refused.
func SetMaxID(ctx context.Context, db DB, name string, maxID int64) error {
	if maxID < 0 {
		return fmt.Errorf("%w, got %d", ErrBadMaxID, maxID)
	}
	// The condition sits in the UPDATE itself, so a concurrent segment load between a check
	// and the write cannot make us lower max_id: PostgreSQL re-checks it on the newest row.
	tag, err := db.Exec(ctx, `UPDATE leaf_alloc SET max_id = $2, update_time = now()
		WHERE biz_tag = $1 AND max_id <= $2`, name, maxID)
	if err != nil {
		return schemaError(err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	cur, err := Get(ctx, db, name)
	if err != nil {
		return err
	}
	return fmt.Errorf("%w: %q is at %d, refusing %d (IDs up to %d may already be in use)",
		ErrMaxIDDown, name, cur.MaxID, maxID, cur.MaxID)
}

// Remove deletes a tag. Proxies stop serving it at their next tag refresh.
func Remove(ctx context.Context, db DB, name string) error {
	tag, err := db.Exec(ctx, `DELETE FROM leaf_alloc WHERE biz_tag = $1`, name)
	if err != nil {
		return schemaError(err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return nil
}
