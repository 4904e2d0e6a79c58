// Package httpapi is the admin HTTP server of leafproxy: Leaf-compatible ID endpoints,
// Leaf's /cache and /decodeSnowflakeId monitors, a status page, Prometheus metrics, and
// health and readiness probes.
//
// Every endpoint except /healthz requires the bearer token when one is configured, so
// that an admin port reachable by others hands out neither IDs nor internals.
package httpapi

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/segment"
	"github.com/leafproxy/leafproxy/internal/metrics"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// Options are what the server shows and serves. Nil fields turn their endpoints into a
// 503 (or, for the status page, leave the section out).
type Options struct {
	// Segment serves /api/segment/get/{tag}.
	Segment idgen.Generator
	// Snowflake serves /api/snowflake/get/{tag}; as in Leaf the tag is ignored.
	Snowflake idgen.Generator
	// MaxBatch is the largest count of /api/{segment,snowflake}/get/{tag}?count=n; zero
	// refuses every count.
	MaxBatch int
	// Decode splits a snowflake ID for /decodeSnowflakeId.
	Decode func(id int64) Decoded
	// Cache returns the segment engine's buffers for /cache and the status page.
	Cache func() []segment.TagSnapshot
	// Status returns what the status page shows besides the segment tags.
	Status func() Status
	// History returns the totals sampled over the last hour, oldest first, the last one
	// being now's, for the status page's graphs and error counts.
	History func() []metrics.HistorySample
	// IsSnowflakeTag reports whether a tag is served by the snowflake engine, so that the
	// segment endpoint can point at the snowflake one.
	IsSnowflakeTag func(tag string) bool
	// Rates returns IDs per second per engine and tag, Totals the IDs issued so far.
	Rates  func() map[metrics.Key]float64
	Totals func() map[metrics.Key]uint64
	// Ready returns nil when the engines can issue IDs, else the reason they cannot.
	Ready func(ctx context.Context) error
	// Pools returns the figures of the proxy's pools of server connections, of both
	// modes, for /pools and the status page.
	Pools func() []pool.Stats
	// Metrics serves /metrics.
	Metrics http.Handler
	// Token, when not empty, is required as "Authorization: Bearer <token>".
	Token string
	// Logger receives request failures; default logrus.StandardLogger().
	Logger logrus.FieldLogger
	// Extra adds handlers by ServeMux pattern ("POST /debug/clock"), behind the token like
	// every other endpoint; test builds use it.
	Extra map[string]http.Handler
}

// Decoded is a snowflake ID split into its parts. WorkerID and SequenceID repeat worker and
// sequence as strings under the names Leaf's decoder uses.
type Decoded struct {
	ID         int64     `json:"id,string"`
	Timestamp  int64     `json:"timestamp"` // Unix milliseconds
	Time       time.Time `json:"time"`
	Worker     int64     `json:"worker"`
	Sequence   int64     `json:"sequence"`
	WorkerID   string    `json:"workerId"`
	SequenceID string    `json:"sequenceId"`
	// Warning says why the value cannot be a snowflake ID of this layout (its time is
	// before the epoch plus a day, or in the future); empty when it can be one.
	Warning string `json:"warning,omitempty"`
}

type server struct {
	Options
	mux   *http.ServeMux
	rates poolRates // the pools' rates on the status page
}

