package report

import (
	"bytes"
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/palette/moreland"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/replay"
)

// Plot sizes in pixels (at dpi).
const (
	dpi          = 96
	smallW       = 440
	smallH       = 380
	wideW        = 660
	wideH        = 380
	colorBarW    = 96
	paletteSteps = 255
)

func px(n int) vg.Length { return vg.Length(n) * vg.Inch / dpi }

// grid is a GridXYZ over z[row][col]: columns on x, rows on y, row 0 at
// the bottom, or at the top when topDown (as a matrix is printed).
type grid struct {
	z       [][]float64
	topDown bool
}

func (g grid) Dims() (c, r int) { return len(g.z[0]), len(g.z) }

// Z returns the value drawn at (c, r), row r counted from the bottom.
func (g grid) Z(c, r int) float64 {
	if g.topDown {
		return g.z[len(g.z)-1-r][c]
	}
	return g.z[r][c]
}
func (g grid) X(c int) float64 { return float64(c) }
func (g grid) Y(r int) float64 { return float64(r) }

// y is where row r of z is drawn.
func (g grid) y(r int) float64 {
	if g.topDown {
		return float64(len(g.z) - 1 - r)
	}
	return float64(r)
}

// heatFigure draws z[row][col] with a color bar from lo to hi, labelled
// unit. A matrix has row 0 at the top; labels writes every cell's value (in
// MB) into it.
func heatFigure(title, xLabel, yLabel, unit string, z [][]float64, lo, hi float64, matrix, labels bool) ([]byte, error) {
	if !(hi > lo) {
		hi = lo + math.Max(1e-9, math.Abs(lo)*1e-6)
	}
	cm := moreland.BlackBody()
	cm.SetMin(lo)
	cm.SetMax(hi)
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	g := grid{z: z, topDown: matrix}
	hm := plotter.NewHeatMap(g, cm.Palette(paletteSteps))
	hm.Min, hm.Max = lo, hi
	p.Add(hm)
	cols, rows := len(z[0]), len(z)
	p.X.Tick.Marker = intTicks(cols, false)
	p.Y.Tick.Marker = intTicks(rows, matrix)
	if labels {
		var xy plotter.XYLabels
		for r := range rows {
			for c := range cols {
				xy.XYs = append(xy.XYs, plotter.XY{X: g.X(c), Y: g.y(r)})
				xy.Labels = append(xy.Labels, bytesStr(z[r][c]*1e6))
			}
		}
		lb, err := plotter.NewLabels(xy)
		if err != nil {
			return nil, err
		}
		for i := range lb.TextStyle {
			lb.TextStyle[i].XAlign = draw.XCenter
			lb.TextStyle[i].YAlign = draw.YCenter
			// Light text on the dark low end of the map, dark on the rest.
			v := (z[i/cols][i%cols] - lo) / (hi - lo)
			lb.TextStyle[i].Color = color.Black
			if v < 0.45 {
				lb.TextStyle[i].Color = color.White
			}
		}
		p.Add(lb)
	}
	bar := plot.New()
	bar.HideX()
	bar.Y.Label.Text = unit
	bar.Add(&plotter.ColorBar{ColorMap: cm, Vertical: true})
	bar.Title.Text = " "

	c := vgimg.NewWith(vgimg.UseWH(px(smallW), px(smallH)), vgimg.UseDPI(dpi))
	dc := draw.New(c)
	if err := drawSafely(func() {
		p.Draw(draw.Crop(dc, 0, -px(colorBarW), 0, 0))
		bar.Draw(draw.Crop(dc, px(smallW-colorBarW+8), 0, 0, 0))
	}); err != nil {
		return nil, err
	}
	return encodePNG(c)
}

// intTicks labels integer positions 0..n-1, thinned to about 10 labels;
// reversed, position i is labelled n-1-i (row 0 on top).
func intTicks(n int, reversed bool) plot.TickerFunc {
	return func(min, max float64) []plot.Tick {
		step := max1(n / 10)
		var ts []plot.Tick
		for i := 0; i < n; i++ {
			idx := i
			if reversed {
				idx = n - 1 - i
			}
			t := plot.Tick{Value: float64(i)}
			if idx%step == 0 {
				t.Label = fmt.Sprint(idx)
			}
			ts = append(ts, t)
		}
		return ts
	}
}

