package trafficbound

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// instance is a tiny random problem for brute force.
type instance struct {
	name  string
	stats *routing.Stats
	shape Shape
}

// randomInstance draws tokens for layers layers: each token's top-k set
// uniform or skewed towards low ids (co-activation), its source a GPU or
// −1 (unknown) when sources is set.
func randomInstance(r *rand.Rand, E, N, P, slots, k, T, layers int, sources bool) instance {
	G := N * P
	tr := &routing.Trace{Tokens: T, Layers: layers, TopK: k, Experts: E, IDs: make([]int16, T*layers*k)}
	if sources {
		tr.Source = make([]int32, T)
	}
	for t := range T {
		for l := range layers {
			set := map[int]bool{}
			for len(set) < k {
				e := r.IntN(E)
				if r.IntN(3) == 0 {
					e = r.IntN(max(E/2, k))
				}
				set[e] = true
			}
			j := 0
			for e := range E {
				if set[e] {
					tr.IDs[(t*layers+l)*k+j] = int16(e)
					j++
				}
			}
		}
		if sources {
			tr.Source[t] = int32(r.IntN(G+1) - 1)
		}
	}
	st := tr.Stats(routing.StatsOptions{})
	for i := range st.Patterns { // integral weights other than 1
		st.Patterns[i].Count *= float64(1 + r.IntN(3))
	}
	name := fmt.Sprintf("E%d_N%dx%d_s%d_k%d_T%d_src%v", E, N, P, slots, k, T, sources)
	return instance{name: name, stats: st, shape: Uniform(N, P, slots)}
}

// bruteHome is min over all placements (every GPU g a set of at most
// SlotsPerGPU[g] experts, every expert on some GPU) of Σ_t Count·R_t at
// layer l, written from the definition: each expert's copy probabilities
// from placement.Dispatch.Split, R_t = Σ_{B≠A} (1 − Π_e (1 − q_eB)).
func bruteHome(t *testing.T, in instance, l int, d placement.Dispatch) float64 {
	st, c := in.stats, in.shape
	E, G, P := st.Experts, c.Nodes*c.GPUsPerNode, c.GPUsPerNode
	best := math.Inf(1)
	count := 0
	eachPlacement(in, func(held []uint32) {
		count++
		best = min(best, homeCost(st, l, held, E, G, P, d))
	})
	require.Positive(t, count, "no feasible placement")
	return best
}

// eachPlacement calls f with every placement of in's experts (held[g],
// bit e: GPU g holds expert e; at most SlotsPerGPU[g] experts on GPU g,
// every expert on some GPU). f must not keep held.
func eachPlacement(in instance, f func(held []uint32)) {
	st, c := in.stats, in.shape
	E, G := st.Experts, c.Nodes*c.GPUsPerNode
	subsets := make([][]uint32, G)
	for g := range G {
		for m := uint32(0); m < 1<<E; m++ {
			if bits.OnesCount32(m) <= c.SlotsPerGPU[g] {
				subsets[g] = append(subsets[g], m)
			}
		}
	}
	held := make([]uint32, G)
	var rec func(g int, union uint32)
	rec = func(g int, union uint32) {
		if g == G {
			if union == 1<<E-1 {
				f(held)
			}
			return
		}
		for _, m := range subsets[g] {
			held[g] = m
			rec(g+1, union|m)
		}
	}
	rec(0, 0)
}

// homeCost is Σ_t Count·R_t for the placement held[g] (bit e: GPU g
// holds expert e).
func homeCost(st *routing.Stats, l int, held []uint32, E, G, P int, d placement.Dispatch) float64 {
	N := G / P
	q := copyShares(held, E, G, P, d)
	k := st.TopK
	total := 0.0
	for _, pt := range st.Patterns {
		h0, h1, w := int(pt.Source), int(pt.Source)+1, pt.Count
		if pt.Source < 0 {
			h0, h1, w = 0, G, pt.Count/float64(G)
		}
		for h := h0; h < h1; h++ {
			for B := range N {
				if B == h/P {
					continue
				}
				miss := 1.0
				for _, e := range pt.Experts[l*k : (l+1)*k] {
					miss *= 1 - q[e][h*N+B]
				}
				total += w * (1 - miss)
			}
		}
	}
	return total
}

