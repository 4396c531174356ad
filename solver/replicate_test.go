package solver_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/solver/internal/testkit"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	. "github.com/moetuner/moetuner/solver"
)

func replicatedProblem(load [][]float64, nodes, perNode, redundant int) Problem {
	return Problem{Stats: routing.StatsFromLoad(load, 2), Cluster: testkit.SmallCluster(nodes, perNode), Model: testkit.FakeModel(len(load[0]), 2), RedundantSlots: redundant}
}

// bruteBusiest is the smallest busiest-GPU load over every replicated
// plan: every way of filling G GPUs × S slots with experts (each at least
// once, no two copies on one GPU), tokens split evenly over copies.
func bruteBusiest(load []float64, G, S int) float64 {
	slots := make([]int, G)
	for g := range slots {
		slots[g] = S
	}
	return testkit.BruteBusiestSlots(load, slots)
}

func TestReplicatedBoundIsValidAndTight(t *testing.T) {
	cases := []struct {
		name string
		load []float64
		G, R int // GPUs, redundant slots
	}{
		{"one hot expert", []float64{900, 50, 30, 20}, 2, 2},
		{"two hot", []float64{500, 400, 60, 40, 30, 10}, 3, 3},
		{"flat", []float64{100, 100, 100, 100, 100, 100}, 3, 3},
		{"skewed 4 gpus", []float64{1000, 300, 200, 100, 50, 50, 20, 10}, 4, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := replicatedProblem([][]float64{tc.load}, 1, tc.G, tc.R)
			res, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint, Effort: 100})
			require.NoError(t, err)
			verify(t, p, res)
			opt := bruteBusiest(tc.load, tc.G, (len(tc.load)+tc.R)/tc.G)
			b := res.Balance.Layers[0]
			assert.LessOrEqual(t, b.Bound, opt*(1+1e-12), "the bound must not exceed the true optimum")
			assert.GreaterOrEqual(t, b.Busiest, opt*(1-1e-12))
			assert.InDelta(t, opt, b.Busiest, 0.05*opt, "heuristic within 5%% of brute force")
			assert.InDelta(t, res.Report.Layers[0].MaxTokens, b.Busiest, 1e-6*b.Busiest, "balance report agrees with the cost model")
		})
	}
}

func TestReplicatedErrors(t *testing.T) {
	load := [][]float64{{5, 4, 3, 2, 1, 1}}
	p := replicatedProblem(load, 1, 4, 1) // 7 slots on 4 GPUs
	_, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint})
	assert.ErrorIs(t, err, ErrInfeasible)
	assert.Contains(t, err.Error(), "redundant slots")

	p = replicatedProblem(load, 1, 2, 2)
	p.Cluster.GPUMemBytes = 1 << 30 // 1 GiB for 4 Mixtral-size experts
	_, err = Solve(context.Background(), p, Options{Strategy: StrategyJoint})
	assert.ErrorIs(t, err, ErrInfeasible)
	assert.Contains(t, err.Error(), "GiB missing")

	// Per-GPU memory: only GPU 1 is short.
	p = replicatedProblem(load, 1, 2, 2)
	p.Cluster.MemBytes = []int64{1 << 40, 1 << 30}
	_, err = Solve(context.Background(), p, Options{Strategy: StrategyJoint})
	assert.ErrorIs(t, err, ErrInfeasible)
	assert.Contains(t, err.Error(), "GPU 1 needs")
}

func TestReplicatedHeterogeneousSpeed(t *testing.T) {
	load := [][]float64{{400, 300, 200, 100, 100, 100, 50, 50}}
	p := replicatedProblem(load, 1, 2, 0)
	p.Cluster.Speed = []float64{3, 1}
	p.SlotsPerGPU = []int{6, 2}
	res, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint})
	require.NoError(t, err)
	verify(t, p, res)
	lr := res.Report.Layers[0]
	assert.Greater(t, lr.Tokens[0], 2*lr.Tokens[1], "the 3× faster GPU takes most tokens")
	assert.Equal(t, []int{6, 2}, res.Plan.SlotsPerGPU(0))
}

