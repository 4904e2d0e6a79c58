package driversuite

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// The tests in this file check the harness itself: reading go test's JSON, comparing
// runs, and the connection strings it hands the suite.

const pkgA = "example.com/a"

func results(pairs ...string) *report {
	r := newReport()
	for i := 0; i+1 < len(pairs); i += 2 {
		r.Results[testID{pkgA, pairs[i]}] = pairs[i+1]
	}
	return r
}

func TestParseReport(t *testing.T) {
	input := strings.Join([]string{
		`{"Action":"start","Package":"example.com/a"}`,
		`{"Action":"run","Package":"example.com/a","Test":"TestOK"}`,
		`{"Action":"output","Package":"example.com/a","Test":"TestOK","Output":"=== RUN   TestOK\n"}`,
		`{"Action":"pass","Package":"example.com/a","Test":"TestOK","Elapsed":0.01}`,
		`{"Action":"output","Package":"example.com/a","Test":"TestBad/sub","Output":"    bad_test.go:9: boom\n"}`,
		`{"Action":"fail","Package":"example.com/a","Test":"TestBad/sub"}`,
		`{"Action":"fail","Package":"example.com/a","Test":"TestBad"}`,
		`{"Action":"skip","Package":"example.com/a","Test":"TestSkipped"}`,
		`{"Action":"pass","Package":"example.com/a","Test":"TestDir/file=/tmp/TestDir123456/001/x"}`,
		`{"Action":"output","Package":"example.com/a","Output":"FAIL\n"}`,
		`{"Action":"fail","Package":"example.com/a","Elapsed":1.5}`,
		`{"ImportPath":"example.com/b","Action":"build-output","Output":"b.go:1: syntax error\n"}`,
		`{"ImportPath":"example.com/b","Action":"build-fail"}`,
		`not json at all`,
	}, "\n")
	r, err := parseReport(strings.NewReader(input))
	if err != nil {
		t.Fatal(err)
	}
	wantResults := map[testID]string{
		{pkgA, "TestOK"}:                           "pass",
		{pkgA, "TestBad/sub"}:                      "fail",
		{pkgA, "TestBad"}:                          "fail",
		{pkgA, "TestSkipped"}:                      "skip",
		{pkgA, "TestDir/file=/tmp/TestDirN/NNN/x"}: "pass",
	}
	if !reflect.DeepEqual(r.Results, wantResults) {
		t.Errorf("results:\n got %v\nwant %v", r.Results, wantResults)
	}
	if got := r.Output[testID{pkgA, "TestBad/sub"}].lines(); !slices.Equal(got, []string{"    bad_test.go:9: boom"}) {
		t.Errorf("output of TestBad/sub: %q", got)
	}
	if r.Packages[pkgA] != "fail" || r.Packages["example.com/b"] != "fail" {
		t.Errorf("packages: %v", r.Packages)
	}
	if r.PackageElapsed[pkgA] != 1500*time.Millisecond {
		t.Errorf("elapsed of %s: %v", pkgA, r.PackageElapsed[pkgA])
	}
	if got := r.PackageOutput["example.com/b"].lines(); !slices.Equal(got, []string{"b.go:1: syntax error"}) {
		t.Errorf("build output: %q", got)
	}
	if got := r.Stray.lines(); !slices.Equal(got, []string{"not json at all"}) {
		t.Errorf("stray lines: %q", got)
	}
	if pass, fail, skip := r.counts(); pass != 2 || fail != 2 || skip != 1 {
		t.Errorf("counts = %d passed, %d failed, %d skipped; want 2, 2, 1", pass, fail, skip)
	}
}

