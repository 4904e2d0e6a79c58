package main

import (
	"context"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// chromium returns the path of a Chromium binary, skipping the test when there is none
// (failing under CI, where `make test` installs it).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.SkipOrFail(t, "no chromium on PATH for the status-page browser test")
	return ""
}

// artifactDir is where the screenshot goes: $LEAF_TEST_ARTIFACTS when set, so CI can
// keep it, else the test's temporary directory.
func artifactDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("LEAF_TEST_ARTIFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

func runChromium(t *testing.T, bin string, args ...string) string {
	t.Helper()
	// Generous: on a machine loaded by parallel tests one Chromium run has taken minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--user-data-dir=" + t.TempDir()}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, errOut.String())
	}
	return out.String()
}

// pageIDs are the id attributes of a rendered DOM, in order: the page's structure.
func pageIDs(dom string) []string {
	var ids []string
	for _, m := range regexp.MustCompile(`\sid="([^"]+)"`).FindAllStringSubmatch(dom, -1) {
		ids = append(ids, m[1])
	}
	return ids
}

// screenshot renders url at 1280x1400 into name under the artifact directory and checks
// that the file is a PNG of that size.
func screenshot(t *testing.T, bin, url, name string) string {
	t.Helper()
	shot := filepath.Join(artifactDir(t), name)
	os.Remove(shot)
	runChromium(t, bin, "--screenshot="+shot, "--window-size=1280,1400", "--hide-scrollbars", url)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1280 || b.Dy() != 1400 {
		t.Errorf("screenshot is %v, want 1280x1400", b)
	}
	t.Logf("status page screenshot: %s", shot)
	return shot
}

// TestStatusPageInBrowser renders the status page in headless Chromium twice: healthy,
// then with the upstream database stopped. The DOM Chromium builds is compared by
// structure: the same sections in both states, the state of each dependency, the reason
// the proxy is not ready, the refusal counted by SQLSTATE, the graphs; screenshots of both
// are kept as artifacts.
func TestStatusPageInBrowser(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	dsn := newStore(t)
	up := testenv.NewPostgres(t)
	upAddr := fmt.Sprintf("127.0.0.1:%d", up.Port)
	s := startServe(t, nil, withUpstream(serveArgs(t, dsn, 421), upAddr)...)
	waitReady(s)
	for i := 0; i < 30; i++ {
		s.get("/api/segment/get/audit", "")
	}
	s.get("/api/segment/get/invoice", "")

	healthy := runChromium(t, bin, "--dump-dom", s.http+"/")
	for _, want := range []string{
		"<title>leafproxy status</title>",
		"<td>audit</td><td>segment</td>",
		"<td>invoice</td><td>segment</td>",
		"<td>order</td><td>snowflake</td>",
		"<td>pay</td><td>snowflake</td>",
		`id="worker-id">421<`,
		`id="worker-source">static<`,
		`id="ready">ready<`,
		"orders.id=order",
		"<td>upstream</td><td>" + upAddr + `</td>`,
		`<span class="state ok">reachable</span>`,
		`id="clients-open">`,
		"no errors or refusals since start",
		`<svg id="graph-ids"`, `<svg id="graph-loads"`, `<svg id="graph-errors"`,
		"5001–5010", // invoice's first segment
		`id="freshness">Generated at`,
	} {
		if !strings.Contains(healthy, want) {
			t.Errorf("healthy DOM lacks %q", want)
		}
	}
	if strings.Contains(healthy, `id="not-ready"`) {
		t.Error("healthy DOM lists reasons for not being ready")
	}
	screenshot(t, bin, s.http+"/", "status-page-healthy.png")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := up.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	s.waitFor("/readyz to fail", func() bool { code, _ := s.get("/readyz", ""); return code == 503 })
	if _, err := connectThrough(ctx, t, s, ""); err == nil {
		t.Fatal("a client got through to a stopped upstream")
	}
	down := runChromium(t, bin, "--dump-dom", s.http+"/")
	for _, want := range []string{
		`id="ready">not ready<`,
		`<ul class="reasons" id="not-ready"><li>upstream ` + upAddr + " unreachable since ",
		`<tr id="health-upstream">`,
		`<span class="state bad">unreachable</span>`,
		"dial tcp " + upAddr + ": connect: connection refused",
		`<td><code>08001</code></td><td>upstream unreachable</td><td>client refused</td><td class="num">1</td>`,
	} {
		if !strings.Contains(down, want) {
			t.Errorf("upstream-down DOM lacks %q", want)
		}
	}
	// The same page, one list more: the reasons.
	healthyIDs, downIDs := pageIDs(healthy), pageIDs(down)
	var withoutReasons []string
	for _, id := range downIDs {
		if id != "not-ready" {
			withoutReasons = append(withoutReasons, id)
		}
	}
	if strings.Join(healthyIDs, " ") != strings.Join(withoutReasons, " ") || len(downIDs) != len(healthyIDs)+1 {
		t.Errorf("page structure differs between the states:\nhealthy: %v\ndown:    %v", healthyIDs, downIDs)
	}
	if t.Failed() {
		t.Logf("healthy DOM:\n%s\nupstream-down DOM:\n%s", healthy, down)
	}
	screenshot(t, bin, s.http+"/", "status-page-upstream-down.png")
}