func TestReplicatedGroupsStayOnNode(t *testing.T) {
	load := make([]float64, 16)
	for e := range load {
		load[e] = float64(1000 / (e + 1))
	}
	p := replicatedProblem([][]float64{load, load}, 2, 2, 4) // 20 slots, 5 per GPU
	p.ExpertGroups = 4
	res, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint})
	require.NoError(t, err)
	verify(t, p, res)
	for l := range res.Plan.Layers {
		for e, gs := range res.Plan.ExpertGPUs(l) {
			groupNode := -1
			for _, g := range gs {
				nd := int(g) / 2
				if groupNode < 0 {
					groupNode = nd
				}
				assert.Equal(t, groupNode, nd, "layer %d expert %d copies on one node", l, e)
			}
		}
		// All experts of a group on one node.
		for gr := range 4 {
			nodes := map[int]bool{}
			for e := gr * 4; e < gr*4+4; e++ {
				for _, g := range res.Plan.ExpertGPUs(l)[e] {
					nodes[int(g)/2] = true
				}
			}
			assert.Len(t, nodes, 1, "group %d", gr)
		}
	}
}

// Incremental re-placement stays within its move budget and uses it: with
// one swap allowed (two slots) it makes a swap that lowers the busiest
// GPU, as brute force over every single swap shows one exists; more moves
// never end worse. Returning Current unchanged fails the first check;
// ignoring the budget fails the second.
func TestIncrementalRespectsMoveBudget(t *testing.T) {
	old := [][]float64{{100, 90, 80, 70, 60, 50, 40, 30}}
	p := replicatedProblem(old, 1, 4, 0)
	cur, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint})
	require.NoError(t, err)
	// Traffic shifts: the two coldest experts become the hottest.
	newLoad := [][]float64{{30, 40, 50, 60, 70, 80, 200, 190}}
	q := replicatedProblem(newLoad, 1, 4, 0)
	q.Current = cur.Plan
	curRep, err := q.Scenario().Evaluate(cur.Plan)
	require.NoError(t, err)
	// The best single swap, by brute force.
	bestSwap := curRep.Layers[0].MaxTokens
	lp := cur.Plan.Layers[0]
	for a := range lp.SlotGPU {
		for b := a + 1; b < len(lp.SlotGPU); b++ {
			if lp.SlotGPU[a] == lp.SlotGPU[b] {
				continue
			}
			sw := cur.Plan.Clone()
			sw.Layers[0].SlotGPU[a], sw.Layers[0].SlotGPU[b] = lp.SlotGPU[b], lp.SlotGPU[a]
			rep, err := q.Scenario().Evaluate(sw)
			require.NoError(t, err)
			bestSwap = math.Min(bestSwap, rep.Layers[0].MaxTokens)
		}
	}
	require.Less(t, bestSwap, curRep.Layers[0].MaxTokens, "the instance must have a beneficial swap")
	prev := math.Inf(1)
	for _, k := range []int{2, 4, 0} {
		res, err := Solve(context.Background(), q, Options{Strategy: StrategyJoint, MaxMoves: k})
		require.NoError(t, err)
		verify(t, q, res)
		moved := changedSlots(cur.Plan, res.Plan)
		busiest := res.Report.Layers[0].MaxTokens
		if k > 0 {
			assert.LessOrEqual(t, moved, k, "k=%d", k)
		}
		if k == 2 {
			assert.Equal(t, 2, moved, "one swap")
			assert.LessOrEqual(t, busiest, bestSwap*(1+1e-12), "k=2 makes the best single swap")
		}
		assert.Less(t, busiest, curRep.Layers[0].MaxTokens, "k=%d must improve on staying", k)
		assert.LessOrEqual(t, busiest, prev*(1+1e-12), "k=%d: more moves never end worse", k)
		prev = busiest
	}
}

// TestStoppedSolveKeepsMoveBudget: a solve from a running plan under a
// move budget whose context ends before the strategy has a plan returns
// the running plan (the one plan known to keep the budget), not a fresh
// baseline that moves every slot.
func TestStoppedSolveKeepsMoveBudget(t *testing.T) {
	old := [][]float64{{100, 90, 80, 70, 60, 50, 40, 30}}
	p := replicatedProblem(old, 2, 2, 4)
	cur, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint, Effort: 1})
	require.NoError(t, err)
	q := replicatedProblem([][]float64{{30, 40, 50, 60, 70, 80, 200, 190}}, 2, 2, 4)
	q.Current = cur.Plan
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := Solve(ctx, q, Options{Strategy: StrategyJoint, MaxMoves: 2})
	require.NoError(t, err)
	assert.Equal(t, StatusStopped, res.Status)
	assert.LessOrEqual(t, changedSlots(cur.Plan, res.Plan), 2)
}

