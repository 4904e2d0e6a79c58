package httpapi

import (
	"fmt"
	"html/template"
	"strings"
	"time"

	"github.com/leafproxy/leafproxy/internal/metrics"
)

// graph is one small history chart of the status page: inline SVG, drawn on the server.
type graph struct {
	SVG     template.HTML
	Caption string
}

// The charts span the last hour, now at the right edge.
const (
	graphSpan          = time.Hour
	graphW, graphH     = 320, 90
	graphLeft, graphTB = 34, 12 // room for the scale on the left, top and bottom margins
)

// point is one value of a series at a time.
type point struct {
	at time.Time
	v  float64
}

// historyGraphs turns the samples (oldest first, the newest being now's totals) into the
// three charts: IDs per second, segment loads and errors (with refusals) per interval.
func historyGraphs(samples []metrics.HistorySample, now time.Time) []graph {
	var ids, loads, errs []point
	for i := 1; i < len(samples); i++ {
		prev, cur := samples[i-1], samples[i]
		secs := cur.At.Sub(prev.At).Seconds()
		if secs <= 0 {
			continue
		}
		ids = append(ids, point{cur.At, float64(cur.IDs-min(cur.IDs, prev.IDs)) / secs})
		l := cur.Loads + cur.LoadErrors - min(cur.Loads+cur.LoadErrors, prev.Loads+prev.LoadErrors)
		loads = append(loads, point{cur.At, float64(l)})
		errs = append(errs, point{cur.At, float64(sumDelta(cur.Errors, prev.Errors) + sumDelta(cur.Rejects, prev.Rejects))})
	}
	return []graph{
		drawGraph("graph-ids", "IDs per second", ids, now, "%.1f"),
		drawGraph("graph-loads", "segment loads per sample", loads, now, "%.0f"),
		drawGraph("graph-errors", "errors and refusals per sample", errs, now, "%.0f"),
	}
}

func sumDelta(cur, prev map[string]uint64) uint64 {
	var n uint64
	for k, v := range cur {
		n += v - min(v, prev[k])
	}
	return n
}

// drawGraph draws a series as a polyline over the last hour with its scale.
// Everything written into the SVG is a number or a fixed string, so nothing needs
// escaping but the title, which is escaped.
func drawGraph(id, title string, pts []point, now time.Time, format string) graph {
	var peak, last float64
	for _, p := range pts {
		peak = max(peak, p.v)
	}
	if len(pts) > 0 {
		last = pts[len(pts)-1].v
	}
	scale := peak
	if scale == 0 {
		scale = 1
	}
	plotW := float64(graphW - graphLeft - 4)
	plotH := float64(graphH - 2*graphTB)
	x := func(at time.Time) float64 {
		f := 1 - now.Sub(at).Seconds()/graphSpan.Seconds()
		return float64(graphLeft) + max(0, min(1, f))*plotW
	}
	y := func(v float64) float64 { return float64(graphTB) + plotH*(1-v/scale) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="%s" class="graph" role="img" width="%d" height="%d" viewBox="0 0 %d %d">`,
		id, graphW, graphH, graphW, graphH)
	fmt.Fprintf(&b, `<title>%s</title>`, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="#f6f8fa" stroke="#e3e7ec"/>`, graphLeft, graphTB, plotW, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">`+format+`</text>`, graphLeft-3, graphTB+8, peak)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">0</text>`, graphLeft-3, graphH-graphTB)
	fmt.Fprintf(&b, `<text x="%d" y="%d">-60 min</text>`, graphLeft, graphH-1)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">now</text>`, graphW-4, graphH-1)
	if len(pts) > 0 {
		b.WriteString(`<polyline fill="none" stroke="#3a7bd5" stroke-width="1.5" points="`)
		for i, p := range pts {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%.1f,%.1f", x(p.at), y(p.v))
		}
		b.WriteString(`"/>`)
		// The newest value as a dot, so that a series of one sample shows too.
		p := pts[len(pts)-1]
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="#3a7bd5"/>`, x(p.at), y(p.v))
	} else {
		fmt.Fprintf(&b, `<text x="%d" y="%d">collecting samples…</text>`, graphLeft+8, graphH/2)
	}
	b.WriteString(`</svg>`)
	caption := fmt.Sprintf("%s: now "+format+", peak "+format, title, last, peak)
	return graph{SVG: template.HTML(b.String()), Caption: caption}
}
