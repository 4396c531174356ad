package affinity

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// checkPlan fails unless copies is a valid layer set for slots: every
// expert at least once, no GPU with two copies of one expert, and every
// GPU exactly its slot count.
func checkPlan(t *testing.T, copies [][][]placement.GPU, E int, slots []int) {
	t.Helper()
	for l, layer := range copies {
		require.Len(t, layer, E, "layer %d", l)
		count := make([]int, len(slots))
		for e, gs := range layer {
			require.NotEmpty(t, gs, "layer %d expert %d has no copy", l, e)
			seen := map[placement.GPU]bool{}
			for _, g := range gs {
				require.False(t, seen[g], "layer %d expert %d twice on GPU %d", l, e, g)
				seen[g] = true
				count[g]++
			}
		}
		require.Equal(t, slots, count, "layer %d slots per GPU", l)
	}
}

// TestSolveKeepsConstraints: on random instances of both flows, every
// dispatch, with and without replicas and sources, the searches return
// valid plans with every GPU's slot count, and in the home flow a
// surrogate cost no higher than the start's. A move applied to the wrong
// slot, a retarget that drops an expert's last copy or a packing that
// puts two copies on one GPU fails it.
func TestSolveKeepsConstraints(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 3))
	for it := range 24 {
		N, P := 2+rng.IntN(2), 1+rng.IntN(3)
		E, K := 6+rng.IntN(10), 1+rng.IntN(3)
		red := 0
		if it%2 == 1 {
			red = N * P
		}
		red = fillSlots(E, N*P, red)
		d := []placement.Dispatch{placement.DispatchEven, placement.DispatchStaticMean, placement.DispatchLocal}[it%3]
		flow := costmodel.FlowHome
		if it%4 == 3 {
			flow, d = costmodel.FlowChain, placement.DispatchEven
		}
		t.Run(fmt.Sprintf("%d-%s-%s-N%dP%dE%dR%d", it, flow, d, N, P, E, red), func(t *testing.T) {
			sc, plan, slots := randomInstance(t, rng, N, P, E, K, 3, 80+rng.IntN(80), red, d, it%5 == 0)
			sc.Flow = flow
			p := Problem{Scenario: sc, Slots: slots, Start: plan}
			opts := Options{Limit: task.Limit{Work: 3000}, Parallel: 2, Shares: Shares{Proxy: 0.4, Nodes: 0.25, GPUs: 0.15}}
			var res *Result
			var err error
			if flow == costmodel.FlowChain {
				res, err = SolveChain(context.Background(), p, opts)
			} else {
				res, err = Solve(context.Background(), p, opts)
			}
			require.NoError(t, err)
			checkPlan(t, res.Copies, E, slots)
			if flow == costmodel.FlowHome {
				sh, err := newShape(p)
				require.NoError(t, err)
				for l := range res.Copies {
					ly := buildLayer(p, sh, l)
					before := newStateKappa(ly, int32Copies(plan.ExpertGPUs(l)), 0).costNow(levelGPU)
					after := newStateKappa(ly, int32Copies(res.Copies[l]), 0).costNow(levelGPU)
					assert.LessOrEqual(t, after, before*(1+1e-12), "layer %d", l)
				}
			}
		})
	}
}

// TestReachesBruteForceOptimum: on small one-layer home-flow instances
// (2 nodes × 2 GPUs, 2 slots each, with and without replicas, static and
// even dispatch), the search's plan has the exact cost model's least
// layer time over every valid placement, found by enumeration. It catches
// a search that stops at a local optimum of its moves, a surrogate that
// disagrees with the cost model on which plan is best, and a layer result
// worse than its start.
func TestReachesBruteForceOptimum(t *testing.T) {
	// Fast NVLink: the NIC decides every phase.
	reachBruteForce(t, rand.New(rand.NewPCG(5, 8)), 1e9)
}

// TestReachesBruteForceOptimumNVLink is TestReachesBruteForceOptimum on
// nodes whose NVLink (40 GB/s, 20 each way, against the NIC's 50) sets
// the phases' time: a search blind to the NVLink ports, or counting
// them wrongly, stops at a plan the enumeration beats.
func TestReachesBruteForceOptimumNVLink(t *testing.T) {
	reachBruteForce(t, rand.New(rand.NewPCG(6, 9)), 40)
}