func changedSlots(a, b *placement.Plan) int {
	n := 0
	for l := range a.Layers {
		have := map[[2]int]int{}
		for s, e := range a.Layers[l].SlotExpert {
			have[[2]int{int(a.Layers[l].SlotGPU[s]), int(e)}]++
		}
		for s, e := range b.Layers[l].SlotExpert {
			k := [2]int{int(b.Layers[l].SlotGPU[s]), int(e)}
			if have[k] > 0 {
				have[k]--
			} else {
				n++
			}
		}
	}
	return n
}

// TestOptimalSplitMatchesLP checks the max-flow split against an LP solved
// by HiGHS: min T s.t. Σ_{copies} f = load[e], Σ_{f on g} f ≤ T·speed_g.
func TestOptimalSplitMatchesLP(t *testing.T) {
	load := [][]float64{{900, 300, 200, 150, 100, 80, 60, 50}, {400, 400, 10, 10, 10, 10, 10, 10}}
	for _, speed := range [][]float64{nil, {1, 2, 1, 1}} {
		p := replicatedProblem(load, 1, 4, 4)
		p.Cluster.Speed = speed
		even, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint})
		require.NoError(t, err)
		p.Split = SplitOptimal
		opt, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint})
		require.NoError(t, err)
		verify(t, p, opt)
		for l, lp := range opt.Plan.Layers {
			require.NotNil(t, lp.SlotShare)
			// Independent LP over the same copies.
			lpT := splitLP(t, load[l], lp, p.Cluster)
			b := opt.Balance.Layers[l]
			assert.InDelta(t, lpT, b.Busiest, 1e-6*lpT, "layer %d", l)
			assert.InDelta(t, lpT, maxPerSpeed(opt.Report.Layers[l].Tokens, p.Cluster), 1e-6*lpT+1e-9, "cost model agrees, layer %d", l)
			assert.LessOrEqual(t, b.Busiest, even.Balance.Layers[l].Busiest*(1+1e-12))
			assert.GreaterOrEqual(t, b.Busiest, b.Bound*(1-1e-9))
		}
	}
}

// maxPerSpeed is the busiest GPU's tokens/speed in a cost-model report.
func maxPerSpeed(tokens []float64, c costmodel.Cluster) float64 {
	best := 0.0
	for g, v := range tokens {
		best = math.Max(best, v/c.SpeedOf(g))
	}
	return best
}

func splitLP(t *testing.T, load []float64, lp placement.LayerPlan, c costmodel.Cluster) float64 {
	G := c.GPUs()
	m := &mip.Model{}
	S := len(lp.SlotExpert)
	for range S {
		m.Cost, m.Lower, m.Upper, m.Integer = append(m.Cost, 0), append(m.Lower, 0), append(m.Upper, math.Inf(1)), append(m.Integer, false)
	}
	m.Cost, m.Lower, m.Upper, m.Integer = append(m.Cost, 1), append(m.Lower, 0), append(m.Upper, math.Inf(1)), append(m.Integer, false)
	T := S
	m.RowStart = []int{0}
	addRow := func(lo, hi float64, idx []int, val []float64) {
		m.RowLower, m.RowUpper = append(m.RowLower, lo), append(m.RowUpper, hi)
		m.RowIndex, m.RowValue = append(m.RowIndex, idx...), append(m.RowValue, val...)
		m.RowStart = append(m.RowStart, len(m.RowIndex))
	}
	for e, v := range load {
		var idx []int
		var val []float64
		for s, se := range lp.SlotExpert {
			if int(se) == e {
				idx, val = append(idx, s), append(val, 1)
			}
		}
		addRow(v, v, idx, val)
	}
	for g := range G {
		idx, val := []int{T}, []float64{-c.SpeedOf(g)}
		for s, sg := range lp.SlotGPU {
			if int(sg) == g {
				idx, val = append(idx, s), append(val, 1)
			}
		}
		addRow(math.Inf(-1), 0, idx, val)
	}
	sol, err := testBackend(t).Solve(context.Background(), m, mip.Options{})
	require.NoError(t, err)
	require.Equal(t, mip.Optimal, sol.Status)
	return sol.Objective
}

