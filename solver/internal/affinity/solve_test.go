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
		d := []placement.Dispatch{placement.DispatchEven, placement.DispatchStatic, placement.DispatchLocal}[it%3]
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
	rng := rand.New(rand.NewPCG(5, 8))
	const N, P, S = 2, 2, 2
	G := N * P
	solved := 0
	for it := range 12 {
		E := 8 - 2*(it%2) // 8 experts, or 6 with 2 redundant slots
		d := []placement.Dispatch{placement.DispatchEven, placement.DispatchStatic}[(it/2)%2]
		t.Run(fmt.Sprintf("%d-%s-E%d", it, d, E), func(t *testing.T) {
			sc, plan, slots := randomInstance(t, rng, N, P, E, 2+rng.IntN(2), 1, 60+rng.IntN(60), G*S-E, d, false)
			// Fast NVLink: the NIC decides every phase, as the search's
			// surrogate assumes.
			sc.Cluster.NVLinkGBps = 1e9
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
