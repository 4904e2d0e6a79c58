package driversuite

import (
	"fmt"
	"sort"
	"strings"
)

// exclusion is a test of the suite that cannot pass through a proxy by design.
type exclusion struct {
	ID     testID
	Reason string
}

// problem is a test that passed straight at the database but not through a proxy.
type problem struct {
	ID     testID
	Got    string  // fail, skip, or "" when the test did not run at all
	Output *output // its output through the proxy
}

func (p problem) String() string {
	got := p.Got
	if got == "" {
		got = "did not run"
	}
	return fmt.Sprintf("%s: passes direct, %s through the proxy", p.ID, got)
}

// compare returns the tests that pass in direct but not in via, leaving out the excluded
// ones, sorted by name. A test that failed only because one of its subtests failed is
// not reported itself: the subtest is (or is excluded).
func compare(direct, via *report, excluded []exclusion) []problem {
	skip := make(map[testID]bool, len(excluded))
	for _, e := range excluded {
		skip[e.ID] = true
	}
	var problems []problem
	for id, action := range direct.Results {
		if action != "pass" || skip[id] {
			continue
		}
		got := via.Results[id]
		if got == "pass" || (got == "fail" && hasFailedSubtest(via, id)) {
			continue
		}
		problems = append(problems, problem{ID: id, Got: got, Output: via.Output[id]})
	}
	sort.Slice(problems, func(i, j int) bool { return problems[i].ID.String() < problems[j].ID.String() })
	return problems
}

func hasFailedSubtest(r *report, parent testID) bool {
	prefix := parent.Test + "/"
	for id, action := range r.Results {
		if action == "fail" && id.Package == parent.Package && strings.HasPrefix(id.Test, prefix) {
			return true
		}
	}
	return false
}

// staleExclusions returns why entries of the exclusion list no longer hold: an excluded
// test must pass direct (else it proves nothing here) and must not pass through the proxy
// (else the exclusion hides nothing and should go).
func staleExclusions(direct, via *report, excluded []exclusion) []string {
	var stale []string
	for _, e := range excluded {
		switch d, v := direct.Results[e.ID], via.Results[e.ID]; {
		case d != "pass":
			stale = append(stale, fmt.Sprintf("excluded %s does not pass direct (%q): fix the test setup or drop the entry", e.ID, d))
		case v == "pass":
			stale = append(stale, fmt.Sprintf("excluded %s passes through the proxy: drop the entry", e.ID))
		}
	}
	return stale
}

// rerunPattern returns a `go test -run` pattern selecting the top-level tests of ids.
func rerunPattern(ids []testID) string {
	seen := make(map[string]bool)
	var names []string
	for _, id := range ids {
		top, _, _ := strings.Cut(id.Test, "/")
		if !seen[top] {
			seen[top] = true
			names = append(names, top)
		}
	}
	sort.Strings(names)
	return "^(" + strings.Join(names, "|") + ")$"
}