// Under local dispatch joint puts the copies of an expert on different
// nodes, which keeps each node's tokens for it off the NICs, without
// giving up balance: its busiest GPU equals the even-dispatch plan's, and
// the certified busiest load matches the cost model's tokens. (Loads where
// no expert needs more copies than there are nodes.)
func TestReplicatedLocalDispatchSpreadsNodes(t *testing.T) {
	load := make([][]float64, 3)
	for l := range load {
		load[l] = make([]float64, 16)
		for e := range load[l] {
			load[l][e] = 1000 / math.Pow(float64((e+5*l)%16+1), 0.5)
		}
	}
	even := replicatedProblem(load, 2, 4, 8) // 24 slots, 3 per GPU
	local := even
	local.Dispatch = placement.DispatchLocal
	re, err := Solve(context.Background(), even, Options{Strategy: StrategyJoint, Effort: 1})
	require.NoError(t, err)
	verify(t, even, re)
	rl, err := Solve(context.Background(), local, Options{Strategy: StrategyJoint, Effort: 1})
	require.NoError(t, err)
	verify(t, local, rl)
	// The even plan scored under local dispatch, for a like-for-like
	// comparison of cross-node bytes.
	reAsLocal, err := local.Scenario().Evaluate(re.Plan)
	require.NoError(t, err)
	assert.Less(t, rl.Report.CrossNodeBytes, reAsLocal.CrossNodeBytes)
	assert.Less(t, rl.Report.CrossNodeBytes, re.Report.CrossNodeBytes)
	assert.Less(t, rl.Objective, reAsLocal.TimeSec)
	for l := range load {
		for e, gs := range rl.Plan.ExpertGPUs(l) {
			nodes := map[int]bool{}
			for _, g := range gs {
				nodes[int(g)/4] = true
			}
			assert.Len(t, nodes, min(len(gs), 2), "layer %d expert %d on GPUs %v", l, e, gs)
		}
		b := rl.Balance.Layers[l]
		assert.LessOrEqual(t, b.Busiest, re.Balance.Layers[l].Busiest*1.01, "layer %d", l)
		assert.InDelta(t, rl.Report.Layers[l].MaxTokens, b.Busiest, 1e-9*b.Busiest, "layer %d", l)
	}
	t.Logf("cross-node bytes: local %.0f, even plan under local dispatch %.0f, even %.0f; time %.3g vs %.3g s; gaps %.3f%% vs %.3f%%", rl.Report.CrossNodeBytes, reAsLocal.CrossNodeBytes, re.Report.CrossNodeBytes, rl.Objective, reAsLocal.TimeSec, 100*rl.Balance.MaxGap, 100*re.Balance.MaxGap)

	// Skewed loads: the hottest expert needs more copies than nodes, and a
	// lone copy on a node would serve that whole node. The certificate
	// still describes the plan as the cost model scores it.
	for l := range load {
		for e := range load[l] {
			load[l][e] = 1000 / math.Pow(float64((e+5*l)%16+1), 1.1)
		}
	}
	skew := replicatedProblem(load, 2, 4, 8)
	skew.Dispatch = placement.DispatchLocal
	rs, err := Solve(context.Background(), skew, Options{Strategy: StrategyJoint, Effort: 1})
	require.NoError(t, err)
	verify(t, skew, rs)
	for l, b := range rs.Balance.Layers {
		assert.InDelta(t, rs.Report.Layers[l].MaxTokens, b.Busiest, 1e-9*b.Busiest, "layer %d", l)
		assert.GreaterOrEqual(t, b.Busiest, b.Bound*(1-1e-12), "layer %d", l)
	}

	chain := local
	chain.Flow = costmodel.FlowChain
	_, err = Solve(context.Background(), chain, Options{Strategy: StrategyJoint, TimeLimit: time.Second})
	assert.ErrorContains(t, err, "home flow only")
	split := local
	split.Split = SplitOptimal
	_, err = Solve(context.Background(), split, Options{Strategy: StrategyJoint, TimeLimit: time.Second})
	assert.ErrorContains(t, err, "choose one")
}

