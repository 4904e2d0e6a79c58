package segment

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leafproxy/leafproxy/idgen"
)

// Store is where segments are reserved: the leaf_alloc table, or a fake in tests.
// Implementations must be safe for concurrent use.
type Store interface {
	// Tags lists every tag (biz_tag) the store knows.
	Tags(ctx context.Context) ([]string, error)
	// Allocate reserves the next range of tag in one atomic step and returns it. It reserves
	// max(step, the tag's minimum step) IDs, so step 0 asks for exactly the minimum. A tag
	// the store does not know is reported with an error wrapping idgen.ErrUnknownTag.
	// Once Allocate returns successfully the range is durably reserved: nobody else gets it.
	Allocate(ctx context.Context, tag string, step int64) (Allocation, error)
	// GiveBack sets tag's high-water mark back from expectedMax to newMax, but only if it
	// still equals expectedMax (nobody reserved anything since). It reports whether it did.
	GiveBack(ctx context.Context, tag string, expectedMax, newMax int64) (bool, error)
}

// Allocation is a range reserved by Store.Allocate: the IDs (Max-Size, Max].
type Allocation struct {
	Max     int64 // highest ID of the range (leaf_alloc.max_id after the update)
	Size    int64 // number of IDs in the range
	MinStep int64 // the tag's minimum step (leaf_alloc.step) at the time of the update
}

// DB is what PostgresStore needs of a connection: *pgxpool.Pool, *pgx.Conn and pgx.Tx all
// satisfy it.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// PostgresStore keeps segments in the leaf_alloc table (see the migrations package).
type PostgresStore struct {
	db DB
}

// NewPostgresStore returns a Store over db, normally a *pgxpool.Pool.
func NewPostgresStore(db DB) *PostgresStore { return &PostgresStore{db: db} }

// The reservation is one statement, so it is atomic and needs no explicit transaction:
// concurrent proxies serialize on the row lock. GREATEST makes the step column a floor
// that takes effect at once when an operator raises it, without a separate read.
const (
	sqlTags     = `SELECT biz_tag FROM leaf_alloc ORDER BY biz_tag`
	sqlAllocate = `UPDATE leaf_alloc SET max_id = max_id + GREATEST($2::bigint, step), update_time = now()
WHERE biz_tag = $1 RETURNING max_id, step`
	sqlGiveBack = `UPDATE leaf_alloc SET max_id = $3, update_time = now() WHERE biz_tag = $1 AND max_id = $2`
)

// Tags implements Store.
func (s *PostgresStore) Tags(ctx context.Context) ([]string, error) {
	rows, err := s.db.Query(ctx, sqlTags)
	if err != nil {
		return nil, fmt.Errorf("segment: list tags: %w", err)
	}
	tags, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("segment: list tags: %w", err)
	}
	return tags, nil
}

// Allocate implements Store.
func (s *PostgresStore) Allocate(ctx context.Context, tag string, step int64) (Allocation, error) {
	if step < 0 {
		return Allocation{}, fmt.Errorf("%w: negative step %d", idgen.ErrBadArgument, step)
	}
	var a Allocation
	var minStep int32
	err := s.db.QueryRow(ctx, sqlAllocate, tag, step).Scan(&a.Max, &minStep)
	if errors.Is(err, pgx.ErrNoRows) {
		return Allocation{}, fmt.Errorf("%w: %q has no leaf_alloc row", idgen.ErrUnknownTag, tag)
	}
	if err != nil {
		return Allocation{}, fmt.Errorf("segment: allocate %q: %w", tag, err)
	}
	a.MinStep = int64(minStep)
	a.Size = max(step, a.MinStep)
	return a, nil
}

// GiveBack implements Store.
func (s *PostgresStore) GiveBack(ctx context.Context, tag string, expectedMax, newMax int64) (bool, error) {
	if newMax >= expectedMax {
		return false, fmt.Errorf("%w: give back %q from %d to %d", idgen.ErrBadArgument, tag, expectedMax, newMax)
	}
	ct, err := s.db.Exec(ctx, sqlGiveBack, tag, expectedMax, newMax)
	if err != nil {
		return false, fmt.Errorf("segment: give back %q: %w", tag, err)
	}
	return ct.RowsAffected() == 1, nil
}
