package replay

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/routing"
)

func mixtral(t testing.TB) (*routing.Stats, costmodel.Cluster, costmodel.Model) {
	t.Helper()
	src, err := routing.Load(filepath.Join("..", "testdata", "mixtral-8x7b", "fiddler"), routing.LoadOptions{})
	require.NoError(t, err)
	c, err := costmodel.ClusterPreset("h100x8")
	require.NoError(t, err)
	c.GPUsPerNode = 4 // MoETuner's EP4 for Mixtral
	m, err := costmodel.ModelPreset("mixtral-8x7b")
	require.NoError(t, err)
	return src.Stats, c, m
}

// cpuSetup is the small cpu replay the tests use: one sampled batch of 256
// tokens (512 routings per layer) through all 32 layers at hidden 128.
var cpuSetup = struct {
	cpu  CPU
	wopt WorkloadOptions
}{CPU{Hidden: 128, FFN: 448, TokenScale: 1.0 / 16}, WorkloadOptions{BatchTokens: 4096, Iterations: 1}}

func TestCPUJointTailBelowContiguous(t *testing.T) {
	if testing.Short() {
		t.Skip("cpu replay runs GEMMs")
	}
	st, c, m := mixtral(t)
	var ws []*Workload
	for _, name := range []string{"mixtral-contiguous.json", "mixtral-joint.json"} {
		w, err := NewWorkload(readPlan(t, name), Input{Stats: st}, cpuSetup.wopt)
		require.NoError(t, err)
		ws = append(ws, w)
	}
	// Joint's busiest GPUs hold 5.0 % fewer tokens in this batch. Measured
	// with intervals, the tail difference must be resolved below 0 (as the
	// README's three runs are, at hidden 128) and the mean (the same work)
	// within ±2 %. Hidden 64 measures as surely in a quarter of the time
	// (the README's table of a plan against itself). Compare stops as soon
	// as the difference is resolved; the 40-round budget is for a loaded
	// machine, where 12 rounds left it within noise.
	start := time.Now()
	cpu := CPU{Hidden: 64, FFN: 224, TokenScale: cpuSetup.cpu.TokenScale}
	cmp, err := Compare(context.Background(), cpu, ws, RunOptions{Cluster: c, Model: m, Repeats: 1}, CompareOptions{MaxRounds: 40})
	require.NoError(t, err)
	d := cmp.Diffs[0]
	t.Logf("cpu replay, %d rounds in %v (%s): joint vs contiguous tail %s, mean %s; modeled token tails %v vs %v",
		cmp.Rounds, time.Since(start), cmp.Stop, d.Tail, d.Mean, maxTokSum(ws[1]), maxTokSum(ws[0]))
	assert.Equal(t, Measured, cmp.Measurements[1].Compute)
	assert.Equal(t, Modeled, cmp.Measurements[1].Communication)
	assert.Less(t, d.Tail.Hi, 0.0, "joint's measured tail must be below contiguous's with 95 %% confidence: %s", d.Tail)
	assert.InDelta(t, 0, d.Mean.Estimate, 0.02, "both plans run the same work: %s", d.Mean)
}

func maxTokSum(w *Workload) int {
	s := 0
	for l := range w.Layers() {
		s += slicesMax(w.GPUTokens(0, l))
	}
	return s
}

func slicesMax(v []int) int {
	m := 0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func TestCPUCalibration(t *testing.T) {
	if testing.Short() {
		t.Skip("cpu replay runs GEMMs")
	}
	st, c, m := mixtral(t)
	w, err := NewWorkload(readPlan(t, "mixtral-contiguous.json"), Input{Stats: st}, cpuSetup.wopt)
	require.NoError(t, err)
	ms, err := RunInterleaved(context.Background(), cpuSetup.cpu, []*Workload{w}, 2, RunOptions{Cluster: c, Model: m, Repeats: 3})
	require.NoError(t, err)
	fit, err := Calibrate(Observations(w, ms[0], cpuSetup.cpu.ScaledTokens))
	require.NoError(t, err)
	t.Logf("fit: %.3g s/token, %.3g s/expert; per GPU-layer error mean %.2f%% max %.2f%%; tail mean %.2f%% max %.2f%%",
		fit.PerTokenSec, fit.PerExpertSec, fit.MeanAbsPct, fit.MaxAbsPct, fit.TailMeanAbsPct, fit.TailMaxAbsPct)

	// The cost model with the fitted coefficients, at the cpu's scaled size,
	// predicts the measured per-GPU compute.
	scaled := m
	scaled.Hidden, scaled.FFN, scaled.BytesPerExpert = 128, 448, 0
	acc, err := CheckModel(w, ms[0], fit.Apply(c), scaled, cpuSetup.cpu.TokenScale)
	require.NoError(t, err)
	t.Logf("costmodel.Evaluate vs cpu measurement: mean |error| %.2f%% (max %.2f%%), tail mean %.2f%% over %d GPU-layers", acc.MeanAbsPct, acc.MaxAbsPct, acc.TailMeanAbsPct, acc.N)
	assert.Less(t, acc.MeanAbsPct, 15.0)
	assert.Less(t, acc.TailMeanAbsPct, 15.0)
	assert.Less(t, fit.MeanAbsPct, 15.0)
	assert.Less(t, fit.TailMeanAbsPct, 15.0)
}