// With one or two slots per GPU the exact pair method (HiGHS) proves a
// bound that never exceeds the brute-force optimum and, on these small
// instances, reaches it.
func TestReplicatedPairsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	reached, closed := 0, 0
	const runs = 24
	for it := 0; it < runs; it++ {
		G := 2 + rng.IntN(3)
		slots := make([]int, G)
		S := 0
		for g := range slots {
			slots[g] = 2
			if it%3 == 2 && g < G/2 {
				slots[g] = 1 // mixed one- and two-slot GPUs
			}
			S += slots[g]
		}
		E := 2 + rng.IntN(S-2)
		load := make([]float64, E)
		for e := range load {
			load[e] = math.Round(1000 / math.Pow(float64(e+1), 0.5+rng.Float64()))
		}
		p := Problem{Stats: routing.StatsFromLoad([][]float64{load}, 2), Cluster: testkit.SmallCluster(1, G), Model: testkit.FakeModel(E, 2), SlotsPerGPU: slots}
		res, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint, Effort: 100})
		require.NoError(t, err, "load %v slots %v", load, slots)
		verify(t, p, res)
		opt := testkit.BruteBusiestSlots(load, slots)
		b := res.Balance.Layers[0]
		name := fmt.Sprintf("load %v slots %v", load, slots)
		assert.LessOrEqual(t, b.Bound, opt*(1+1e-9), "the bound must not exceed the optimum: %s", name)
		assert.GreaterOrEqual(t, b.Busiest, opt*(1-1e-9), name)
		assert.InDelta(t, res.Report.Layers[0].MaxTokens, b.Busiest, 1e-6*b.Busiest, name)
		if b.Busiest <= opt*(1+1e-9) {
			reached++
		}
		if b.Gap() <= 1e-4 {
			closed++
			assert.InDelta(t, opt, b.Busiest, 1e-4*opt, "a closed gap means optimal: %s", name)
		}
	}
	t.Logf("optimum reached in %d of %d instances, proven (gap ≤ 0.01 %%) in %d", reached, runs, closed)
	assert.GreaterOrEqual(t, reached, runs*3/4)
	assert.GreaterOrEqual(t, closed, runs*3/4)
}

// Found by TestReplicatedPairsExact: largest-first packing put the lone
// slot of GPU 0 and a copy of expert 0 everywhere else before expert 0's
// third copy came; packing most-copies-first finds the placement.
func TestPackMixedSlotsRegression(t *testing.T) {
	load := []float64{1000, 361, 488}
	p := Problem{Stats: routing.StatsFromLoad([][]float64{load}, 2), Cluster: testkit.SmallCluster(1, 3), Model: testkit.FakeModel(3, 2), SlotsPerGPU: []int{1, 2, 2}}
	res, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint, Effort: 1})
	require.NoError(t, err)
	verify(t, p, res)
	assert.InDelta(t, testkit.BruteBusiestSlots(load, []int{1, 2, 2}), res.Balance.Layers[0].Busiest, 1e-9)
}

// TestProblemChecks: what Solve refuses before any strategy runs, for every
// strategy alike, in the library's words.
func TestProblemChecks(t *testing.T) {
	p := mixtralProblem(t)
	// A token from rank 4 on a 4-GPU cluster: its home does not exist.
	st := *p.Stats
	st.Patterns = append(slices.Clone(st.Patterns), routing.Pattern{Source: 4, Experts: slices.Repeat([]int16{0, 1}, st.Layers), Count: 1})
	p.Stats = &st
	for _, s := range []Strategy{StrategyEPLB, StrategyJoint} {
		_, err := Solve(context.Background(), p, Options{Strategy: s, TimeLimit: time.Second})
		require.Error(t, err, s)
		assert.Contains(t, err.Error(), fmt.Sprintf("Problem.Stats.Patterns[%d] comes from source rank 4, but Problem.Cluster has 4 GPUs (ranks 0 to 3)", len(st.Patterns)-1), s)
	}
	// The contiguous layout needs the GPUs to divide the experts.
	p = mixtralProblem(t)
	p.Cluster = testkit.SmallCluster(3, 2)
	p.RedundantSlots = 4
	_, err := Solve(context.Background(), p, Options{Strategy: StrategyContiguous})
	assert.ErrorIs(t, err, ErrInfeasible)
	assert.Contains(t, err.Error(), "8 experts do not divide over 6 GPUs")
	res, err := Solve(context.Background(), p, Options{Strategy: StrategyRoundRobin})
	require.NoError(t, err)
	assert.Equal(t, 6, res.Plan.GPUs)
	// Greedy fills the GPUs as evenly as the counts allow (2 2 1 1 1 1),
	// then the 4 redundant slots with copies: 2 on every GPU, as for
	// round-robin.
	for _, st := range []Strategy{StrategyGreedy, StrategyRoundRobin} {
		res, err = Solve(context.Background(), p, Options{Strategy: st})
		require.NoError(t, err)
		for l := range p.Stats.Layers {
			assert.Equal(t, []int{2, 2, 2, 2, 2, 2}, res.Plan.SlotsPerGPU(l), st)
		}
	}
}