// New returns the admin handler.
func New(o Options) http.Handler {
	if o.Logger == nil {
		o.Logger = logrus.StandardLogger()
	}
	s := &server{Options: o, mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /api/segment/get/{tag}", s.segmentID)
	s.mux.HandleFunc("GET /api/snowflake/get/{tag}", s.snowflakeID)
	s.mux.HandleFunc("GET /decodeSnowflakeId", s.decode)
	s.mux.HandleFunc("GET /cache", s.cache)
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.HandleFunc("GET /pools", s.pools)
	s.mux.HandleFunc("GET /{$}", s.statusPage)
	for pattern, h := range o.Extra {
		s.mux.Handle(pattern, h)
	}
	if o.Metrics != nil {
		s.mux.Handle("GET /metrics", o.Metrics)
	} else {
		s.mux.HandleFunc("GET /metrics", unavailable("metrics are not configured"))
	}
	return s
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.Token != "" && r.URL.Path != "/healthz" && !s.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="leafproxy"`)
		http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
		return
	}
	s.mux.ServeHTTP(w, r)
}

func (s *server) authorized(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	// ConstantTimeCompare leaks only the length, which a token's length does not help guess.
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(s.Token)) == 1
}

func unavailable(msg string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, msg, http.StatusServiceUnavailable)
	}
}

// idStatus maps an engine error to the HTTP status Leaf users expect: 404 for an unknown
// tag, 400 for a malformed request, 500 for everything else (Leaf answers 500 on failure).
func idStatus(err error) int {
	switch {
	case errors.Is(err, idgen.ErrUnknownTag):
		return http.StatusNotFound
	case errors.Is(err, idgen.ErrBadArgument):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

func (s *server) writeID(w http.ResponseWriter, r *http.Request, g idgen.Generator, engine, tag string) {
	if g == nil {
		http.Error(w, engine+" engine is not running", http.StatusServiceUnavailable)
		return
	}
	if r.URL.Query().Has("count") {
		s.writeIDs(w, r, g, engine, tag)
		return
	}
	id, err := g.Next(r.Context(), tag)
	if err != nil {
		code := idStatus(err)
		if code == http.StatusInternalServerError {
			s.Logger.WithFields(logrus.Fields{"engine": engine, "tag": tag, "error": err}).Warn("ID request failed")
		}
		http.Error(w, idMessage(err, engine, tag), code)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(strconv.AppendInt(nil, id, 10))
}

// idMessage words an engine error for the HTTP client, with what to do.
func idMessage(err error, engine, tag string) string {
	switch {
	case errors.Is(err, idgen.ErrUnknownTag):
		return fmt.Sprintf("unknown segment tag %q: create it with \"leafproxy tag add %s --step 1000\" (proxies see new tags within 60 s)", tag, tag)
	case errors.Is(err, idgen.ErrBadArgument):
		return "bad request: " + EngineAccount(err)
	}
	why := "the ID source is unavailable"
	switch {
	case errors.Is(err, idgen.ErrClockBackwards):
		why = "the clock moved backwards"
	case errors.Is(err, idgen.ErrWorkerNotHeld):
		why = "this proxy does not hold its worker ID"
	}
	return fmt.Sprintf("cannot issue a %s ID now, %s: %s (see /readyz)", engine, why, EngineAccount(err))
}

// EngineAccount is an engine error's own account, without the texts of the idgen
// sentinels (the caller words those) and without Go package prefixes: "tag \"x\": both
// segments used up and the last load failed: …".
func EngineAccount(err error) string {
	s := err.Error()
	for _, sentinel := range []error{idgen.ErrUnknownTag, idgen.ErrUnavailable, idgen.ErrClockBackwards,
		idgen.ErrWorkerNotHeld, idgen.ErrBadArgument} {
		s = strings.ReplaceAll(s, ": "+sentinel.Error(), "")
		s = strings.ReplaceAll(s, sentinel.Error()+": ", "")
		s = strings.ReplaceAll(s, sentinel.Error(), "")
	}
	for _, prefix := range []string{"idgen: ", "segment: ", "snowflake: "} {
		s = strings.ReplaceAll(s, prefix, "")
	}
	return strings.Trim(s, " :")
}

// writeIDs answers ?count=n, beyond Leaf: n IDs, one per line, or a JSON array of numbers
// when the client accepts application/json.
func (s *server) writeIDs(w http.ResponseWriter, r *http.Request, g idgen.Generator, engine, tag string) {
	raw := r.URL.Query().Get("count")
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 || n > s.MaxBatch {
		http.Error(w, "count must be an integer between 1 and "+strconv.Itoa(s.MaxBatch)+", got "+strconv.Quote(raw), http.StatusBadRequest)
		return
	}
	ids, err := idgen.NextBatch(r.Context(), g, tag, n, make([]int64, 0, n))
	if err != nil {
		code := idStatus(err)
		if code == http.StatusInternalServerError {
			s.Logger.WithFields(logrus.Fields{"engine": engine, "tag": tag, "count": n, "error": err}).Warn("ID batch request failed")
		}
		http.Error(w, idMessage(err, engine, tag), code)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	if acceptsJSON(r) {
		writeJSON(w, ids)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	out := make([]byte, 0, 20*len(ids))
	for _, id := range ids {
		out = strconv.AppendInt(out, id, 10)
		out = append(out, '\n')
	}
	_, _ = w.Write(out)
}

// acceptsJSON reports whether the Accept header names application/json.
func acceptsJSON(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, _, _ := strings.Cut(part, ";")
		if strings.EqualFold(strings.TrimSpace(mt), "application/json") {
			return true
		}
	}
	return false
}

func (s *server) segmentID(w http.ResponseWriter, r *http.Request) {
	tag := r.PathValue("tag")
	if s.IsSnowflakeTag != nil && s.IsSnowflakeTag(tag) {
		http.Error(w, fmt.Sprintf("%q is a snowflake tag: ask /api/snowflake/get/%s", tag, url.PathEscape(tag)), http.StatusNotFound)
		return
	}
	s.writeID(w, r, s.Segment, "segment", tag)
}

func (s *server) snowflakeID(w http.ResponseWriter, r *http.Request) {
	// Leaf ignores the key here; so do we, and the metrics do not get a label per key.
	s.writeID(w, r, s.Snowflake, "snowflake", "")
}

func (s *server) decode(w http.ResponseWriter, r *http.Request) {
	if s.Decode == nil {
		http.Error(w, "snowflake decoding is not configured", http.StatusServiceUnavailable)
		return
	}
	raw := r.URL.Query().Get("snowflakeId")
	id, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 64)
	if err != nil || id < 0 {
		http.Error(w, "snowflakeId must be a non-negative 64-bit integer, got "+strconv.Quote(raw), http.StatusBadRequest)
		return
	}
	writeJSON(w, s.Decode(id))
}

func (s *server) cache(w http.ResponseWriter, r *http.Request) {
	if s.Cache == nil {
		http.Error(w, "segment engine is not running", http.StatusServiceUnavailable)
		return
	}
	writeJSON(w, cacheView(s.Cache()))
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if s.Ready == nil {
		http.Error(w, "no readiness check configured", http.StatusServiceUnavailable)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.Ready(ctx); err != nil {
		http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
