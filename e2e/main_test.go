package e2e

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

var soak = flag.Bool("soak", false, "run the load tests for 60 s instead of 15 s (also LEAF_E2E_SOAK=1)")

// binary is the leafproxy command built once for the whole package by TestMain.
var leafBinary struct {
	path     string
	missing  string // why there is nothing to build (cmd/leafproxy absent), or ""
	buildErr error  // the build failed although the sources are there: a real failure
}

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "leafproxy-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	if testing.Short() {
		// make test-short: unit tests only; building the binary alone takes a while.
		leafBinary.missing = "-short: the end-to-end tests need the leafproxy binary and live servers"
	} else if bin := os.Getenv("LEAF_E2E_BINARY"); bin != "" {
		// A prebuilt binary (a release build, say) instead of building the tree.
		leafBinary.path = bin
	} else {
		buildBinary(dir)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// moduleRoot walks up from the test's directory to the go.mod of the module.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the test directory")
		}
		dir = parent
	}
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// buildBinary builds cmd/leafproxy without -race: the proxy under test is a normal build,
// the race detector watches the test's own clients.
func buildBinary(dir string) {
	root, err := moduleRoot()
	if err != nil {
		leafBinary.buildErr = err
		return
	}
	srcs, _ := filepath.Glob(filepath.Join(root, "cmd", "leafproxy", "*.go"))
	if len(srcs) == 0 {
		leafBinary.missing = "cmd/leafproxy has no Go files yet: the leafproxy binary cannot be built"
		return
	}
	out := filepath.Join(dir, "leafproxy")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool(), "build", "-o", out, "./cmd/leafproxy")
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		leafBinary.buildErr = fmt.Errorf("go build ./cmd/leafproxy: %w\n%s", err, msg)
		return
	}
	leafBinary.path = out
}

// leafproxyBin returns the built binary. It skips the test in -short mode, skips it (fails
// it under CI) when the command does not exist in the tree, and fails it when the command
// exists but does not build.
func leafproxyBin(t testing.TB) string {
	t.Helper()
	switch {
	case testing.Short():
		t.Skip("-short: the end-to-end tests need the leafproxy binary and live servers")
	case leafBinary.missing != "":
		testenv.SkipOrFail(t, "%s", leafBinary.missing)
	case leafBinary.buildErr != nil:
		t.Fatal(leafBinary.buildErr)
	}
	return leafBinary.path
}

var helpCache sync.Map // subcommand → help text

// helpText returns `leafproxy <sub> --help` (stdout and stderr: flag packages differ in
// where they print usage, and many exit non-zero after -h).
func helpText(t testing.TB, sub ...string) string {
	t.Helper()
	key := strings.Join(sub, " ")
	if v, ok := helpCache.Load(key); ok {
		return v.(string)
	}
	bin := leafproxyBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var buf bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, append(append([]string{}, sub...), "--help")...)
	cmd.Stdout, cmd.Stderr = &buf, &buf
	_ = cmd.Run()
	helpCache.Store(key, buf.String())
	return buf.String()
}

// hasFlag reports whether `leafproxy <sub> --help` lists the flag (given without dashes).
func hasFlag(t testing.TB, sub, name string) bool {
	t.Helper()
	help := helpText(t, strings.Fields(sub)...)
	for _, form := range []string{"--" + name, "-" + name} {
		for _, line := range strings.Split(help, "\n") {
			for _, f := range strings.FieldsFunc(line, func(r rune) bool {
				return r == ' ' || r == '\t' || r == ',' || r == '=' || r == '['
			}) {
				if f == form {
					return true
				}
			}
		}
	}
	return false
}

// requireServeFlags skips the test (fails it under CI) when the binary's serve command
// lacks one of the flags: the feature the test exercises is not built.
func requireServeFlags(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if !hasFlag(t, "serve", n) {
			testenv.SkipOrFail(t, "`leafproxy serve --help` lists no --%s flag: feature not in the binary\n%s", n, helpText(t, "serve"))
		}
	}
}

// loadDuration is how long the load tests run: 15 s, 60 s with -soak or LEAF_E2E_SOAK=1,
// or LEAF_E2E_DURATION (a Go duration) when set.
func loadDuration() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("LEAF_E2E_DURATION")); err == nil && d > 0 {
		return d
	}
	if *soak || os.Getenv("LEAF_E2E_SOAK") == "1" {
		return 60 * time.Second
	}
	return 15 * time.Second
}
