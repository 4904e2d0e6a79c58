package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/tagadmin"
)

const tagUsage = `Usage: leafproxy tag <subcommand> [arguments] [--dsn URL]

Subcommands:
  add NAME --step N [--max-id M] [--description D]   create a segment tag
  list [--json]                                       show every tag
  set-step NAME N                                     change a tag's minimum step
  set-max-id NAME M                                   move a tag forward (never back)
  remove NAME                                         delete a tag

Run "leafproxy tag <subcommand> --help" for its flags.
`

func tagCmd(args []string, stdout, stderr io.Writer) error {
	return runSubcommand("tag", tagUsage, args, stdout, stderr, map[string]subcommand{
		"add":  tagAdd,
		"list": tagList,
		"set-step": func(args []string, stdout, stderr io.Writer) error {
			return tagSetNumber("set-step", "NAME N", "set the minimum step of tag NAME to N (≥ 1); proxies use it from their next segment load", args, stdout, stderr)
		},
		"set-max-id": func(args []string, stdout, stderr io.Writer) error {
			return tagSetNumber("set-max-id", "NAME M", "raise tag NAME's max_id to M so its next segment starts after M; lowering it is refused", args, stdout, stderr)
		},
		"remove": tagRemove,
	})
}

// subcommand runs one subcommand of a command group (tag, fill) with the arguments after it.
type subcommand func(args []string, stdout, stderr io.Writer) error

// runSubcommand runs the subcommand args[0] of group, or prints the group's usage: to
// stdout when asked for help, else to stderr with a usage error.
func runSubcommand(group, usage string, args []string, stdout, stderr io.Writer, subs map[string]subcommand) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageError("%s: missing subcommand", group)
	}
	sub, args := args[0], args[1:]
	if run, ok := subs[sub]; ok {
		return run(args, stdout, stderr)
	}
	switch sub {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return usageError("%s: unknown subcommand %q", group, sub)
}

// withDB connects to the store for one tag command.
func withDB(dsnArg string, f func(ctx context.Context, db *pgx.Conn) error) error {
	dsn, err := resolveDSN(dsnArg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("cannot connect to the store %s: %s", storeTarget(dsn), connectFailure(err))
	}
	defer conn.Close(context.Background())
	return f(ctx, conn)
}

func tagAdd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tag add", "tag add NAME --step N [--max-id M] [--description D] [--config FILE] [--dsn URL]\n\nCreates segment tag NAME. Its first segment starts at max-id + 1. A name the proxies'\nconfiguration (--config, LEAFPROXY_CONFIG, LEAFPROXY_SNOWFLAKE_TAGS) serves as a\nsnowflake tag is refused: a tag is served by one engine.", stderr)
	dsn := dsnFlag(fs)
	file := fs.String("config", "", "the proxies' configuration `FILE`, to refuse a name it lists in snowflake-tags (env LEAFPROXY_CONFIG)")
	step := fs.Int64("step", 0, "minimum number of IDs (`N`) reserved per segment load (required, ≥ 1; Leaf uses 1000–2000)")
	maxID := fs.Int64("max-id", 1, "IDs up to this one (`M`) are never handed out (the first ID is max-id + 1)")
	desc := fs.String("description", "", "free `TEXT` stored with the tag")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return usageError("tag add: want exactly one tag NAME, got %q", pos)
	}
	if *step == 0 && !flagGiven(fs, "step") {
		return usageError("tag add: --step is required")
	}
	snow, origin, err := configuredSnowflakeTags(*file)
	if err != nil {
		return err
	}
	if slices.Contains(snow, pos[0]) {
		return fmt.Errorf("tag add: %q is a snowflake tag (snowflake-tags in %s): a tag is served by one engine, so it cannot be a segment tag too; choose another name, or remove it from snowflake-tags first", pos[0], origin)
	}
	return withDB(*dsn, func(ctx context.Context, db *pgx.Conn) error {
		if err := tagadmin.Add(ctx, db, pos[0], *step, *maxID, *desc); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "added tag %s: step %d, first ID %d\n", pos[0], *step, *maxID+1)
		return nil
	})
}

// configuredSnowflakeTags returns the snowflake tags the proxies' configuration names, as
// far as this command can know it: $LEAFPROXY_SNOWFLAKE_TAGS, else the snowflake-tags of
// the configuration file (file, else $LEAFPROXY_CONFIG); and where they come from.
func configuredSnowflakeTags(file string) (tags []string, origin string, err error) {
	if v, ok := os.LookupEnv("LEAFPROXY_SNOWFLAKE_TAGS"); ok {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				tags = append(tags, t)
			}
		}
		return tags, "env LEAFPROXY_SNOWFLAKE_TAGS", nil
	}
	if file == "" {
		file = os.Getenv("LEAFPROXY_CONFIG")
	}
	if file == "" {
		return nil, "", nil
	}
	c, err := config.ReadFile(file)
	if err != nil {
		return nil, "", err
	}
	return c.SnowflakeTags, "file " + file, nil
}

func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

func tagList(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tag list", "tag list [--json] [--dsn URL]\n\nShows every segment tag: its max_id (the last ID reserved by any proxy), step and description.", stderr)
	dsn := dsnFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError("tag list: unexpected arguments %q", pos)
	}
	return withDB(*dsn, func(ctx context.Context, db *pgx.Conn) error {
		tags, err := tagadmin.List(ctx, db)
		if err != nil {
			return err
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if tags == nil {
				tags = []tagadmin.Tag{}
			}
			return enc.Encode(tags)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TAG\tMAX_ID\tSTEP\tUPDATED\tDESCRIPTION")
		for _, t := range tags {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", t.Name, t.MaxID, t.Step, t.UpdateTime.UTC().Format(time.RFC3339), t.Description)
		}
		return tw.Flush()
	})
}

func tagSetNumber(sub, args0, what string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tag "+sub, "tag "+sub+" "+args0+" [--dsn URL]\n\n"+what+".", stderr)
	dsn := dsnFlag(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		fs.Usage()
		return usageError("tag %s: want %s, got %q", sub, args0, pos)
	}
	n, err := strconv.ParseInt(pos[1], 10, 64)
	if err != nil {
		return usageError("tag %s: %q is not an integer", sub, pos[1])
	}
	return withDB(*dsn, func(ctx context.Context, db *pgx.Conn) error {
		if sub == "set-step" {
			err = tagadmin.SetStep(ctx, db, pos[0], n)
		} else {
			err = tagadmin.SetMaxID(ctx, db, pos[0], n)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "tag %s: %s %d\n", pos[0], sub[len("set-"):], n)
		return nil
	})
}

func tagRemove(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tag remove", "tag remove NAME [--dsn URL]\n\nDeletes segment tag NAME; proxies stop serving it at their next tag refresh (60 s).", stderr)
	dsn := dsnFlag(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return usageError("tag remove: want exactly one tag NAME, got %q", pos)
	}
	return withDB(*dsn, func(ctx context.Context, db *pgx.Conn) error {
		t, err := tagadmin.Get(ctx, db, pos[0])
		if err != nil {
			return err
		}
		if err := tagadmin.Remove(ctx, db, pos[0]); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "removed tag %s; IDs up to %d were reserved: create it again with --max-id %d or more\n",
			pos[0], t.MaxID, t.MaxID)
		return nil
	})
}
