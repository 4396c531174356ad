package replay

import (
	"context"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

func smallTrace() *routing.Trace {
	return &routing.Trace{Tokens: 4, Layers: 2, TopK: 2, Experts: 4, IDs: []int16{
		0, 1, 2, 3,
		0, 2, 0, 1,
		0, 3, 1, 2,
		1, 2, 3, 0,
	}}
}

func smallPlan() *placement.Plan {
	return &placement.Plan{GPUs: 2, Experts: 4, Strategy: "test", Layers: []placement.LayerPlan{
		{SlotExpert: []routing.Expert{0, 1, 2, 3, 0}, SlotGPU: []placement.GPU{0, 0, 1, 1, 1}},
		{SlotExpert: []routing.Expert{0, 1, 2, 3}, SlotGPU: []placement.GPU{0, 0, 1, 1}},
	}}
}

func TestWorkloadFromTrace(t *testing.T) {
	w, err := NewWorkload(smallPlan(), Input{Trace: smallTrace()}, WorkloadOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, w.Iterations())
	assert.False(t, w.Sampled)
	assert.Equal(t, []int{4}, w.Tokens)
	// Layer 0 loads 3,2,2,1; expert 0's 3 tokens split 2 (slot 0) + 1 (slot 4).
	assert.Equal(t, []int{2, 2, 2, 1, 1}, w.SlotTokens[0][0])
	assert.Equal(t, []int{2, 2, 2, 2}, w.SlotTokens[0][1])
	assert.Equal(t, []int{4, 4}, w.GPUTokens(0, 0))
	assert.Equal(t, [][]int{{0, 1}, {2, 3, 4}}, w.GPUSlots(0))

	w, err = NewWorkload(smallPlan(), Input{Trace: smallTrace()}, WorkloadOptions{BatchTokens: 2})
	require.NoError(t, err)
	require.Equal(t, 2, w.Iterations())
	// Tokens 0-1 at layer 0: experts 0,1 and 0,2 → loads 2,1,1,0.
	assert.Equal(t, []int{1, 1, 1, 0, 1}, w.SlotTokens[0][0])
	assert.Equal(t, []int{1, 1, 1, 1}, w.SlotTokens[0][1])
	assert.Equal(t, 2.0, w.Stats[0].Tokens)

	w, err = NewWorkload(smallPlan(), Input{Trace: smallTrace()}, WorkloadOptions{BatchTokens: 3})
	require.NoError(t, err)
	assert.Equal(t, 1, w.Iterations(), "partial batch dropped")
	w, err = NewWorkload(smallPlan(), Input{Trace: smallTrace()}, WorkloadOptions{BatchTokens: 1, Iterations: 3})
	require.NoError(t, err)
	assert.Equal(t, 3, w.Iterations())
}

func TestWorkloadErrors(t *testing.T) {
	bad := smallPlan()
	bad.Experts = 5
	for name, tc := range map[string]struct {
		plan *placement.Plan
		in   Input
		opts WorkloadOptions
		want string
	}{
		"nil plan":     {nil, Input{Trace: smallTrace()}, WorkloadOptions{}, "nil plan"},
		"no input":     {smallPlan(), Input{}, WorkloadOptions{}, "neither"},
		"shape":        {bad, Input{Trace: smallTrace()}, WorkloadOptions{}, "2 layers × 5 experts but the routing data has 2 × 4"},
		"negative":     {smallPlan(), Input{Trace: smallTrace()}, WorkloadOptions{BatchTokens: -1}, "negative"},
		"no top-k":     {smallPlan(), Input{Stats: routing.StatsFromLoad([][]float64{{1, 1, 1, 1}, {1, 1, 1, 1}}, 0)}, WorkloadOptions{}, "top-k"},
		"invalid plan": {&placement.Plan{GPUs: 2, Experts: 4, Layers: []placement.LayerPlan{{SlotExpert: []routing.Expert{0, 1, 2}, SlotGPU: []placement.GPU{0, 0, 1}}, {SlotExpert: []routing.Expert{0, 1, 2, 3}, SlotGPU: []placement.GPU{0, 0, 1, 1}}}}, Input{Trace: smallTrace()}, WorkloadOptions{}, "expert 3"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewWorkload(tc.plan, tc.in, tc.opts)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "replay: ")
		})
	}
}

