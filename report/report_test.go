package report

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"html"
	"image"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/replay"
	"github.com/moetuner/moetuner/routing"
)

// flameInput scores the bundled FLAME plans on nodes × (8/nodes) GPUs.
func flameInput(t testing.TB, nodes int) Input {
	t.Helper()
	src, err := routing.Load(filepath.Join("..", "testdata", "flame-moe-290m", "trace.jsonl"), routing.LoadOptions{})
	require.NoError(t, err)
	c, err := costmodel.ClusterPreset("h100x8")
	require.NoError(t, err)
	c = c.WithNodes(nodes)
	c.GPUsPerNode = 8 / nodes
	m, err := costmodel.ModelPreset("flame-moe-290m")
	require.NoError(t, err)
	sc := costmodel.Scenario{Stats: src.Stats, Cluster: c, Model: m}
	in := Input{Description: []string{"FLAME-MoE-290M"}, Cluster: c, Bound: math.NaN()}
	for _, name := range []string{"flame-contiguous.json", "flame-joint.json"} {
		plan, err := placement.ReadFile(filepath.Join("..", "testdata", "plans", name))
		require.NoError(t, err)
		rep, err := sc.Evaluate(plan)
		require.NoError(t, err)
		in.Plans = append(in.Plans, Plan{Name: plan.Strategy, Plan: plan, Report: rep, Gap: math.NaN()})
	}
	return in
}

var imgRE = regexp.MustCompile(`<img class="plot" alt="[^"]*" width="(\d+)" height="(\d+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)">`)

// plots decodes every embedded plot of page.
func plots(t *testing.T, page string) []image.Image {
	t.Helper()
	var out []image.Image
	for _, m := range imgRE.FindAllStringSubmatch(page, -1) {
		data, err := base64.StdEncoding.DecodeString(m[3])
		require.NoError(t, err)
		img, err := png.Decode(bytes.NewReader(data))
		require.NoError(t, err)
		assert.Equal(t, m[1], strconv.Itoa(img.Bounds().Dx()), "declared width")
		assert.Equal(t, m[2], strconv.Itoa(img.Bounds().Dy()), "declared height")
		out = append(out, img)
	}
	return out
}

// inked counts the chromatic pixels in the left three quarters of r (the
// plot area; heatmaps keep their color bar on the right): data is drawn in
// color, axes, text and grid lines in gray, so an empty plot has none.
func inked(img image.Image, r image.Rectangle) int {
	r = r.Intersect(img.Bounds())
	r.Max.X = r.Min.X + 3*r.Dx()/4
	ink := 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			cr, cg, cb, _ := img.At(x, y).RGBA()
			if (max(cr, cg, cb)-min(cr, cg, cb))>>8 > 40 {
				ink++
			}
		}
	}
	return ink
}

func TestWriteFigures(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes int
		add   func(*Input)
		want  int
	}{
		// Per plan: load map, GPU traffic, node traffic; busiest/mean and
		// cross-node per layer.
		{"two nodes", 2, nil, 2*3 + 2},
		// One node: no node matrix, no cross-node plot.
		{"one node", 1, nil, 2*2 + 1},
		{"bound", 2, func(in *Input) { in.Bound = in.Plans[1].Report.TimeSec * 0.98 }, 2*3 + 3},
		{"solver gap", 1, func(in *Input) { in.Plans[1].Gap = 0.05 }, 2*2 + 2},
		{"replay and backtest", 2, func(in *Input) {
			in.Replay = simReplay(t, *in)
			in.Backtest = &Backtest{Title: "held-out days", Unit: "ms", Windows: []string{"d1", "d2", "d3"},
				Series: []Series{{Name: "contiguous", Values: []float64{3, 3.2, 3.1}}, {Name: "joint", Values: []float64{2.8, 2.9, 2.7}}}}
		}, 2*3 + 2 + 2 + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := flameInput(t, tc.nodes)
			if tc.add != nil {
				tc.add(&in)
			}
			var buf bytes.Buffer
			require.NoError(t, Write(&buf, in))
			page := buf.String()
			imgs := plots(t, page)
			assert.Len(t, imgs, tc.want)
			assert.Equal(t, tc.want, Figures(in))
			assert.Contains(t, page, `data-plots="`+strconv.Itoa(tc.want)+`"`)
			for k, img := range imgs {
				// The sparsest plot, three points of the replay differences,
				// has about 300 colored pixels.
				assert.Greater(t, inked(img, img.Bounds()), 150, "plot %d has no data drawn", k)
			}
			// Nothing from the network: no URL but the embedded data.
			assert.NotRegexp(t, `(?i)(src|href)="(https?:)?//`, page)
			assert.NotContains(t, page, "@import")
			assert.NotContains(t, page, "url(")
			assert.Contains(t, page, "<td>joint</td>")
		})
	}
}

