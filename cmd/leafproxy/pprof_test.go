package main

import (
	"net/http"
	"strings"
	"testing"
)

// TestHTTPPprof checks that the profiler is served only with http-pprof, and behind the
// admin token.
func TestHTTPPprof(t *testing.T) {
	t.Parallel()
	dsn := newStore(t)
	off := startServe(t, nil, serveArgs(t, dsn, 81)...)
	waitReady(off)
	if code, _ := off.get("/debug/pprof/", ""); code != http.StatusNotFound {
		t.Errorf("without http-pprof: GET /debug/pprof/ = %d, want 404", code)
	}
	on := startServe(t, nil, serveArgs(t, dsn, 82, "--http-pprof", "--http-token", "secret")...)
	on.waitFor("/readyz to answer 200", func() bool {
		code, _ := on.get("/readyz", "secret")
		return code == http.StatusOK
	})
	if code, _ := on.get("/debug/pprof/", ""); code != http.StatusUnauthorized {
		t.Errorf("with http-pprof, no token: GET /debug/pprof/ = %d, want 401", code)
	}
	code, body := on.get("/debug/pprof/", "secret")
	if code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("with http-pprof and the token: GET /debug/pprof/ = %d %.200q", code, body)
	}
}
