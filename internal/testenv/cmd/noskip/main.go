// Command noskip runs `go test -json …`, prints the tests' output as plain go test would
// (each package's output together, when the package ends), and lists the tests that
// skipped. Under CI (the CI variable set) a skipped test fails the run: the suite must
// not go green by skipping what it could not run.
//
//	go run ./internal/testenv/cmd/noskip -- go test -json -race ./...
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
)

// event is the part of a test2json event this command reads.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: noskip -- go test -json [flags] [packages]")
		os.Exit(2)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stderr = os.Stdin, os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "noskip:", err)
		os.Exit(1)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "noskip:", err)
		os.Exit(1)
	}
	skipped := relay(stdout, os.Stdout)
	code := 0
	if err := cmd.Wait(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			fmt.Fprintln(os.Stderr, "noskip:", err)
			os.Exit(1)
		}
		code = exit.ExitCode()
	}
	if len(skipped) > 0 {
		fmt.Printf("noskip: %d tests skipped:\n  %s\n", len(skipped), strings.Join(skipped, "\n  "))
		if os.Getenv("CI") != "" {
			fmt.Println("noskip: FAIL: no test may skip under CI")
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// relay copies the output of the events on r to w as plain go test prints it: a package
// that passes gets its summary line, one that fails all its output, each package's lines
// together when it ends. It returns the tests that skipped as "package TestName", sorted.
// A line that is not an event (a build error, say) goes through at once.
func relay(r io.Reader, w io.Writer) []string {
	type pkgOutput struct{ all, summary strings.Builder }
	pending := map[string]*pkgOutput{}
	var skipped []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(w, sc.Text())
			continue
		}
		out := pending[e.Package]
		if out == nil {
			out = &pkgOutput{}
			pending[e.Package] = out
		}
		out.all.WriteString(e.Output)
		if e.Test == "" && e.Output != "PASS\n" {
			out.summary.WriteString(e.Output)
		}
		switch {
		case e.Action == "skip" && e.Test != "":
			skipped = append(skipped, e.Package+" "+e.Test)
		case e.Test == "" && e.Action == "fail":
			io.WriteString(w, out.all.String())
			delete(pending, e.Package)
		case e.Test == "" && (e.Action == "pass" || e.Action == "skip"):
			io.WriteString(w, out.summary.String())
			delete(pending, e.Package)
		}
	}
	for _, out := range pending { // a package cut short (a panic, a timeout)
		io.WriteString(w, out.all.String())
	}
	sort.Strings(skipped)
	return skipped
}
