package trafficbound

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMaxAssignExact: the transportation bound equals the brute-force
// optimum (never below it: it is an upper bound; never above: the
// Hungarian search and its potentials are optimal). Catches a wrong
// potential (bound above) and a capacity overrun (bound below).
func TestMaxAssignExact(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for trial := range 300 {
		n, N := 1+r.IntN(7), 1+r.IntN(3)
		caps := make([]int, N)
		for B := range caps {
			caps[B] = r.IntN(4)
		}
		for sum(caps) < n {
			caps[r.IntN(N)]++
		}
		val := make([][]float64, n)
		for e := range val {
			val[e] = make([]float64, N)
			for B := range val[e] {
				val[e][B] = float64(r.IntN(5)) // ties on purpose
			}
		}
		best := math.Inf(-1)
		x := make([]int, n)
		var rec func(e int, used []int, v float64)
		rec = func(e int, used []int, v float64) {
			if e == n {
				best = max(best, v)
				return
			}
			for B := range N {
				if used[B] < caps[B] {
					used[B]++
					x[e] = B
					rec(e+1, used, v+val[e][B])
					used[B]--
				}
			}
		}
		rec(0, make([]int, N), 0)
		got, _ := maxAssign(val, caps)
		assert.InDelta(t, best, got, 1e-9, "trial %d caps %v val %v", trial, caps, val)
	}
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

// TestMaxExtraExact compares the dynamic program with enumeration of copy
// counts. Catches an off-by-one in the slot accounting.
func TestMaxExtraExact(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	for trial := range 200 {
		E, extra, cmax := 1+r.IntN(4), r.IntN(5), 1+r.IntN(4)
		gain := make([][]float64, E)
		for e := range gain {
			gain[e] = make([]float64, cmax+1)
			for c := 2; c <= cmax; c++ {
				gain[e][c] = float64(r.IntN(6))
			}
		}
		best := 0.0
		var rec func(e, left int, v float64)
		rec = func(e, left int, v float64) {
			if e == E {
				best = max(best, v)
				return
			}
			for c := 1; c <= cmax && c-1 <= left; c++ {
				rec(e+1, left-(c-1), v+gain[e][c])
			}
		}
		rec(0, extra, 0)
		got := maxExtra(E, extra, cmax, func(e, c int) float64 { return gain[e][c] })
		assert.InDelta(t, best, got, 1e-12, "trial %d", trial)
	}
}

// TestSizeVectors: exactly the node-size multisets that fit the caps.
func TestSizeVectors(t *testing.T) {
	for _, tc := range []struct {
		E    int
		caps []int
		want [][]float64
	}{
		{4, []int{2, 2}, [][]float64{{2, 2}}},
		{4, []int{3, 2}, [][]float64{{3, 1}, {2, 2}}},
		{5, []int{2, 4, 1}, [][]float64{{4, 1, 0}, {3, 2, 0}, {3, 1, 1}, {2, 2, 1}}},
		{3, []int{1, 1}, nil}, // cannot fit: no vector
	} {
		got := sizeVectors(tc.E, tc.caps, 100)
		assert.Equal(t, tc.want, got, "E %d caps %v", tc.E, tc.caps)
	}
	assert.Nil(t, sizeVectors(256, []int{72, 72, 72, 72, 72}, 10), "over the limit")
}

// TestPairBoundAbovePartitions: the spectral and star bounds are at least
// the largest pair weight of every partition with node sizes within the
// caps (the quantity the home and chain certificates need), on random
// weight matrices, with caps summing to E and above it, with and without
// shift steps, and in the worst-case branch (no size list).
func TestPairBoundAbovePartitions(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	for trial := range 150 {
		E, N := 3+r.IntN(5), 2+r.IntN(2)
		caps := make([]int, N)
		for sum(caps) < E {
			caps[r.IntN(N)]++
		}
		for range r.IntN(3) {
			caps[r.IntN(N)]++
		}
		C := make([]float64, E*E)
		for a := range E {
			for b := a + 1; b < E; b++ {
				v := float64(r.IntN(4))
				if r.IntN(3) == 0 {
					v = 0
				}
				C[a*E+b], C[b*E+a] = v, v
			}
		}
		best := 0.0
		node := make([]int, E)
		var rec func(e int, used []int)
		rec = func(e int, used []int) {
			if e == E {
				w := 0.0
				for a := range E {
					for b := a + 1; b < E; b++ {
						if node[a] == node[b] {
							w += C[a*E+b]
						}
					}
				}
				best = max(best, w)
				return
			}
			for B := range N {
				if used[B] < caps[B] {
					used[B]++
					node[e] = B
					rec(e+1, used)
					used[B]--
				}
			}
		}
		rec(0, make([]int, N))
		p := &pairProblem{C: C, E: E, N: N, caps: caps}
		var w Work
		for _, steps := range []int{0, 6} {
			assert.GreaterOrEqual(t, spectralBound(p, steps, &w), best-1e-9, "trial %d spectral steps %d", trial, steps)
		}
		assert.GreaterOrEqual(t, starBound(p), best-1e-9, "trial %d star", trial)
		ev := &shiftEval{p: p, mt: newMassTerms(E, N, caps), rs: rowSums(C, E), w: &w}
		ev.mt.sizes = nil // the worst-case branch
		v, _ := ev.value(make([]float64, E), certified)
		assert.GreaterOrEqual(t, v, best-1e-9, "trial %d worst-case branch", trial)
	}
}

func rowSums(C []float64, E int) []float64 {
	rs := make([]float64, E)
	for a := range E {
		for b := range E {
			rs[a] += C[a*E+b]
		}
	}
	return rs
}

// TestHomeConfigs: the configurations are the partitions the definition
// gives (k = 3, N = 3: 3 at home; 2 + one block; 1 + {2} or {1,1}; 0 +
// {3}, {2,1}), each with its moments; one node leaves only all-at-home.
func TestHomeConfigs(t *testing.T) {
	got := homeConfigs(3, 3)
	want := []config{
		{0, []float64{3, 3}},
		{1, []float64{2, 1}},
		{1, []float64{1, 1}}, {2, []float64{1, 0}},
		{1, []float64{0, 3}}, {2, []float64{0, 1}},
	}
	assert.Equal(t, want, got)
	assert.Equal(t, []config{{0, []float64{8, 28}}}, homeConfigs(8, 1))
	assert.Len(t, homeConfigs(8, 4), 1+1+2+3+4+5+7+8+10) // partitions of r into ≤ 3 parts, r = 0..8
}

// bruteChain is the chain flow's minimum transitions into layer 1 over
// all pairs of single-copy placements of layers 0 and 1 (each GPU at most
// its slots), from the definition.
func bruteChain(in instance) float64 {
	st, c := in.stats, in.shape
	E, G, P := st.Experts, c.Nodes*c.GPUsPerNode, c.GPUsPerNode
	var all [][]int
	gpu := make([]int, E)
	var rec func(e int, used []int)
	rec = func(e int, used []int) {
		if e == E {
			all = append(all, slices.Clone(gpu))
			return
		}
		for g := range G {
			if used[g] < c.SlotsPerGPU[g] {
				used[g]++
				gpu[e] = g
				rec(e+1, used)
				used[g]--
			}
		}
	}
	rec(0, make([]int, G))
	k := st.TopK
	best := math.Inf(1)
	for _, g0 := range all {
		for _, g1 := range all {
			cost := 0.0
			for _, pt := range st.Patterns {
				gpus := map[int]bool{}
				for _, e := range pt.Experts[:k] {
					gpus[g0[e]] = true
				}
				nodes := map[int]bool{}
				for _, e := range pt.Experts[k : 2*k] {
					nodes[g1[e]/P] = true
				}
				for g := range gpus {
					for B := range nodes {
						if B != g/P {
							cost += pt.Count
						}
					}
				}
			}
			best = min(best, cost)
		}
	}
	return best
}

// TestChainCrossNodeBelowBruteForce: the chain bound never exceeds the
// optimum over pairs of single-copy placements; one node gives 0.
func TestChainCrossNodeBelowBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	shapes := []struct{ E, N, P, slots, k int }{{4, 2, 1, 2, 2}, {4, 2, 2, 1, 2}, {5, 2, 1, 3, 2}, {6, 3, 1, 2, 2}, {4, 2, 1, 2, 1}}
	ratio := 0.0
	for i := range 30 {
		s := shapes[i%len(shapes)]
		in := randomInstance(r, s.E, s.N, s.P, s.slots, s.k, 3+r.IntN(6), 2, false)
		b, err := ChainCrossNode(context.Background(), in.stats, 1, in.shape, Options{})
		require.NoError(t, err)
		opt := bruteChain(in)
		assert.LessOrEqual(t, b.Value, opt+1e-9*(1+opt), "%s: bound %v above optimum %v", in.name, b.Value, opt)
		ratio += b.Value / max(opt, 1e-12)
	}
	t.Logf("mean bound/optimum %.3f", ratio/30)
	in := randomInstance(r, 4, 1, 2, 2, 2, 5, 2, false)
	b, err := ChainCrossNode(context.Background(), in.stats, 1, in.shape, Options{})
	require.NoError(t, err)
	assert.Equal(t, MethodOneNode, b.Method)
	assert.Zero(t, b.Value)
	_, err = ChainCrossNode(context.Background(), in.stats, 0, in.shape, Options{})
	assert.ErrorContains(t, err, "start at layer 1")
}

// TestChainConfigs: k1 = 2 experts at l−1, k2 = 1 at l, 2 nodes of 2
// GPUs, by hand: both l−1 experts on one node (one GPU: a GPU pair; or two
// GPUs), matched with l's node or not; or on two nodes, one of them l's.
func TestChainConfigs(t *testing.T) {
	want := []config{
		{1, []float64{1, 0, 1, 0}}, // one GPU, l elsewhere
		{0, []float64{1, 0, 1, 2}}, // one GPU, l on its node
		{2, []float64{1, 0, 0, 0}}, // two GPUs of one node, l elsewhere
		{0, []float64{1, 0, 0, 2}}, // two GPUs of one node, l there
		{1, []float64{0, 0, 0, 1}}, // two nodes, l on one of them
	}
	assert.ElementsMatch(t, want, chainConfigs(2, 1, 2, 2))
	for _, c := range chainConfigs(3, 2, 1, 4) { // one node: nothing crosses
		assert.Zero(t, c.cost)
	}
}
