package solver_test

import (
	"context"
	"fmt"
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
	. "github.com/moetuner/moetuner/solver"
)

// randomHomeProblem is a small one-node home-flow problem with per-token
// patterns whose expert sets are skewed towards a few experts, so that
// groups differ in how many tokens they reach.
func randomHomeProblem(t *testing.T, rng *rand.Rand, E, G, k, L, T int, mode costmodel.Mode) Problem {
	t.Helper()
	tr := &routing.Trace{Tokens: T, Layers: L, TopK: k, Experts: E}
	for range T {
		for range L {
			// Tokens favour one of G clusters of experts (e mod G), and
			// low ids, so co-activation and load both vary.
			c := rng.IntN(G)
			var pick []int
			for len(pick) < k {
				e := rng.IntN(E)
				if rng.IntN(10) < 6 {
					e = (e/G)*G + c
				}
				if rng.IntN(3) == 0 {
					e = e / 2
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
	st := tr.Stats(routing.StatsOptions{})
	m := fakeModel(E, k)
	m.Hidden = 256 + rng.IntN(8192)
	return Problem{Stats: st, Cluster: smallCluster(1, G), Model: m, Flow: costmodel.FlowHome, Mode: mode}
}

// randomBalancedPlan puts E/G random experts on each GPU in every layer.
func randomBalancedPlan(rng *rand.Rand, L, E, G int) *placement.Plan {
	row := make([][]placement.GPU, L)
	for l := range row {
		row[l] = make([]placement.GPU, E)
		for i, e := range rng.Perm(E) {
			row[l][e] = placement.GPU(i / (E / G))
		}
	}
	return placement.FromAssignment(G, row, "rand")
}

// layerMaxima computes, independently of the solver, a plan layer's
// busiest GPU's routed tokens and busiest GPU's distinct tokens.
func layerMaxima(p Problem, lp placement.LayerPlan, l int) (float64, float64) {
	G := p.Cluster.GPUs()
	gpuOf := make(map[int]int)
	for s, e := range lp.SlotExpert {
		gpuOf[int(e)] = int(lp.SlotGPU[s])
	}
	load := make([]float64, G)
	dist := make([]float64, G)
	k := p.Stats.TopK
	for _, pt := range p.Stats.Patterns {
		hit := make([]bool, G)
		for _, e := range pt.Experts[l*k : (l+1)*k] {
			g := gpuOf[int(e)]
			load[g] += pt.Count
			hit[g] = true
		}
		for g, h := range hit {
			if h {
				dist[g] += pt.Count
			}
		}
	}
	return slices.Max(load), slices.Max(dist)
}

// tokenSets returns, for brute force, the tokens of each expert in a
// one-layer problem (a pattern of count c stands for c tokens) and the
// token count.
func tokenSets(p Problem) ([]map[int]bool, int) {
	sets := make([]map[int]bool, p.Stats.Experts)
	for e := range sets {
		sets[e] = map[int]bool{}
	}
	tok := 0
	for _, pt := range p.Stats.Patterns {
		for range int(pt.Count) {
			for _, e := range pt.Experts {
				sets[e][tok] = true
			}
			tok++
		}
	}
	return sets, tok
}

// coverOf returns N(S), the tokens with an expert in S.
func coverOf(sets []map[int]bool, S []int) int {
	u := map[int]bool{}
	for _, e := range S {
		for x := range sets[e] {
			u[x] = true
		}
	}
	return len(u)
}

// homeCost, the layer cost as a function of the two maxima that annealing
// and the bound rely on, equals the cost model's layer time on random
// plans, in both modes.
func TestHomeCostMatchesEvaluator(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	for it := range 20 {
		G := 2 + rng.IntN(4)
		E := G * (2 + rng.IntN(3))
		p := randomHomeProblem(t, rng, E, G, 2+rng.IntN(2), 2, 30+rng.IntN(80), costmodel.Mode(it%2))
		cost, ok := HomeCost(p)
		require.True(t, ok)
		ev, err := costmodel.NewEvaluator(p.Stats, p.Cluster, p.Model, costmodel.Options{Flow: costmodel.FlowHome, Mode: p.Mode})
		require.NoError(t, err)
		for range 5 {
			lp := randomBalancedPlan(rng, 1, E, G).Layers[0]
			for l := 0; l < p.Stats.Layers; l++ {
				mL, mD := layerMaxima(p, lp, l)
				want := ev.LayerTime(l, lp, nil)
				assert.InDelta(t, want, cost(mL, mD), 1e-12*want, "it %d layer %d", it, l)
			}
		}
	}
}

// The group search is exhaustive: it reports a group exactly when brute
// force over every group of at most E/G experts finds one with N(S) ≤ z and
// π(S) ≥ theta, and every group it returns qualifies.
func TestCoverSearchExhaustive(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 44))
	for it := range 60 {
		G := 2 + rng.IntN(3)
		E := G * (2 + rng.IntN(3))
		p := randomHomeProblem(t, rng, E, G, 2+rng.IntN(2), 1, 20+rng.IntN(60), costmodel.Sequential)
		m := E / G
		pi := make([]float64, E)
		for e := range pi {
			if rng.IntN(4) > 0 {
				pi[e] = rng.Float64()
			}
		}
		sets, tok := tokenSets(p)
		cover := func(S []int) int { return coverOf(sets, S) }
		z := tok/G + rng.IntN(tok/2+1)
		theta := 0.5 + rng.Float64()*float64(m)/2
		want := false
		for mask := 1; mask < 1<<E; mask++ {
			var S []int
			w := 0.0
			for e := 0; e < E; e++ {
				if mask>>e&1 == 1 {
					S = append(S, e)
					w += pi[e]
				}
			}
			if len(S) <= m && w >= theta && cover(S) <= z {
				want = true
				break
			}
		}
		got, groups := CoverSearch(p, 0, pi, z, theta)
		name := fmt.Sprintf("it %d: E %d G %d z %d theta %.3f", it, E, G, z, theta)
		require.Equal(t, want, got, name)
		for _, S := range groups {
			w := 0.0
			for _, e := range S {
				w += pi[e]
			}
			assert.LessOrEqual(t, len(S), m, name)
			assert.GreaterOrEqual(t, w, theta, name)
			assert.LessOrEqual(t, cover(S), z, name)
		}
	}
}

// The certified corners hold for every partition, found by brute force:
// each partition has busiest routed tokens ≥ L and busiest distinct tokens
// ≥ D for some corner (L, D) of its layer. The uncapped corner reaches the
// best partition's busiest distinct tokens in most layers, and capped
// corners appear; the search starts from a random partition, so a broken
// certificate check would report that partition's (larger) value.
func TestHomeBottleneckBruteForce(t *testing.T) {
	t.Run("heuristic pricing", func(t *testing.T) { testHomeBottleneckBruteForce(t) })
	// Without the heuristic every column, and every certificate, comes
	// from the exhaustive search, which the small instances above may
	// never need.
	t.Run("exhaustive pricing", func(t *testing.T) {
		defer SetCoverHeuristicStarts(0)()
		testHomeBottleneckBruteForce(t)
	})
}

func testHomeBottleneckBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(45, 46))
	exact, nontrivial, capped, layers := 0, 0, 0, 0
	for it := range 16 {
		G := 2 + rng.IntN(3)
		E := G * (2 + rng.IntN(2))
		if E > 9 {
			E, G = 8, 4
		}
		p := randomHomeProblem(t, rng, E, G, 2+rng.IntN(2), 2, 30+rng.IntN(60), costmodel.Sequential)
		plan := randomBalancedPlan(rng, p.Stats.Layers, E, G)
		corners, err := HomeBottleneckPairs(context.Background(), p, testBackend(t), plan, time.Now().Add(5*time.Second), 2, uint64(it))
		require.NoError(t, err)
		require.Len(t, corners, p.Stats.Layers)
		parts := balancedPartitions(E, G)
		for l := 0; l < p.Stats.Layers; l++ {
			name := fmt.Sprintf("it %d layer %d: E %d G %d corners %v", it, l, E, G, corners[l])
			require.NotEmpty(t, corners[l], name)
			if len(corners[l]) > 1 {
				capped++
			}
			uncapped := corners[l][len(corners[l])-1][1]
			best := math.Inf(1)
			for _, a := range parts {
				r := make([]placement.GPU, E)
				for e, g := range a {
					r[e] = placement.GPU(g)
				}
				lp := placement.FromAssignment(G, [][]placement.GPU{r}, "brute").Layers[0]
				mL, mD := layerMaxima(p, lp, l)
				best = math.Min(best, mD)
				covered := false
				for _, c := range corners[l] {
					if mL >= c[0] && mD >= c[1] {
						covered = true
					}
				}
				require.True(t, covered, "%s: partition %v (maxL %v, maxD %v) escapes every corner", name, a, mL, mD)
			}
			layers++
			if uncapped == best {
				exact++
			}
			if uncapped > slices.Max(p.Stats.Load[l]) {
				nontrivial++
			}
		}
	}
	t.Logf("uncapped bound equals the optimum in %d of %d layers, beats the largest expert in %d; %d layers have capped corners", exact, layers, nontrivial, capped)
	assert.GreaterOrEqual(t, exact, layers/2)
	assert.GreaterOrEqual(t, nontrivial, layers/2)
	assert.Positive(t, capped)
}