// simReplay measures the input's plans with the sim backend.
func simReplay(t *testing.T, in Input) *Replay {
	t.Helper()
	src, err := routing.Load(filepath.Join("..", "testdata", "flame-moe-290m", "trace.jsonl"), routing.LoadOptions{})
	require.NoError(t, err)
	m, err := costmodel.ModelPreset("flame-moe-290m")
	require.NoError(t, err)
	var ws []*replay.Workload
	r := &Replay{Note: "sim"}
	for _, p := range in.Plans {
		w, err := replay.NewWorkload(p.Plan, replay.Input{Trace: src.Trace}, replay.WorkloadOptions{BatchTokens: 256})
		require.NoError(t, err)
		ws = append(ws, w)
		r.Names = append(r.Names, p.Name)
	}
	c, err := replay.Compare(t.Context(), replay.Sim{}, ws, replay.RunOptions{Cluster: in.Cluster, Model: m}, replay.CompareOptions{MaxRounds: 2, Resamples: 100})
	require.NoError(t, err)
	r.Measurements, r.Diffs, r.Rounds = c.Measurements, c.Diffs, c.Rounds
	return r
}

func TestWriteErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		mod  func(*Input)
		want string
	}{
		"no plans":     {func(in *Input) { in.Plans = nil }, "report: no plans"},
		"no report":    {func(in *Input) { in.Plans[0].Report = nil }, `plan "contiguous" has no cost report`},
		"no name":      {func(in *Input) { in.Plans[1].Name = "" }, "plans[1] has no name"},
		"same name":    {func(in *Input) { in.Plans[1].Name = "contiguous" }, `name "contiguous" used twice`},
		"no cluster":   {func(in *Input) { in.Cluster.Nodes = 0 }, "has no GPUs"},
		"gpu mismatch": {func(in *Input) { in.Cluster.GPUsPerNode = 2 }, "the cost report has 8 GPUs but the cluster 4"},
		"layer mismatch": {func(in *Input) {
			r := *in.Plans[1].Report
			r.Layers = r.Layers[:3]
			in.Plans[1].Report = &r
		}, `plan "joint" has 3 layers, plan "contiguous" 8`},
		"replay names": {func(in *Input) { in.Replay = &Replay{Names: []string{"a"}} }, "1 names for 0 measurements"},
		"backtest values": {func(in *Input) {
			in.Backtest = &Backtest{Windows: []string{"a", "b"}, Series: []Series{{Name: "x", Values: []float64{1}}}}
		}, `series[0] "x" has 1 values for 2 windows`},
		"backtest nan": {func(in *Input) {
			in.Backtest = &Backtest{Windows: []string{"a"}, Series: []Series{{Name: "x", Values: []float64{math.NaN()}}}}
		}, "values[0] is NaN"},
	} {
		t.Run(name, func(t *testing.T) {
			in := flameInput(t, 2)
			tc.mod(&in)
			var buf bytes.Buffer
			err := Write(&buf, in)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.True(t, strings.HasPrefix(err.Error(), "report: "), err.Error())
			assert.Zero(t, buf.Len(), "nothing written on error")
		})
	}
}

