package solver_test

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	. "github.com/moetuner/moetuner/solver"
	"github.com/moetuner/moetuner/solver/internal/testkit"
	"github.com/moetuner/moetuner/solvertest"
)

func loadStats(t testing.TB, rel string) (*routing.Stats, *routing.Source) {
	t.Helper()
	src, err := routing.Load(filepath.Join("..", "testdata", rel), routing.LoadOptions{})
	require.NoError(t, err)
	return src.Stats, src
}

func mixtralProblem(t testing.TB) Problem {
	stats, _ := loadStats(t, "mixtral-8x7b/fiddler")
	require.Equal(t, 32, stats.Layers)
	require.Equal(t, 8, stats.Experts)
	m, err := costmodel.ModelPreset("mixtral-8x7b")
	require.NoError(t, err)
	return Problem{Stats: stats, Cluster: testkit.SmallCluster(1, 4), Model: m}
}

func flameProblem(t testing.TB, nodes int, flow costmodel.Flow) Problem {
	stats, _ := loadStats(t, "flame-moe-290m/trace.jsonl")
	m, err := costmodel.ModelPreset("flame-moe-290m")
	require.NoError(t, err)
	return Problem{Stats: stats, Cluster: testkit.SmallCluster(nodes, 8/nodes), Model: m, Flow: flow}
}

// bruteMinMax returns the smallest busiest-GPU load over every way of
// putting the E experts of one layer on G GPUs with E/G each.
func bruteMinMax(load []float64, G int) float64 {
	best := math.Inf(1)
	for _, a := range testkit.Assignments(len(load), G) {
		t := make([]float64, G)
		for e, g := range a {
			t[g] += load[e]
		}
		mx := 0.0
		for _, v := range t {
			mx = math.Max(mx, v)
		}
		best = math.Min(best, mx)
	}
	return best
}

// verify checks what every solver test must: the plan validates and its
// cost recomputes to the reported objective.
// verify validates res for p and recomputes its cost (solvertest.Check).
func verify(t *testing.T, p Problem, res *Result) {
	t.Helper()
	solvertest.Verify(t, p, res)
}

func TestMixtralJointBusiestGPUIsOptimal(t *testing.T) {
	p := mixtralProblem(t)
	// A work budget: a time limit on a loaded machine may stop HiGHS
	// before it proves the optimum.
	res, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint, Effort: 10, RelGap: -1})
	require.NoError(t, err)
	verify(t, p, res)
	assert.Equal(t, StatusOptimal, res.Status)
	for l, lr := range res.Report.Layers {
		assert.InDelta(t, bruteMinMax(p.Stats.Load[l], 4), lr.MaxTokens, 1e-6, "layer %d", l)
	}
}

// stirlingPartitions enumerates every partition of E experts into G
// non-empty unlabelled clusters (S(8,4) = 1701) as cluster labels.
func stirlingPartitions(E, G int) [][]int {
	var out [][]int
	cur := make([]int, E)
	var rec func(e, used int)
	rec = func(e, used int) {
		if e == E {
			if used == G {
				out = append(out, append([]int(nil), cur...))
			}
			return
		}
		for c := 0; c < used && c < G; c++ {
			cur[e] = c
			rec(e+1, used)
		}
		if used < G {
			cur[e] = used
			rec(e+1, used+1)
		}
	}
	rec(0, 0)
	return out
}

func TestMixtralMoETunerILP1IsOptimal(t *testing.T) {
	parts := stirlingPartitions(8, 4)
	require.Len(t, parts, 1701)
	p := mixtralProblem(t)
	res, err := Solve(context.Background(), p, Options{Strategy: StrategyMoETuner, Effort: 10, RelGap: -1})
	require.NoError(t, err)
	verify(t, p, res)
	want := 0.0
	for l := range p.Stats.Layers {
		load := p.Stats.Load[l]
		mean := 0.0
		for _, v := range load {
			mean += v / 4
		}
		best := math.Inf(1)
		for _, part := range parts {
			tc := make([]float64, 4)
			for e, c := range part {
				tc[c] += load[e]
			}
			o := 0.0
			for _, v := range tc {
				o += math.Abs(v - mean)
			}
			best = math.Min(best, o)
		}
		want += best
	}
	assert.InDelta(t, want, res.Stage1Objective, 1e-6*want)
	// Eq. 13: every GPU holds E·L/G = 64 experts over the model.
	for g, n := range expertsPerGPU(res.Plan) {
		assert.Equal(t, 64, n, "GPU %d", g)
	}
}

