package driversuite

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// How many output lines are kept per test and per package: enough to show why a test
// failed, few enough that a chatty suite cannot exhaust memory.
const (
	headLines = 20 // the first lines: how a panic or a timeout's goroutine dump began
	tailLines = 40 // the last lines: how a failure ended
)

// event is one line of `go test -json` (see `go doc cmd/test2json`).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output and build-fail events name the package here
	Test       string
	Output     string
	Elapsed    float64 // seconds, on pass, fail and skip
}

// testID names one test, subtests included, across runs.
type testID struct{ Package, Test string }

func (id testID) String() string { return shortPackage(id.Package) + " " + id.Test }

// shortPackage shortens pgx's import paths for logs: pgx, pgx/pgconn, ….
func shortPackage(pkg string) string {
	if rest, ok := strings.CutPrefix(pkg, pgxModule); ok {
		return "pgx" + rest
	}
	return pkg
}

// report is what one `go test -json` run produced.
type report struct {
	Results  map[testID]string  // final action of each test: pass, fail or skip
	Output   map[testID]*output // what each test printed
	Packages map[string]string  // final action of each package: pass, fail (or skip: no tests)
	// PackageElapsed is how long each package's test binary ran.
	PackageElapsed map[string]time.Duration
	// PackageOutput holds output not attributed to a test: build errors, a panic that
	// ended the test binary, the final FAIL line.
	PackageOutput map[string]*output
	Stray         output // lines of stdout that were not JSON
	Stderr        string
	Elapsed       time.Duration
}

func newReport() *report {
	return &report{
		Results:        make(map[testID]string),
		Output:         make(map[testID]*output),
		Packages:       make(map[string]string),
		PackageElapsed: make(map[string]time.Duration),
		PackageOutput:  make(map[string]*output),
	}
}

// parseReport reads `go test -json` output to its end.
func parseReport(r io.Reader) (*report, error) {
	rep := newReport()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var e event
		if line[0] != '{' || json.Unmarshal(line, &e) != nil {
			rep.Stray.add(string(line))
			continue
		}
		rep.add(e)
	}
	return rep, sc.Err()
}

func (r *report) add(e event) {
	pkg := e.Package
	if pkg == "" {
		pkg = e.ImportPath
	}
	switch e.Action {
	case "output", "build-output":
		text := strings.TrimRight(e.Output, "\n")
		if e.Test != "" {
			id := testID{pkg, stableName(e.Test)}
			if r.Output[id] == nil {
				r.Output[id] = &output{}
			}
			r.Output[id].add(text)
		} else {
			if r.PackageOutput[pkg] == nil {
				r.PackageOutput[pkg] = &output{}
			}
			r.PackageOutput[pkg].add(text)
		}
	case "pass", "fail", "skip":
		if e.Test != "" {
			r.Results[testID{pkg, stableName(e.Test)}] = e.Action
		} else {
			r.Packages[pkg] = e.Action
			r.PackageElapsed[pkg] = time.Duration(e.Elapsed * float64(time.Second))
		}
	case "build-fail":
		r.Packages[pkg] = "fail"
	}
}

// tempDirName matches the part of a t.TempDir path that differs from run to run: the
// random number os.MkdirTemp appends to the test's name, and the directory's sequence number.
var tempDirName = regexp.MustCompile(`(/Test[A-Za-z_]*)[0-9]+/[0-9]{3,}/`)

// stableName returns a test's name with the temporary directories some subtests of pgx
// have in their names (TestParseConfigSSLCertMode) made the same in every run.
func stableName(test string) string {
	return tempDirName.ReplaceAllString(test, "${1}N/NNN/")
}

// output holds the first headLines and the last tailLines lines of some output.
type output struct {
	head, tail []string
	omitted    int
}

func (o *output) add(line string) {
	switch {
	case len(o.head) < headLines:
		o.head = append(o.head, line)
	case len(o.tail) < tailLines:
		o.tail = append(o.tail, line)
	default:
		o.tail = append(o.tail[:0], o.tail[1:]...)
		o.tail = append(o.tail, line)
		o.omitted++
	}
}

// lines returns the lines kept, with a line saying how many were left out between them.
// A nil output has none.
func (o *output) lines() []string {
	if o == nil {
		return nil
	}
	lines := append([]string(nil), o.head...)
	if o.omitted > 0 {
		lines = append(lines, fmt.Sprintf("[… %d lines left out …]", o.omitted))
	}
	return append(lines, o.tail...)
}

func (o *output) String() string { return strings.Join(o.lines(), "\n") }

// counts returns how many tests passed, failed and were skipped.
func (r *report) counts() (pass, fail, skip int) {
	for _, action := range r.Results {
		switch action {
		case "pass":
			pass++
		case "fail":
			fail++
		case "skip":
			skip++
		}
	}
	return pass, fail, skip
}

// goTest runs `go test -count=1 -json args…` in dir with exactly the environment env and
// parses its output. Failing tests are not an error (they are in the report); a go command
// that cannot run, or output that does not parse, is.
func goTest(ctx context.Context, goBin, dir string, env []string, args ...string) (*report, error) {
	start := time.Now()
	cmd := exec.CommandContext(ctx, goBin, append([]string{"test", "-count=1", "-json"}, args...)...)
	cmd.Dir = dir
	cmd.Env = env
	// go test starts one test binary per package; kill the whole process group when the
	// context ends, or the binaries would outlive the go command.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", goBin, err)
	}
	rep, parseErr := parseReport(stdout)
	if parseErr != nil {
		// Keep draining so that the go command is not blocked writing to a full pipe.
		_, _ = io.Copy(io.Discard, stdout)
	}
	waitErr := cmd.Wait()
	if rep == nil {
		rep = newReport()
	}
	rep.Stderr = stderr.String()
	rep.Elapsed = time.Since(start)
	if ctx.Err() != nil {
		return rep, fmt.Errorf("go test did not finish: %w\n%s", ctx.Err(), rep.Stderr)
	}
	if parseErr != nil {
		return rep, fmt.Errorf("read go test output: %w", parseErr)
	}
	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) {
		return rep, fmt.Errorf("go test: %w\n%s", waitErr, rep.Stderr)
	}
	if len(rep.Packages) == 0 {
		return rep, fmt.Errorf("go test reported no package (exit %v)\nstderr:\n%s\nstdout:\n%s",
			waitErr, rep.Stderr, rep.Stray.String())
	}
	return rep, nil
}

// subprocessEnv returns this process's environment without the variables that steer
// libpq-style clients or pgx's test suite (PG…, PGX_…), plus extra ("KEY=value"): the
// suite must see only the servers the test chose for it.
func subprocessEnv(extra map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "PG") {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}