// copyShares is, for the placement held[g] (bit e: GPU g holds expert e),
// q[e][h·N+B]: the share of expert e's tokens from source GPU h that
// node B serves under dispatch d (placement.Dispatch.Split).
func copyShares(held []uint32, E, G, P int, d placement.Dispatch) [][]float64 {
	N := G / P
	q := make([][]float64, E)
	for e := range E {
		var gpus []int32
		for g := range G {
			if held[g]>>e&1 == 1 {
				gpus = append(gpus, int32(g))
			}
		}
		frac := make([]float64, G*len(gpus))
		d.Split(gpus, G, P, frac)
		q[e] = make([]float64, G*N)
		for h := range G {
			for i, g := range gpus {
				q[e][h*N+int(g)/P] += frac[h*len(gpus)+i]
			}
		}
	}
	return q
}

var dispatches = []placement.Dispatch{placement.DispatchEven, placement.DispatchStaticMean, placement.DispatchLocal}

// TestHomeCostMatchesCostModel pins the brute force's cost to costmodel's
// (CrossNodeBytes of a layer = 2·token bytes·Σ_t Count·R_t) on random
// placements, so that the brute force tests the quantity the product
// reports; and its node loads (nodeLoads, for the capped brute force) to
// costmodel's per-GPU tokens summed over each node, whose busiest over the
// mean is the product's busiest/mean.
func TestHomeCostMatchesCostModel(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	m := costmodel.Model{Name: "tiny", Layers: 1, Experts: 6, TopK: 2, Hidden: 64, FFN: 64, BytesPerActivation: 2}
	for trial := range 30 {
		in := randomInstance(r, 6, 2, 2, 2, 2, 12, 1, true)
		// randomInstance reweights the patterns after counting the loads:
		// count them again from the patterns, as a trace's own would be
		// (the per-source loads too: the patterns are the trace).
		st := in.stats
		st.SourceLoad = nil
		clear(st.Load[0])
		for _, pt := range st.Patterns {
			for _, e := range pt.Experts[:st.TopK] {
				st.Load[0][e] += pt.Count
			}
		}
		cl, err := costmodel.ClusterPreset("h200x8")
		require.NoError(t, err)
		cl = cl.WithNodes(2)
		cl.GPUsPerNode = 2
		held := make([]uint32, 4)
		plan := &placement.Plan{GPUs: 4, Experts: 6, Layers: []placement.LayerPlan{{}}}
		for e := range 6 { // every expert once, plus random extra copies
			g := r.IntN(4)
			held[g] |= 1 << e
		}
		for range 3 {
			held[r.IntN(4)] |= 1 << r.IntN(6)
		}
		for g, hm := range held {
			for e := range 6 {
				if hm>>e&1 == 1 {
					plan.Layers[0].SlotExpert = append(plan.Layers[0].SlotExpert, routing.Expert(e))
					plan.Layers[0].SlotGPU = append(plan.Layers[0].SlotGPU, placement.GPU(g))
				}
			}
		}
		for _, d := range dispatches {
			rep, err := costmodel.Scenario{Stats: in.stats, Cluster: cl, Model: m, Dispatch: d}.Evaluate(plan)
			require.NoError(t, err)
			want := rep.Layers[0].CrossNodeBytes / 2 / m.TokenBytes()
			assert.InDelta(t, want, homeCost(in.stats, 0, held, 6, 4, 2, d), 1e-9*(1+want), "trial %d %v", trial, d)
			tok := rep.Layers[0].Tokens
			nodes := []float64{tok[0] + tok[1], tok[2] + tok[3]}
			assert.InDeltaSlice(t, nodes, nodeLoads(in.stats, 0, held, 6, 4, 2, d), 1e-9*(1+nodes[0]+nodes[1]), "trial %d %v", trial, d)
		}
	}
}

