package driversuite

import (
	"context"
	"flag"
	"fmt"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var pgxRun = flag.String("pgx.run", "", "run only the tests of pgx's suite matching this `go test -run` pattern")

// suiteRun is one run of the suite: straight at the database or through a proxy.
type suiteRun struct {
	Name     string
	Endpoint endpoint
	DB       string
	Proxy    *runningProxy // nil for the direct run
	Report   *report
}

// TestPgxSuite runs pgx's own tests straight at the database and through two proxies, and
// checks that every test passing direct passes through both (see the package doc).
//
// The three runs go at the same time, each on its own fresh database: pgx's tests spend
// much of their time waiting (timeouts, sleeps, round trips), so running them side by side
// brings the wall time down to about that of the slowest run; and direct and proxied tests
// see the same load, so a timing-sensitive test is not held against the proxy. pgx's tests
// run without -race (they test the proxy's behaviour, not pgx's code); the proxies run in
// this process, under -race when this package is tested with it, as `make test` does.
func TestPgxSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the driver suite needs a live PostgreSQL and takes minutes")
	}
	ctx := testContext(t)
	s := sharedServer(ctx, t)
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to run pgx's tests: %v", err)
	}

	configure, engine := rewritingProxy(ctx, t)
	plain, rewriting := startProxy(t, s, nil), startProxy(t, s, configure)
	runs := []*suiteRun{
		{Name: "direct", Endpoint: endpoint{Addr: s.Addr, SocketDir: s.SocketDir, TLS: s.Cert != nil}},
		{Name: "proxy", Endpoint: plain.Endpoint, Proxy: plain},
		{Name: "rewriting proxy", Endpoint: rewriting.Endpoint, Proxy: rewriting},
	}
	for _, r := range runs {
		r.DB = newSuiteDatabase(ctx, t)
	}

	args := suiteArgs(ctx, *pgxRun)
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Go(func() {
			r.Report, errs[i] = goTest(ctx, goBin, "", subprocessEnv(suiteEnv(s, r.Endpoint, r.DB)), args...)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s run: %v", runs[i].Name, err)
		}
	}

	direct := runs[0].Report
	checkDirect(t, direct)
	var flaky []string
	for _, r := range runs[1:] {
		flaky = append(flaky, checkProxied(ctx, t, goBin, s, direct, r)...)
	}
	logSummary(t, goBin, runs, flaky)
	checkFill(ctx, t, s, rewriting.Endpoint, runs[2].DB, engine)
}

// suiteParallel is how many tests of one package run at once. Most of pgx's tests wait on
// the server or on timers rather than compute, so more than go test's default of GOMAXPROCS
// shortens the run without loading the CPU much more.
const suiteParallel = 8

// suiteArgs returns the arguments of `go test` for the suite: pgx's packages, a timeout
// that ends the run with the stacks of hung tests before ctx ends, and the -run filter.
func suiteArgs(ctx context.Context, run string) []string {
	timeout := 10 * time.Minute
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline)-30*time.Second)
	}
	args := []string{"-timeout", timeout.Round(time.Second).String(), "-parallel", strconv.Itoa(suiteParallel)}
	if run != "" {
		args = append(args, "-run", run)
	}
	return append(args, pgxPackages...)
}

// checkDirect fails the test when the direct run did not test anything: a package that did
// not build, or a suite that ran no test. Tests failing direct are logged, not compared.
func checkDirect(t *testing.T, direct *report) {
	t.Helper()
	for _, pkg := range pgxPackages {
		if direct.Packages[pkg] == "" || (direct.Packages[pkg] == "fail" && !anyResult(direct, pkg)) {
			t.Fatalf("%s did not run its tests direct:\n%s\n%s", pkg, direct.PackageOutput[pkg], direct.Stderr)
		}
	}
	if pass, _, _ := direct.counts(); pass == 0 {
		t.Fatal("no test of the suite passed direct")
	}
	var failed []string
	for id, action := range direct.Results {
		if action == "fail" {
			failed = append(failed, id.String())
		}
	}
	sort.Strings(failed)
	if len(failed) > 0 {
		t.Logf("%d tests fail straight at the database and are not compared: %s", len(failed), strings.Join(failed, ", "))
	}
}

func anyResult(r *report, pkg string) bool {
	for id := range r.Results {
		if id.Package == pkg {
			return true
		}
	}
	return false
}