// TestReplicatedExactSmallLayers: with three or four slots per GPU (no
// pair method) and few experts, the joint plan's busiest GPU is the
// brute-force optimum over every copy count and packing, certified with
// a zero gap. The packer alone misses it on some (the bundled Mixtral
// counts' layer 9: 1.0205 of the mean against 1.0095).
func TestReplicatedExactSmallLayers(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 7))
	for it := range 12 {
		G := 2 + rng.IntN(3)
		per := 3 + rng.IntN(2)
		E := min(8, G*per-1-rng.IntN(G))
		E = max(E, per)
		load := make([]float64, E)
		for e := range load {
			load[e] = math.Round(100 + 1900*math.Pow(rng.Float64(), 2))
		}
		slots := make([]int, G)
		for g := range slots {
			slots[g] = per
		}
		p := Problem{Stats: routing.StatsFromLoad([][]float64{load}, 2), Cluster: testkit.SmallCluster(1, G), Model: testkit.FakeModel(E, 2), SlotsPerGPU: slots}
		name := fmt.Sprintf("%d: load %v slots %v", it, load, slots)
		// A work budget, not the clock, bounds the search: whether it
		// completes must not depend on the machine's load.
		res, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint, Effort: 100})
		require.NoError(t, err, name)
		verify(t, p, res)
		opt := testkit.BruteBusiestSlots(load, slots)
		assert.InDelta(t, opt, res.Balance.Layers[0].Busiest, 1e-9*opt, name)
		assert.InDelta(t, opt, res.Report.Layers[0].MaxTokens, 1e-9*opt, name)
		assert.LessOrEqual(t, res.Gap, 1e-9, name)
		assert.Equal(t, StatusOptimal, res.Status, name)
	}
}

// TestReplicatedExactGroups: small layers under expert groups (two or
// three nodes, one or two GPUs each, spare slots) are solved node by node
// and proven: the busiest GPU is the brute-force optimum over every
// grouped plan, with status optimal and gap 0, and the plan keeps each
// group on one node. Without the grouped search the gap stays open.
func TestReplicatedExactGroups(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 2))
	solved := 0
	for it := range 150 {
		N := 2 + rng.IntN(2)
		per := 1 + rng.IntN(2)
		groups := N * (1 + rng.IntN(2))
		size := 1 + rng.IntN(2)
		E := groups * size
		G := N * per
		if E > 8 || E < G {
			continue
		}
		redundant := G * (1 + rng.IntN(2))
		if (E+redundant)%G != 0 {
			continue
		}
		load := make([]float64, E)
		for e := range load {
			load[e] = math.Round(100 + 1900*math.Pow(rng.Float64(), 2))
		}
		slots := make([]int, G)
		speed := make([]float64, G)
		for g := range slots {
			slots[g], speed[g] = (E+redundant)/G, 1
		}
		opt := testkit.BruteBusiestGrouped(load, speed, slots, groups, per)
		if math.IsInf(opt, 1) {
			continue
		}
		p := Problem{Stats: routing.StatsFromLoad([][]float64{load}, 2), Cluster: testkit.SmallCluster(N, per), Model: testkit.FakeModel(E, 2),
			RedundantSlots: redundant, ExpertGroups: groups}
		name := fmt.Sprintf("%d: load %v, %d × %d GPUs, %d redundant slots, %d groups", it, load, N, per, redundant, groups)
		res, err := Solve(context.Background(), p, Options{Strategy: StrategyJoint, Effort: 100})
		require.NoError(t, err, name)
		verify(t, p, res)
		solved++
		assert.InDelta(t, opt, res.Balance.Layers[0].Busiest, 1e-9*opt, name)
		assert.InDelta(t, opt, res.Report.Layers[0].MaxTokens, 1e-9*opt, name)
		assert.LessOrEqual(t, res.Gap, 1e-9, name)
		assert.Equal(t, StatusOptimal, res.Status, name)
		lp := res.Plan.Layers[0]
		nodeOf := map[int]int{}
		for s, e := range lp.SlotExpert {
			k, nd := int(e)/size, int(lp.SlotGPU[s])/per
			if was, ok := nodeOf[k]; ok {
				assert.Equal(t, was, nd, "%s: group %d on two nodes", name, k)
			}
			nodeOf[k] = nd
		}
	}
	assert.Greater(t, solved, 20)
}