func max1(n int) int {
	if n < 1 {
		return 1
	}
	return n
}

// renderPNG renders p at w×h pixels.
func renderPNG(p *plot.Plot, w, h int) ([]byte, error) {
	c := vgimg.NewWith(vgimg.UseWH(px(w), px(h)), vgimg.UseDPI(dpi))
	if err := drawSafely(func() { p.Draw(draw.New(c)) }); err != nil {
		return nil, err
	}
	return encodePNG(c)
}

func encodePNG(c *vgimg.Canvas) ([]byte, error) {
	var buf bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: c}).WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// drawSafely runs draw and turns a panic into an error: gonum/plot panics
// on some data ranges (an axis spanning 1e308, for one), and a report must
// fail with an error, not crash, on odd input.
func drawSafely(draw func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cannot draw the data: %v", r)
		}
	}()
	draw()
	return nil
}

// lines draws one line per series over x = 0, 1, …
// With xNames the x axis is labelled by name.
func lines(title, xLabel, yLabel string, names []string, ys [][]float64, xNames ...string) ([]byte, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	for k, y := range ys {
		xy := make(plotter.XYs, len(y))
		for i, v := range y {
			xy[i] = plotter.XY{X: float64(i), Y: v}
		}
		l, s, err := plotter.NewLinePoints(xy)
		if err != nil {
			return nil, err
		}
		l.Color = plotutil.Color(k)
		l.Width = vg.Points(1.5)
		l.Dashes = plotutil.Dashes(k)
		s.Color = plotutil.Color(k)
		s.Shape = plotutil.Shape(k)
		p.Add(l, s)
		p.Legend.Add(names[k], l, s)
	}
	if len(xNames) > 0 {
		p.NominalX(xNames...)
	}
	return renderPNG(p, wideW, wideH)
}

func planFigures(in Input) ([][]figure, error) {
	g := in.Cluster.GPUs()
	// One color range for every plan's load map, centred on the mean, so
	// the maps compare at a glance.
	dev := 0.01
	for _, pl := range in.Plans {
		for _, lr := range pl.Report.Layers {
			for _, t := range lr.Tokens {
				if lr.MeanTokens > 0 {
					dev = math.Max(dev, math.Abs(t/lr.MeanTokens-1))
				}
			}
		}
	}
	// Traffic maps share one range too.
	var maxGPU, maxNode float64
	gpuM := make([][][]float64, len(in.Plans))
	nodeM := make([][][]float64, len(in.Plans))
	for k, pl := range in.Plans {
		gpuM[k], nodeM[k] = traffic(pl.Report, g, in.Cluster.GPUsPerNode)
		for _, row := range gpuM[k] {
			for _, v := range row {
				maxGPU = math.Max(maxGPU, v)
			}
		}
		for _, row := range nodeM[k] {
			for _, v := range row {
				maxNode = math.Max(maxNode, v)
			}
		}
	}
	out := make([][]figure, len(in.Plans))
	for k, pl := range in.Plans {
		L := len(pl.Report.Layers)
		z := make([][]float64, L)
		for l, lr := range pl.Report.Layers {
			z[l] = make([]float64, g)
			for gi, t := range lr.Tokens {
				z[l][gi] = 1
				if lr.MeanTokens > 0 {
					z[l][gi] = t / lr.MeanTokens
				}
			}
		}
		b, err := heatFigure(pl.Name+": GPU load ÷ layer mean", "GPU", "MoE layer", "load ÷ mean", z, 1-dev, 1+dev, false, false)
		if err != nil {
			return nil, fmt.Errorf("report: plan %q load map: %w", pl.Name, err)
		}
		out[k] = append(out[k], newFigure(pl.Name+" load", fmt.Sprintf("%s: routed tokens per GPU and layer, relative to the layer's mean (1 = balanced; busiest/mean %.3f on average, %.3f at worst).", pl.Name, pl.Report.MeanBalance, pl.Report.MaxBalance), b, smallW, smallH))
		b, err = heatFigure(pl.Name+": dispatch bytes, GPU → GPU", "destination GPU", "source GPU", "MB (all layers)", gpuM[k], 0, maxGPU, true, false)
		if err != nil {
			return nil, fmt.Errorf("report: plan %q traffic map: %w", pl.Name, err)
		}
		out[k] = append(out[k], newFigure(pl.Name+" GPU traffic", pl.Name+": dispatch bytes from each source GPU to each destination GPU, summed over layers (combine mirrors it).", b, smallW, smallH))
		if in.Cluster.Nodes > 1 {
			b, err = heatFigure(pl.Name+": dispatch bytes, node → node", "destination node", "source node", "MB (all layers)", nodeM[k], 0, maxNode, true, true)
			if err != nil {
				return nil, fmt.Errorf("report: plan %q node map: %w", pl.Name, err)
			}
			out[k] = append(out[k], newFigure(pl.Name+" node traffic", pl.Name+": dispatch bytes between nodes, summed over layers; off the diagonal they cross the NICs.", b, smallW, smallH))
		}
	}
	return out, nil
}

