package main

import (
	"fmt"
	"io"
	"strconv"

	"github.com/leafproxy/leafproxy/migrations"
)

const migrateSynopsis = `migrate up|down|version|force VERSION [--dsn URL]

  up       apply every migration not applied yet (creates leaf_alloc and leaf_worker_lease)
  down     revert every migration: drops leaf_alloc and leaf_worker_lease (needs --yes)
  version  print the applied version, and whether a failed migration left it dirty
  force    record VERSION as applied and clean without running anything (after fixing
           a failed migration by hand)`

func migrateCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("migrate", migrateSynopsis, stderr)
	dsnArg := dsnFlag(fs)
	yes := fs.Bool("yes", false, "confirm `down`: dropping leaf_alloc forgets every tag's position, and IDs would repeat if the tags were created again")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		fs.Usage()
		return usageError("migrate: missing subcommand (up, down, version or force)")
	}
	sub, rest := pos[0], pos[1:]
	wantArgs := 0
	if sub == "force" {
		wantArgs = 1
	}
	if len(rest) != wantArgs {
		return usageError("migrate %s: want %d argument(s), got %q", sub, wantArgs, rest)
	}
	switch sub {
	case "up", "down", "version", "force":
	default:
		return usageError("migrate: unknown subcommand %q (want up, down, version or force)", sub)
	}
	dsn, err := resolveDSN(*dsnArg)
	if err != nil {
		return err
	}
	switch sub {
	case "up":
		if err := migrations.Up(dsn); err != nil {
			return err
		}
		return printVersion(stdout, dsn)
	case "down":
		if !*yes {
			return usageError("migrate down drops leaf_alloc and leaf_worker_lease; pass --yes to confirm")
		}
		if err := migrations.Down(dsn); err != nil {
			return err
		}
		return printVersion(stdout, dsn)
	case "version":
		return printVersion(stdout, dsn)
	default: // force
		v, err := strconv.Atoi(rest[0])
		if err != nil || v < -1 {
			return usageError("migrate force: VERSION must be an integer ≥ -1, got %q", rest[0])
		}
		if err := migrations.Force(dsn, v); err != nil {
			return err
		}
		return printVersion(stdout, dsn)
	}
}

func printVersion(w io.Writer, dsn string) error {
	v, dirty, err := migrations.Version(dsn)
	if err != nil {
		return err
	}
	latest, err := migrations.Latest()
	if err != nil {
		return err
	}
	state := ""
	if dirty {
		state = " (dirty: a migration failed half-way; fix it, then `leafproxy migrate force N`)"
	}
	fmt.Fprintf(w, "version %d of %d%s\n", v, latest, state)
	return nil
}