// Re-placement from a running plan on several nodes with per-token paths
// runs the affinity search: with free moves the plan is at least as good
// as planning afresh and as the running plan; under a budget of k slots
// per layer (and under a move cost) every layer changes at most k slots
// and the plan beats the running one, on a trace whose home nodes'
// tokens favour blocks of experts that the running plan (EPLB's, one
// redundant slot per GPU) ignores.
// The balance-only path this replaces moved no token off a NIC and fails
// the budgeted case's margin.
func TestRunningPlanAffinityMoves(t *testing.T) {
	pl := testkit.Planted{Nodes: 2, GPUsPerNode: 2, SlotsPerGPU: 4, Layers: 3, TopK: 2, Tokens: 800, Stray: 10, Skew: 0.8, HomeTopics: true}
	tr, _ := pl.Trace(rand.New(rand.NewPCG(3, 1)))
	require.NoError(t, tr.Validate())
	p := Problem{Stats: tr.Stats(routing.StatsOptions{}), Cluster: testkit.SmallCluster(2, 2), Model: testkit.FakeModel(16, 2), Flow: costmodel.FlowHome, Dispatch: placement.DispatchStaticMean, RedundantSlots: 4}
	ctx := context.Background()
	eplb, err := Solve(ctx, p, Options{Strategy: StrategyEPLB})
	require.NoError(t, err)
	fresh, err := Solve(ctx, p, Options{Strategy: StrategyJoint, Effort: 1})
	require.NoError(t, err)
	q := p
	q.Current = eplb.Plan
	free, err := Solve(ctx, q, Options{Strategy: StrategyJoint, Effort: 1})
	require.NoError(t, err)
	verify(t, q, free)
	assert.Contains(t, free.Note, "affinity search")
	assert.LessOrEqual(t, free.Objective, fresh.Objective*(1+1e-12))
	assert.LessOrEqual(t, free.Objective, eplb.Objective*(1+1e-12))
	for _, c := range []struct {
		k    int
		cost float64
	}{{4, 0}, {8, 0}, {0, 0.002}} {
		q.MoveCost = c.cost
		res, err := Solve(ctx, q, Options{Strategy: StrategyJoint, Effort: 1, MaxMoves: c.k})
		require.NoError(t, err)
		verify(t, q, res)
		assert.Contains(t, res.Note, "affinity search")
		for l := range res.Plan.Layers {
			n := placement.ChangedSlots(eplb.Plan.Layers[l], res.Plan.Layers[l])
			if c.k > 0 {
				assert.LessOrEqual(t, n, c.k, "k=%d layer %d", c.k, l)
			}
			assert.Positive(t, n, "k=%d cost %g layer %d: no move made", c.k, c.cost, l)
		}
		assert.Less(t, res.Objective, eplb.Objective*0.99, "k=%d cost %g: %.4g against the running plan's %.4g", c.k, c.cost, res.Objective, eplb.Objective)
	}
}

// Under SplitOptimal (SGLang's dispatch LP splits each expert's tokens
// over its copies) on several nodes with per-token paths, joint runs the
// affinity search and then splits: every replicated layer carries its
// shares and the plan is at least 5 % faster than EPLB's (split the same
// way) on a trace whose home nodes favour blocks of experts (6.0 %). The
// balance-only path, which this case took before, is 4.0 % faster and
// fails it.
func TestOptimalSplitAffinity(t *testing.T) {
	pl := testkit.Planted{Nodes: 2, GPUsPerNode: 2, SlotsPerGPU: 4, Layers: 3, TopK: 2, Tokens: 800, Stray: 10, Skew: 0.8, HomeTopics: true}
	tr, _ := pl.Trace(rand.New(rand.NewPCG(5, 2)))
	require.NoError(t, tr.Validate())
	p := Problem{Stats: tr.Stats(routing.StatsOptions{}), Cluster: testkit.SmallCluster(2, 2), Model: testkit.FakeModel(16, 2), Flow: costmodel.FlowHome, RedundantSlots: 4, Split: SplitOptimal}
	ctx := context.Background()
	eplb, err := Solve(ctx, p, Options{Strategy: StrategyEPLB})
	require.NoError(t, err)
	res, err := Solve(ctx, p, Options{Strategy: StrategyJoint, Effort: 1})
	require.NoError(t, err)
	verify(t, p, res)
	assert.Contains(t, res.Note, "affinity search")
	for l, lp := range res.Plan.Layers {
		assert.Len(t, lp.SlotShare, len(lp.SlotExpert), "layer %d has no shares", l)
	}
	t.Logf("joint %.6g eplb %.6g", res.Objective, eplb.Objective)
	assert.Less(t, res.Objective, eplb.Objective*0.95, "%.4g against EPLB's %.4g", res.Objective, eplb.Objective)
}

