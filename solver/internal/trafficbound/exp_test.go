package trafficbound

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/internal/sharedfiles"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// TestExperimentBudgets shows where the home-flow bound loses against a
// plan (run with MOETUNER_EXP=1; TRACE, NODES and LAYERS as in the
// affinity experiments; one copy of every expert, even dispatch). Per
// layer it prints the bound and its two budgets (home H*, pairs W*), the
// moments of EPLB's plan and of a node-level swap search from it at
// EPLB's node loads, and the configuration LP with each budget replaced
// by the search plan's moment: what a perfect master could give. Last,
// a balance-aware pair budget: for plans whose nodes carry at most 1.02
// of the mean load, Σ_B load_B² ≤ Q, so for μ ≥ 0
//
//	W ≤ max_X Σ_{a<b} (C_ab − 2μ·L_a·L_b)⟨x_a, x_b⟩ + μ·(Q − Σ_a L_a²),
//
// the same pair master on a shifted matrix, minimized over a grid of μ.
func TestExperimentBudgets(t *testing.T) {
	if os.Getenv("MOETUNER_EXP") == "" {
		t.Skip("experiment: set MOETUNER_EXP=1")
	}
	st, N, layers := expStats(t)
	const P = 8
	S := st.Experts / (N * P)
	shape := Uniform(N, P, S)
	caps, err := shape.check(st)
	require.NoError(t, err)
	eplb, err := baseline.EPLB(st, N*P, baseline.EPLBOptions{})
	require.NoError(t, err)
	for _, l := range layers {
		b, err := HomeRemote(context.Background(), st, l, shape, placement.DispatchEven, Options{})
		require.NoError(t, err)
		lt, err := tokenSet(st, l, shape, false)
		require.NoError(t, err)
		T := lt.total
		node := make([]int, st.Experts)
		for s, e := range eplb.Layers[l].SlotExpert {
			node[e] = int(eplb.Layers[l].SlotGPU[s]) / P
		}
		nodeLoad := make([]float64, N)
		for e, B := range node {
			nodeLoad[B] += st.Load[l][e]
		}
		limit := 0.0
		for _, v := range nodeLoad {
			limit = max(limit, v)
		}
		search := nodeSearch(st, l, N, P, node, limit, 3)
		moments := func(node []int) (cost, h, w float64) {
			k := st.TopK
			for _, pt := range st.Patterns {
				A := -1
				if pt.Source >= 0 {
					A = int(pt.Source) / P
				}
				ex := distinct(nil, pt.Experts[l*k:(l+1)*k])
				used := make([]bool, N)
				for i, a := range ex {
					used[node[a]] = true
					if node[a] == A {
						h += pt.Count
					}
					for _, c := range ex[i+1:] {
						if node[a] == node[c] {
							w += pt.Count
						}
					}
				}
				for B, u := range used {
					switch {
					case u && A < 0:
						cost += pt.Count * float64(N-1) / float64(N)
					case u && B != A:
						cost += pt.Count
					}
				}
			}
			return cost, h, w
		}
		groups := make([]group, 0, len(lt.kWeight))
		for _, k := range sortedKeys(lt.kWeight) {
			groups = append(groups, group{weight: lt.kWeight[k], configs: homeConfigs(k, N)})
		}
		lp := func(h, w float64) float64 {
			budget := []float64{h, w}
			nu, _ := multipliers(groups, budget)
			return certify(groups, budget, nu) / T
		}
		ce, he, we := moments(node)
		cs, hs, ws := moments(search)
		t.Logf("layer %d: bound %.4f, H* %.3f, W* %.3f (per token)", l, b.Value/T, b.HomeBudget/T, b.PairBudget/T)
		t.Logf("  EPLB:   remote %.4f, H %.3f, W %.3f", ce/T, he/T, we/T)
		t.Logf("  search: remote %.4f, H %.3f, W %.3f", cs/T, hs/T, ws/T)
		t.Logf("  LP with (H*, W_search) %.4f, (H_search, W*) %.4f, (H_search, W_search) %.4f", lp(b.HomeBudget, ws), lp(hs, b.PairBudget), lp(hs, ws))
		// The balance-aware pair budget at node cap 1.02.
		E, L := lt.E, st.Load[l]
		total, sq := 0.0, 0.0
		for _, v := range L {
			total += v
			sq += v * v
		}
		Q, left := 0.0, total
		for range N {
			x := min(left, 1.02*total/float64(N))
			Q += x * x
			left -= x
		}
		best := b.PairBudget
		for _, f := range []float64{1, 2, 4, 8, 16, 32, 64, 128, 256} {
			mu := f * T / (total * total)
			C := make([]float64, E*E)
			for a := range E {
				for c := range E {
					if a != c {
						C[a*E+c] = lt.C[a*E+c] - 2*mu*L[a]*L[c]
					}
				}
			}
			var w Work
			best = min(best, spectralBound(&pairProblem{C: C, E: E, N: N, caps: caps}, DefaultShiftSteps, &w)+mu*(Q-sq))
		}
		t.Logf("  balance-aware W* (node cap 1.02) %.3f: LP %.4f", best/T, lp(b.HomeBudget, best))
	}
}