// reachBruteForce runs the brute-force comparison on 12 instances with
// NVLink of nvGBps.
func reachBruteForce(t *testing.T, rng *rand.Rand, nvGBps float64) {
	const N, P, S = 2, 2, 2
	G := N * P
	solved := 0
	for it := range 12 {
		E := 8 - 2*(it%2) // 8 experts, or 6 with 2 redundant slots
		d := []placement.Dispatch{placement.DispatchEven, placement.DispatchStaticMean}[(it/2)%2]
		t.Run(fmt.Sprintf("%d-%s-E%d", it, d, E), func(t *testing.T) {
			sc, plan, slots := randomInstance(t, rng, N, P, E, 2+rng.IntN(2), 1, 60+rng.IntN(60), G*S-E, d, false)
			sc.Cluster.NVLinkGBps = nvGBps
			best, bestPlan := math.Inf(1), (*placement.Plan)(nil)
			for _, cp := range allPlacements(E, G, S) {
				pl := placement.FromReplicas(G, [][][]placement.GPU{cp}, "brute")
				rep, err := sc.Evaluate(pl)
				require.NoError(t, err)
				if rep.TimeSec < best {
					best, bestPlan = rep.TimeSec, pl
				}
			}
			require.NotNil(t, bestPlan)
			// Most of the work to the exact annealing, which on instances
			// this small can sweep the whole neighbourhood many times.
			res, err := Solve(context.Background(), Problem{Scenario: sc, Slots: slots, Start: plan}, Options{Limit: task.Limit{Work: 100000}, Parallel: 1, Shares: Shares{Proxy: 0.05, Nodes: 0.05, GPUs: 0.05}})
			require.NoError(t, err)
			rep, err := sc.Evaluate(placement.FromReplicas(G, res.Copies, "affinity"))
			require.NoError(t, err)
			sh, _ := newShape(Problem{Scenario: sc, Slots: slots, Start: plan})
			ly := buildLayer(Problem{Scenario: sc, Slots: slots}, sh, 0)
			sb := newStateKappa(ly, int32Copies(bestPlan.ExpertGPUs(0)), 0).costNow(levelGPU)
			so := newStateKappa(ly, int32Copies(res.Copies[0]), 0).costNow(levelGPU)
			assert.InDelta(t, best, rep.TimeSec, 1e-9*best, "search %.9g, optimum %.9g; surrogate %.9g vs %.9g", rep.TimeSec, best, so, sb)
			solved++
		})
	}
	require.Equal(t, 12, solved)
}

// allPlacements enumerates every layer of E experts on G GPUs with S slots
// each: every expert at least once, no two copies of an expert on one GPU.
func allPlacements(E, G, S int) [][][]placement.GPU {
	var out [][][]placement.GPU
	held := make([][]int, G)
	var rec func(g int)
	rec = func(g int) {
		if g == G {
			cp := make([][]placement.GPU, E)
			for gg, hs := range held {
				for _, e := range hs {
					cp[e] = append(cp[e], placement.GPU(gg))
				}
			}
			for _, c := range cp {
				if len(c) == 0 {
					return
				}
			}
			out = append(out, cp)
			return
		}
		// GPU g's S experts, a combination in increasing order.
		var pick func(from int)
		pick = func(from int) {
			if len(held[g]) == S {
				rec(g + 1)
				return
			}
			for e := from; e < E; e++ {
				held[g] = append(held[g], e)
				pick(e + 1)
				held[g] = held[g][:len(held[g])-1]
			}
		}
		pick(0)
	}
	rec(0)
	slices.Reverse(out)
	return out
}

// layerChanged is placement.ChangedSlots between a running plan's layer l
// and one layer of copies on G GPUs.
func layerChanged(run *placement.Plan, l, G int, cp [][]placement.GPU) int {
	return placement.ChangedSlots(run.Layers[l], placement.FromReplicas(G, [][][]placement.GPU{cp}, "x").Layers[0])
}

// requireWithin fails unless every layer of copies changes at most k slots
// of the running plan run (none with k = 0: a prohibitive MoveCost).
func requireWithin(t *testing.T, run *placement.Plan, G int, copies [][][]placement.GPU, k int) {
	t.Helper()
	for l := range copies {
		require.LessOrEqual(t, layerChanged(run, l, G, copies[l]), k, "layer %d: more changed slots than the budget (0: a prohibitive MoveCost)", l)
	}
}

// layersOver counts the layers of copies that change more than k slots
// of the running plan run.
func layersOver(run *placement.Plan, G int, copies [][][]placement.GPU, k int) int {
	n := 0
	for l := range copies {
		if layerChanged(run, l, G, copies[l]) > k {
			n++
		}
	}
	return n
}

