package report

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"html"
	"html/template"
	"io"
	"math"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/replay"
)

// Input is everything a report shows. Plans and Cluster are required; the
// other sections appear only when set.
type Input struct {
	// Title heads the page; "" means "moetuner report".
	Title string
	// Description lines (trace, cluster, model, flow, …) are listed under
	// the title, as given.
	Description []string
	// Cluster groups the GPUs into nodes (GPUsPerNode) for the node×node
	// traffic matrix; its GPU count must equal every plan's.
	Cluster costmodel.Cluster
	// Plans are the placements compared, in table order. The one whose
	// Name or Plan.Strategy is "contiguous", else the first, is the
	// reference of the "vs" column.
	Plans []Plan
	// Bound is a lower bound in seconds on the modeled layer time (the
	// Report's TimeSec) of every plan of the problem, such as a certified
	// bound on the exact cost model; NaN or 0 means none. When set, every
	// plan's gap is measured against it (as compare's "exact" gap).
	Bound float64
	// Replay adds the measured section when non-nil.
	Replay *Replay
	// Backtest adds the backtest section when non-nil.
	Backtest *Backtest
}

// Plan is one placement in the report.
type Plan struct {
	// Name labels the plan in the table and the plots (a strategy or a
	// file name); it must be non-empty and unique.
	Name string
	// Plan is the placement; optional (nil), it adds the slot count to the
	// table.
	Plan *placement.Plan
	// Report is the plan's modeled cost (costmodel.Scenario.Evaluate);
	// required.
	Report *costmodel.Report
	// Status is the solver's status ("optimal", "time-limit", …); "" shows
	// "-".
	Status string
	// Gap is the relative gap the solver proved for this plan on its own
	// model; NaN means none. Input.Bound, when set, takes precedence.
	Gap float64
	// SolveTime is how long the plan took to make; 0 shows "-".
	SolveTime time.Duration
	// Note is shown under the table when non-empty.
	Note string
}

// Replay is a replay measurement of some of the plans (moetuner replay).
type Replay struct {
	// Names label the measurements, in order; the first is the reference of
	// Diffs.
	Names []string
	// Measurements are replay's aggregates, one per name.
	Measurements []*replay.Measurement
	// Diffs[j-1] compares measurement j with the first (replay.Compare);
	// optional.
	Diffs []replay.PlanDiff
	// Rounds is the number of interleaved rounds measured; 0 when unknown.
	Rounds int
	// Note describes the run (backend, sizes); shown as given.
	Note string
}

// Backtest is a series of held-out windows on which plans were scored:
// Series[k].Values[w] is plan k's value (in Unit, lower is better) on
// window Windows[w].
type Backtest struct {
	Title   string   `json:"title"`
	Unit    string   `json:"unit"`
	Windows []string `json:"windows"`
	Series  []Series `json:"series"`
	Note    string   `json:"note"`
}

// Series is one plan's values over the backtest windows.
type Series struct {
	Name   string    `json:"name"`
	Values []float64 `json:"values"`
}

// maxValue bounds the values report plots: gonum/plot panics on, or loops
// over, axes that span more than float64 can hold.
const maxValue = 1e15

// Validate checks that b is complete: at least one window and series, one
// value per window in every series, values within ±1e15, named series.
func (b *Backtest) Validate() error {
	if len(b.Windows) == 0 || len(b.Series) == 0 {
		return errors.New("report: backtest: needs at least one window and one series")
	}
	for k, s := range b.Series {
		if s.Name == "" {
			return fmt.Errorf("report: backtest: series[%d] has no name", k)
		}
		if len(s.Values) != len(b.Windows) {
			return fmt.Errorf("report: backtest: series[%d] %q has %d values for %d windows; give one value per window", k, s.Name, len(s.Values), len(b.Windows))
		}
		for w, v := range s.Values {
			if !(math.Abs(v) <= maxValue) {
				return fmt.Errorf("report: backtest: series[%d] %q: values[%d] is %v; want a number within ±%g", k, s.Name, w, v, maxValue)
			}
		}
	}
	return nil
}

