package httpapi

import (
	"bytes"
	"context"
	"html/template"
	"net/http"
	"sort"
	"time"

	"github.com/leafproxy/leafproxy/internal/metrics"
)

// statusTemplate is the human status page: no scripts, no external assets, refreshes
// itself every 5 s.
var statusTemplate = template.Must(template.New("status").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="5">
<title>leafproxy status</title>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem; color: #1d2733; background: #f6f8fa; }
h1 { font-size: 1.5rem; margin: 0 0 .25rem; }
h2 { font-size: 1.1rem; margin: 1.75rem 0 .5rem; }
.sub { color: #5b6775; margin-bottom: 1rem; }
.ready { display: inline-block; padding: .1rem .6rem; border-radius: 1rem; font-weight: 600; }
.ok { background: #d7f5df; color: #11632b; } .bad { background: #fde1e1; color: #8d1a1a; }
table { border-collapse: collapse; background: #fff; box-shadow: 0 1px 2px rgba(0,0,0,.08); min-width: 40rem; }
th, td { padding: .4rem .8rem; border-bottom: 1px solid #e3e7ec; text-align: left; white-space: nowrap; }
th { background: #eef1f5; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.bar { width: 9rem; height: .7rem; background: #e3e7ec; border-radius: .35rem; overflow: hidden; display: inline-block; vertical-align: middle; }
.bar span { display: block; height: 100%; background: #3a7bd5; }
.bar.next span { background: #7fb069; }
dl { display: grid; grid-template-columns: max-content auto; gap: .3rem 1.25rem; background: #fff; padding: .8rem 1rem; box-shadow: 0 1px 2px rgba(0,0,0,.08); max-width: 44rem; }
dt { color: #5b6775; } dd { margin: 0; font-family: ui-monospace, monospace; }
.muted { color: #8a96a3; }
</style>
</head>
<body>
<h1>leafproxy</h1>
<div class="sub">{{.Status.Version}} · up since {{.Status.StartedAt.Format "2006-01-02 15:04:05 MST"}} · proxy {{.Status.Listen}} → {{.Status.Upstream}}</div>
{{if .ReadyErr}}<span class="ready bad" id="ready">not ready: {{.ReadyErr}}</span>{{else}}<span class="ready ok" id="ready">ready</span>{{end}}

<h2>Tags</h2>
<table id="tags">
<tr><th>tag</th><th>engine</th><th>step</th><th>current buffer</th><th>next buffer</th><th>IDs issued</th><th>IDs/s</th></tr>
{{range .Rows}}<tr>
<td>{{.Tag}}</td><td>{{.Engine}}</td>
{{if .Segment}}<td class="num">{{.Step}}</td>
<td>{{if .Initialized}}<span class="bar"><span style="width: {{.CurPct}}%"></span></span> {{.CurIdle}} left{{else}}<span class="muted">not loaded yet</span>{{end}}</td>
<td>{{if .NextReady}}<span class="bar next"><span style="width: {{.NextPct}}%"></span></span> {{.NextIdle}} ready{{else if .Loading}}loading…{{else}}<span class="muted">—</span>{{end}}{{if .LastError}} <span class="muted" title="{{.LastError}}">(last load failed)</span>{{end}}</td>
{{else}}<td class="muted">—</td><td class="muted">—</td><td class="muted">—</td>{{end}}
<td class="num">{{.Issued}}</td><td class="num">{{printf "%.1f" .Rate}}</td>
</tr>{{else}}<tr><td colspan="7" class="muted">no tags yet: add one with <code>leafproxy tag add NAME --step N</code></td></tr>{{end}}
</table>

<h2>Snowflake</h2>
{{with .Status.Snowflake}}<dl id="snowflake">
<dt>worker ID</dt><dd id="worker-id">{{if ge .WorkerID 0}}{{.WorkerID}}{{else}}none{{end}}{{if not .Held}} (not held: not issuing){{end}}</dd>
<dt>worker source</dt><dd id="worker-source">{{.Source}}</dd>
<dt>clock high-water</dt><dd>{{if .HighWater.IsZero}}none yet{{else}}{{.HighWater.Format "2006-01-02 15:04:05.000 MST"}}{{end}}</dd>
<dt>layout</dt><dd>{{.Layout}}</dd>
<dt>epoch</dt><dd>{{.Epoch.Format "2006-01-02 15:04:05.000 MST"}}</dd>
</dl>{{else}}<p class="muted">The snowflake engine is not running.</p>{{end}}

<h2>Fill rules</h2>
{{if .Status.FillRules}}<ul>{{range .Status.FillRules}}<li><code>{{.}}</code></li>{{end}}</ul>{{else}}<p class="muted">none</p>{{end}}

<p class="muted">Machine-readable: <a href="cache">/cache</a> · <a href="metrics">/metrics</a> · <a href="readyz">/readyz</a></p>
</body>
</html>
`))

type statusRow struct {
	Tag, Engine        string
	Segment            bool
	Initialized        bool
	Step               int64
	CurIdle, NextIdle  int64
	CurPct, NextPct    int
	NextReady, Loading bool
	LastError          string
	Issued             uint64
	Rate               float64
}

type statusData struct {
	Status   Status
	ReadyErr string
	Rows     []statusRow
}

func pct(idle, size int64) int {
	if size <= 0 {
		return 0
	}
	return int(idle * 100 / size)
}

func (s *server) statusPage(w http.ResponseWriter, r *http.Request) {
	d := statusData{}
	if s.Status != nil {
		d.Status = s.Status()
	}
	if s.Ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		if err := s.Ready(ctx); err != nil {
			d.ReadyErr = err.Error()
		}
		cancel()
	}
	var rates map[metrics.Key]float64
	var totals map[metrics.Key]uint64
	if s.Rates != nil {
		rates = s.Rates()
	}
	if s.Totals != nil {
		totals = s.Totals()
	}
	if s.Cache != nil {
		for _, t := range s.Cache() {
			k := metrics.Key{Engine: "segment", Tag: t.Tag}
			cur, next := t.Buffers[t.Pos], t.Buffers[1-t.Pos]
			row := statusRow{Tag: t.Tag, Engine: "segment", Segment: true, Initialized: t.Initialized,
				Step: t.Step, CurIdle: cur.Idle, CurPct: pct(cur.Idle, cur.Step),
				NextReady: t.NextReady, Loading: t.Loading, LastError: t.LastError,
				Issued: totals[k], Rate: rates[k]}
			if t.NextReady {
				row.NextIdle, row.NextPct = next.Idle, pct(next.Idle, next.Step)
			}
			d.Rows = append(d.Rows, row)
		}
	}
	for _, tag := range d.Status.SnowflakeTags {
		k := metrics.Key{Engine: "snowflake", Tag: tag}
		d.Rows = append(d.Rows, statusRow{Tag: tag, Engine: "snowflake", Issued: totals[k], Rate: rates[k]})
	}
	// leaf_snowflake() and the HTTP snowflake endpoint carry no tag.
	if k := (metrics.Key{Engine: "snowflake"}); totals[k] > 0 {
		d.Rows = append(d.Rows, statusRow{Tag: "(untagged)", Engine: "snowflake", Issued: totals[k], Rate: rates[k]})
	}
	sort.SliceStable(d.Rows, func(i, j int) bool { return d.Rows[i].Tag < d.Rows[j].Tag })

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