// A running plan (Problem.Current) that does not fit the problem is an
// error naming Problem.Current, not a panic: another GPU count, another
// layer count, an expert or GPU id out of range.
func TestCurrentValidated(t *testing.T) {
	p := replicatedProblem([][]float64{{100, 90, 80, 70, 60, 50, 40, 30}, {10, 20, 30, 40, 50, 60, 70, 80}}, 1, 4, 4)
	cur, err := Solve(context.Background(), p, Options{Strategy: StrategyEPLB})
	require.NoError(t, err)
	bad := map[string]func(*placement.Plan){
		"gpus":   func(pl *placement.Plan) { pl.GPUs = 8 },
		"layers": func(pl *placement.Plan) { pl.Layers = pl.Layers[:1] },
		"expert": func(pl *placement.Plan) { pl.Layers[1].SlotExpert[0] = 99 },
		"gpu":    func(pl *placement.Plan) { pl.Layers[0].SlotGPU[2] = 17 },
	}
	for name, edit := range bad {
		t.Run(name, func(t *testing.T) {
			q := p
			q.Current = cur.Plan.Clone()
			edit(q.Current)
			for _, st := range []Strategy{StrategyJoint, StrategyEPLB} {
				_, err := Solve(context.Background(), q, Options{Strategy: st, MaxMoves: 2})
				require.Error(t, err, st)
				assert.Contains(t, err.Error(), "Problem.Current", st)
			}
		})
	}
}

// A move cost that is negative or not finite, and a negative move budget,
// are errors naming the field.
func TestMoveBudgetFieldsValidated(t *testing.T) {
	p := replicatedProblem([][]float64{{100, 90, 80, 70, 60, 50, 40, 30}}, 1, 4, 4)
	cur, err := Solve(context.Background(), p, Options{Strategy: StrategyEPLB})
	require.NoError(t, err)
	p.Current = cur.Plan
	for _, c := range []float64{-0.1, math.NaN(), math.Inf(1)} {
		q := p
		q.MoveCost = c
		_, err := Solve(context.Background(), q, Options{Strategy: StrategyJoint})
		require.Error(t, err, "%v", c)
		assert.Contains(t, err.Error(), "Problem.MoveCost")
	}
	_, err = Solve(context.Background(), p, Options{Strategy: StrategyJoint, MaxMoves: -1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Options.MaxMoves -1")
}

// With free moves (no MaxMoves, no MoveCost) joint from a running plan
// plans afresh, also off the affinity search's path (one node here): it
// is no slower than joint without the running plan, nor than the running
// plan. A local search from the running plan (what this path did) ends
// 1.0 % slower than the fresh plan on this instance and fails it.
func TestRunningPlanFreeMovesPlansAfresh(t *testing.T) {
	p := replicatedProblem([][]float64{{100, 90, 80, 70, 60, 50, 40, 30}, {10, 20, 30, 40, 50, 60, 70, 80}, {300, 10, 10, 10, 10, 10, 10, 10}}, 1, 4, 4)
	// The running plan: contiguous-like, two experts a GPU and the
	// redundant slots on the lightest experts, far from balanced.
	cp := make([][][]placement.GPU, 3)
	for l := range cp {
		cp[l] = make([][]placement.GPU, 8)
		for e := range 8 {
			cp[l][e] = []placement.GPU{placement.GPU(e / 2)}
		}
		for g := range 4 {
			e := (g + 2) % 8 // a second copy on another GPU
			if int(cp[l][e][0]) == g {
				e = (e + 2) % 8
			}
			cp[l][e] = append(cp[l][e], placement.GPU(g))
		}
	}
	running := placement.FromReplicas(4, cp, "running")
	require.NoError(t, running.Validate(placement.ValidateOptions{Experts: 8, Layers: 3, EqualSlots: true}))
	ctx := context.Background()
	fresh, err := Solve(ctx, p, Options{Strategy: StrategyJoint})
	require.NoError(t, err)
	q := p
	q.Current = running
	res, err := Solve(ctx, q, Options{Strategy: StrategyJoint})
	require.NoError(t, err)
	verify(t, q, res)
	runRep, err := q.Scenario().Evaluate(running)
	require.NoError(t, err)
	t.Logf("from the running plan %.6g, fresh %.6g, running %.6g", res.Objective, fresh.Objective, runRep.TimeSec)
	assert.LessOrEqual(t, res.Objective, fresh.Objective*(1+1e-9))
	assert.LessOrEqual(t, res.Objective, runRep.TimeSec*(1+1e-9))
}
