package httpapi

import (
	"bytes"
	"context"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/leafproxy/leafproxy/internal/health"
	"github.com/leafproxy/leafproxy/internal/metrics"
	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// The status page is one server-rendered HTML document that an operator keeps open: it
// reloads itself every refreshSeconds with a meta refresh, draws its graphs as inline SVG,
// runs no script and fetches nothing, so it works as plain HTML, in a text browser, and
// behind a proxy that strips JavaScript.
const refreshSeconds = 5

// Status is the non-segment part of the status page.
type Status struct {
	Version       string
	StartedAt     time.Time
	Listen        string
	Upstream      string
	SnowflakeTags []string
	FillRules     []string
	Snowflake     *SnowflakeStatus // nil when the snowflake engine is not running
	// Health is the last known state of the upstream database and the store.
	Health []health.State
	// ClientsOpen are the client connections open now, ClientsTotal those accepted.
	ClientsOpen, ClientsTotal int64
	// Conflicts are tags named both in snowflake-tags and in leaf_alloc: the proxy serves
	// them from the snowflake engine only.
	Conflicts []string
	// Lease is what is known of the snowflake worker ID's lease; nil when not known.
	Lease *LeaseStatus
	// Runway is how long the tags, the snowflake time bits and the worker IDs last; nil
	// when it is not measured.
	Runway *metrics.RunwaySnapshot
}

// SnowflakeStatus describes the snowflake engine and its worker ID.
type SnowflakeStatus struct {
	Source    string // static, postgres, zookeeper
	WorkerID  int64  // -1 while none is held
	Held      bool
	Layout    string
	Epoch     time.Time
	HighWater time.Time // the last millisecond used in an ID (the durable high-water mark)
}

// LeaseStatus is the worker ID's lease as the store or the ZooKeeper session shows it.
type LeaseStatus struct {
	// Holder, ExpiresAt and Renewed are the lease row of the postgres source (zero when
	// unknown); ReadError says why the row could not be read.
	Holder    string
	ExpiresAt time.Time
	Renewed   time.Time
	ReadError string
	// Session is the ZooKeeper session as its events tell it ("connected", …); empty for
	// other sources.
	Session string
	// Events are the lease events seen since start, by name.
	Events []LeaseEvent
}

// LeaseEvent counts one kind of lease event (acquired, fenced, reconnect, …).
type LeaseEvent struct {
	Name  string
	Count uint64
	Last  time.Time
}

// sqlStateNames are the SQLSTATEs the proxy answers itself, for the errors table.
var sqlStateNames = map[string]string{
	sqlstate.UndefinedObject:              "unknown tag",
	sqlstate.InvalidParameterValue:        "bad argument",
	sqlstate.FeatureNotSupported:          "unsupported here",
	sqlstate.ObjectNotInPrerequisiteState: "clock backwards / worker ID not held",
	sqlstate.SystemError:                  "ID source unavailable",
	sqlstate.BadCopyFileFormat:            "bad COPY data",
	sqlstate.ProgramLimitExceeded:         "message too large",
	sqlstate.StatementTooComplex:          "statement too complex",
	sqlstate.ConnectionUnable:             "upstream unreachable",
	sqlstate.TooManyConnections:           "too many clients",
	sqlstate.CannotConnectNow:             "shutting down",
}

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{"lasts": lasts}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="{{.Refresh}}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>leafproxy status</title>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5rem 2rem; color: #1d2733; background: #f6f8fa; }
h1 { font-size: 1.5rem; margin: 0 0 .25rem; }
h2 { font-size: 1.1rem; margin: 1.5rem 0 .5rem; }
.sub { color: #5b6775; margin-bottom: .75rem; }
.ready, .state { display: inline-block; padding: .1rem .6rem; border-radius: 1rem; font-weight: 600; }
.ok { background: #d7f5df; color: #11632b; } .bad { background: #fde1e1; color: #8d1a1a; } .warn { background: #fff1c9; color: #6b4e00; }
ul.reasons { margin: .4rem 0 0; color: #8d1a1a; }
table { border-collapse: collapse; background: #fff; box-shadow: 0 1px 2px rgba(0,0,0,.08); min-width: 40rem; }
th, td { padding: .35rem .7rem; border-bottom: 1px solid #e3e7ec; text-align: left; white-space: nowrap; }
th { background: #eef1f5; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.err { white-space: normal; max-width: 32rem; color: #8d1a1a; font-family: ui-monospace, monospace; font-size: 12px; }
.bar { width: 7rem; height: .7rem; background: #e3e7ec; border-radius: .35rem; overflow: hidden; display: inline-block; vertical-align: middle; }
.bar span { display: block; height: 100%; background: #3a7bd5; }
.bar.next span { background: #7fb069; }
dl { display: grid; grid-template-columns: max-content auto; gap: .3rem 1.25rem; background: #fff; padding: .8rem 1rem; box-shadow: 0 1px 2px rgba(0,0,0,.08); max-width: 52rem; margin: 0; }
dt { color: #5b6775; } dd { margin: 0; font-family: ui-monospace, monospace; }
.muted { color: #8a96a3; }
.graphs { display: flex; flex-wrap: wrap; gap: 1rem; }
figure { margin: 0; background: #fff; padding: .5rem .75rem; box-shadow: 0 1px 2px rgba(0,0,0,.08); }
figcaption { color: #5b6775; font-size: 12px; }
svg text { font: 10px system-ui, sans-serif; fill: #5b6775; }
</style>
</head>
<body>
<h1>leafproxy</h1>
<div class="sub">{{.Status.Version}} · up since {{.Status.StartedAt.Format "2006-01-02 15:04:05 MST"}} · proxy {{.Status.Listen}} → {{.Status.Upstream}}</div>
<div class="sub" id="freshness">Generated at <time datetime="{{.Now.Format "2006-01-02T15:04:05Z07:00"}}">{{.Now.Format "2006-01-02 15:04:05 MST"}}</time>; this page reloads every {{.Refresh}} s, health is checked in the background every few seconds.</div>
{{if .Reasons}}<div><span class="ready bad" id="ready">not ready</span>
<ul class="reasons" id="not-ready">{{range .Reasons}}<li>{{.}}</li>{{end}}</ul></div>{{else}}<span class="ready ok" id="ready">ready</span>{{end}}
{{range .Status.Conflicts}}<p class="state warn conflict">tag {{.}} is both a snowflake tag and a leaf_alloc row: served by snowflake only; remove the row or the snowflake-tags entry</p>{{end}}

<h2>Dependencies</h2>
<table id="health">
<tr><th>what</th><th>address</th><th>state</th><th>since</th><th>last check</th><th>last error</th></tr>
{{range .Status.Health}}<tr id="health-{{.Name}}">
<td>{{.Name}}</td><td>{{.Target}}</td>
<td>{{if not .Checked}}<span class="state warn">not checked yet</span>{{else if .OK}}<span class="state ok">reachable</span>{{else}}<span class="state bad">unreachable</span>{{end}}</td>
<td>{{if .Checked}}{{.Since.Format "15:04:05"}}{{end}}</td>
<td>{{if .Checked}}{{.LastCheck.Format "15:04:05"}}{{end}}</td>
<td class="err">{{if .LastError}}{{.LastErrorAt.Format "15:04:05"}}: {{.LastError}}{{else}}<span class="muted">none</span>{{end}}</td>
</tr>{{else}}<tr><td colspan="6" class="muted">not checked</td></tr>{{end}}
</table>

<h2>Clients and errors</h2>
<dl id="clients">
<dt>client connections</dt><dd id="clients-open">{{.Status.ClientsOpen}} open, {{.Status.ClientsTotal}} accepted since start</dd>
</dl>
<p></p>
<table id="errors">
<tr><th>SQLSTATE</th><th>meaning</th><th>kind</th><th>last 5 min</th><th>last hour</th><th>since start</th></tr>
{{range .Errors}}<tr><td><code>{{.Code}}</code></td><td>{{.Meaning}}</td><td>{{.Kind}}</td><td class="num">{{.Last5m}}</td><td class="num">{{.LastHour}}</td><td class="num">{{.Total}}</td></tr>
{{else}}<tr><td colspan="6" class="muted">no errors or refusals since start</td></tr>{{end}}
</table>

<h2>Last hour</h2>
<div class="graphs" id="history">
{{range .Graphs}}<figure>{{.SVG}}<figcaption>{{.Caption}}</figcaption></figure>
{{end}}</div>

<h2>Tags</h2>
<table id="tags">
<tr><th>tag</th><th>engine</th><th>step</th><th>current buffer</th><th>next buffer</th><th>current range</th><th>last load</th><th>last error</th><th>IDs issued</th><th>IDs/s</th></tr>
{{range .Rows}}<tr>
<td>{{.Tag}}</td><td>{{.Engine}}</td>
{{if .Segment}}<td class="num">{{.Step}}</td>
<td>{{if .Initialized}}<span class="bar"><span style="width: {{.CurPct}}%"></span></span> {{.CurIdle}} left{{else}}<span class="muted">not loaded yet</span>{{end}}</td>
<td>{{if .NextReady}}<span class="bar next"><span style="width: {{.NextPct}}%"></span></span> {{.NextIdle}} ready{{else if .Loading}}loading…{{else}}<span class="muted">—</span>{{end}}</td>
<td>{{if .Initialized}}{{.RangeStart}}–{{.RangeMax}}{{else}}<span class="muted">—</span>{{end}}</td>
<td>{{if .LastLoad.IsZero}}<span class="muted">never</span>{{else}}{{.LastLoad.Format "15:04:05"}}{{end}}</td>
<td class="err">{{if .LastError}}{{.LastError}}{{else}}<span class="muted">none</span>{{end}}</td>
{{else}}<td class="muted">—</td><td class="muted">—</td><td class="muted">—</td><td class="muted">—</td><td class="muted">—</td>
<td>{{if .Conflict}}<span class="state warn">also a leaf_alloc row: ignored</span>{{else}}<span class="muted">—</span>{{end}}</td>{{end}}
<td class="num">{{.Issued}}</td><td class="num">{{printf "%.1f" .Rate}}</td>
</tr>{{else}}<tr><td colspan="10" class="muted">no tags yet: add one with <code>leafproxy tag add NAME --step N</code></td></tr>{{end}}
</table>

<h2>Snowflake</h2>
{{with .Status.Snowflake}}<dl id="snowflake">
<dt>worker ID</dt><dd id="worker-id">{{if ge .WorkerID 0}}{{.WorkerID}}{{else}}none{{end}}{{if not .Held}} (not held: not issuing){{end}}</dd>
<dt>worker source</dt><dd id="worker-source">{{.Source}}</dd>
<dt>clock high-water</dt><dd>{{if .HighWater.IsZero}}none yet{{else}}{{.HighWater.Format "2006-01-02 15:04:05.000 MST"}}{{end}}</dd>
<dt>layout</dt><dd>{{.Layout}}</dd>
<dt>epoch</dt><dd>{{.Epoch.Format "2006-01-02 15:04:05.000 MST"}}</dd>
{{with $.Status.Lease}}{{if .Holder}}<dt>lease holder</dt><dd id="lease-holder">{{.Holder}}</dd>{{end}}
{{if not .ExpiresAt.IsZero}}<dt>lease expires</dt><dd id="lease-expires">{{.ExpiresAt.Format "2006-01-02 15:04:05 MST"}}</dd>{{end}}
{{if not .Renewed.IsZero}}<dt>last renewal</dt><dd id="lease-renewed">{{.Renewed.Format "2006-01-02 15:04:05 MST"}}</dd>{{end}}
{{if .ReadError}}<dt>lease row</dt><dd id="lease-error">not read: {{.ReadError}}</dd>{{end}}
{{if .Session}}<dt>ZooKeeper session</dt><dd id="zk-session">{{.Session}}</dd>{{end}}
<dt>lease events</dt><dd id="lease-events">{{range $i, $e := .Events}}{{if $i}}; {{end}}{{$e.Name}} {{$e.Count}}{{if not $e.Last.IsZero}} (last {{$e.Last.Format "15:04:05"}}){{end}}{{else}}none{{end}}</dd>{{end}}
</dl>{{else}}<p class="muted">The snowflake engine is not running.</p>{{end}}

<h2>Runway</h2>
{{with .Status.Runway}}<table id="runway">
<tr><th>what</th><th>key type</th><th>used up to</th><th>left</th><th>rate</th><th>lasts</th></tr>
{{range .Tags}}<tr class="runway-tag"><td>segment tag {{.Tag}}</td><td>{{.KeyType}}</td><td class="num">{{.MaxID}}</td><td class="num">{{.Left}}</td><td class="num">{{printf "%.1f" .Rate}}/s</td><td>{{lasts .SecondsLeft}}</td></tr>
{{end}}{{with .Snowflake}}<tr id="runway-snowflake"><td>snowflake time bits</td><td>—</td><td>—</td><td>until {{.End.Format "2006-01-02"}}</td><td>—</td><td>{{lasts .SecondsLeft}}</td></tr>
{{end}}{{with .Workers}}<tr id="runway-workers"><td>worker IDs (lease table)</td><td>—</td><td class="num">{{.Capacity}} in all</td><td class="num">{{.Free}} free</td><td>—</td><td>—</td></tr>
{{end}}</table>
<p class="muted">{{if .Read}}Read from the store at {{.ReadAt.Format "15:04:05"}}{{else}}Not read from the store yet{{end}}{{if .LastError}}; last error: {{.LastError}}{{end}}. Rates are the advance of max_id by all proxies together.</p>
{{else}}<p class="muted">not measured</p>{{end}}

{{if .PoolsOn}}<h2>Pools</h2>
{{if .Pools}}<table id="pools">
<tr><th>database</th><th>user</th><th>mode</th><th>clients active</th><th>waiting</th><th>longest wait</th><th>servers active</th><th>idle</th><th>used</th><th>login</th><th>pool size</th><th>transactions/s</th><th>queries/s</th><th>wait time</th><th>wait timeouts</th></tr>
{{range .Pools}}<tr class="pool"><td>{{.Database}}</td><td>{{.User}}</td><td>{{.Mode}}</td><td class="num">{{.ClientsActive}}</td><td class="num">{{.ClientsWaiting}}</td><td class="num">{{.MaxWait.Round 1000000}}</td><td class="num">{{.ServersActive}}</td><td class="num">{{.ServersIdle}}</td><td class="num">{{.ServersUsed}}</td><td class="num">{{.ServersLogin}}</td><td class="num">{{.PoolSize}}</td>{{if eq .Mode "session"}}<td class="num">—</td><td class="num">—</td>{{else if .Rated}}<td class="num">{{printf "%.1f" .TxPerSecond}}</td><td class="num">{{printf "%.1f" .QPerSecond}}</td>{{else}}<td class="num muted">next look</td><td class="num muted">next look</td>{{end}}<td class="num">{{.WaitTime.Round 1000000}}</td><td class="num">{{.WaitTimeouts}}</td></tr>
{{end}}</table>
<p class="muted">One row per (database, user) and pool mode, as on <a href="pools">/pools</a>. Session mode counts the sessions the proxy authenticated; its sessions are not counted by transaction. Rates are over the time since this page was last made.</p>
{{else}}<p class="muted">none yet</p>{{end}}
{{end}}
<h2>Fill rules</h2>
{{if .Status.FillRules}}<ul>{{range .Status.FillRules}}<li><code>{{.}}</code></li>{{end}}</ul>{{else}}<p class="muted">none</p>{{end}}

<p class="muted">Machine-readable: <a href="cache">/cache</a> · <a href="pools">/pools</a> · <a href="metrics">/metrics</a> · <a href="readyz">/readyz</a></p>
</body>
</html>
`))

type statusRow struct {
	Tag, Engine          string
	Segment              bool
	Initialized          bool
	Step                 int64
	CurIdle, NextIdle    int64
	CurPct, NextPct      int
	NextReady, Loading   bool
	RangeStart, RangeMax int64
	LastLoad             time.Time
	LastError            string
	Conflict             bool
	Issued               uint64
	Rate                 float64
}

type errorRow struct {
	Code, Meaning, Kind     string
	Last5m, LastHour, Total uint64
}

type statusData struct {
	Now     time.Time
	Refresh int
	Status  Status
	Reasons []string
	Rows    []statusRow
	Errors  []errorRow
	Graphs  []graph
	// PoolsOn: the proxy reports its pools (Options.Pools); Pools are they.
	PoolsOn bool
	Pools   []poolRow
}

func pct(idle, size int64) int {
	if size <= 0 {
		return 0
	}
	return int(idle * 100 / size)
}

func (s *server) statusPage(w http.ResponseWriter, r *http.Request) {
	d := statusData{Now: time.Now().UTC(), Refresh: refreshSeconds}
	if s.Status != nil {
		d.Status = s.Status()
	}
	if s.Ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		if err := s.Ready(ctx); err != nil {
			d.Reasons = strings.Split(err.Error(), "; ")
		}
		cancel()
	}
	d.Rows = s.tagRows(d.Status)
	if s.Pools != nil {
		d.PoolsOn = true
		d.Pools = s.rates.rows(s.Pools(), d.Now)
	}
	if s.History != nil {
		samples := s.History()
		d.Errors = errorRows(samples, d.Now)
		d.Graphs = historyGraphs(samples, d.Now)
	}
	var buf bytes.Buffer
	if err := statusTemplate.Execute(&buf, d); err != nil {
		s.Logger.WithField("error", err).Error("render status page")
		http.Error(w, "cannot render the status page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(buf.Bytes())
}

// tagRows lists every tag once: a tag that is both a snowflake tag and a leaf_alloc row is
// served by snowflake, so it is listed as such, with the conflict noted.
func (s *server) tagRows(st Status) []statusRow {
	var rates map[metrics.Key]float64
	var totals map[metrics.Key]uint64
	if s.Rates != nil {
		rates = s.Rates()
	}
	if s.Totals != nil {
		totals = s.Totals()
	}
	snow := make(map[string]bool, len(st.SnowflakeTags))
	for _, t := range st.SnowflakeTags {
		snow[t] = true
	}
	conflict := map[string]bool{}
	var rows []statusRow
	if s.Cache != nil {
		for _, t := range s.Cache() {
			if snow[t.Tag] {
				conflict[t.Tag] = true
				continue
			}
			k := metrics.Key{Engine: "segment", Tag: t.Tag}
			cur, next := t.Buffers[t.Pos], t.Buffers[1-t.Pos]
			row := statusRow{Tag: t.Tag, Engine: "segment", Segment: true, Initialized: t.Initialized,
				Step: t.Step, CurIdle: cur.Idle, CurPct: pct(cur.Idle, cur.Step),
				NextReady: t.NextReady, Loading: t.Loading, LastError: t.LastError, LastLoad: t.LastLoad,
				RangeStart: cur.Start, RangeMax: cur.Max,
				Issued: totals[k], Rate: rates[k]}
			if t.NextReady {
				row.NextIdle, row.NextPct = next.Idle, pct(next.Idle, next.Step)
			}
			rows = append(rows, row)
		}
	}
	for _, tag := range st.SnowflakeTags {
		k := metrics.Key{Engine: "snowflake", Tag: tag}
		rows = append(rows, statusRow{Tag: tag, Engine: "snowflake", Conflict: conflict[tag], Issued: totals[k], Rate: rates[k]})
	}
	// leaf_snowflake() and the HTTP snowflake endpoint carry no tag.
	if k := (metrics.Key{Engine: "snowflake"}); totals[k] > 0 {
		rows = append(rows, statusRow{Tag: "(untagged)", Engine: "snowflake", Issued: totals[k], Rate: rates[k]})
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Tag < rows[j].Tag })
	return rows
}

// errorRows counts the errors and refusals by SQLSTATE over the last 5 minutes, the last
// hour (or as much of it as the history holds) and since start.
func errorRows(samples []metrics.HistorySample, now time.Time) []errorRow {
	if len(samples) == 0 {
		return nil
	}
	last := samples[len(samples)-1]
	ago := func(d time.Duration) metrics.HistorySample {
		base := samples[0]
		for _, s := range samples {
			if s.At.After(now.Add(-d)) {
				break
			}
			base = s
		}
		return base
	}
	before5m, beforeHour := ago(5*time.Minute), ago(time.Hour)
	var rows []errorRow
	add := func(kind string, totals, at5m, atHour map[string]uint64) {
		for code, n := range totals {
			if n == 0 {
				continue
			}
			meaning := sqlStateNames[code]
			rows = append(rows, errorRow{Code: code, Meaning: meaning, Kind: kind,
				Last5m: n - min(n, at5m[code]), LastHour: n - min(n, atHour[code]), Total: n})
		}
	}
	add("statement error", last.Errors, before5m.Errors, beforeHour.Errors)
	add("client refused", last.Rejects, before5m.Rejects, beforeHour.Rejects)
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Kind != rows[j].Kind {
			return rows[i].Kind > rows[j].Kind
		}
		return rows[i].Code < rows[j].Code
	})
	return rows
}

// lasts words a runway in seconds for a reader: "no consumption" while nothing is used,
// else the largest unit that fits.
func lasts(seconds float64) string {
	const day = 24 * 3600
	count := func(n float64, unit string) string {
		if n == 1 {
			return "1 " + unit
		}
		return fmt.Sprintf("%.0f %ss", n, unit)
	}
	switch {
	case math.IsInf(seconds, 1) || math.IsNaN(seconds):
		return "no consumption"
	case seconds <= 0:
		return "used up"
	case seconds >= 365*day:
		return count(math.Floor(seconds/(365*day)), "year")
	case seconds >= day:
		return count(math.Floor(seconds/day), "day")
	case seconds >= 3600:
		return count(math.Floor(seconds/3600), "hour")
	}
	return count(math.Ceil(seconds/60), "minute")
}
