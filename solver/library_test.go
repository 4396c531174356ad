package solver_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	. "github.com/moetuner/moetuner/solver"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// deepseekCounts is count-only statistics of DeepSeek-V3's shape (58 MoE
// layers of 256 experts, top-8) that record neither their layer ids nor
// the decoder layers: the model preset knows both (61 decoder layers, the
// first 3 dense).
func deepseekCounts(seed uint64) *routing.Stats {
	rng := rand.New(rand.NewPCG(seed, 35))
	load := make([][]float64, 58)
	for l := range load {
		load[l] = make([]float64, 256)
		for e := range load[l] {
			load[l][e] = float64(1 + rng.IntN(4000))
		}
	}
	return routing.StatsFromLoad(load, 8)
}

// What a new user writes: Solve with only statistics and a cluster, then
// write the SGLang file with the result's layout. The model Solve
// inferred and the layout it implies come back with the result, and
// SGLang's map (one row per decoder layer) reads back to the same plan,
// its MoE layers at decoder layers 3..60. Without Result.Layout (a zero
// layout) the write fails with placement.ErrNeedLayers, as the problem's
// own layout used to once the model was left to Solve.
func TestSolveThenWriteSGLang(t *testing.T) {
	p := Problem{Stats: deepseekCounts(1), Cluster: testkit.SmallCluster(2, 8)}
	res, err := Solve(context.Background(), p, Options{Strategy: StrategyEPLB})
	require.NoError(t, err)
	want, err := costmodel.InferModel(p.Stats)
	require.NoError(t, err)
	assert.Equal(t, "deepseek-v3", res.Model.Name)
	assert.Equal(t, want, res.Model)
	assert.Equal(t, 61, res.Layout.ModelLayers)
	require.Len(t, res.Layout.LayerIDs, 58)
	assert.Equal(t, 3, res.Layout.LayerIDs[0])
	assert.Equal(t, 60, res.Layout.LayerIDs[57])
	assert.Equal(t, placement.Layout{GPUs: 16, Experts: 256, Layers: 58, LayerIDs: res.Layout.LayerIDs, ModelLayers: 61}, res.Layout)
	assert.Equal(t, res.Layout, p.Layout(), "the problem's layout infers the same model")

	out := filepath.Join(t.TempDir(), "plan.sglang.json")
	require.NoError(t, placement.WriteFileWith(out, res.Plan, placement.FormatSGLang, res.Layout))
	back, err := placement.ReadFileWith(out, res.Layout)
	require.NoError(t, err)
	require.Len(t, back.Layers, 58)
	for l := range back.Layers {
		assert.Equal(t, res.Plan.Layers[l].SlotExpert, back.Layers[l].SlotExpert, "layer %d", l)
	}
	err = placement.WriteFileWith(filepath.Join(t.TempDir(), "zero.sglang.json"), res.Plan, placement.FormatSGLang, placement.Layout{})
	assert.ErrorIs(t, err, placement.ErrNeedLayers)
}

// A given model is the one the result carries, and its layout is the
// problem's.
func TestResultCarriesGivenModel(t *testing.T) {
	p := mixtralProblem(t)
	res, err := Solve(context.Background(), p, Options{Strategy: StrategyGreedy})
	require.NoError(t, err)
	assert.Equal(t, p.Model, res.Model)
	assert.Equal(t, p.Layout(), res.Layout)
	assert.Equal(t, 32, res.Layout.ModelLayers)
}

// Evaluate scores a plan exactly as Solve scored it, model inference and
// top-k included: on count-only statistics without a model (the defaults
// matter: without them the cost model has no model to price), for a
// baseline, a replicated plan and joint's plan; and a plan of another
// cluster is an error, not a panic.
func TestEvaluateMatchesSolve(t *testing.T) {
	counts := routing.StatsFromLoad(mixtralProblem(t).Stats.Load, 0)
	cases := map[string]struct {
		p    Problem
		opts Options
	}{
		"greedy, model inferred": {Problem{Stats: counts, Cluster: testkit.SmallCluster(1, 4)}, Options{Strategy: StrategyGreedy}},
		"eplb with replicas":     {Problem{Stats: counts, Cluster: testkit.SmallCluster(2, 2), RedundantSlots: 4}, Options{Strategy: StrategyEPLB}},
		"joint, sequential":      {Problem{Stats: counts, Cluster: testkit.SmallCluster(1, 4), Mode: costmodel.Sequential}, Options{Strategy: StrategyJoint, Effort: 1, TimeLimit: 20 * time.Second}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			res, err := Solve(context.Background(), tc.p, tc.opts)
			require.NoError(t, err)
			rep, err := Evaluate(tc.p, res.Plan)
			require.NoError(t, err)
			assert.Equal(t, res.Report.TimeSec, rep.TimeSec)
			assert.Equal(t, res.Objective, rep.TimeSec)
			assert.Equal(t, res.Report.CrossNodeBytes, rep.CrossNodeBytes)
			assert.Equal(t, res.Report.MaxBalance, rep.MaxBalance)
		})
	}
	p := Problem{Stats: counts, Cluster: testkit.SmallCluster(1, 4)}
	other, err := Solve(context.Background(), Problem{Stats: counts, Cluster: testkit.SmallCluster(1, 2)}, Options{Strategy: StrategyGreedy})
	require.NoError(t, err)
	_, err = Evaluate(p, other.Plan)
	assert.ErrorContains(t, err, "solver: Evaluate: the plan is for 2 GPUs but Problem.Cluster has 4")
	_, err = Evaluate(Problem{Cluster: p.Cluster}, other.Plan)
	assert.ErrorContains(t, err, "solver: problem has no statistics")
	_, err = Evaluate(p, nil)
	assert.Error(t, err)
}