func TestWriteTable(t *testing.T) {
	in := flameInput(t, 2)
	in.Plans[1].Status = "time-limit"
	in.Plans[1].SolveTime = 1500 * time.Millisecond
	in.Plans[1].Note = "polished"
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, in))
	page := html.UnescapeString(buf.String())
	c, j := in.Plans[0].Report, in.Plans[1].Report
	vs := 100 * (c.TimeSec - j.TimeSec) / c.TimeSec
	assert.Contains(t, page, "<th>vs contiguous</th>")
	assert.Contains(t, page, fmt.Sprintf("<td>%+.1f%%</td>", vs))
	assert.Contains(t, page, "<td>time-limit</td>")
	assert.Contains(t, page, "<td>1.5s</td>")
	assert.Contains(t, page, "joint: polished")
	// The same input gives the same page.
	var again bytes.Buffer
	require.NoError(t, Write(&again, in))
	assert.True(t, bytes.Equal(buf.Bytes(), again.Bytes()), "two renders differ")
}

func TestReadJSON(t *testing.T) {
	read := func(name string) []byte {
		data, err := os.ReadFile(filepath.Join("..", "testdata", "report", name))
		require.NoError(t, err)
		return data
	}
	r, err := ReadReplay(read("replay-cpu.json"))
	require.NoError(t, err)
	assert.Equal(t, []string{"flame-contiguous.json", "flame-joint.json"}, r.Names)
	require.Len(t, r.Measurements, 2)
	require.Len(t, r.Diffs, 1)
	assert.Equal(t, 3, r.Rounds)
	assert.False(t, math.IsNaN(r.Diffs[0].Tail.Lo), "a cpu comparison has intervals")
	assert.Contains(t, r.Note, "backend cpu")
	r, err = ReadReplay(read("replay-sim.json"))
	require.NoError(t, err)
	assert.True(t, math.IsNaN(r.Diffs[0].Tail.Lo), "one sim round: no interval (null)")
	b, err := ReadBacktest(read("backtest.json"))
	require.NoError(t, err)
	assert.Len(t, b.Series, 2)

	for name, tc := range map[string]struct {
		data, want string
	}{
		"syntax":         {`{"plans": [`, "report: replay: unexpected end of JSON input"},
		"no plans":       {`{"plans": []}`, "report: replay: no plans"},
		"no measurement": {`{"plans": [{"file": "a.json"}]}`, `report: replay: plans[0] ("a.json") has no measured layers`},
		"diff count": {`{"plans": [{"file": "a", "measurement": {"layers": [{"tail_ns": 1}]}}], "comparison": {"diffs": [{"tail": {"estimate": 0}}]}}`,
			"comparison.diffs has 1 entries for 1 plans"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ReadReplay([]byte(tc.data))
			assert.ErrorContains(t, err, tc.want)
		})
	}
	_, err = ReadBacktest([]byte(`{"windows": []}`))
	assert.ErrorContains(t, err, "report: backtest: needs at least one window and one series")
	assert.Equal(t, []string{"a.json", "x/b.json", "y/b.json"}, PlanNames([]string{"p/a.json", "x/b.json", "y/b.json"}))
}

// TestWriteHugeValues: gonum/plot panics on an axis spanning 1e308 (found
// by FuzzReadJSON) and loops forever on one spanning ±1e308; Write refuses
// such values, and turns a panic while drawing into an error.
func TestWriteHugeValues(t *testing.T) {
	in := flameInput(t, 1)
	in.Backtest = &Backtest{Windows: []string{"a"}, Series: []Series{{Name: "x", Values: []float64{1e308}}, {Name: "y", Values: []float64{-1e308}}}}
	var buf bytes.Buffer
	assert.ErrorContains(t, Write(&buf, in), `report: backtest: series[0] "x": values[0] is 1e+308; want a number within ±1e+15`)
	in.Backtest = nil
	in.Replay = simReplay(t, in)
	in.Replay.Diffs[0].Tail.Hi = 1e300
	assert.ErrorContains(t, Write(&buf, in), "report: replay: difference 0, tail")
	assert.Zero(t, buf.Len())
	assert.ErrorContains(t, drawSafely(func() { panic("illegal range") }), "cannot draw the data: illegal range")
}