func TestWorkloadFromStats(t *testing.T) {
	st := routing.StatsFromLoad([][]float64{{600, 200, 100, 100}, {250, 250, 250, 250}}, 2)
	opts := WorkloadOptions{BatchTokens: 5000, Iterations: 3}
	w, err := NewWorkload(smallPlan(), Input{Stats: st}, opts)
	require.NoError(t, err)
	require.Equal(t, 3, w.Iterations())
	assert.True(t, w.Sampled)
	for i := range 3 {
		for l := range 2 {
			sum := 0
			for _, n := range w.SlotTokens[i][l] {
				sum += n
			}
			assert.Equal(t, 10000, sum, "B·k routings per layer")
			assert.InDelta(t, 5000.0, w.Stats[i].Tokens, 1e-9)
		}
		// Expert 0 draws ≈ 60 % of 10000, split over two copies.
		e0 := w.SlotTokens[i][0][0] + w.SlotTokens[i][0][4]
		assert.InDelta(t, 6000, e0, 300)
		assert.LessOrEqual(t, w.SlotTokens[i][0][0]-w.SlotTokens[i][0][4], 1)
	}
	again, err := NewWorkload(smallPlan(), Input{Stats: st}, opts)
	require.NoError(t, err)
	assert.Equal(t, w.SlotTokens, again.SlotTokens, "fixed seed, same batches")
	opts.Seed = 7
	other, err := NewWorkload(smallPlan(), Input{Stats: st}, opts)
	require.NoError(t, err)
	assert.NotEqual(t, w.SlotTokens, other.SlotTokens)
}

func loadFLAME(t testing.TB) (*routing.Trace, costmodel.Cluster, costmodel.Model) {
	t.Helper()
	src, err := routing.Load(filepath.Join("..", "testdata", "flame-moe-290m", "trace.jsonl"), routing.LoadOptions{})
	require.NoError(t, err)
	require.NotNil(t, src.Trace)
	c, err := costmodel.ClusterPreset("h100x8")
	require.NoError(t, err)
	m, err := costmodel.ModelPreset("flame-moe-290m")
	require.NoError(t, err)
	return src.Trace, c, m
}

func readPlan(t testing.TB, name string) *placement.Plan {
	t.Helper()
	p, err := placement.ReadFile(filepath.Join("..", "testdata", "plans", name))
	require.NoError(t, err)
	return p
}

func TestSimMatchesCostModel(t *testing.T) {
	tr, c, m := loadFLAME(t)
	for _, name := range []string{"flame-joint.json", "flame-contiguous.json"} {
		t.Run(name, func(t *testing.T) {
			plan := readPlan(t, name)
			w, err := NewWorkload(plan, Input{Trace: tr}, WorkloadOptions{})
			require.NoError(t, err)
			require.Equal(t, 1, w.Iterations())
			seq, err := Sim{}.Run(context.Background(), w, RunOptions{Cluster: c, Model: m})
			require.NoError(t, err)
			rep, err := costmodel.Evaluate(plan, tr.Stats(routing.StatsOptions{}), c, m, costmodel.Options{})
			require.NoError(t, err)
			assert.Equal(t, Modeled, seq.Compute)
			assert.Equal(t, Modeled, seq.Communication)
			for l, lr := range rep.Layers {
				assert.InDelta(t, lr.ComputeTail.Seconds(), seq.Layers[l].Tail.Seconds(), 2e-9, "layer %d tail", l)
				assert.InDelta(t, lr.CommTime.Seconds(), seq.Layers[l].Comm.Seconds(), 2e-9, "layer %d comm", l)
				assert.InDelta(t, lr.Sequential.Seconds(), seq.Layers[l].Time.Seconds(), 4e-9, "layer %d time", l)
			}
			assert.InDelta(t, rep.Sequential.Seconds(), seq.E2E.Seconds(), 4e-9*float64(len(rep.Layers)))

			ov, err := Sim{}.Run(context.Background(), w, RunOptions{Cluster: c, Model: m, Mode: costmodel.Overlapped})
			require.NoError(t, err)
			for l := range rep.Layers {
				ideal := max(seq.Layers[l].Tail, seq.Layers[l].Comm)
				assert.GreaterOrEqual(t, ov.Layers[l].Time, ideal-1, "layer %d: overlap beats ideal", l)
				assert.LessOrEqual(t, ov.Layers[l].Time, seq.Layers[l].Time+1, "layer %d: overlap worse than sequential", l)
			}
			assert.Less(t, ov.E2E, seq.E2E)
		})
	}
}

