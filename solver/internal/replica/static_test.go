package replica

import (
	"cmp"
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/task"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// staticScenario is a home-flow scenario under static dispatch whose
// sources route unevenly: every source prefers its own few experts, and
// a quarter of the tokens have no source.
func staticScenario(t testing.TB, rng *rand.Rand, nodes, perNode, E, k, L, T int) costmodel.Scenario {
	t.Helper()
	G := nodes * perNode
	tr := &routing.Trace{Tokens: T, Layers: L, TopK: k, Experts: E, Source: make([]int32, T)}
	pop := make([]float64, E)
	for e := range pop {
		pop[e] = math.Pow(rng.Float64(), 3) + 0.02
	}
	fav := make([][]int, G)
	for h := range fav {
		for range 3 {
			fav[h] = append(fav[h], rng.IntN(E))
		}
	}
	for tok := range T {
		h := rng.IntN(G)
		tr.Source[tok] = int32(h)
		if rng.IntN(4) == 0 {
			tr.Source[tok] = -1
		}
		for range L {
			var pick []int
			for len(pick) < k {
				e := testkit.Pick(rng, pop)
				if rng.IntN(2) == 0 {
					e = fav[h][rng.IntN(len(fav[h]))]
				}
				if !slices.Contains(pick, e) {
					pick = append(pick, e)
				}
			}
			for _, e := range pick {
				tr.IDs = append(tr.IDs, int16(e))
			}
		}
	}
	require.NoError(t, tr.Validate())
	return costmodel.Scenario{Stats: tr.Stats(routing.StatsOptions{}), Cluster: testkit.SmallCluster(nodes, perNode),
		Model: testkit.FakeModel(E, k), Flow: costmodel.FlowHome, Dispatch: placement.DispatchStaticMean}
}

// solveScored solves p and scores its plan under sc (which may dispatch
// differently from p).
func solveScored(t *testing.T, p Problem, sc costmodel.Scenario, opts Options) (*Result, *costmodel.Report) {
	t.Helper()
	res, err := Solve(context.Background(), p, nil, opts)
	require.NoError(t, err)
	rep, err := sc.Evaluate(res.Plan)
	require.NoError(t, err)
	return res, rep
}

// staticLoads is what the cost model counts: every layer's busiest GPU's
// tokens, recomputed by Evaluate, match the largest of staticLoads.
func TestStaticLoadsMatchCostModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 1))
	differ, layers := 0, 0
	for trial := range 6 {
		nodes, perNode := 1+rng.IntN(2), 2+rng.IntN(3)
		G := nodes * perNode
		E := G * (2 + rng.IntN(2))
		sc := staticScenario(t, rng, nodes, perNode, E, 2, 3, 300)
		plan := testkit.RandomBalancedPlan(rng, 3, E, G)
		// Copies of random experts on GPUs that lack them.
		copies := make([][][]placement.GPU, 3)
		for l := range copies {
			copies[l] = plan.ExpertGPUs(l)
			for range G {
				e, g := rng.IntN(E), placement.GPU(rng.IntN(G))
				if !slices.Contains(copies[l][e], g) {
					copies[l][e] = append(copies[l][e], g)
				}
			}
		}
		rep, err := sc.Evaluate(placement.FromReplicas(G, copies, "t"))
		require.NoError(t, err)
		src := costmodel.SourceShares(sc.Stats, G)
		require.NotNil(t, src)
		speed := slices.Repeat([]float64{1}, G)
		for l := range copies {
			gl := staticLoads(sc.Stats.Load[l], copies[l], speed, src[l])
			assert.InDelta(t, rep.Layers[l].MaxTokens, slices.Max(gl), 1e-6*rep.Layers[l].MaxTokens, "trial %d layer %d", trial, l)
			even := gpuLoads(sc.Stats.Load[l], copies[l], speed, 0)
			if math.Abs(slices.Max(even)-rep.Layers[l].MaxTokens) > 1e-6*rep.Layers[l].MaxTokens {
				differ++
			}
			layers++
		}
	}
	// The instances tell the splits apart: the even split misses the
	// busiest GPU's load in many layers.
	t.Logf("the even split misses the busiest GPU in %d of %d layers", differ, layers)
	assert.GreaterOrEqual(t, differ, layers/3)
}