// TestSolveKeepsMoveBudget: from a running plan with a move budget, on
// random home-flow instances (every dispatch, with and without replicas
// and sources), every layer of the plan is valid, changes at most
// MaxMoves slots of the running plan (as placement.ChangedSlots counts
// them) and has a surrogate cost, moves charged, no higher than the
// running plan's; a prohibitive MoveCost keeps the running plan. The same
// searches without the budget change more slots than it allows (checked
// below), so a search that ignores the budget, or counts it wrongly, fails.
func TestSolveKeepsMoveBudget(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 9))
	over := 0
	for it := range 18 {
		N, P := 2+rng.IntN(2), 1+rng.IntN(3)
		E, K := 6+rng.IntN(10), 1+rng.IntN(3)
		red := 0
		if it%2 == 1 {
			red = N * P
		}
		red = fillSlots(E, N*P, red)
		d := []placement.Dispatch{placement.DispatchEven, placement.DispatchStaticMean, placement.DispatchLocal}[it%3]
		if it%6 == 5 {
			// SGLang's newest tree: the search is repaired as dealt
			// (repairDealt), within the budget too.
			d = placement.DispatchSGLangStaticNarrow
		}
		t.Run(fmt.Sprintf("%d-%s-N%dP%dE%dR%d", it, d, N, P, E, red), func(t *testing.T) {
			sc, run, slots := randomInstance(t, rng, N, P, E, K, 3, 80+rng.IntN(80), red, d, it%5 == 0)
			G := N * P
			opts := Options{Limit: task.Limit{Work: 3000}, Parallel: 2, Shares: Shares{Proxy: 0.4, Nodes: 0.25, GPUs: 0.15}}
			free, err := Solve(context.Background(), Problem{Scenario: sc, Slots: slots, Start: run}, opts)
			require.NoError(t, err)
			k := 1 + rng.IntN(4)
			over += layersOver(run, G, free.Copies, k)
			p := Problem{Scenario: sc, Slots: slots, Start: run, Current: run, MaxMoves: k}
			if it%3 == 2 {
				p.MoveCost = 0.01
			}
			res, err := Solve(context.Background(), p, opts)
			require.NoError(t, err)
			checkPlan(t, res.Copies, E, slots)
			sh, err := newShape(p)
			require.NoError(t, err)
			for l := range res.Copies {
				require.LessOrEqual(t, layerChanged(run, l, G, res.Copies[l]), k, "layer %d", l)
				ly := buildLayer(p, sh, l)
				before := newStateKappa(ly, int32Copies(run.ExpertGPUs(l)), 0).costNow(levelGPU)
				after := newStateKappa(ly, int32Copies(res.Copies[l]), 0)
				require.Equal(t, layerChanged(run, l, G, res.Copies[l]), after.changed, "layer %d: the state's count", l)
				assert.LessOrEqual(t, after.costNow(levelGPU), before*(1+1e-12), "layer %d", l)
			}
			p.MaxMoves, p.MoveCost = 0, 1e6
			res, err = Solve(context.Background(), p, opts)
			require.NoError(t, err)
			requireWithin(t, run, G, res.Copies, 0)
		})
	}
	require.Greater(t, over, 10, "the unbudgeted searches must want more moves than the budgets allow")
}

// TestSolveChainKeepsMoveBudget is TestSolveKeepsMoveBudget for the chain
// flow (one copy of every expert, where the exact annealing runs, and
// with replicas, where only the polish does): every layer changes at most
// MaxMoves slots of the running plan, and a prohibitive MoveCost keeps
// it. The searches without the budget change more than it allows.
func TestSolveChainKeepsMoveBudget(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 5))
	over := 0
	for it := range 8 {
		N, P := 2+rng.IntN(2), 1+rng.IntN(3)
		E, K := N*P*(2+rng.IntN(3)), 1+rng.IntN(3)
		red := 0
		if it%2 == 1 {
			E -= 1 + rng.IntN(N*P-1+1)
			red = fillSlots(E, N*P, N*P)
		}
		t.Run(fmt.Sprintf("%d-N%dP%dE%dR%d", it, N, P, E, red), func(t *testing.T) {
			sc, run, slots := randomInstance(t, rng, N, P, E, K, 4, 80+rng.IntN(80), red, placement.DispatchEven, false)
			sc.Flow = costmodel.FlowChain
			G := N * P
			opts := Options{Limit: task.Limit{Work: 3000}, Parallel: 2, Shares: Shares{Proxy: 0.4, Nodes: 0.25, GPUs: 0.15}}
			free, err := SolveChain(context.Background(), Problem{Scenario: sc, Slots: slots, Start: run}, opts)
			require.NoError(t, err)
			k := 1 + rng.IntN(3)
			over += layersOver(run, G, free.Copies, k)
			p := Problem{Scenario: sc, Slots: slots, Start: run, Current: run, MaxMoves: k}
			res, err := SolveChain(context.Background(), p, opts)
			require.NoError(t, err)
			checkPlan(t, res.Copies, E, slots)
			requireWithin(t, run, G, res.Copies, k)
			p.MaxMoves, p.MoveCost = 0, 1e6
			res, err = SolveChain(context.Background(), p, opts)
			require.NoError(t, err)
			requireWithin(t, run, G, res.Copies, 0)
		})
	}
	require.Greater(t, over, 8, "the unbudgeted searches must want more moves than the budgets allow")
}