func (in *Input) validate() error {
	if len(in.Plans) == 0 {
		return errors.New("report: no plans")
	}
	g := in.Cluster.GPUs()
	if g <= 0 {
		return fmt.Errorf("report: cluster %q has no GPUs (%d nodes × %d)", in.Cluster.Name, in.Cluster.Nodes, in.Cluster.GPUsPerNode)
	}
	seen := map[string]bool{}
	L := -1
	for k, p := range in.Plans {
		switch {
		case p.Name == "":
			return fmt.Errorf("report: plans[%d] has no name", k)
		case seen[p.Name]:
			return fmt.Errorf("report: plans[%d]: name %q used twice; names must be unique", k, p.Name)
		case p.Report == nil:
			return fmt.Errorf("report: plan %q has no cost report; set Plan.Report from costmodel.Scenario.Evaluate", p.Name)
		case len(p.Report.Layers) == 0:
			return fmt.Errorf("report: plan %q: the cost report has no layers", p.Name)
		}
		seen[p.Name] = true
		if L >= 0 && len(p.Report.Layers) != L {
			return fmt.Errorf("report: plan %q has %d layers, plan %q %d; every plan must be scored on the same trace", p.Name, len(p.Report.Layers), in.Plans[0].Name, L)
		}
		L = len(p.Report.Layers)
		for _, lr := range p.Report.Layers {
			if len(lr.Tokens) != g || len(lr.Dispatch) != g {
				return fmt.Errorf("report: plan %q, layer %d: the cost report has %d GPUs but the cluster %d (%d nodes × %d)", p.Name, lr.Layer, len(lr.Tokens), g, in.Cluster.Nodes, in.Cluster.GPUsPerNode)
			}
		}
	}
	if r := in.Replay; r != nil {
		if len(r.Names) != len(r.Measurements) || len(r.Names) == 0 {
			return fmt.Errorf("report: replay: %d names for %d measurements; give one name per measurement", len(r.Names), len(r.Measurements))
		}
		for j, m := range r.Measurements {
			if m == nil || len(m.Layers) == 0 {
				return fmt.Errorf("report: replay: measurement %d (%s) is empty", j, r.Names[j])
			}
		}
		if len(r.Diffs) != 0 && len(r.Diffs) != len(r.Measurements)-1 {
			return fmt.Errorf("report: replay: %d differences for %d measurements; want one per measurement after the first", len(r.Diffs), len(r.Measurements))
		}
		for j, d := range r.Diffs {
			for _, x := range []struct {
				name string
				d    replay.Difference
			}{{"tail", d.Tail}, {"mean", d.Mean}, {"layer time", d.Time}} {
				// A relative difference; an interval may be missing (NaN).
				ok := math.Abs(x.d.Estimate) <= 1e6 && (math.IsNaN(x.d.Lo) || math.Abs(x.d.Lo) <= 1e6) && (math.IsNaN(x.d.Hi) || math.Abs(x.d.Hi) <= 1e6)
				if !ok {
					return fmt.Errorf("report: replay: difference %d, %s: %v [%v, %v] is not a relative difference (want |x| ≤ 1e6)", j, x.name, x.d.Estimate, x.d.Lo, x.d.Hi)
				}
			}
		}
	}
	if in.Backtest != nil {
		if err := in.Backtest.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// Write renders the report of in to w as one HTML page. It returns an error,
// and writes nothing, when in is incomplete or inconsistent (see Input).
func Write(w io.Writer, in Input) error {
	if err := in.validate(); err != nil {
		return err
	}
	page, err := build(in)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := pageTemplate.Execute(&buf, page); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	_, err = w.Write(buf.Bytes())
	return err
}

// Figures returns how many plots Write draws for in: per plan a load
// heatmap, a GPU×GPU and (with several nodes) a node×node traffic matrix;
// busiest/mean per layer; cross-node bytes per layer (several nodes); the
// gap to the bound when any plan has one; with Replay the measured tail per
// layer and, with Diffs, the differences; with Backtest its series.
func Figures(in Input) int {
	n := len(in.Plans)*2 + 1
	if in.Cluster.Nodes > 1 {
		n += len(in.Plans) + 1
	}
	if hasGaps(in) {
		n++
	}
	if in.Replay != nil {
		n++
		if len(in.Replay.Diffs) > 0 {
			n++
		}
	}
	if in.Backtest != nil {
		n++
	}
	return n
}

type page struct {
	Title       string
	Description []string
	Table       []row
	RefName     string
	Notes       []string
	PlanFigs    [][]figure // per plan
	Shared      []figure
	Replay      *replayPage
	Backtest    []figure
	BacktestRow []string
	Plots       int
}

type replayPage struct {
	Note  string
	Figs  []figure
	Diffs []string
}

type row struct {
	Name, Slots, TokenTail, Imbalance, Comm, CrossNode, Time, Vs, Status, Gap, Solve string
}

type figure struct {
	Caption string
	W       int
	// Img is the <img> element, built here rather than by the template so
	// that the base64 data stays literal (html/template would write every
	// '+' as "&#43;").
	Img template.HTML
}

func newFigure(title, caption string, png []byte, w, h int) figure {
	img := fmt.Sprintf(`<img class="plot" alt="%s" width="%d" height="%d" src="data:image/png;base64,%s">`,
		html.EscapeString(title), w, h, base64.StdEncoding.EncodeToString(png))
	return figure{Caption: caption, W: w, Img: template.HTML(img)}
}

func build(in Input) (*page, error) {
	p := &page{Title: in.Title, Description: in.Description}
	if p.Title == "" {
		p.Title = "moetuner report"
	}
	ref := in.Plans[0]
	for _, pl := range in.Plans {
		if pl.Name == "contiguous" || (pl.Plan != nil && pl.Plan.Strategy == "contiguous") {
			ref = pl
			break
		}
	}
	p.RefName = ref.Name
	for _, pl := range in.Plans {
		r := pl.Report
		rw := row{Name: pl.Name, Slots: "-", TokenTail: fmt.Sprintf("%.0f", r.MaxTokensSum), Imbalance: fmt.Sprintf("%.3f", r.MeanBalance),
			Comm: dur(r.CommTime), CrossNode: bytesStr(r.CrossNodeBytes), Time: dur(r.Time), Vs: "-", Status: orDash(pl.Status), Gap: "-", Solve: "-"}
		if pl.Plan != nil && len(pl.Plan.Layers) > 0 {
			rw.Slots = fmt.Sprint(len(pl.Plan.Layers[0].SlotExpert))
		}
		if ref.Report.TimeSec > 0 {
			rw.Vs = fmt.Sprintf("%+.1f%%", 100*(ref.Report.TimeSec-r.TimeSec)/ref.Report.TimeSec)
		}
		if g, exact := planGap(in, pl); !math.IsNaN(g) {
			rw.Gap = fmt.Sprintf("%.2f%%", 100*g)
			if exact {
				rw.Gap += " exact"
			}
		}
		if pl.SolveTime > 0 {
			rw.Solve = pl.SolveTime.Round(time.Millisecond).String()
		}
		p.Table = append(p.Table, rw)
		if pl.Note != "" {
			p.Notes = append(p.Notes, pl.Name+": "+pl.Note)
		}
	}
	figs, err := planFigures(in)
	if err != nil {
		return nil, err
	}
	p.PlanFigs = figs
	if p.Shared, err = sharedFigures(in); err != nil {
		return nil, err
	}
	if in.Replay != nil {
		if p.Replay, err = replayFigures(in.Replay); err != nil {
			return nil, err
		}
	}
	if in.Backtest != nil {
		f, err := backtestFigure(in.Backtest)
		if err != nil {
			return nil, err
		}
		p.Backtest = []figure{f}
	}
	for _, fs := range p.PlanFigs {
		p.Plots += len(fs)
	}
	p.Plots += len(p.Shared) + len(p.Backtest)
	if p.Replay != nil {
		p.Plots += len(p.Replay.Figs)
	}
	return p, nil
}

// planGap is the plan's relative gap: to Input.Bound when set (exact:
// the bound holds for every plan), else the solver's own Gap.
func planGap(in Input, pl Plan) (gap float64, exact bool) {
	if in.Bound > 0 && !math.IsNaN(in.Bound) {
		return math.Max(0, pl.Report.TimeSec/in.Bound-1), true
	}
	return pl.Gap, false
}

func hasGaps(in Input) bool {
	for _, pl := range in.Plans {
		if g, _ := planGap(in, pl); !math.IsNaN(g) {
			return true
		}
	}
	return false
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.3fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.3fms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.1fµs", float64(d)/1e3)
	}
}

func bytesStr(b float64) string {
	switch {
	case b >= 1e9:
		return fmt.Sprintf("%.2fGB", b/1e9)
	case b >= 1e6:
		return fmt.Sprintf("%.2fMB", b/1e6)
	case b >= 1e3:
		return fmt.Sprintf("%.1fkB", b/1e3)
	}
	return fmt.Sprintf("%.0fB", b)
}

var pageTemplate = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{.Title}}</title>
<style>
body { font-family: sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; margin: 0 0 8px; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #ccc; padding-bottom: 4px; }
ul.desc { margin: 0 0 12px; padding-left: 18px; color: #444; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 4px 10px; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f3f3f3; }
.grid { display: flex; flex-wrap: wrap; gap: 16px; }
figure { margin: 0; }
figcaption { font-size: 12px; color: #555; }
p.note { font-size: 13px; color: #444; max-width: 1100px; }
</style>
</head>
<body data-plots="{{.Plots}}">
<h1>{{.Title}}</h1>
<ul class="desc">{{range .Description}}<li>{{.}}</li>{{end}}</ul>
<h2>Modeled comparison</h2>
<table>
<tr><th>plan</th><th>slots/layer</th><th>token tail</th><th>max/mean</th><th>all-to-all tail</th><th>cross-node</th><th>layer time</th><th>vs {{.RefName}}</th><th>status</th><th>gap</th><th>solve</th></tr>
{{range .Table}}<tr><td>{{.Name}}</td><td>{{.Slots}}</td><td>{{.TokenTail}}</td><td>{{.Imbalance}}</td><td>{{.Comm}}</td><td>{{.CrossNode}}</td><td>{{.Time}}</td><td>{{.Vs}}</td><td>{{.Status}}</td><td>{{.Gap}}</td><td>{{.Solve}}</td></tr>
{{end}}</table>
<p class="note">token tail: Σ over layers of the busiest GPU's routed tokens; max/mean: busiest/mean GPU load, mean over layers; all-to-all tail: Σ of the dispatch + combine bottleneck; layer time: Σ of modeled layer times; vs {{.RefName}}: how much lower the layer time is; gap: to the solver's bound on its model, or "exact": to a lower bound on the exact cost model that holds for every plan.</p>
{{range .Notes}}<p class="note">{{.}}</p>{{end}}
{{range $i, $figs := .PlanFigs}}<div class="grid">{{range $figs}}{{template "fig" .}}{{end}}</div>
{{end}}
<h2>All plans</h2>
<div class="grid">{{range .Shared}}{{template "fig" .}}{{end}}</div>
{{with .Replay}}<h2>Replay</h2>
<p class="note">{{.Note}}</p>
{{range .Diffs}}<p class="note">{{.}}</p>{{end}}
<div class="grid">{{range .Figs}}{{template "fig" .}}{{end}}</div>
{{end}}
{{if .Backtest}}<h2>Backtest</h2>
{{range .BacktestRow}}<p class="note">{{.}}</p>{{end}}
<div class="grid">{{range .Backtest}}{{template "fig" .}}{{end}}</div>
{{end}}
<script>
// Records for automated checks how many plots decoded and where they are.
window.addEventListener("load", function () {
  var imgs = document.querySelectorAll("img.plot"), ok = 0, rects = [];
  for (var i = 0; i < imgs.length; i++) {
    var im = imgs[i], r = im.getBoundingClientRect();
    if (im.complete && im.naturalWidth > 0) { ok++; }
    rects.push([Math.round(r.left + window.scrollX), Math.round(r.top + window.scrollY), Math.round(r.width), Math.round(r.height)]);
  }
  var b = document.body;
  b.setAttribute("data-decoded", ok);
  b.setAttribute("data-rects", JSON.stringify(rects));
  b.setAttribute("data-height", Math.ceil(document.documentElement.scrollHeight));
});
</script>
</body>
</html>
{{define "fig"}}<figure style="width: {{.W}}px">{{.Img}}<figcaption>{{.Caption}}</figcaption></figure>{{end}}`))

func secDur(s float64) time.Duration { return time.Duration(s*1e9 + 0.5) }