// TestExperimentBalancedBound prints, per layer, the home-flow bound over
// every plan and over the plans whose nodes carry at most CAP (default
// 1.02) of the mean load, without and with the shift steps, and their
// times (run with MOETUNER_EXP=1; TRACE, NODES, LAYERS as above; SLOTS
// per GPU, 9 by default: 32 redundant slots on 4 × 8; DISPATCH, static by
// default).
func TestExperimentBalancedBound(t *testing.T) {
	if os.Getenv("MOETUNER_EXP") == "" {
		t.Skip("experiment: set MOETUNER_EXP=1")
	}
	st, N, layers := expStats(t)
	slots := 9
	if v := os.Getenv("SLOTS"); v != "" {
		_, err := fmt.Sscan(v, &slots)
		require.NoError(t, err)
	}
	capRatio := 1.02
	if v := os.Getenv("CAP"); v != "" {
		_, err := fmt.Sscan(v, &capRatio)
		require.NoError(t, err)
	}
	shape := Uniform(N, 8, slots)
	d := placement.DispatchStaticMean
	if v := os.Getenv("DISPATCH"); v != "" {
		var err error
		d, err = placement.ParseDispatch(v)
		require.NoError(t, err)
	}
	for _, l := range layers {
		t0 := time.Now()
		b0, err := HomeRemote(context.Background(), st, l, shape, d, Options{ShiftSteps: -1})
		require.NoError(t, err)
		t1 := time.Now()
		b1, err := HomeRemote(context.Background(), st, l, shape, d, Options{ShiftSteps: -1, MaxNodeLoad: capRatio})
		require.NoError(t, err)
		t2 := time.Now()
		b2, err := HomeRemote(context.Background(), st, l, shape, d, Options{MaxNodeLoad: capRatio})
		require.NoError(t, err)
		T := b0.Tokens
		t.Logf("layer %d: bound %.4f (W* %.3f, %v); at node cap %.2f %.4f (W* %.3f, %v), with the shift steps %.4f (%v)", l, b0.Value/T, b0.PairBudget/T, t1.Sub(t0), capRatio, b1.Value/T, b1.PairBudget/T, t2.Sub(t1), b2.Value/T, time.Since(t2))
	}
}

// expStats reads the experiments' trace (TRACE, else the shared 32k
// synthetic one; skips when absent) with their NODES and LAYERS.
func expStats(t *testing.T) (*routing.Stats, int, []int) {
	path := os.Getenv("TRACE")
	if path == "" {
		path = sharedfiles.Find("shared/traces/synthetic-deepseek-v3/ds3-prefill4096-32k.npy")
	}
	N, layers := testkit.ExpSettings(t, 0, 20)
	if path == "" {
		t.Skip("no trace: set TRACE")
	}
	src, err := routing.Load(path, routing.LoadOptions{})
	require.NoError(t, err)
	return src.Stats, N, layers
}
