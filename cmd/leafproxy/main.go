// Command leafproxy is a PostgreSQL wire-protocol proxy that hands out Leaf IDs: it answers
// leaf_next('tag') and fills the primary keys of configured tables on INSERT.
//
//	leafproxy serve --config leafproxy.yaml      run the proxy and the admin HTTP server
//	leafproxy migrate up --dsn postgres://…      create or upgrade the leaf_alloc schema
//	leafproxy tag add order --step 1000 --dsn …  manage segment tags
//	leafproxy decode 1234567890123456789         split a snowflake ID
//	leafproxy healthcheck                        probe a running proxy (for containers)
//	leafproxy version
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"

	"github.com/leafproxy/leafproxy/internal/config"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3"; otherwise the
// module version or VCS revision from the build info is used.
var version = ""

// exitError carries an exit status; usage errors exit 2, failures 1.
type exitError struct {
	code    int
	err     error
	printed bool // the flag package already printed the message and the usage
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageError(format string, args ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, args...)}
}

const mainUsage = `leafproxy hands out Leaf IDs (segment and snowflake) through a PostgreSQL proxy.

Usage:
  leafproxy <command> [arguments]

Commands:
  serve        run the proxy, the ID engines and the admin HTTP server
  migrate      apply or revert the leaf_alloc schema: up, down, version, force
  tag          manage segment tags in leaf_alloc: add, list, set-step, set-max-id, remove
  fill         manage the fill rules every proxy reads from leaf_fill: add, list, remove
  decode       split snowflake IDs into time, worker and sequence (JSON)
  healthcheck  ask a running proxy's /readyz (exit 0 when ready), for container probes
  version      print the version

Run "leafproxy <command> --help" for the flags of a command.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command and returns the process exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, mainUsage)
		return 2
	}
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "serve":
		err = serveCmd(rest, stdout, stderr)
	case "migrate":
		err = migrateCmd(rest, stdout, stderr)
	case "tag":
		err = tagCmd(rest, stdout, stderr)
	case "fill":
		err = fillCmd(rest, stdout, stderr)
	case "decode":
		err = decodeCmd(rest, stdout, stderr)
	case "healthcheck":
		err = healthcheckCmd(rest, stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "leafproxy", buildVersion())
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, mainUsage)
	default:
		fmt.Fprintf(stderr, "leafproxy: unknown command %q\n\n%s", cmd, mainUsage)
		return 2
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if !ee.printed {
			fmt.Fprintln(stderr, "leafproxy:", err)
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "leafproxy:", err)
	return 1
}

// buildVersion returns the -X version, else what the Go toolchain recorded.
func buildVersion() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	rev, dirty := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return "devel-" + rev
}

// newFlagSet returns a FlagSet that prints its usage (a synopsis, then the flags) to w.
func newFlagSet(name, synopsis string, w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(w)
	fs.Usage = func() {
		fmt.Fprintf(w, "Usage: leafproxy %s\n\nFlags:\n", strings.TrimSpace(synopsis))
		printFlags(w, fs)
	}
	return fs
}

// printFlags lists the flags as "--name ARG" with their help and default; unlike
// flag.PrintDefaults it names each argument after what it is (HOST:PORT, URL, N).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		if a := config.FlagArg(f.Name); a != "" {
			arg = a
		}
		if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
			arg = ""
		}
		line := "  --" + f.Name
		if arg != "" {
			line += " " + arg
		}
		fmt.Fprintln(w, line)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			usage += " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(w, "        %s\n", usage)
	})
}

// parseInterleaved parses flags that may come before, between or after positional
// arguments ("tag add order --step 10" as well as "tag add --step 10 order"), which the
// flag package alone does not allow. "--" ends the flags.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// parseFlags parses args. --help prints the usage; a bad flag is a usage error (exit 2)
// of one line that names the nearest flag and points at --help, instead of the flag
// package's message followed by the whole usage.
func parseFlags(fs *flag.FlagSet, args []string) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.Usage = usage
	fs.SetOutput(out)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		usage()
		return err
	}
	return &exitError{code: 2, err: flagError(fs, err)}
}

// flagError words a flag package error: flags are spelled with two dashes, as the usage
// spells them, and an unknown one gets the nearest known name.
func flagError(fs *flag.FlagSet, err error) error {
	help := fmt.Sprintf("run \"leafproxy %s --help\" for the flags", fs.Name())
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		name = strings.TrimLeft(name, "-")
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		msg = "unknown flag --" + name
		if near := config.Nearest(name, names); near != "" {
			msg += " (did you mean --" + near + "?)"
		}
	} else {
		msg = strings.Replace(msg, " -", " --", 1)
	}
	return fmt.Errorf("%s: %s; %s", fs.Name(), msg, help)
}

// dsnFlag registers --dsn. Its default comes from $LEAFPROXY_STORE when the flag is
// absent (see resolveDSN), not at registration, so --help never prints a password.
func dsnFlag(fs *flag.FlagSet) *string {
	return fs.String("dsn", "",
		"PostgreSQL `URL` of the database holding leaf_alloc, e.g. postgres://leaf@127.0.0.1:5432/app (default $LEAFPROXY_STORE)")
}

// resolveDSN returns the --dsn value or $LEAFPROXY_STORE, checked.
func resolveDSN(dsn string) (string, error) {
	if dsn == "" {
		dsn = os.Getenv("LEAFPROXY_STORE")
	}
	if dsn == "" {
		return "", usageError("no store given: pass --dsn URL or set LEAFPROXY_STORE, e.g. postgres://leaf@127.0.0.1:5432/app")
	}
	if err := config.CheckStoreDSN(dsn); err != nil {
		return "", usageError("--dsn: %v", err)
	}
	return dsn, nil
}