func expertsPerGPU(plan *placement.Plan) []int {
	out := make([]int, plan.GPUs)
	for l := range plan.Layers {
		for g, n := range plan.SlotsPerGPU(l) {
			out[g] += n
		}
	}
	return out
}

func TestMoETunerEq13Infeasible(t *testing.T) {
	// One layer whose only zero-deviation clustering has sizes {1,2,2,3}
	// ILP 2's Eq. 13 (E·L/G = 2 experts per GPU) cannot hold.
	stats := routing.StatsFromLoad([][]float64{{300, 150, 150, 150, 150, 100, 100, 100}}, 2)
	m := testkit.FakeModel(8, 2)
	p := Problem{Stats: stats, Cluster: testkit.SmallCluster(1, 4), Model: m}
	_, err := Solve(context.Background(), p, Options{Strategy: StrategyMoETuner, Effort: 1, RelGap: -1})
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrInfeasible)
	var ie *InfeasibleError
	require.True(t, errors.As(err, &ie))
	assert.Contains(t, err.Error(), "Eq. 13")

	// E·L not divisible by G.
	stats = routing.StatsFromLoad([][]float64{{3, 2, 1, 1, 1, 1}}, 2)
	p = Problem{Stats: stats, Cluster: testkit.SmallCluster(1, 4), Model: testkit.FakeModel(6, 2)}
	_, err = Solve(context.Background(), p, Options{Strategy: StrategyMoETuner})
	assert.ErrorIs(t, err, ErrInfeasible)

	// The equal-size variant always meets Eq. 13.
	stats = routing.StatsFromLoad([][]float64{{300, 150, 150, 150, 150, 100, 100, 100}}, 2)
	p = Problem{Stats: stats, Cluster: testkit.SmallCluster(1, 4), Model: m}
	res, err := Solve(context.Background(), p, Options{Strategy: StrategyMoETuner, MoETunerEqualSizes: true, RelGap: -1})
	require.NoError(t, err)
	verify(t, p, res)
}

// TestFLAMEJointBeatsBaselines is the acceptance check: on FLAME-MoE with
// 8 GPUs on 1 and 2 nodes, joint's modeled layer time is below contiguous
// and greedy in both flows.
func TestFLAMEJointBeatsBaselines(t *testing.T) {
	if testing.Short() {
		t.Skip("solves four ILPs")
	}
	for _, nodes := range []int{1, 2} {
		for _, flow := range []costmodel.Flow{costmodel.FlowHome, costmodel.FlowChain} {
			t.Run(flow.String()+"-"+string(rune('0'+nodes))+"node", func(t *testing.T) {
				p := flameProblem(t, nodes, flow)
				// The home flow on a work budget, so that the result does not
				// depend on how loaded the machine is; the chain flow's
				// ILPs (under EffortMaxCols columns on one node) have root
				// nodes a work budget does not bound: Effort 3 took 14 min
				// on one node at load average 10, so it keeps 8 s.
				opts := Options{Strategy: StrategyJoint, Effort: 3}
				if flow == costmodel.FlowChain {
					opts = Options{Strategy: StrategyJoint, TimeLimit: 8 * time.Second}
				}
				res, err := Solve(context.Background(), p, opts)
				require.NoError(t, err)
				verify(t, p, res)
				for _, st := range []Strategy{StrategyContiguous, StrategyGreedy} {
					base, err := Solve(context.Background(), p, Options{Strategy: st})
					require.NoError(t, err)
					assert.Less(t, res.Objective, base.Objective, "joint vs %s", st)
				}
				assert.LessOrEqual(t, res.Objective, res.BaselineObjective)
				assert.False(t, math.IsNaN(res.Bound))
				assert.GreaterOrEqual(t, res.Gap, 0.0)
				if nodes == 1 && flow == costmodel.FlowHome {
					// The exact-cost bound with the certified busiest-GPU
					// counts (coverbound.go); the counting bound alone left
					// 15 % here. About 0.8 % is typical at 8 s; the time limit
					// makes the gap depend on the machine's speed (3.6 % under
					// the race detector), so 5 % leaves room for slow CI.
					t.Logf("joint %.4g s, %.2f%% above the exact-cost bound %.4g s", res.Objective, 100*res.CostGap, res.CostBound)
					assert.Less(t, res.CostGap, 0.05)
				}
			})
		}
	}
}

