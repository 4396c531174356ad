package solver_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	. "github.com/moetuner/moetuner/solver"
)

// A solve given a 2 s limit on the 32,768-token DeepSeek-V3-shaped trace
// (58 layers × 256 experts, top-8, per-token with source ranks; 4 nodes ×
// 8 GPUs) returns within 2.2 s of its call, the trace already read (on a
// loaded machine the limit is three times the solve's floor, its run with
// a 1 ms limit, when that is longer, and the allowance past it the floor),
// on the affinity search's paths: the home flow with 32 redundant slots
// under static dispatch, the chain flow without copies, and the home flow
// from a running plan under a move budget, under the optimal split, and
// on PCIe-linked nodes (NVLink ports counted). Its plan is valid and its
// cost recomputes. A search that counted its limit per layer or per
// phase ends past it; one that scored its plan again after the limit
// does on an idle machine, where the floor is short.
func TestSynthetic32kTwoSecondLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("reads a 30 MB trace")
	}
	path := filepath.Join(sharedTraces(t), "synthetic-deepseek-v3", "ds3-prefill4096-32k.npy")
	if _, err := os.Stat(path); err != nil {
		t.Skip("the synthetic trace is absent")
	}
	src, err := routing.Load(path, routing.LoadOptions{})
	require.NoError(t, err)
	m, err := costmodel.ModelPreset("deepseek-v3")
	require.NoError(t, err)
	c, err := costmodel.ClusterPreset("4xh100x8")
	require.NoError(t, err)
	home := Problem{Stats: src.Stats, Cluster: c, Model: m, RedundantSlots: 32, Dispatch: placement.DispatchStaticMean}
	eplb, err := Solve(context.Background(), home, Options{Strategy: StrategyEPLB})
	require.NoError(t, err)
	budget := home
	budget.Current = eplb.Plan
	split := home
	split.Dispatch, split.Split = placement.DispatchEven, SplitOptimal
	pcie := home
	pcie.Cluster.NVLinkGBps = 128 // PCIe Gen5 inside a node: the NVLink ports are counted
	for _, tc := range []struct {
		name     string
		p        Problem
		maxMoves int
	}{
		{"home-32-slots-static", home, 0},
		{"chain", Problem{Stats: src.Stats, Cluster: c, Model: m, Flow: costmodel.FlowChain}, 0},
		{"home-from-running-plan-16-moves", budget, 16},
		{"home-optimal-split", split, 0},
		{"home-pcie-nodes", pcie, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The floor: a 1 ms limit, what no limit can cut (a first
			// plan and its evaluation), which grows with the machine's
			// load; the limit under test is at least three times it, as
			// in the command line's TestTimeLimitHolds. The longer of two
			// runs, since the load changes from one second to the next.
			var floor time.Duration
			for range 2 {
				start := time.Now()
				_, err := Solve(context.Background(), tc.p, Options{Strategy: StrategyJoint, TimeLimit: time.Millisecond, MaxMoves: tc.maxMoves})
				floor = max(floor, time.Since(start))
				require.NoError(t, err)
			}
			limit := max(2*time.Second, 3*floor)
			start := time.Now()
			res, err := Solve(context.Background(), tc.p, Options{Strategy: StrategyJoint, TimeLimit: limit, MaxMoves: tc.maxMoves})
			took := time.Since(start)
			require.NoError(t, err)
			t.Logf("%s: %v for a %v limit (floor %v), %s, layer time %.4g s", tc.name, took.Round(time.Millisecond), limit.Round(time.Millisecond), floor.Round(time.Millisecond), res.Status, res.Report.TimeSec)
			// What follows the limit (the plan's last evaluation, the
			// certificate) slows with the load as the floor does: the
			// allowance is a tenth of the limit, or the floor when that
			// is longer (a loaded machine). A limit counted per layer or
			// per phase overruns by several times the limit.
			assert.LessOrEqual(t, took, limit+max(limit/10, floor))
			verify(t, tc.p, res)
		})
	}
}