// traffic sums the report's dispatch matrices over layers, in MB, per GPU
// pair and per node pair.
func traffic(r *costmodel.Report, g, perNode int) (gpu, node [][]float64) {
	nodes := max1(g / max1(perNode))
	gpu = make([][]float64, g)
	for s := range gpu {
		gpu[s] = make([]float64, g)
	}
	node = make([][]float64, nodes)
	for s := range node {
		node[s] = make([]float64, nodes)
	}
	for _, lr := range r.Layers {
		for s, row := range lr.Dispatch {
			for d, b := range row {
				gpu[s][d] += b / 1e6
				node[min(s/max1(perNode), nodes-1)][min(d/max1(perNode), nodes-1)] += b / 1e6
			}
		}
	}
	return gpu, node
}

func sharedFigures(in Input) ([]figure, error) {
	names := make([]string, len(in.Plans))
	imb := make([][]float64, len(in.Plans))
	cross := make([][]float64, len(in.Plans))
	for k, pl := range in.Plans {
		names[k] = pl.Name
		for _, lr := range pl.Report.Layers {
			imb[k] = append(imb[k], lr.Balance)
			cross[k] = append(cross[k], lr.CrossNodeBytes/1e6)
		}
	}
	var out []figure
	b, err := lines("Busiest GPU ÷ mean, per layer", "MoE layer", "max/mean load", names, imb)
	if err != nil {
		return nil, fmt.Errorf("report: imbalance plot: %w", err)
	}
	out = append(out, newFigure("busiest/mean per layer", "Busiest GPU's routed tokens over the mean, per MoE layer (1 = perfectly balanced).", b, wideW, wideH))
	if in.Cluster.Nodes > 1 {
		b, err = lines("Cross-node bytes per layer", "MoE layer", "MB over the NICs", names, cross)
		if err != nil {
			return nil, fmt.Errorf("report: cross-node plot: %w", err)
		}
		out = append(out, newFigure("cross-node bytes per layer", "Bytes over the NICs per MoE layer, dispatch and combine.", b, wideW, wideH))
	}
	if hasGaps(in) {
		b, err = gapFigure(in)
		if err != nil {
			return nil, fmt.Errorf("report: gap plot: %w", err)
		}
		cap := "Gap between each plan's modeled layer time and its solver's bound (plans without one are left out)."
		if in.Bound > 0 {
			cap = fmt.Sprintf("Modeled layer time above a lower bound (%s) that holds for every plan.", dur(secDur(in.Bound)))
		}
		out = append(out, newFigure("gap to the bound", cap, b, wideW, wideH))
	}
	return out, nil
}

func gapFigure(in Input) ([]byte, error) {
	var vals plotter.Values
	var names []string
	for _, pl := range in.Plans {
		g, _ := planGap(in, pl)
		if math.IsNaN(g) {
			continue
		}
		vals = append(vals, 100*g)
		names = append(names, pl.Name)
	}
	p := plot.New()
	p.Title.Text = "Gap to the bound"
	p.Y.Label.Text = "% above the lower bound"
	p.Add(plotter.NewGrid())
	bars, err := plotter.NewBarChart(vals, px(40))
	if err != nil {
		return nil, err
	}
	bars.Color = plotutil.Color(0)
	bars.LineStyle.Width = 0
	p.Add(bars)
	p.NominalX(names...)
	p.Y.Min = 0
	return renderPNG(p, wideW, wideH)
}