func TestOverlapLayer(t *testing.T) {
	for name, tc := range map[string]struct {
		disp, comb float64
		comp       []float64
		sigma      float64
		chunks     int
		want       float64
	}{
		"compute only":        {0, 0, []float64{3, 5}, 0.2, 4, 5},
		"no sigma one chunk":  {1, 1, []float64{4}, 0, 1, 6},
		"perfect pipeline":    {1, 1, []float64{4, 2}, 0, 4, 0.25 + 4 + 0.25},
		"comm bound":          {8, 8, []float64{1}, 0, 4, 16},
		"sigma slows compute": {1, 0, []float64{4}, 1, 1, 1 + 4},
	} {
		t.Run(name, func(t *testing.T) {
			assert.InDelta(t, tc.want, overlapLayer(tc.disp, tc.comb, tc.comp, tc.sigma, tc.chunks), 1e-9)
		})
	}
	// Compute overlapped with communication is slowed: while the first
	// combine chunk runs with σ = 1 the last compute chunk goes half speed.
	got := overlapLayer(1, 1, []float64{2}, 1, 2)
	assert.Greater(t, got, overlapLayer(1, 1, []float64{2}, 0, 2))
	assert.LessOrEqual(t, got, 1+2+1+1e-9)
}

func TestMedian(t *testing.T) {
	assert.Equal(t, time.Duration(0), median(nil))
	assert.Equal(t, 2*time.Second, median([]time.Duration{3 * time.Second, time.Second, 2 * time.Second}))
	assert.Equal(t, 2500*time.Millisecond, median([]time.Duration{3 * time.Second, 9 * time.Second, 2 * time.Second, time.Second}))
}

func TestRunInterleavedMedians(t *testing.T) {
	w, err := NewWorkload(smallPlan(), Input{Trace: smallTrace()}, WorkloadOptions{})
	require.NoError(t, err)
	b := &scripted{times: []time.Duration{10, 1000, 12}}
	ms, err := RunInterleaved(context.Background(), b, []*Workload{w}, 3, RunOptions{})
	require.NoError(t, err)
	assert.Equal(t, time.Duration(12), ms[0].GPUTime[0][0][0])
	assert.Equal(t, time.Duration(12), ms[0].Layers[0].Tail)
}

// scripted returns the same time for every GPU, from a script per call.
type scripted struct {
	times []time.Duration
	n     int
}

func (*scripted) Name() string { return "scripted" }
func (s *scripted) Run(_ context.Context, w *Workload, opts RunOptions) (*Measurement, error) {
	m := newMeasurement("scripted", w, opts)
	for i := range m.GPUTime {
		for l := range m.GPUTime[i] {
			for g := range m.GPUTime[i][l] {
				m.GPUTime[i][l][g] = s.times[s.n]
			}
		}
	}
	s.n++
	m.finish(opts)
	return m, nil
}

func TestCalibrateExact(t *testing.T) {
	var obs []Observation
	for i, n := range []float64{10, 50, 100, 400, 30} {
		e := 1 + i%3
		obs = append(obs, Observation{Layer: i, Tokens: n, Experts: e, Time: time.Duration(2000*n + 50000*float64(e))})
	}
	f, err := Calibrate(obs)
	require.NoError(t, err)
	assert.InDelta(t, 2e-6, f.PerTokenSec, 1e-12)
	assert.InDelta(t, 5e-5, f.PerExpertSec, 1e-12)
	assert.Less(t, f.MaxAbsPct, 1e-6)
	c := f.Apply(costmodel.Cluster{})
	assert.Equal(t, 2*time.Microsecond, c.TokenCost)
	assert.Equal(t, 50*time.Microsecond, c.ExpertCost)

	_, err = Calibrate(obs[:1])
	assert.Error(t, err)
}

func TestWriteCluster(t *testing.T) {
	c, err := costmodel.ClusterPreset("h100x8")
	require.NoError(t, err)
	c = Fit{PerTokenSec: 1.5e-6, PerExpertSec: 2e-5}.Apply(c)
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	require.NoError(t, WriteCluster(path, c))
	back, err := costmodel.LoadCluster(path)
	require.NoError(t, err)
	assert.Equal(t, c.TokenCost, back.TokenCost)
	assert.Equal(t, c.ExpertCost, back.ExpertCost)
	assert.Error(t, WriteCluster(filepath.Join(t.TempDir(), "no", "such", "dir.yaml"), c))
}