// checkProxied compares a proxied run with the direct one. A test that passes direct but
// not through the proxy is run once more through the same proxy; when it passes then it
// is returned as flaky (and logged), otherwise it fails the test with its output.
func checkProxied(ctx context.Context, t *testing.T, goBin string, s *server, direct *report, r *suiteRun) (flaky []string) {
	t.Helper()
	if *pgxRun == "" {
		for _, msg := range staleExclusions(direct, r.Report, exclusions) {
			t.Errorf("%s: %s", r.Name, msg)
		}
	}
	if r.Proxy.tcpClients.Load() == 0 || (r.Endpoint.SocketDir != "" && *pgxRun == "" && r.Proxy.unixClients.Load() == 0) {
		t.Errorf("%s: the suite did not go through the proxy: %d TCP and %d Unix socket clients",
			r.Name, r.Proxy.tcpClients.Load(), r.Proxy.unixClients.Load())
	}
	problems := compare(direct, r.Report, exclusions)
	if len(problems) == 0 {
		return nil
	}
	retried := rerun(ctx, t, goBin, s, r, problems)
	for _, p := range problems {
		if retried.Results[p.ID] == "pass" {
			flaky = append(flaky, fmt.Sprintf("%s (%s)", p.ID, r.Name))
			t.Logf("%s: %s, but passed when run once more; its first output:\n%s", r.Name, p, p.Output)
			continue
		}
		out := p.Output
		if p.Got == "" {
			out = r.Report.PackageOutput[p.ID.Package]
		}
		t.Errorf("%s: %s, and again when run once more; its output through the proxy:\n%s", r.Name, p, out)
	}
	return flaky
}

// rerun runs the top-level tests holding problems once more through r's endpoint, on r's
// database, one package at a time.
func rerun(ctx context.Context, t *testing.T, goBin string, s *server, r *suiteRun, problems []problem) *report {
	t.Helper()
	byPackage := make(map[string][]testID)
	for _, p := range problems {
		byPackage[p.ID.Package] = append(byPackage[p.ID.Package], p.ID)
	}
	merged := newReport()
	env := subprocessEnv(suiteEnv(s, r.Endpoint, r.DB))
	for pkg, ids := range byPackage {
		rep, err := goTest(ctx, goBin, "", env, "-timeout", "5m", "-run", rerunPattern(ids), pkg)
		if err != nil {
			t.Errorf("%s: rerun of %s: %v", r.Name, shortPackage(pkg), err)
			continue
		}
		for id, action := range rep.Results {
			merged.Results[id] = action
		}
	}
	return merged
}

// logSummary logs what each run did, the exclusions and how they fared, the flaky tests
// and what the proxies logged.
func logSummary(t *testing.T, goBin string, runs []*suiteRun, flaky []string) {
	t.Helper()
	var b strings.Builder
	short := make([]string, len(pgxPackages))
	for i, p := range pgxPackages {
		short[i] = shortPackage(p)
	}
	fmt.Fprintf(&b, "pgx %s suite (%s)", pgxVersion(goBin), strings.Join(short, ", "))
	if *pgxRun != "" {
		fmt.Fprintf(&b, ", -run %q", *pgxRun)
	}
	fmt.Fprintf(&b, "\n  %-16s %7s %7s %7s %8s  %s\n", "run", "passed", "failed", "skipped", "wall", "per package")
	for _, r := range runs {
		pass, fail, skip := r.Report.counts()
		var perPackage []string
		for _, p := range pgxPackages {
			perPackage = append(perPackage, fmt.Sprintf("%s %s", shortPackage(p), r.Report.PackageElapsed[p].Round(100*time.Millisecond)))
		}
		fmt.Fprintf(&b, "  %-16s %7d %7d %7d %8s  %s\n", r.Name, pass, fail, skip,
			r.Report.Elapsed.Round(100*time.Millisecond), strings.Join(perPackage, ", "))
	}
	var skipped []string
	for id, action := range runs[0].Report.Results {
		if action == "skip" {
			skipped = append(skipped, id.String())
		}
	}
	sort.Strings(skipped)
	fmt.Fprintf(&b, "skipped direct (what they need is not set up here): %s\n", strings.Join(skipped, ", "))
	fmt.Fprintf(&b, "excluded: %d", len(exclusions))
	for _, e := range exclusions {
		var got []string
		for _, r := range runs {
			got = append(got, r.Name+" "+orNone(r.Report.Results[e.ID]))
		}
		fmt.Fprintf(&b, "\n  %s: %s [%s]", e.ID, e.Reason, strings.Join(got, ", "))
	}
	if len(flaky) > 0 {
		fmt.Fprintf(&b, "\nfailed once, passed when run again: %s", strings.Join(flaky, ", "))
	}
	for _, r := range runs {
		if r.Proxy == nil {
			continue
		}
		count, first := r.Proxy.log.snapshot()
		fmt.Fprintf(&b, "\n%s served %d clients on TCP and %d on its Unix socket, and logged %d warnings or errors",
			r.Name, r.Proxy.tcpClients.Load(), r.Proxy.unixClients.Load(), count)
		for _, line := range first {
			fmt.Fprintf(&b, "\n  %s", line)
		}
	}
	t.Log(b.String())
}

func orNone(action string) string {
	if action == "" {
		return "not run"
	}
	return action
}

// pgxVersion returns the version of pgx this module builds with, as go.mod selects it.
func pgxVersion(goBin string) string {
	out, err := exec.Command(goBin, "list", "-m", "-f", "{{.Version}}", pgxModule).Output()
	if err != nil {
		return "(version unknown: " + err.Error() + ")"
	}
	return strings.TrimSpace(string(out))
}