// TestFLAMEHoldout: a plan made from the first half of the trace keeps its
// advantage over contiguous on the second half.
func TestFLAMEHoldout(t *testing.T) {
	if testing.Short() {
		t.Skip("solves ILPs")
	}
	_, src := loadStats(t, "flame-moe-290m/trace.jsonl")
	train := src.Trace.Slice(0, 512).Stats(routing.StatsOptions{})
	test := src.Trace.Slice(512, 1024).Stats(routing.StatsOptions{})
	for _, flow := range []costmodel.Flow{costmodel.FlowHome, costmodel.FlowChain} {
		p := flameProblem(t, 1, flow)
		p.Stats = train
		// The home flow on a work budget; the chain flow's one-node ILP
		// has a root a work budget does not bound (see
		// TestFLAMEJointBeatsBaselines), so it keeps 6 s.
		opts := Options{Strategy: StrategyJoint, Effort: 1}
		if flow == costmodel.FlowChain {
			opts = Options{Strategy: StrategyJoint, TimeLimit: 6 * time.Second}
		}
		res, err := Solve(context.Background(), p, opts)
		require.NoError(t, err)
		cont, err := baseline.Contiguous(8, 64, 8)
		require.NoError(t, err)
		p.Stats = test
		jr, err := p.Scenario().Evaluate(res.Plan)
		require.NoError(t, err)
		cr, err := p.Scenario().Evaluate(cont)
		require.NoError(t, err)
		jointT, contT := jr.TimeSec, cr.TimeSec
		t.Logf("%s flow, held-out half: joint %.3g s vs contiguous %.3g s (%.1f%% better)", flow, jointT, contT, 100*(contT-jointT)/contT)
		assert.Less(t, jointT, contT, "flow %s", flow)
	}
}

// TestChainPermutationOracle: in a top-1 trace where expert e of layer l
// always continues to π(e) at layer l+1, the joint strategy in the chain
// flow co-locates every chain, so no bytes move between layers.
func TestChainPermutationOracle(t *testing.T) {
	const T, L, E = 800, 3, 8
	tr := &routing.Trace{Tokens: T, Layers: L, TopK: 1, Experts: E, IDs: make([]int16, T*L)}
	pi := []int{3, 0, 6, 1, 7, 2, 5, 4}
	for tok := range T {
		e := (tok * 7 % 13) % E
		if tok%3 == 0 {
			e = tok % 2 // skew so balancing matters too
		}
		for l := range L {
			tr.IDs[tok*L+l] = int16(e)
			e = pi[e]
		}
	}
	p := Problem{Stats: tr.Stats(routing.StatsOptions{}), Cluster: testkit.SmallCluster(1, 4), Model: testkit.FakeModel(E, 1), Flow: costmodel.FlowChain}
	res, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint, Effort: 1, RelGap: -1})
	require.NoError(t, err)
	verify(t, p, res)
	for l := 1; l < L; l++ {
		moved := 0.0
		for src, row := range res.Report.Layers[l].Dispatch {
			for dst, b := range row {
				if src != dst {
					moved += b
				}
			}
		}
		assert.Zero(t, moved, "layer %d transition bytes", l)
	}
}

func TestBaselinesAreHeuristic(t *testing.T) {
	p := mixtralProblem(t)
	for _, st := range []Strategy{StrategyContiguous, StrategyRoundRobin, StrategyGreedy} {
		res, err := Solve(context.Background(), p, Options{Strategy: st})
		require.NoError(t, err)
		verify(t, p, res)
		assert.Equal(t, StatusHeuristic, res.Status)
		assert.True(t, math.IsNaN(res.Gap))
	}
	// A backend that fails is an error of the ILP strategies, not of the
	// baselines.
	_, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint, Backend: failingBackend{}})
	assert.ErrorContains(t, err, "MIP backend failed")
	_, err = Solve(context.Background(), p, Options{Strategy: StrategyGreedy, Backend: failingBackend{}})
	assert.NoError(t, err)
}

// failingBackend fails every solve.
type failingBackend struct{}

func (failingBackend) Solve(context.Context, *mip.Model, mip.Options) (*mip.Solution, error) {
	return &mip.Solution{Status: mip.Error}, nil
}

func TestSolveErrors(t *testing.T) {
	p := mixtralProblem(t)
	p.Cluster = testkit.SmallCluster(1, 16)
	_, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint})
	assert.ErrorIs(t, err, ErrInfeasible, "16 GPUs for 8 experts")
	p = mixtralProblem(t)
	p.Cluster = testkit.SmallCluster(1, 3)
	_, err = Solve(context.Background(), p, Options{Strategy: StrategyJoint})
	assert.ErrorIs(t, err, ErrInfeasible, "8 experts on 3 GPUs")
	p.Stats = nil
	_, err = Solve(context.Background(), p, Options{Strategy: StrategyJoint})
	assert.Error(t, err)
	_, err = ParseStrategy("nope")
	assert.Error(t, err)
}
