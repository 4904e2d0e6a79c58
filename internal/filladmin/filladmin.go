// Package filladmin manages the rows of leaf_fill, the fill rules shared by every proxy
// reading the store, for the `leafproxy fill` commands, and reads them for the proxies.
// A rule that would conflict with one already stored (the same column filled from another
// tag, or a second key column for the same table) is refused when it is added.
package filladmin

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// Errors the commands report; test them with errors.Is.
var (
	ErrExists   = errors.New("fill rule already exists")
	ErrNotFound = errors.New("no such fill rule")
	ErrNoSchema = errors.New("leaf_fill does not exist (run `leafproxy migrate up` first)")
)

// DB is what the functions need from a connection or a pool.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func schemaError(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == sqlstate.UndefinedTable {
		return ErrNoSchema
	}
	return err
}

// List returns every stored rule, ordered by table and column.
func List(ctx context.Context, db DB) ([]config.FillRule, error) {
	rows, err := db.Query(ctx, `SELECT table_name, column_name, tag FROM leaf_fill ORDER BY table_name, column_name`)
	if err != nil {
		return nil, schemaError(err)
	}
	type row struct{ table, column, tag string }
	raw, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.table, &x.column, &x.tag)
		return x, err
	})
	if err != nil {
		return nil, schemaError(err)
	}
	out := make([]config.FillRule, 0, len(raw))
	for _, x := range raw {
		r, err := config.FillRuleFromStore(x.table, x.column, x.tag)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// Add stores r. The check against the stored rules and the insert run in one transaction
// that locks leaf_fill against other writers, so that two concurrent adds cannot store
// two key columns for one table.
func Add(ctx context.Context, db *pgx.Conn, r config.FillRule) error {
	if err := config.CheckTagName(r.Tag); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `LOCK TABLE leaf_fill IN SHARE ROW EXCLUSIVE MODE`); err != nil {
			return schemaError(err)
		}
		stored, err := List(ctx, tx)
		if err != nil {
			return err
		}
		for _, s := range stored {
			if s == r {
				return fmt.Errorf("%w: %s", ErrExists, r)
			}
		}
		if _, err := config.MergeFillRules(config.Sourced(stored, "stored"), config.Sourced([]config.FillRule{r}, "new")); err != nil {
			return fmt.Errorf("%w (remove the stored rule first with `leafproxy fill remove`)", err)
		}
		_, err = tx.Exec(ctx, `INSERT INTO leaf_fill (table_name, column_name, tag) VALUES ($1, $2, $3)`,
			r.SQLTable(), r.SQLColumn(), r.Tag)
		return schemaError(err)
	})
}

// Remove deletes the rule for target's table and column (its Tag is ignored) and returns it.
func Remove(ctx context.Context, db DB, target config.FillRule) (config.FillRule, error) {
	rows, err := db.Query(ctx, `DELETE FROM leaf_fill WHERE table_name = $1 AND column_name = $2 RETURNING tag`,
		target.SQLTable(), target.SQLColumn())
	if err != nil {
		return target, schemaError(err)
	}
	tags, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return target, schemaError(err)
	}
	target.Tag = ""
	if len(tags) == 0 {
		return target, fmt.Errorf("%w: %s.%s", ErrNotFound, target.QualifiedTable(), target.Column)
	}
	target.Tag = tags[0]
	return target, nil
}
