package rebalance

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver"
)

// sharedTrace is the path of a trace under ../shared/traces beside the
// module root; the test is skipped when it is absent.
func sharedTrace(tb testing.TB, name string) string {
	tb.Helper()
	dir, err := os.Getwd()
	require.NoError(tb, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "..", "shared", "traces", name)
			if _, err := os.Stat(p); err != nil {
				tb.Skip("../shared/traces is absent")
			}
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Skip("no module root")
		}
		dir = parent
	}
}

// The window and budget of BenchmarkProposeAffinity32k.
const (
	// benchWindowTokens: two prefill passes of the trace's 4096 tokens,
	// which the solver keeps whole (exact paths). With 16384 tokens one
	// evaluation of the cost model took twice as long (0.87–1.05 s on the
	// loaded 2-core machine) and a 2 s Propose ran 2.95–4.1 s.
	benchWindowTokens = 8192
	benchStepTokens   = 4096
	// benchMaxMoves: a third of each layer's 288 slots (3 of every GPU's
	// 9). With 60 s from EPLB's plan on this window the search cut the
	// remote copies by 0.028 per token-layer with 32 moves, 0.081 with 96,
	// and 0.154 with every slot free (which moved up to 282), on the
	// 16384-token window; on this one 0.080 with 96 and 0.164 free. 96 is
	// the least of these budgets under which half the free cut is
	// reachable at all.
	benchMaxMoves = 96
)

// BenchmarkProposeAffinity32k: Propose from EPLB's plan of an 8k-token
// window of the 32k DeepSeek-V3 trace (4 nodes × 8 H100, 32 redundant
// slots, SGLang's static table), its tokens observed as two steps, with a
// deadline of 2 s (sub-benchmark 2s) and, for the cut the search reaches
// given more time, 10 s and a minute (10s, 1m0s). Metrics: remote-node
// copies per token-layer of the proposal and of EPLB's plan, their ratio,
// the most slots a layer changed, and the time Observe took per step (its
// tokens checked, counted and added to the path window).
func BenchmarkProposeAffinity32k(b *testing.B) {
	src, err := routing.Load(sharedTrace(b, "synthetic-deepseek-v3/ds3-prefill4096-32k.npy"), routing.LoadOptions{})
	require.NoError(b, err)
	m, err := costmodel.ModelPreset("deepseek-v3")
	require.NoError(b, err)
	c, err := costmodel.ClusterPreset("4xh100x8")
	require.NoError(b, err)
	win := src.Trace.Slice(0, benchWindowTokens)
	eplb, err := solver.Solve(context.Background(), solver.Problem{Stats: win.Stats(routing.StatsOptions{}), Cluster: c, Model: m,
		RedundantSlots: 32, Dispatch: placement.DispatchSGLangStatic}, solver.Options{Strategy: solver.StrategyEPLB})
	require.NoError(b, err)
	for _, limit := range []time.Duration{2 * time.Second, 10 * time.Second, time.Minute} {
		b.Run(limit.String(), func(b *testing.B) {
			r, err := New(Config{Cluster: c, Model: m, Initial: eplb.Plan, Window: benchWindowTokens / benchStepTokens, Dispatch: placement.DispatchSGLangStatic})
			require.NoError(b, err)
			steps := make([]*routing.Trace, 0, benchWindowTokens/benchStepTokens)
			for t := 0; t < benchWindowTokens; t += benchStepTokens {
				steps = append(steps, win.Slice(t, t+benchStepTokens))
			}
			t0 := time.Now()
			for _, st := range steps {
				require.NoError(b, r.Observe(Step{Tokens: st, Phase: PhasePrefill}))
			}
			observe := time.Since(t0)
			b.ResetTimer()
			var prop *Proposal
			for range b.N {
				prop, err = r.Propose(context.Background(), Budget{MaxMoves: benchMaxMoves, Time: limit})
				require.NoError(b, err)
			}
			b.StopTimer()
			b.ReportMetric(prop.Remote, "remote/token-layer")
			b.ReportMetric(prop.CurrentRemote, "eplb-remote/token-layer")
			b.ReportMetric(prop.Remote/prop.CurrentRemote, "ratio-vs-eplb")
			most := 0
			for _, n := range prop.Moved {
				most = max(most, n)
			}
			b.ReportMetric(float64(most), "max-moved/layer")
			b.ReportMetric(observe.Seconds()*1e3/float64(len(steps)), "observe-ms/step")
			b.Logf("status %v, solve %v, layers kept %d, layer time %.4f → %.4f ms", prop.Status, prop.SolveTime.Round(time.Millisecond), prop.Kept, prop.CurrentLayerSec*1e3, prop.LayerSec*1e3)
		})
	}
}
