package main

import (
	"context"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
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
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
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

// TestStatusPageInBrowser renders the status page in headless Chromium: the DOM it builds
// shows the tags and the worker ID, and a screenshot is kept as an artifact.
func TestStatusPageInBrowser(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	dsn := newStore(t)
	s := startServe(t, nil, serveArgs(t, dsn, 421)...)
	waitReady(s)
	for i := 0; i < 30; i++ {
		s.get("/api/segment/get/audit", "")
	}
	s.get("/api/segment/get/invoice", "")

	dom := runChromium(t, bin, "--dump-dom", s.http+"/")
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
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("rendered DOM lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}

	shot := filepath.Join(artifactDir(t), "status-page.png")
	os.Remove(shot)
	runChromium(t, bin, "--screenshot="+shot, "--window-size=1280,900", "--hide-scrollbars", s.http+"/")
	f, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1280 || b.Dy() != 900 {
		t.Errorf("screenshot is %v, want 1280x900", b)
	}
	t.Logf("status page screenshot: %s", shot)
}
