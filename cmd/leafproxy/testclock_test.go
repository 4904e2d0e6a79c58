package main

import (
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestClockHook builds the test-only binary (-tags leafproxy_testclock) and moves its
// clock back. With clock-max-backwards 1s (wide enough that the HTTP round trips between
// two requests cannot hide the step) a 600 ms step is waited out and a 3 s step
// fails with the clock error; both are counted, and issue resumes once the offset is
// gone. The release binary has no such endpoint.
func TestClockHook(t *testing.T) {
	t.Parallel()
	clockBin := testClockBinary(t)
	dsn := newStore(t)
	s := startServeBinary(t, clockBin, nil, serveArgs(t, dsn, 8, "--http-token", "tk", "--clock-max-backwards", "1s")...)
	s.waitFor("ready", func() bool { code, _ := s.get("/readyz", "tk"); return code == 200 })
	setOffset := func(offset string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, s.http+"/debug/clock?offset="+offset, nil)
		req.Header.Set("Authorization", "Bearer tk")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("set offset %s: %v %v", offset, resp, err)
		}
		resp.Body.Close()
	}
	snow := func() (int, string) { return s.get("/api/snowflake/get/x", "tk") }
	if code, body := snow(); code != 200 {
		t.Fatalf("snowflake before: %d %s", code, body)
	}
	setOffset("-600ms")
	if code, body := snow(); code != 200 {
		t.Errorf("after a 600 ms step back (waited out): %d %s", code, body)
	}
	setOffset("-3s")
	if code, body := snow(); code != 500 || !strings.Contains(body, "clock moved backwards") {
		t.Errorf("after a further step back: %d %q, want 500 clock moved backwards", code, body)
	}
	_, m := s.get("/metrics", "tk")
	if v := metricValue(t, m, `leafproxy_snowflake_clock_backwards_total{outcome="refused"}`); v < 1 {
		t.Errorf("refused clock steps counted %v", v)
	}
	if v := metricValue(t, m, `leafproxy_snowflake_clock_backwards_total{outcome="waited"}`); v < 1 {
		t.Errorf("waited-out clock steps counted %v", v)
	}
	setOffset("0s")
	s.waitFor("issue to resume", func() bool { code, _ := snow(); return code == 200 })

	// The release binary has no clock endpoint.
	r := startServe(t, nil, serveArgs(t, dsn, 9)...)
	req, _ := http.NewRequest(http.MethodPost, r.http+"/debug/clock?offset=-1s", nil)
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("release binary: POST /debug/clock = %d, want 404", resp.StatusCode)
	}
}

var testClock struct {
	once sync.Once
	path string
	err  error
}

// testClockBinary builds the test-only binary (-tags leafproxy_testclock) once for the
// tests that need it; a cgo link is too slow to repeat.
func testClockBinary(t *testing.T) string {
	t.Helper()
	testClock.once.Do(func() {
		// Next to the release binary, so TestMain removes both.
		testClock.path = filepath.Join(filepath.Dir(binPath), "leafproxy-testclock")
		out, err := exec.Command("go", "build", "-tags", "leafproxy_testclock", "-o", testClock.path, ".").CombinedOutput()
		if err != nil {
			testClock.err = fmt.Errorf("build with -tags leafproxy_testclock: %w\n%s", err, out)
		}
	})
	if testClock.err != nil {
		t.Fatal(testClock.err)
	}
	return testClock.path
}