var _ = math.Abs

func TestSplitSlotsFollowsShares(t *testing.T) {
	lp := placement.LayerPlan{
		SlotExpert: []routing.Expert{0, 0, 1, 0},
		SlotGPU:    []placement.GPU{0, 1, 1, 2},
		SlotShare:  []float64{0.5, 0.25, 1, 0.25},
	}
	got := splitSlots(lp, []float64{10, 7})
	assert.Equal(t, []int{5, 3, 7, 2}, got, "10 tokens as 5/2.5/2.5: the first .5 remainder wins")
	lp.SlotShare = nil
	assert.Equal(t, []int{4, 3, 7, 3}, splitSlots(lp, []float64{10, 7}))
}

// Under local dispatch the workload splits each expert's tokens by the
// local shares and sim models communication with the same dispatch: on a
// plan whose extra copies sit on the other node, sim's per-layer compute
// tail is the cost model's up to token rounding and its communication is
// the cost model's exactly.
func TestSimLocalDispatch(t *testing.T) {
	tr, c, m := loadFLAME(t)
	c = c.WithNodes(2)
	c.GPUsPerNode = 4
	plan := &placement.Plan{GPUs: 8, Experts: 64}
	for range tr.Layers {
		var lp placement.LayerPlan
		for e := 0; e < 64; e++ {
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
			lp.SlotGPU = append(lp.SlotGPU, placement.GPU(e/8))
		}
		for e := 0; e < 64; e += 8 { // one extra copy per GPU, other node
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
			lp.SlotGPU = append(lp.SlotGPU, placement.GPU((e/8+4)%8))
		}
		// Expert 1 on GPUs 0, 1 (node 0) and 5 (node 1): under local
		// dispatch the lone copy on node 1 serves half the tokens.
		lp.SlotExpert = append(lp.SlotExpert, 1, 1)
		lp.SlotGPU = append(lp.SlotGPU, 1, 5)
		plan.Layers = append(plan.Layers, lp)
	}
	w, err := NewWorkload(plan, Input{Trace: tr}, WorkloadOptions{Dispatch: placement.DispatchLocal, GPUsPerNode: 4})
	require.NoError(t, err)
	even, err := NewWorkload(plan, Input{Trace: tr}, WorkloadOptions{})
	require.NoError(t, err)
	ro := RunOptions{Cluster: c, Model: m, Dispatch: placement.DispatchLocal}
	sim, err := Sim{}.Run(context.Background(), w, ro)
	require.NoError(t, err)
	rep, err := costmodel.Evaluate(plan, tr.Stats(routing.StatsOptions{}), c, m, costmodel.Options{Dispatch: placement.DispatchLocal})
	require.NoError(t, err)
	perTok, _ := c.Coefficients(m)
	for l, lr := range rep.Layers {
		// A GPU has at most 10 slots, each off by at most one token.
		assert.InDelta(t, lr.ComputeTail.Seconds(), sim.Layers[l].Tail.Seconds(), 10*perTok+2e-9, "layer %d tail", l)
		assert.InDelta(t, lr.CommTime.Seconds(), sim.Layers[l].Comm.Seconds(), 2e-9, "layer %d comm", l)
		// Same tokens, split differently for expert 1: the copy on GPU 5
		// (slot 73) gets half, the others a quarter each.
		assert.Equal(t, sum(w.SlotTokens[0][l]), sum(even.SlotTokens[0][l]), "layer %d: same tokens", l)
		n1 := w.SlotTokens[0][l][1] + w.SlotTokens[0][l][72] + w.SlotTokens[0][l][73]
		assert.InDelta(t, float64(n1)/2, float64(w.SlotTokens[0][l][73]), 1, "layer %d", l)
		assert.InDelta(t, float64(n1)/3, float64(even.SlotTokens[0][l][73]), 1, "layer %d", l)
	}
	_, err = NewWorkload(plan, Input{Trace: tr}, WorkloadOptions{Dispatch: placement.DispatchLocal})
	assert.ErrorContains(t, err, "nodes of 0")
}

func sum(x []int) int {
	s := 0
	for _, v := range x {
		s += v
	}
	return s
}