// staticSwap keeps every slot count and every expert's distinct GPUs (and
// nodes, when held to them), never raises the busiest GPU, and stops only
// where no swap with the busiest GPU lowers it: checked by trying every
// such swap on the result.
func TestStaticSwapLocalOptimum(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	improved := 0
	for trial := range 20 {
		nodes, perNode := 1+rng.IntN(2), 2+rng.IntN(3)
		G := nodes * perNode
		E := G * (1 + rng.IntN(3))
		sc := staticScenario(t, rng, nodes, perNode, E, 2, 1, 400)
		src := costmodel.SourceShares(sc.Stats, G)[0]
		load := sc.Stats.Load[0]
		speed := make([]float64, G)
		for g := range speed {
			speed[g] = 1 + float64(rng.IntN(2))
		}
		// One copy per expert round-robin, then G extra copies of the
		// busiest experts on GPUs that lack them.
		copies := make([][]placement.GPU, E)
		for e := range copies {
			copies[e] = []placement.GPU{placement.GPU(e % G)}
		}
		order := make([]int, E)
		for e := range order {
			order[e] = e
		}
		slices.SortFunc(order, func(a, b int) int { return cmp.Compare(load[b], load[a]) })
		for i := range G {
			e := order[i%E]
			g := placement.GPU((e + 1 + i/E) % G)
			if !slices.Contains(copies[e], g) {
				copies[e] = append(copies[e], g)
			}
		}
		perNodeHold := 0
		if nodes > 1 && rng.IntN(2) == 0 {
			perNodeHold = perNode
		}
		before := staticLoads(load, copies, speed, src)
		out, swaps := staticSwap(load, copies, speed, src, perNodeHold, -1, 0, task.ByWork(context.Background(), 1<<40))
		after := staticLoads(load, out, speed, src)
		assert.LessOrEqual(t, slices.Max(after), slices.Max(before)*(1+1e-12), "trial %d", trial)
		if slices.Max(after) < slices.Max(before)*(1-1e-9) {
			improved++
		}
		if swaps == 0 {
			assert.Equal(t, copies, out)
		}
		// Slots and nodes kept, copies on distinct GPUs.
		count := func(c [][]placement.GPU) []int {
			n := make([]int, G)
			for _, gs := range c {
				for _, g := range gs {
					n[g]++
				}
			}
			return n
		}
		require.Equal(t, count(copies), count(out), "trial %d: slots per GPU", trial)
		for e := range out {
			require.Len(t, out[e], len(copies[e]))
			seen := map[placement.GPU]bool{}
			for i, g := range out[e] {
				require.False(t, seen[g], "trial %d: expert %d twice on GPU %d", trial, e, g)
				seen[g] = true
				if perNodeHold > 0 {
					require.Equal(t, int(copies[e][i])/perNodeHold, int(g)/perNodeHold, "trial %d: expert %d left its node", trial, e)
				}
			}
		}
		// Local optimum: no swap between the busiest GPU and another
		// lowers the busiest of the GPUs it changes below the peak.
		a := 0
		for g, v := range after {
			if v > after[a] {
				a = g
			}
		}
		peak := after[a]
		for e := range out {
			if !slices.Contains(out[e], placement.GPU(a)) {
				continue
			}
			for b := range G {
				if b == a || slices.Contains(out[e], placement.GPU(b)) || (perNodeHold > 0 && b/perNodeHold != a/perNodeHold) {
					continue
				}
				for f := range out {
					if f == e || !slices.Contains(out[f], placement.GPU(b)) || slices.Contains(out[f], placement.GPU(a)) {
						continue
					}
					try := make([][]placement.GPU, E)
					for x := range out {
						try[x] = slices.Clone(out[x])
					}
					try[e][slices.Index(try[e], placement.GPU(a))] = placement.GPU(b)
					try[f][slices.Index(try[f], placement.GPU(b))] = placement.GPU(a)
					gl := staticLoads(load, try, speed, src)
					worst := max(gl[a], gl[b])
					for g := range G {
						if gl[g] != after[g] {
							worst = max(worst, gl[g])
						}
					}
					assert.GreaterOrEqual(t, worst, peak*(1-1e-9), "trial %d: swapping %d@%d with %d@%d lowers the busiest GPU", trial, e, a, f, b)
				}
			}
		}
	}
	// The round-robin starts are poor: most searches must improve them.
	t.Logf("%d of 20 searches lowered the busiest GPU", improved)
	assert.GreaterOrEqual(t, improved, 12, "searches that lowered the busiest GPU")
}

// Under static dispatch with uneven sources (and local dispatch on one
// node, which splits the same way) the replicated solve balances the
// split the cost model counts: its busiest GPUs, summed over the
// layers, are below those of the plan the same solve makes for even
// dispatch (which balances the even split) scored under static dispatch,
// and it reports its gaps under the static split.
func TestSolveBalancesStaticSplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 5))
	better, layers := 0, 0
	for trial := range 6 {
		nodes, perNode := 1, 4+rng.IntN(5)
		G := nodes * perNode
		E := 2*G + rng.IntN(G)
		R := 2*G - E%G
		L := 3
		sc := staticScenario(t, rng, nodes, perNode, E, 2, L, 600)
		if trial%2 == 1 {
			sc.Dispatch = placement.DispatchLocal // on one node, the same split
		}
		p := Problem{Scenario: sc, RedundantSlots: R}
		opts := Options{Start: time.Now(), Deadline: time.Now().Add(time.Minute), LayerShare: 1, NoPolish: true, Work: 1 << 24}
		st, rs := solveScored(t, p, sc, opts)
		pe := p
		pe.Dispatch = placement.DispatchEven
		_, re := solveScored(t, pe, sc, opts)
		require.NoError(t, st.Plan.Validate(placement.ValidateOptions{Experts: E}))
		for l := range L {
			layers++
			if rs.Layers[l].MaxTokens < re.Layers[l].MaxTokens*(1-1e-9) {
				better++
			}
			// The reported balance is the static split's.
			assert.InDelta(t, rs.Layers[l].MaxTokens, st.Balance.Layers[l].Busiest, 1e-6*rs.Layers[l].MaxTokens, "trial %d layer %d", trial, l)
			assert.LessOrEqual(t, st.Balance.Layers[l].Bound, st.Balance.Layers[l].Busiest*(1+1e-9))
		}
		t.Logf("trial %d: static %.4f, even plan under static %.4f", trial, rs.MeanBalance, re.MeanBalance)
	}
	t.Logf("%d of %d layers better", better, layers)
	assert.GreaterOrEqual(t, better, layers*2/3)
}

