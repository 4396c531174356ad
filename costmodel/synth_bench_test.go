package costmodel_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/internal/sharedfiles"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// synth32k reads the shared 32,768-token DeepSeek-V3-shaped trace, or
// skips when it is absent.
func synth32k(b *testing.B) *routing.Stats {
	b.Helper()
	path := sharedfiles.Find("shared/traces/synthetic-deepseek-v3/ds3-prefill4096-32k.npy")
	if path == "" {
		b.Skip("the shared synthetic trace is absent")
	}
	src, err := routing.Load(path, routing.LoadOptions{})
	require.NoError(b, err)
	return src.Stats
}

// BenchmarkEvaluateSynthetic32k: one evaluation of an EPLB plan on the
// 32k-token trace, 4 nodes × 8 GPUs, in the two settings the affinity
// search serves: the home flow with 32 redundant slots under static
// dispatch (per-source shares of every copy), and the chain flow.
func BenchmarkEvaluateSynthetic32k(b *testing.B) {
	st := synth32k(b)
	c, err := costmodel.ClusterPreset("4xh100x8")
	require.NoError(b, err)
	m, err := costmodel.ModelPreset("deepseek-v3")
	require.NoError(b, err)
	for _, tc := range []struct {
		name string
		red  int
		flow costmodel.Flow
		disp placement.Dispatch
	}{
		{"home-static-32slots", 32, costmodel.FlowHome, placement.DispatchStaticMean},
		{"chain", 0, costmodel.FlowChain, placement.DispatchEven},
	} {
		b.Run(tc.name, func(b *testing.B) {
			plan, err := baseline.EPLB(st, c.GPUs(), baseline.EPLBOptions{RedundantSlots: tc.red, Nodes: c.Nodes, FixDuplicates: true})
			require.NoError(b, err)
			sc := costmodel.Scenario{Stats: st, Cluster: c, Model: m, Flow: tc.flow, Dispatch: tc.disp}
			var rep *costmodel.Report
			for b.Loop() {
				rep, err = sc.Evaluate(plan)
				require.NoError(b, err)
			}
			b.ReportMetric(rep.TimeSec*1e3, "model-ms")
		})
	}
}