// boundCases are the random shapes of the property tests: with and
// without redundant slots, sources and co-activation.
func boundCases(r *rand.Rand, n int) []instance {
	shapes := []struct{ E, N, P, slots, k int }{
		{8, 2, 2, 2, 3}, // 8 experts, 2 nodes × 2 GPUs × 2 slots: no replicas
		{8, 2, 2, 2, 2},
		{6, 3, 1, 2, 2},
		{6, 2, 2, 2, 2}, // 2 redundant slots
		{5, 2, 2, 2, 3}, // 3 redundant slots
		{6, 2, 1, 4, 3},
		{4, 2, 2, 1, 2},
		{6, 3, 2, 1, 2},
	}
	var out []instance
	for i := range n {
		s := shapes[i%len(shapes)]
		out = append(out, randomInstance(r, s.E, s.N, s.P, s.slots, s.k, 4+r.IntN(10), 1, i%3 != 0))
	}
	return out
}

// TestHomeRemoteBelowBruteForce is the main property: on many random
// small instances, for every dispatch, the bound never exceeds the
// brute-force optimum over all placements. The mutation tests below show
// it catches bounds that drop a term.
func TestHomeRemoteBelowBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, in := range boundCases(r, 48) {
		for _, d := range dispatches {
			b, err := HomeRemote(context.Background(), in.stats, 0, in.shape, d, Options{})
			require.NoError(t, err)
			opt := bruteHome(t, in, 0, d)
			assert.LessOrEqual(t, b.Value, opt+1e-9*(1+opt), "%s %v: bound %v above optimum %v", in.name, d, b.Value, opt)
			assert.GreaterOrEqual(t, b.Value, 0.0)
		}
	}
}

// mutatedHome recomputes HomeRemote's certificate with one part
// weakened, the way a wrong bound would be: the budgets of another
// dispatch (dropping the static or local replica terms), no eigenvalue
// term in the spectral bound, or the home master replaced by its mean.
func mutatedHome(t *testing.T, in instance, d placement.Dispatch, mutation string) float64 {
	st, c := in.stats, in.shape
	caps, err := c.check(st)
	require.NoError(t, err)
	R := -st.Experts
	for _, s := range c.SlotsPerGPU {
		R += s
	}
	lt, err := tokenSet(st, 0, c, true)
	require.NoError(t, err)
	if c.Nodes == 1 || lt.total == 0 {
		return 0
	}
	var w Work
	var H, W float64
	switch mutation {
	case "even budgets":
		H, W = homeBudget(lt, caps, R, placement.DispatchEven, &w), pairBudget(lt, caps, R, placement.DispatchEven, 4, &w)
	case "no eigen term":
		H = homeBudget(lt, caps, R, d, &w)
		W = spectralBound(&pairProblem{C: lt.C, E: lt.E, N: lt.N, caps: caps, noEigenTerm: true}, 4, &w)
	case "mean home":
		for _, row := range lt.nodeLoad {
			for _, x := range row {
				H += x / float64(c.Nodes)
			}
		}
		W = pairBudget(lt, caps, R, d, 4, &w)
	}
	var groups []group
	for _, k := range sortedKeys(lt.kWeight) {
		groups = append(groups, group{weight: lt.kWeight[k], configs: homeConfigs(k, c.Nodes)})
	}
	budget := []float64{H, W}
	nu, _ := multipliers(groups, budget)
	return certify(groups, budget, nu)
}

// TestMutationsAreCaught runs the property above with a mutated bound and
// requires a violation: proof that the property test has teeth. Each
// mutation drops a term the certificate needs.
func TestMutationsAreCaught(t *testing.T) {
	for _, tc := range []struct {
		mutation string
		d        placement.Dispatch
	}{
		{"even budgets", placement.DispatchLocal}, // local's replica terms dropped
		{"even budgets", placement.DispatchStaticMean},
		{"no eigen term", placement.DispatchEven}, // λ(PAP) term of the spectral bound dropped
		{"mean home", placement.DispatchEven},     // home transportation master replaced by the mean
	} {
		t.Run(tc.mutation+"/"+tc.d.String(), func(t *testing.T) {
			r := rand.New(rand.NewPCG(3, 4))
			caught := 0
			for _, in := range boundCases(r, 64) {
				v := mutatedHome(t, in, tc.d, tc.mutation)
				if opt := bruteHome(t, in, 0, tc.d); v > opt+1e-9*(1+opt) {
					caught++
				}
			}
			assert.Positive(t, caught, "mutation %q never exceeded the optimum", tc.mutation)
			t.Logf("%d of 64 instances caught", caught)
		})
	}
}

