// Package migrations holds the store schema (leaf_alloc, leaf_worker_lease, leaf_fill) as
// golang-migrate migrations, embedded in the binary, and applies them through the pgx5
// driver. Applying them when they are already applied does nothing.
package migrations

import (
	"embed"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // registers pgx5://
	"github.com/golang-migrate/migrate/v4/source/iofs"
)

//go:embed *.sql
var files embed.FS

// MigrationsTable is where golang-migrate records the applied version; it is kept apart
// from an application's own schema_migrations table.
const MigrationsTable = "leaf_schema_migrations"

// open returns a migrator for the PostgreSQL DSN (postgres://, postgresql:// or pgx5://).
func open(dsn string) (*migrate.Migrate, error) {
	src, err := iofs.New(files, ".")
	if err != nil {
		return nil, err
	}
	dbURL, err := driverURL(dsn)
	if err != nil {
		return nil, err
	}
	m, err := migrate.NewWithSourceInstance("iofs", src, dbURL)
	if err != nil {
		return nil, fmt.Errorf("migrations: open database: %w", err)
	}
	return m, nil
}

func driverURL(dsn string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" && !strings.HasPrefix(dsn, "pgx5://") {
		return "", fmt.Errorf("migrations: need a URL DSN such as postgres://user@host:5432/db, got %q", redactDSN(dsn))
	}
	switch u.Scheme {
	case "postgres", "postgresql", "pgx5":
	default:
		return "", fmt.Errorf("migrations: unsupported scheme %q in DSN", u.Scheme)
	}
	u.Scheme = "pgx5"
	q := u.Query()
	q.Set("x-migrations-table", MigrationsTable)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil {
		return u.Redacted()
	}
	return "(unparsable)"
}

func closeMigrate(m *migrate.Migrate, err error) error {
	srcErr, dbErr := m.Close()
	return errors.Join(err, srcErr, dbErr)
}

// Up applies every migration not yet applied.
func Up(dsn string) error {
	m, err := open(dsn)
	if err != nil {
		return err
	}
	err = m.Up()
	if errors.Is(err, migrate.ErrNoChange) {
		err = nil
	}
	return closeMigrate(m, err)
}

// Down reverts every migration, dropping leaf_alloc, the lease table and leaf_fill.
func Down(dsn string) error {
	m, err := open(dsn)
	if err != nil {
		return err
	}
	err = m.Down()
	if errors.Is(err, migrate.ErrNoChange) {
		err = nil
	}
	return closeMigrate(m, err)
}

// Steps applies (n > 0) or reverts (n < 0) n migrations.
func Steps(dsn string, n int) error {
	m, err := open(dsn)
	if err != nil {
		return err
	}
	return closeMigrate(m, m.Steps(n))
}

// Version reports the applied version and whether a failed migration left it dirty.
// Version 0 means none is applied.
func Version(dsn string) (version uint, dirty bool, err error) {
	m, err := open(dsn)
	if err != nil {
		return 0, false, err
	}
	version, dirty, err = m.Version()
	if errors.Is(err, migrate.ErrNilVersion) {
		version, dirty, err = 0, false, nil
	}
	return version, dirty, closeMigrate(m, err)
}

// Force records version as applied and clean without running anything, to recover from a
// failed migration by hand.
func Force(dsn string, version int) error {
	m, err := open(dsn)
	if err != nil {
		return err
	}
	return closeMigrate(m, m.Force(version))
}

// Latest is the newest version the embedded files define.
func Latest() (uint, error) {
	src, err := iofs.New(files, ".")
	if err != nil {
		return 0, err
	}
	defer src.Close()
	v, err := src.First()
	if err != nil {
		return 0, err
	}
	for {
		next, err := src.Next(v)
		if err != nil {
			return v, nil
		}
		v = next
	}
}