// Annealing never returns a plan worse than its start, and its plan
// validates.
func TestHomeAnnealNeverWorse(t *testing.T) {
	rng := rand.New(rand.NewPCG(47, 48))
	for it := range 8 {
		G := 2 + rng.IntN(4)
		E := G * (2 + rng.IntN(4))
		p := randomHomeProblem(t, rng, E, G, 2+rng.IntN(2), 3, 50+rng.IntN(100), costmodel.Mode(it%2))
		plan := randomBalancedPlan(rng, p.Stats.Layers, E, G)
		_, before, err := Score(p, plan)
		require.NoError(t, err)
		out, ok := HomeAnneal(context.Background(), p, plan, 20000, 2, 2, time.Now().Add(2*time.Second), uint64(it))
		require.True(t, ok)
		require.NoError(t, out.Validate(placement.ValidateOptions{Experts: E, Layers: p.Stats.Layers}))
		_, after, err := Score(p, out)
		require.NoError(t, err)
		assert.LessOrEqual(t, after, before*(1+1e-12), "it %d", it)
	}
}

// Cancelling a joint solve on the one-node home flow stops the annealing
// and the bound too, not only HiGHS: the solve ends long before its time
// limit.
func TestHomeJointHonoursCancel(t *testing.T) {
	if testing.Short() {
		t.Skip("solves FLAME")
	}
	p := flameProblem(t, 1, costmodel.FlowHome)
	ctx, cancel := context.WithCancel(context.Background())
	// With a 20 s limit the ILP ends at 2 s and the polish at 3 s; the
	// annealing runs to 6 s, so a cancel at 4.5 s lands in it.
	go func() {
		time.Sleep(4500 * time.Millisecond)
		cancel()
	}()
	start := time.Now()
	res, err := Solve(ctx, p, StrategyJoint, testBackend(t), Options{TimeLimit: 20 * time.Second})
	took := time.Since(start)
	t.Logf("cancelled after 4.5 s, returned after %v (err %v)", took.Round(time.Millisecond), err)
	assert.Less(t, took, 12*time.Second)
	if err == nil {
		verify(t, p, res)
	}
}