// TestHomeRemoteExact: where the certificate is tight it must equal the
// optimum. One node: 0. Top-1 without redundant slots: a token is remote
// iff its expert sits off its source's node, so the optimum is
// Σ Count − (the best home transportation), which the bound reproduces.
func TestHomeRemoteExact(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 12 {
		in := randomInstance(r, 6, 1, 3, 2, 2, 8, 1, true)
		b, err := HomeRemote(context.Background(), in.stats, 0, in.shape, dispatches[i%3], Options{})
		require.NoError(t, err)
		assert.Equal(t, MethodOneNode, b.Method)
		assert.Zero(t, b.Value)
		assert.Zero(t, bruteHome(t, in, 0, dispatches[i%3]))
	}
	for i := range 12 {
		in := randomInstance(r, 6, 3, 1, 2, 1, 10, 1, true)
		in.shape = Shape{Nodes: 3, GPUsPerNode: 1, SlotsPerGPU: []int{2, 2, 2}}
		b, err := HomeRemote(context.Background(), in.stats, 0, in.shape, placement.DispatchEven, Options{})
		require.NoError(t, err)
		opt := bruteHome(t, in, 0, placement.DispatchEven)
		assert.InDelta(t, opt, b.Value, 1e-6*(1+opt), "top-1 case %d", i)
	}
}

// TestHomeRemoteErrors: bad input gets an error naming the field.
func TestHomeRemoteErrors(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	in := randomInstance(r, 6, 2, 2, 2, 2, 8, 2, true)
	countOnly := routing.StatsFromLoad([][]float64{{1, 2, 3, 4, 5, 6}}, 2)
	for _, tc := range []struct {
		name  string
		stats *routing.Stats
		layer int
		shape Shape
		d     placement.Dispatch
		want  string
	}{
		{"nil stats", nil, 0, in.shape, placement.DispatchEven, "nil stats"},
		{"count only", countOnly, 0, Uniform(2, 2, 2), placement.DispatchEven, "no per-token patterns"},
		{"layer", in.stats, 2, in.shape, placement.DispatchEven, "layer 2 out of range [0,2)"},
		{"slots length", in.stats, 0, Shape{Nodes: 2, GPUsPerNode: 2, SlotsPerGPU: []int{2, 2}}, placement.DispatchEven, "SlotsPerGPU has 2 entries for 4 GPUs"},
		{"too few slots", in.stats, 0, Uniform(2, 2, 1), placement.DispatchEven, "4 slots per layer for 6 experts"},
		{"negative slots", in.stats, 0, Shape{Nodes: 1, GPUsPerNode: 2, SlotsPerGPU: []int{7, -1}}, placement.DispatchEven, "SlotsPerGPU[1] is -1"},
		{"no nodes", in.stats, 0, Shape{}, placement.DispatchEven, "0 nodes"},
		{"dispatch", in.stats, 0, in.shape, placement.Dispatch(-1), "no bound for"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := HomeRemote(context.Background(), tc.stats, tc.layer, tc.shape, tc.d, Options{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "trafficbound: ")
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := HomeRemote(ctx, in.stats, 0, in.shape, placement.DispatchEven, Options{})
	assert.ErrorIs(t, err, context.Canceled)
	_, err = HomeRemoteLayers(ctx, in.stats, in.shape, placement.DispatchEven, Options{})
	assert.ErrorIs(t, err, context.Canceled)
}

// TestHomeRemoteLayersDeterministic: the same bound for every layer
// whatever the parallelism, and equal to HomeRemote layer by layer.
func TestHomeRemoteLayersDeterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	in := randomInstance(r, 12, 2, 2, 4, 3, 40, 4, true)
	one, err := HomeRemoteLayers(context.Background(), in.stats, in.shape, placement.DispatchStaticMean, Options{})
	require.NoError(t, err)
	par, err := HomeRemoteLayers(context.Background(), in.stats, in.shape, placement.DispatchStaticMean, Options{Parallel: 3})
	require.NoError(t, err)
	for l := range one {
		b, err := HomeRemote(context.Background(), in.stats, l, in.shape, placement.DispatchStaticMean, Options{})
		require.NoError(t, err)
		assert.Equal(t, b, one[l])
		assert.Equal(t, b, par[l])
	}
}