// TestBudgetCountersMatchRecount: under a move budget every tried delta
// (moves charged) is the applied change, the state's changed slots are
// placement.ChangedSlots of its copies against the running plan after
// every move, and no valid move takes them past the budget. A count
// that misses the swap's second slot, or a retarget's, fails it.
func TestBudgetCountersMatchRecount(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 2))
	for it := range 16 {
		N, P := 2+rng.IntN(2), 1+rng.IntN(3)
		E, K := 6+rng.IntN(10), 1+rng.IntN(3)
		red := fillSlots(E, N*P, rng.IntN(3)*N*P)
		d := []placement.Dispatch{placement.DispatchEven, placement.DispatchStaticMean, placement.DispatchLocal}[it%3]
		t.Run(fmt.Sprintf("%d-%s-N%dP%dE%dR%d", it, d, N, P, E, red), func(t *testing.T) {
			sc, run, slots := randomInstance(t, rng, N, P, E, K, 1, 60+rng.IntN(60), red, d, false)
			G := N * P
			k := rng.IntN(6) // 0: no bound
			p := Problem{Scenario: sc, Slots: slots, Start: run, Current: run, MaxMoves: k, MoveCost: 0.05}
			sh, err := newShape(p)
			require.NoError(t, err)
			ly := buildLayer(p, sh, 0)
			require.NotNil(t, ly.bud)
			require.Greater(t, ly.bud.SlotSec, 0.0)
			s := newState(ly, int32Copies(run.ExpertGPUs(0)))
			require.Zero(t, s.changed)
			for i := range 80 {
				if !tryApply(t, rng, s) {
					break
				}
				cp := make([][]placement.GPU, E)
				for e, gs := range s.copies() {
					for _, g := range gs {
						cp[e] = append(cp[e], placement.GPU(g))
					}
				}
				require.Equal(t, layerChanged(run, 0, G, cp), s.changed, "after move %d", i)
				if k > 0 {
					require.LessOrEqual(t, s.changed, k)
				}
			}
		})
	}
}

// TestBudgetReachesBruteForceOptimum: on small one-layer home-flow
// instances (as TestReachesBruteForceOptimum) with a running plan and a
// budget of two changed slots, the search's plan has the exact cost
// model's least layer time over every valid placement within the budget,
// found by enumeration. A search that stops at its first improving move,
// or refuses the moves that undo a change to make a better one, fails it.
func TestBudgetReachesBruteForceOptimum(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 4))
	const N, P, S, k = 2, 2, 2, 2
	G := N * P
	improved := 0
	for it := range 12 {
		E := 8 - 2*(it%2)
		d := []placement.Dispatch{placement.DispatchEven, placement.DispatchStaticMean}[(it/2)%2]
		t.Run(fmt.Sprintf("%d-%s-E%d", it, d, E), func(t *testing.T) {
			sc, run, slots := randomInstance(t, rng, N, P, E, 2+rng.IntN(2), 1, 60+rng.IntN(60), G*S-E, d, false)
			sc.Cluster.NVLinkGBps = 1e9
			runRep, err := sc.Evaluate(run)
			require.NoError(t, err)
			best := math.Inf(1)
			for _, cp := range allPlacements(E, G, S) {
				if layerChanged(run, 0, G, cp) > k {
					continue
				}
				rep, err := sc.Evaluate(placement.FromReplicas(G, [][][]placement.GPU{cp}, "brute"))
				require.NoError(t, err)
				best = math.Min(best, rep.TimeSec)
			}
			p := Problem{Scenario: sc, Slots: slots, Start: run, Current: run, MaxMoves: k}
			res, err := Solve(context.Background(), p, Options{Limit: task.Limit{Work: 100000}, Parallel: 1, Shares: Shares{Proxy: 0.05, Nodes: 0.05, GPUs: 0.05}})
			require.NoError(t, err)
			require.LessOrEqual(t, layerChanged(run, 0, G, res.Copies[0]), k)
			rep, err := sc.Evaluate(placement.FromReplicas(G, res.Copies, "affinity"))
			require.NoError(t, err)
			assert.InDelta(t, best, rep.TimeSec, 1e-9*best, "search %.9g, optimum within the budget %.9g", rep.TimeSec, best)
			if best < runRep.TimeSec*(1-1e-9) {
				improved++
			}
		})
	}
	require.Greater(t, improved, 6, "most running plans must have a better plan within the budget")
}