// In a build without cgo (no HiGHS, so no default backend) the strategies
// that need an ILP return a *BackendError naming the build requirement,
// before any search, and the others run: the baselines, and joint where
// it needs no ILP (replicated problems: the packing, and on several nodes
// with per-token traces the affinity search).
func TestWithoutILPBackend(t *testing.T) {
	ctx := context.Background()
	mix := mixtralProblem(t)
	for _, tc := range []struct {
		name string
		p    Problem
		st   Strategy
	}{
		{"moetuner", mix, StrategyMoETuner},
		{"joint, single copy", mix, StrategyJoint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, err := Solve(ctx, tc.p, WithoutDefaultBackend(Options{Strategy: tc.st, TimeLimit: time.Minute}))
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrNoILPBackend)
			var be *BackendError
			require.True(t, errors.As(err, &be), "%T", err)
			assert.Equal(t, tc.st, be.Strategy)
			for _, want := range []string{"without cgo", "CGO_ENABLED=1", "Options.Backend", "eplb"} {
				assert.Contains(t, err.Error(), want)
			}
			assert.Less(t, time.Since(start), 20*time.Second, "refused before searching")
		})
	}

	rng := rand.New(rand.NewPCG(35, 4))
	tr := testkit.RandomTrace(rng, 300, 3, 16, 2)
	perToken := tr.Stats(routing.StatsOptions{})
	for _, tc := range []struct {
		name string
		p    Problem
		st   Strategy
	}{
		{"eplb", mix, StrategyEPLB},
		{"greedy", mix, StrategyGreedy},
		{"joint, replicated", Problem{Stats: mix.Stats, Cluster: testkit.SmallCluster(1, 4), Model: mix.Model, RedundantSlots: 4}, StrategyJoint},
		{"joint, affinity search", Problem{Stats: perToken, Cluster: testkit.SmallCluster(2, 4), Model: testkit.FakeModel(16, 2), RedundantSlots: 8}, StrategyJoint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Solve(ctx, tc.p, WithoutDefaultBackend(Options{Strategy: tc.st, TimeLimit: 2 * time.Second}))
			require.NoError(t, err)
			if tc.name == "joint, affinity search" {
				assert.Contains(t, res.Note, "affinity search", "the affinity search made the plan")
			}
			require.NoError(t, res.Plan.Validate(placement.ValidateOptions{Experts: tc.p.Stats.Experts, Layers: tc.p.Stats.Layers}))
			rep, err := Evaluate(tc.p, res.Plan)
			require.NoError(t, err)
			assert.Equal(t, rep.TimeSec, res.Objective)
		})
	}
}

// Result.ModelObjective and Gap describe the returned plan: when the
// repair to Problem.MaxImbalance moves experts of joint's ILP plan, they
// are recomputed for the repaired plan (the dual bound holds for every
// plan), not left at the ILP's. A property of any budget; on this trace
// (2 nodes, per-token, the cap a fiftieth of the way from the free plan's
// worst layer to 1) the repair changes a layer in the runs measured.
func TestRepairedILPGap(t *testing.T) {
	tr := testkit.RandomTrace(rand.New(rand.NewPCG(1, 7)), 300, 3, 16, 2)
	p := Problem{Stats: tr.Stats(routing.StatsOptions{}), Cluster: testkit.SmallCluster(2, 2), Model: testkit.FakeModel(16, 2)}
	opts := Options{Strategy: StrategyJoint, TimeLimit: 2 * time.Second}
	free, err := Solve(context.Background(), p, opts)
	require.NoError(t, err)
	worst := 0.0
	for _, r := range layerRatios(t, p, free.Plan) {
		worst = max(worst, r)
	}
	p.MaxImbalance = worst - (worst-1)/50
	res, err := Solve(context.Background(), p, opts)
	var inf *InfeasibleError
	if errors.As(err, &inf) {
		t.Skipf("no plan met the cap in this run: %v", err)
	}
	require.NoError(t, err)
	t.Logf("note %q", res.Note)
	mo, err := JointModelObjective(p, res.Plan, opts)
	require.NoError(t, err)
	assert.InDelta(t, mo, res.ModelObjective, 1e-12*mo)
	assert.LessOrEqual(t, res.Bound, mo*(1+1e-12))
	assert.InDelta(t, math.Max(0, (mo-res.Bound)/mo), res.Gap, 1e-12)
}