func replayFigures(r *Replay) (*replayPage, error) {
	rp := &replayPage{Note: r.Note}
	tails := make([][]float64, len(r.Measurements))
	for j, m := range r.Measurements {
		for _, lr := range m.Layers {
			tails[j] = append(tails[j], float64(lr.Tail)/1e6)
		}
	}
	b, err := lines("Measured tail per layer", "MoE layer", "slowest GPU's compute (ms)", r.Names, tails)
	if err != nil {
		return nil, fmt.Errorf("report: replay plot: %w", err)
	}
	rp.Figs = append(rp.Figs, newFigure("replay tail per layer", fmt.Sprintf("Slowest GPU's expert compute per layer (%s), averaged over iterations.", r.Measurements[0].Compute), b, wideW, wideH))
	if len(r.Diffs) == 0 {
		return rp, nil
	}
	for j, d := range r.Diffs {
		rp.Diffs = append(rp.Diffs, fmt.Sprintf("%s vs %s: tail %s, mean %s, layer %s", r.Names[j+1], r.Names[0], d.Tail, d.Mean, d.Time))
	}
	b, err = diffFigure(r)
	if err != nil {
		return nil, fmt.Errorf("report: replay difference plot: %w", err)
	}
	cap := "Differences against " + r.Names[0] + " with their confidence intervals (bootstrap over the interleaved rounds"
	if r.Rounds > 0 {
		cap += fmt.Sprintf(", %d rounds", r.Rounds)
	}
	rp.Figs = append(rp.Figs, newFigure("replay differences", cap+"); an interval across 0 is within noise.", b, wideW, wideH))
	return rp, nil
}

// diffFigure draws every difference as a point with its interval.
func diffFigure(r *Replay) ([]byte, error) {
	p := plot.New()
	p.Title.Text = "Measured difference vs " + r.Names[0]
	p.Y.Label.Text = "% (negative: faster)"
	p.Add(plotter.NewGrid())
	var names []string
	var pts plotter.XYs
	var errs plotter.YErrors
	for j, d := range r.Diffs {
		for _, m := range []struct {
			name string
			d    replay.Difference
		}{{"tail", d.Tail}, {"mean", d.Mean}, {"layer", d.Time}} {
			x := float64(len(pts))
			names = append(names, r.Names[j+1]+" "+m.name)
			est := 100 * m.d.Estimate
			pts = append(pts, plotter.XY{X: x, Y: est})
			lo, hi := est, est
			if !math.IsNaN(m.d.Lo) {
				lo, hi = 100*m.d.Lo, 100*m.d.Hi
			}
			errs = append(errs, struct{ Low, High float64 }{est - lo, hi - est})
		}
	}
	zero, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 0}, {X: float64(len(pts)) - 0.5, Y: 0}})
	if err != nil {
		return nil, err
	}
	zero.Color = color.Gray{Y: 120}
	s, err := plotter.NewScatter(pts)
	if err != nil {
		return nil, err
	}
	s.Color = plotutil.Color(0)
	s.Shape = draw.CircleGlyph{}
	s.Radius = vg.Points(5)
	eb, err := plotter.NewYErrorBars(struct {
		plotter.XYs
		plotter.YErrors
	}{pts, errs})
	if err != nil {
		return nil, err
	}
	eb.Color = plotutil.Color(0)
	eb.Width = vg.Points(1.5)
	p.Add(zero, eb, s)
	p.NominalX(names...)
	return renderPNG(p, wideW, wideH)
}

func backtestFigure(b *Backtest) (figure, error) {
	names := make([]string, len(b.Series))
	ys := make([][]float64, len(b.Series))
	for k, s := range b.Series {
		names[k], ys[k] = s.Name, s.Values
	}
	title := b.Title
	if title == "" {
		title = "Backtest"
	}
	png, err := lines(title, "window", b.Unit, names, ys, b.Windows...)
	if err != nil {
		return figure{}, fmt.Errorf("report: backtest plot: %w", err)
	}
	cap := "Each plan's value on held-out windows: " + joinWindows(b.Windows) + "."
	if b.Note != "" {
		cap += " " + b.Note
	}
	return newFigure("backtest", cap, png, wideW, wideH), nil
}

func joinWindows(ws []string) string {
	if len(ws) > 6 {
		return fmt.Sprintf("%s … %s (%d windows)", ws[0], ws[len(ws)-1], len(ws))
	}
	s := ""
	for i, w := range ws {
		if i > 0 {
			s += ", "
		}
		s += w
	}
	return s
}