// The support-column climb returns only groups that fit (|S| ≤ E/G,
// N(S) ≤ z, routed tokens within the cap) with π(S) > 1, and from every
// seed it reaches at least the best group that drops up to two of the
// seed's experts and adds up to two others, found here by brute force.
func TestSwapColumnsClimb(t *testing.T) {
	rng := rand.New(rand.NewPCG(45, 46))
	improving := 0
	for it := range 80 {
		G := 2 + rng.IntN(3)
		E := G * (2 + rng.IntN(3))
		p := randomHomeProblem(t, rng, E, G, 2+rng.IntN(2), 1, 20+rng.IntN(60), costmodel.Sequential)
		m := E / G
		sets, tok := tokenSets(p)
		cover := func(S []int) int { return coverOf(sets, S) }
		load := func(S []int) int {
			n := 0
			for _, e := range S {
				n += len(sets[e])
			}
			return n
		}
		weight := func(pi []float64, S []int) float64 {
			w := 0.0
			for _, e := range S {
				w += pi[e]
			}
			return w
		}
		z := tok/G + rng.IntN(tok/2+1)
		lcap := 0
		if it%2 == 1 {
			lcap = tok*p.Stats.TopK/G + rng.IntN(tok/2+1)
		}
		fits := func(S []int) bool {
			return len(S) <= m && cover(S) <= z && (lcap == 0 || load(S) <= lcap)
		}
		pi := make([]float64, E)
		for e := range pi {
			if rng.IntN(5) > 0 {
				pi[e] = rng.Float64() * 2 / float64(m)
			}
		}
		// Seeds: random groups that fit.
		var seeds [][]int
		for range 4 {
			var S []int
			for _, e := range rng.Perm(E) {
				if len(S) < m && fits(append(slices.Clone(S), e)) {
					S = append(S, e)
				}
			}
			if len(S) > 0 {
				seeds = append(seeds, S)
			}
		}
		name := fmt.Sprintf("it %d: E %d G %d z %d lcap %d", it, E, G, z, lcap)
		for _, S := range SwapColumns(p, 0, pi, z, seeds, lcap, 1<<30) {
			assert.True(t, fits(S), name)
			assert.Greater(t, weight(pi, S), 1.0, name)
			assert.Len(t, S, len(slices.Compact(slices.Sorted(slices.Values(S)))), name)
		}
		for _, B := range seeds {
			// The best neighbour: drop R (|R| ≤ 2), add A (1 ≤ |A| ≤ 2).
			var out []int
			for e := 0; e < E; e++ {
				if !slices.Contains(B, e) {
					out = append(out, e)
				}
			}
			nb := weight(pi, B)
			for rm := 0; rm < 1<<len(B); rm++ {
				var kept []int
				for i, e := range B {
					if rm>>i&1 == 0 {
						kept = append(kept, e)
					}
				}
				if len(B)-len(kept) > 2 {
					continue
				}
				for i := range out {
					for j := i; j < len(out); j++ {
						S := append(slices.Clone(kept), out[i])
						if j > i {
							S = append(S, out[j])
						}
						if fits(S) {
							nb = math.Max(nb, weight(pi, S))
						}
					}
				}
			}
			got := SwapColumns(p, 0, pi, z, [][]int{B}, lcap, 1)
			if nb > 1+1e-9 {
				improving++
				if assert.Len(t, got, 1, "%s: seed %v", name, B) {
					assert.GreaterOrEqual(t, weight(pi, got[0]), nb-1e-9, "%s: seed %v", name, B)
				}
			}
		}
	}
	assert.Greater(t, improving, 20, "too few seeds had a neighbour above 1")
}