// BenchmarkStaticSplit: an OLMoE-sized layer set (64 experts, top-8, 16
// layers, 8 GPUs, 8 redundant slots, 4,000 tokens whose sources prefer
// their own experts) under static dispatch. Reports the mean over layers
// of busiest/mean as the cost model counts it, for the solve under static
// dispatch and for the plan the same solve makes for even dispatch, and
// their ratio.
func BenchmarkStaticSplit(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 5))
	sc := staticScenario(b, rng, 1, 8, 64, 8, 16, 4000)
	p := Problem{Scenario: sc, RedundantSlots: 8}
	pe := p
	pe.Dispatch = placement.DispatchEven
	opts := Options{LayerShare: 1, NoPolish: true, Work: 1 << 26}
	var st, ev float64
	for b.Loop() {
		rs, err := Solve(context.Background(), p, nil, opts)
		if err != nil {
			b.Fatal(err)
		}
		re, err := Solve(context.Background(), pe, nil, opts)
		if err != nil {
			b.Fatal(err)
		}
		r1, err1 := sc.Evaluate(rs.Plan)
		r2, err2 := sc.Evaluate(re.Plan)
		if err1 != nil || err2 != nil {
			b.Fatal(err1, err2)
		}
		st, ev = r1.MeanBalance, r2.MeanBalance
	}
	b.ReportMetric(st, "static-busiest/mean")
	b.ReportMetric(ev, "even-plan-busiest/mean")
	b.ReportMetric(st/ev, "static/even-plan")
}

// From a running plan under static dispatch (Problem.Current), the solve
// changes at most MaxMoves slots per layer and balances the static split:
// summed over layers its busiest GPUs are below those of the same solve
// for even dispatch (the even split's search alone) scored under static
// dispatch, layer by layer in most layers. Under MoveCost alone, every
// layer's busiest/mean plus MoveCost per changed slot is at most the
// running plan's.
func TestStaticFromRunningPlan(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 4))
	better, layers := 0, 0
	for trial := range 6 {
		G := 4 + rng.IntN(5)
		E := 2*G + rng.IntN(G)
		R := 2*G - E%G
		L := 3
		sc := staticScenario(t, rng, 1, G, E, 2, L, 600)
		opts := Options{Start: time.Now(), Deadline: time.Now().Add(time.Minute), LayerShare: 1, NoPolish: true, Work: 1 << 24}
		// The running plan: the even split's balanced plan.
		pe := Problem{Scenario: sc, RedundantSlots: R}
		pe.Dispatch = placement.DispatchEven
		run, r0 := solveScored(t, pe, sc, opts)
		maxMoves := 2 + 2*rng.IntN(3)
		p := Problem{Scenario: sc, RedundantSlots: R, Current: run.Plan, MaxMoves: maxMoves}
		st, rs := solveScored(t, p, sc, opts)
		pe.Current, pe.MaxMoves = run.Plan, maxMoves
		_, re := solveScored(t, pe, sc, opts)
		for l := range L {
			layers++
			require.LessOrEqual(t, placement.ChangedSlots(run.Plan.Layers[l], st.Plan.Layers[l]), maxMoves, "trial %d layer %d", trial, l)
			if rs.Layers[l].MaxTokens < re.Layers[l].MaxTokens*(1-1e-9) {
				better++
			}
		}
		// MoveCost alone: no layer pays more than it gains.
		const cost = 0.01
		pc := Problem{Scenario: sc, RedundantSlots: R, Current: run.Plan, MoveCost: cost}
		sc2, r2 := solveScored(t, pc, sc, opts)
		for l := range L {
			paid := r2.Layers[l].Balance + cost*float64(placement.ChangedSlots(run.Plan.Layers[l], sc2.Plan.Layers[l]))
			assert.LessOrEqual(t, paid, r0.Layers[l].Balance*(1+1e-9), "trial %d layer %d", trial, l)
		}
		t.Logf("trial %d (%d moves): static %.4f, even search %.4f, running %.4f, move cost %.4f", trial, maxMoves, rs.MeanBalance, re.MeanBalance, r0.MeanBalance, r2.MeanBalance)
	}
	t.Logf("%d of %d layers better", better, layers)
	assert.GreaterOrEqual(t, better, layers/2)
}