// layerCapRatio is layer copies' busiest/mean by the cost model (tokens
// per unit of speed over the mean), as the solver measures its cap.
func layerCapRatio(t *testing.T, sc costmodel.Scenario, copies [][][]placement.GPU) []float64 {
	t.Helper()
	G := sc.Cluster.GPUs()
	rep, err := sc.Evaluate(placement.FromReplicas(G, copies, "ratio"))
	require.NoError(t, err)
	out := make([]float64, len(rep.Layers))
	for l, lr := range rep.Layers {
		var sum, ssum, peak float64
		for g, v := range lr.Tokens {
			sum += v
			ssum += sc.Cluster.SpeedOf(g)
			peak = max(peak, v/sc.Cluster.SpeedOf(g))
		}
		out[l] = peak / (sum / ssum)
	}
	return out
}

// TestSolveMeetsMaxImbalance: on random home-flow instances with replicas
// (every dispatch, several nodes, random starts), a cap halfway between
// perfect balance and the uncapped search's own busiest/mean is met by the
// capped search in most layers (two thirds: on these layers of four
// slots a GPU the count moves by a few layers with any change of the
// search; with the node phase's balance swaps the capped search met 25
// of 36 against 24 without them on the caps their uncapped search sets,
// and 25 against 28 on the looser caps the search before them set): far
// more than the start or the uncapped search meet. A layer that
// starts within the cap ends within it. A search blind to the cap, or
// one returning its start, fails it.
func TestSolveMeetsMaxImbalance(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 4))
	var layers, startIn, freeIn, capIn int
	for it := range 12 {
		N, P := 2+rng.IntN(2), 2+rng.IntN(2)
		E := 4*N*P - N*P
		d := []placement.Dispatch{placement.DispatchEven, placement.DispatchStaticMean, placement.DispatchLocal}[it%3]
		sc, plan, slots := randomInstance(t, rng, N, P, E, 2+rng.IntN(2), 3, 400+rng.IntN(200), N*P, d, it%4 == 0)
		// Slow NICs overlapped with compute: the uncapped search then
		// trades balance for fewer remote copies.
		sc.Mode, sc.Cluster.NICGbps = costmodel.Overlapped, 25
		opts := Options{Limit: task.Limit{Work: 20000}, Parallel: 2, Shares: Shares{Proxy: 0.4, Nodes: 0.25, GPUs: 0.15}}
		p := Problem{Scenario: sc, Slots: slots, Start: plan}
		free, err := Solve(context.Background(), p, opts)
		require.NoError(t, err)
		rFree := layerCapRatio(t, sc, free.Copies)
		p.MaxImbalance = 1 + (slices.Max(rFree)-1)/2
		res, err := Solve(context.Background(), p, opts)
		require.NoError(t, err)
		checkPlan(t, res.Copies, E, slots)
		rStart := layerCapRatio(t, sc, func() [][][]placement.GPU {
			out := make([][][]placement.GPU, len(plan.Layers))
			for l := range out {
				out[l] = plan.ExpertGPUs(l)
			}
			return out
		}())
		rCap := layerCapRatio(t, sc, res.Copies)
		within := func(r float64) bool { return r <= p.MaxImbalance*(1+1e-9) }
		for l := range rCap {
			layers++
			if within(rStart[l]) {
				startIn++
				assert.True(t, within(rCap[l]), "instance %d layer %d: started within the cap %.4f, ended at %.4f", it, l, p.MaxImbalance, rCap[l])
			}
			if within(rFree[l]) {
				freeIn++
			}
			if within(rCap[l]) {
				capIn++
			}
		}
	}
	t.Logf("layers within the cap: start %d, uncapped search %d, capped search %d of %d", startIn, freeIn, capIn, layers)
	assert.GreaterOrEqual(t, capIn, layers*2/3)
	assert.Greater(t, capIn, freeIn+layers/4)
	assert.Greater(t, capIn, startIn+layers/4)
}