func TestOutputKeepsHeadAndTail(t *testing.T) {
	tests := []struct {
		name  string
		lines int
		want  []string
	}{
		{"none", 0, nil},
		{"few", 3, []string{"0", "1", "2"}},
		{"exactly enough", headLines + tailLines, numbers(0, headLines+tailLines)},
		{"too many", headLines + tailLines + 5,
			append(append(numbers(0, headLines), "[… 5 lines left out …]"), numbers(headLines+5, headLines+tailLines+5)...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o output
			for i := range tt.lines {
				o.add(strconv.Itoa(i))
			}
			if got := o.lines(); !slices.Equal(got, tt.want) {
				t.Errorf("lines:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
	var none *output
	if none.lines() != nil || none.String() != "" {
		t.Error("a nil output has lines")
	}
}

func numbers(from, to int) []string {
	var s []string
	for i := from; i < to; i++ {
		s = append(s, strconv.Itoa(i))
	}
	return s
}

func TestStableName(t *testing.T) {
	tests := []struct{ in, want string }{
		{"TestConnect/TCP", "TestConnect/TCP"},
		{"TestX/servicefile='/tmp/TestX1587100474/001/pg_service.conf'_service=test",
			"TestX/servicefile='/tmp/TestXN/NNN/pg_service.conf'_service=test"},
		{"TestX/servicefile='/tmp/TestX99/002/a'", "TestX/servicefile='/tmp/TestXN/NNN/a'"},
		{"TestNumeric/1234/567", "TestNumeric/1234/567"},
	}
	for _, tt := range tests {
		if got := stableName(tt.in); got != tt.want {
			t.Errorf("stableName(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestCompare(t *testing.T) {
	tests := []struct {
		name     string
		direct   *report
		via      *report
		excluded []string
		want     []string // problems as "test:got"
	}{
		{"same", results("TestA", "pass"), results("TestA", "pass"), nil, nil},
		{"fails through the proxy", results("TestA", "pass"), results("TestA", "fail"), nil, []string{"TestA:fail"}},
		{"skips through the proxy", results("TestA", "pass"), results("TestA", "skip"), nil, []string{"TestA:skip"}},
		{"does not run through the proxy", results("TestA", "pass"), results(), nil, []string{"TestA:"}},
		{"fails direct too", results("TestA", "fail"), results("TestA", "fail"), nil, nil},
		{"skips direct", results("TestA", "skip"), results("TestA", "fail"), nil, nil},
		{"excluded", results("TestA", "pass"), results("TestA", "fail"), []string{"TestA"}, nil},
		{"a subtest fails",
			results("TestA", "pass", "TestA/x", "pass", "TestA/y", "pass"),
			results("TestA", "fail", "TestA/x", "pass", "TestA/y", "fail"),
			nil, []string{"TestA/y:fail"}},
		{"an excluded subtest fails",
			results("TestA", "pass", "TestA/x", "pass"),
			results("TestA", "fail", "TestA/x", "fail"),
			[]string{"TestA/x"}, nil},
		{"the parent fails on its own",
			results("TestA", "pass", "TestA/x", "pass"),
			results("TestA", "fail", "TestA/x", "pass"),
			nil, []string{"TestA:fail"}},
		{"a failing test of the same prefix is no subtest",
			results("TestA", "pass", "TestAB", "pass"),
			results("TestA", "fail", "TestAB", "fail"),
			nil, []string{"TestA:fail", "TestAB:fail"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var excl []exclusion
			for _, name := range tt.excluded {
				excl = append(excl, exclusion{ID: testID{pkgA, name}, Reason: "by design"})
			}
			var got []string
			for _, p := range compare(tt.direct, tt.via, excl) {
				got = append(got, p.ID.Test+":"+p.Got)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("problems = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestStaleExclusions(t *testing.T) {
	direct := results("TestNeeded", "pass", "TestFixed", "pass", "TestSkips", "skip")
	via := results("TestNeeded", "fail", "TestFixed", "pass", "TestSkips", "skip")
	var excl []exclusion
	for _, name := range []string{"TestNeeded", "TestFixed", "TestSkips", "TestRenamed"} {
		excl = append(excl, exclusion{ID: testID{pkgA, name}, Reason: "by design"})
	}
	got := staleExclusions(direct, via, excl)
	want := []string{"TestFixed", "TestSkips", "TestRenamed"}
	if len(got) != len(want) {
		t.Fatalf("stale = %q, want entries for %q", got, want)
	}
	for i, name := range want {
		if !strings.Contains(got[i], " "+name+" ") {
			t.Errorf("stale[%d] = %q, want it about %s", i, got[i], name)
		}
	}
}

func TestRerunPattern(t *testing.T) {
	ids := []testID{{pkgA, "TestB/x/y"}, {pkgA, "TestA"}, {pkgA, "TestB/z"}}
	if got, want := rerunPattern(ids), "^(TestA|TestB)$"; got != want {
		t.Errorf("rerunPattern = %q, want %q", got, want)
	}
}

func TestKeywords(t *testing.T) {
	got := keywords("host", "/tmp/a dir", "password", `it's \ here`)
	want := `host='/tmp/a dir' password='it\'s \\ here'`
	if got != want {
		t.Errorf("keywords = %s, want %s", got, want)
	}
}

func TestSubprocessEnv(t *testing.T) {
	t.Setenv("PGHOST", "elsewhere")
	t.Setenv("PGX_TEST_DATABASE", "postgres://elsewhere/db")
	t.Setenv("LEAF_DRIVERSUITE_KEPT", "yes")
	env := subprocessEnv(map[string]string{"PGX_TEST_DATABASE": "postgres://here/db"})
	for _, kv := range env {
		if strings.HasPrefix(kv, "PGHOST=") || kv == "PGX_TEST_DATABASE=postgres://elsewhere/db" {
			t.Errorf("%s was passed on", kv)
		}
	}
	for _, want := range []string{"LEAF_DRIVERSUITE_KEPT=yes", "PGX_TEST_DATABASE=postgres://here/db"} {
		if !slices.Contains(env, want) {
			t.Errorf("%s is missing", want)
		}
	}
}

// TestGoTest runs the harness on a small module of its own: one test passing, one failing
// with output, one skipped.
func TestGoTest(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		testenv.SkipOrFail(t, "no go command: %v", err)
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/tiny\n\ngo 1.21\n",
		"tiny_test.go": `package tiny

import "testing"

func TestPass(t *testing.T) {}
func TestFail(t *testing.T) { t.Fatal("meant to fail") }
func TestSkip(t *testing.T) { t.Skip("meant to skip") }
`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env := append(subprocessEnv(nil), "GOFLAGS=", "GOWORK=off")
	rep, err := goTest(ctx, goBin, dir, env, "./...")
	if err != nil {
		t.Fatal(err)
	}
	want := map[testID]string{
		{"example.com/tiny", "TestPass"}: "pass",
		{"example.com/tiny", "TestFail"}: "fail",
		{"example.com/tiny", "TestSkip"}: "skip",
	}
	if !reflect.DeepEqual(rep.Results, want) {
		t.Errorf("results = %v, want %v", rep.Results, want)
	}
	if rep.Packages["example.com/tiny"] != "fail" {
		t.Errorf("package result = %q, want fail", rep.Packages["example.com/tiny"])
	}
	if out := rep.Output[testID{"example.com/tiny", "TestFail"}].String(); !strings.Contains(out, "meant to fail") {
		t.Errorf("output of TestFail lacks its message:\n%s", out)
	}
}
