package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/filladmin"
)

const fillUsage = `Usage: leafproxy fill <subcommand> [arguments] [--dsn URL]

Subcommands:
  add [SCHEMA.]TABLE.COLUMN=TAG      fill COLUMN of TABLE with IDs of TAG on every proxy
  list [--json]                      show the rules stored in leaf_fill
  remove [SCHEMA.]TABLE.COLUMN       delete a stored rule

Running proxies read leaf_fill every fill-refresh (60 s) and at once on SIGHUP, and
merge it with the fill rules of their own configuration.

Run "leafproxy fill <subcommand> --help" for its flags.
`

func fillCmd(args []string, stdout, stderr io.Writer) error {
	return runSubcommand("fill", fillUsage, args, stdout, stderr, map[string]subcommand{
		"add":    fillAdd,
		"list":   fillList,
		"remove": fillRemove,
	})
}

func fillAdd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("fill add", "fill add [SCHEMA.]TABLE.COLUMN=TAG [--dsn URL]\n\nStores a fill rule in leaf_fill: INSERTs into TABLE that leave COLUMN out (or give\nDEFAULT or NULL) get an ID of TAG, on every proxy reading this store, from its next rule\nrefresh. Unquoted names fold to lower case; double-quote names to keep their case. A\nrule conflicting with a stored one (same column, other tag; or a second key column for\nthe table) is refused.", stderr)
	dsn := dsnFlag(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return usageError("fill add: want exactly one [SCHEMA.]TABLE.COLUMN=TAG, got %q", pos)
	}
	r, err := config.ParseFillRule(pos[0])
	if err != nil {
		return usageError("fill add: %v", err)
	}
	return withDB(*dsn, func(ctx context.Context, db *pgx.Conn) error {
		if err := filladmin.Add(ctx, db, r); err != nil {
			return fmt.Errorf("fill add: %w", err)
		}
		fmt.Fprintf(stdout, "added fill rule %s; proxies apply it at their next rule refresh (or at once on SIGHUP)\n", r)
		return nil
	})
}

// fillRow is one rule as `fill list --json` prints it.
type fillRow struct {
	Table  string `json:"table"`
	Column string `json:"column"`
	Tag    string `json:"tag"`
}

func fillList(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("fill list", "fill list [--json] [--dsn URL]\n\nShows the fill rules stored in leaf_fill (not those of a proxy's own configuration).", stderr)
	dsn := dsnFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError("fill list: unexpected arguments %q", pos)
	}
	return withDB(*dsn, func(ctx context.Context, db *pgx.Conn) error {
		rules, err := filladmin.List(ctx, db)
		if err != nil {
			return fmt.Errorf("fill list: %w", err)
		}
		if *asJSON {
			rows := []fillRow{}
			for _, r := range rules {
				rows = append(rows, fillRow{Table: r.SQLTable(), Column: r.SQLColumn(), Tag: r.Tag})
			}
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(rows)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TABLE\tCOLUMN\tTAG")
		for _, r := range rules {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", r.SQLTable(), r.SQLColumn(), r.Tag)
		}
		return tw.Flush()
	})
}

func fillRemove(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("fill remove", "fill remove [SCHEMA.]TABLE.COLUMN [--dsn URL]\n\nDeletes a fill rule from leaf_fill; proxies stop filling at their next rule refresh\n(or at once on SIGHUP), unless their own configuration has the rule.", stderr)
	dsn := dsnFlag(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return usageError("fill remove: want exactly one [SCHEMA.]TABLE.COLUMN, got %q", pos)
	}
	target, err := config.ParseFillTarget(pos[0])
	if err != nil {
		return usageError("fill remove: %v", err)
	}
	return withDB(*dsn, func(ctx context.Context, db *pgx.Conn) error {
		r, err := filladmin.Remove(ctx, db, target)
		if err != nil {
			return fmt.Errorf("fill remove: %w", err)
		}
		fmt.Fprintf(stdout, "removed fill rule %s\n", r)
		return nil
	})
}
