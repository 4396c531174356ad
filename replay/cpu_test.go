package replay

import (
	"context"
	"fmt"
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
	for _, name := range []string{"mixtral-joint.json", "mixtral-contiguous.json"} {
		w, err := NewWorkload(readPlan(t, name), Input{Stats: st}, cpuSetup.wopt)
		require.NoError(t, err)
		ws = append(ws, w)
	}
	// Many short interleaved rounds: a burst of other load hits one round of
	// one plan, and the per-entry median over rounds drops it. Under heavy
	// contention (go test ./... runs packages in parallel on 2 cores) one
	// measurement can still flip a 5 % difference, so up to three attempts
	// are made; joint must win one, and the test fails if it loses all.
	var last string
	for attempt := 1; attempt <= 3; attempt++ {
		start := time.Now()
		ms, err := RunInterleaved(context.Background(), cpuSetup.cpu, ws, 9, RunOptions{Cluster: c, Model: m, Repeats: 1})
		require.NoError(t, err)
		joint, contig := ms[0], ms[1]
		assert.Equal(t, Measured, joint.Compute)
		assert.Equal(t, Modeled, joint.Communication)
		last = fmt.Sprintf("attempt %d, cpu replay in %v: mean per-layer tail joint %v, contiguous %v (%.1f%%); mean %v vs %v; modeled token tails %v vs %v",
			attempt, time.Since(start), joint.MeanLayerTail(), contig.MeanLayerTail(), 100*(joint.Tail.Seconds()/contig.Tail.Seconds()-1), joint.Mean, contig.Mean,
			maxTokSum(ws[0]), maxTokSum(ws[1]))
		t.Log(last)
		if joint.MeanLayerTail() < contig.MeanLayerTail() {
			return
		}
	}
	t.Errorf("joint's measured tail must be below contiguous's; three attempts lost, last: %s", last)
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
