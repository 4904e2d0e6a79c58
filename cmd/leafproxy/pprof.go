package main

import (
	"net/http"
	"net/http/pprof"
)

// withPprof adds Go's profiler endpoints (/debug/pprof/...) to the admin server's extra
// handlers, which sit behind the admin token like every other endpoint.
func withPprof(extra map[string]http.Handler) map[string]http.Handler {
	if extra == nil {
		extra = map[string]http.Handler{}
	}
	extra["GET /debug/pprof/"] = http.HandlerFunc(pprof.Index)
	extra["GET /debug/pprof/cmdline"] = http.HandlerFunc(pprof.Cmdline)
	extra["GET /debug/pprof/profile"] = http.HandlerFunc(pprof.Profile)
	extra["GET /debug/pprof/symbol"] = http.HandlerFunc(pprof.Symbol)
	extra["GET /debug/pprof/trace"] = http.HandlerFunc(pprof.Trace)
	return extra
}
