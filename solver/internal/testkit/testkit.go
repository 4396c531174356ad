// Package testkit builds the small random instances the solver's tests
// share: traces with skewed experts and sticky transitions, one-node
// home-flow scenarios, balanced plans, and brute-force counters that are
// independent of the code under test. It is used by tests only.
package testkit

import (
	"cmp"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// RandomTrace makes a trace with skewed experts and sticky transitions.
func RandomTrace(rng *rand.Rand, tokens, layers, experts, k int) *routing.Trace {
	t := &routing.Trace{Tokens: tokens, Layers: layers, TopK: k, Experts: experts, IDs: make([]int16, tokens*layers*k)}
	w := make([]float64, experts)
	for e := range w {
		w[e] = math.Pow(rng.Float64(), 2) + 0.05
	}
	for tok := range tokens {
		prev := -1
		for l := range layers {
			used := map[int]bool{}
			for j := range k {
				var e int
				if j == 0 && prev >= 0 && rng.Float64() < 0.5 {
					e = (prev*3 + l) % experts
				} else {
					e = Pick(rng, w)
				}
				for used[e] {
					e = (e + 1) % experts
				}
				used[e] = true
				t.IDs[(tok*layers+l)*k+j] = int16(e)
				if j == 0 {
					prev = e
				}
			}
		}
	}
	return t
}

// Pick draws an index with probability proportional to w.
func Pick(rng *rand.Rand, w []float64) int {
	sum := 0.0
	for _, v := range w {
		sum += v
	}
	r := rng.Float64() * sum
	for i, v := range w {
		if r < v {
			return i
		}
		r -= v
	}
	return len(w) - 1
}

// SmallCluster is the h100x8 preset on nodes nodes of perNode GPUs.
func SmallCluster(nodes, perNode int) costmodel.Cluster {
	c, err := costmodel.ClusterPreset("h100x8")
	if err != nil {
		panic(err)
	}
	c = c.WithNodes(nodes)
	c.GPUsPerNode = perNode
	return c
}

// FakeModel keeps compute and communication of similar size so that the
// solvers have to trade them off.
func FakeModel(experts, k int) costmodel.Model {
	return costmodel.Model{Name: "tiny", Layers: 2, Experts: experts, TopK: k, Hidden: 4096, FFN: 14336, BytesPerActivation: 2}
}

// RandomHomeScenario is a small one-node home-flow scenario with per-token
// patterns whose expert sets are skewed towards a few experts, so that
// groups differ in how many tokens they reach.
func RandomHomeScenario(t *testing.T, rng *rand.Rand, E, G, k, L, T int, mode costmodel.Mode) costmodel.Scenario {
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
	m := FakeModel(E, k)
	m.Hidden = 256 + rng.IntN(8192)
	return costmodel.Scenario{Stats: st, Cluster: SmallCluster(1, G), Model: m, Flow: costmodel.FlowHome, Mode: mode}
}

// RandomBalancedPlan puts E/G random experts on each GPU in every layer.
func RandomBalancedPlan(rng *rand.Rand, L, E, G int) *placement.Plan {
	row := make([][]placement.GPU, L)
	for l := range row {
		row[l] = make([]placement.GPU, E)
		for i, e := range rng.Perm(E) {
			row[l][e] = placement.GPU(i / (E / G))
		}
	}
	return placement.FromAssignment(G, row, "rand")
}

// LayerMaxima computes, independently of the code under test, a plan
// layer's busiest GPU's routed tokens and busiest GPU's distinct tokens.
func LayerMaxima(st *routing.Stats, G int, lp placement.LayerPlan, l int) (float64, float64) {
	gpuOf := make(map[int]int)
	for s, e := range lp.SlotExpert {
		gpuOf[int(e)] = int(lp.SlotGPU[s])
	}
	load := make([]float64, G)
	dist := make([]float64, G)
	k := st.TopK
	for _, pt := range st.Patterns {
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

// TokenSets returns, for brute force, the tokens of each expert in a
// one-layer problem (a pattern of count c stands for c tokens) and the
// token count.
func TokenSets(st *routing.Stats) ([]map[int]bool, int) {
	sets := make([]map[int]bool, st.Experts)
	for e := range sets {
		sets[e] = map[int]bool{}
	}
	tok := 0
	for _, pt := range st.Patterns {
		for range int(pt.Count) {
			for _, e := range pt.Experts {
				sets[e][tok] = true
			}
			tok++
		}
	}
	return sets, tok
}

// CoverOf returns N(S), the tokens with an expert in S.
func CoverOf(sets []map[int]bool, S []int) int {
	u := map[int]bool{}
	for _, e := range S {
		for x := range sets[e] {
			u[x] = true
		}
	}
	return len(u)
}

// BalancedPartitions enumerates every assignment of E experts to G GPUs
// with E/G each, up to relabelling the GPUs (GPU labels in order of first
// use).
func BalancedPartitions(E, G int) [][]int {
	var out [][]int
	cur := make([]int, E)
	cnt := make([]int, G)
	var rec func(e, used int)
	rec = func(e, used int) {
		if e == E {
			out = append(out, slices.Clone(cur))
			return
		}
		for g := 0; g < min(used+1, G); g++ {
			if cnt[g] < E/G {
				cnt[g]++
				cur[e] = g
				rec(e+1, max(used, g+1))
				cnt[g]--
			}
		}
	}
	rec(0, 0)
	return out
}

// Assignments enumerates every assignment of E experts to G GPUs with E/G
// each (GPUs labelled).
func Assignments(E, G int) [][]int {
	var out [][]int
	cur := make([]int, E)
	cnt := make([]int, G)
	var rec func(e int)
	rec = func(e int) {
		if e == E {
			out = append(out, slices.Clone(cur))
			return
		}
		for g := range G {
			if cnt[g] < E/G {
				cnt[g]++
				cur[e] = g
				rec(e + 1)
				cnt[g]--
			}
		}
	}
	rec(0)
	return out
}

// Tuples calls f with every tuple of L indices in [0, n) (the first index
// varying fastest); f must not keep idx.
func Tuples(n, L int, f func(idx []int)) {
	if n <= 0 {
		return
	}
	idx := make([]int, L)
	for {
		f(idx)
		l := 0
		for ; l < L; l++ {
			if idx[l]++; idx[l] < n {
				break
			}
			idx[l] = 0
		}
		if l == L {
			return
		}
	}
}

// PlanOf builds a single-copy plan from per-layer assignments [e] → GPU.
func PlanOf(gpus int, layers ...[]int) *placement.Plan {
	a := make([][]placement.GPU, len(layers))
	for l, as := range layers {
		for _, g := range as {
			a[l] = append(a[l], placement.GPU(g))
		}
	}
	return placement.FromAssignment(gpus, a, "test")
}

// BruteBusiestSlots is the smallest busiest-GPU load over every replicated
// plan of one layer: every way of filling each GPU g with slots[g]
// distinct experts (each expert at least once), tokens split evenly over
// copies.
func BruteBusiestSlots(load []float64, slots []int) float64 {
	E := len(load)
	best := math.Inf(1)
	choice := make([]int, len(slots))
	var rec func(g, from int)
	rec = func(g, from int) {
		if g == len(slots) {
			best = math.Min(best, masksBusiest(load, nil, choice))
			return
		}
		start := 0
		if g > 0 && slots[g] == slots[g-1] {
			start = from // interchangeable with the previous GPU
		}
		for m := start; m < 1<<E; m++ {
			if popcount(m) == slots[g] {
				choice[g] = m
				rec(g+1, m)
			}
		}
	}
	rec(0, 0)
	return best
}

// masksBusiest is the busiest load per unit of speed (speed nil: 1) when
// GPU g holds the experts in the bit mask choice[g], tokens split evenly
// over copies; +Inf when some expert has no copy.
func masksBusiest(load, speed []float64, choice []int) float64 {
	E := len(load)
	cnt := make([]int, E)
	for _, m := range choice {
		for e := range E {
			cnt[e] += m >> e & 1
		}
	}
	for _, c := range cnt {
		if c == 0 {
			return math.Inf(1)
		}
	}
	busiest := 0.0
	for h, m := range choice {
		t := 0.0
		for e := range E {
			if m>>e&1 == 1 {
				t += load[e] / float64(cnt[e])
			}
		}
		if speed != nil {
			t /= speed[h]
		}
		busiest = math.Max(busiest, t)
	}
	return busiest
}

func popcount(m int) int {
	n := 0
	for ; m > 0; m &= m - 1 {
		n++
	}
	return n
}

// BruteBusiestGrouped is the smallest busiest load per unit of speed over every
// plan of one layer that keeps each group of consecutive experts, and its
// copies, on one node: every assignment of groups to nodes, then every
// way of filling each GPU with slots[g] distinct experts of its node's
// groups (each expert at least once), tokens split evenly over copies.
// +Inf when no plan exists.
func BruteBusiestGrouped(load, speed []float64, slots []int, groups, perNode int) float64 {
	E, G := len(load), len(slots)
	N, size := G/perNode, E/groups
	best := math.Inf(1)
	nodeOf := make([]int, groups)
	choice := make([]int, G)
	var fill func(g int)
	fill = func(g int) {
		if g == G {
			best = math.Min(best, masksBusiest(load, speed, choice))
			return
		}
		allowed := 0
		for e := range E {
			if nodeOf[e/size] == g/perNode {
				allowed |= 1 << e
			}
		}
		for m := allowed; m > 0; m = (m - 1) & allowed {
			if bits.OnesCount(uint(m)) == slots[g] {
				choice[g] = m
				fill(g + 1)
			}
		}
		if slots[g] == 0 {
			choice[g] = 0
			fill(g + 1)
		}
	}
	var assign func(k int)
	assign = func(k int) {
		if k == groups {
			fill(0)
			return
		}
		for nd := range N {
			nodeOf[k] = nd
			assign(k + 1)
		}
	}
	assign(0)
	return best
}

// Planted describes a trace with a planted node structure: every layer
// splits its experts at random into Nodes blocks, and a token of topic b
// takes each of its TopK experts from block b (one in Stray from any
// block), by a Zipf popularity of exponent Skew (0: uniform) drawn per
// layer. A token's topic is its home's node when HomeTopics is set (the
// home flow's structure), else drawn at random (the chain flow's: blocks
// that persist over the layers). Homes are GPUs at random.
type Planted struct {
	Nodes, GPUsPerNode, SlotsPerGPU int
	Layers, TopK, Tokens            int
	Stray                           int
	Skew                            float64
	HomeTopics                      bool
}

// Trace draws the trace and returns it with the planted plan: block b of
// every layer on node b, one copy of every expert, packed over the node's
// GPUs largest first by the trace's counts.
func (pl Planted) Trace(rng *rand.Rand) (*routing.Trace, *placement.Plan) {
	N, P, S, L, K := pl.Nodes, pl.GPUsPerNode, pl.SlotsPerGPU, pl.Layers, pl.TopK
	G := N * P
	E := G * S
	block := make([][][]int, L)
	cum := make([][][]float64, L) // [l][b]: cumulative popularity of block b's experts
	all := make([][]float64, L)
	for l := range L {
		perm := rng.Perm(E)
		rank := rng.Perm(E)
		block[l] = make([][]int, N)
		for i, e := range perm {
			block[l][i*N/E] = append(block[l][i*N/E], e)
		}
		pop := func(e int) float64 { return math.Pow(float64(rank[e]+1), -pl.Skew) }
		cum[l] = make([][]float64, N)
		for b, es := range block[l] {
			s := 0.0
			for _, e := range es {
				s += pop(e)
				cum[l][b] = append(cum[l][b], s)
			}
		}
		s := 0.0
		for e := range E {
			s += pop(e)
			all[l] = append(all[l], s)
		}
	}
	draw := func(c []float64) int {
		i, _ := slices.BinarySearch(c, rng.Float64()*c[len(c)-1])
		return min(i, len(c)-1)
	}
	t := &routing.Trace{Tokens: pl.Tokens, Layers: L, TopK: K, Experts: E, Source: make([]int32, pl.Tokens), IDs: make([]int16, 0, pl.Tokens*L*K)}
	pick := make([]int, 0, K)
	for tok := range pl.Tokens {
		h := rng.IntN(G)
		t.Source[tok] = int32(h)
		b := rng.IntN(N)
		if pl.HomeTopics {
			b = h / P
		}
		for l := range L {
			pick = pick[:0]
			for len(pick) < K {
				var e int
				if pl.Stray > 0 && rng.IntN(pl.Stray) == 0 {
					e = draw(all[l])
				} else {
					e = block[l][b][draw(cum[l][b])]
				}
				if !slices.Contains(pick, e) {
					pick = append(pick, e)
				}
			}
			for _, e := range pick {
				t.IDs = append(t.IDs, int16(e))
			}
		}
	}
	load := make([][]float64, L)
	for l := range load {
		load[l] = make([]float64, E)
	}
	for i, e := range t.IDs {
		load[i/K%L][e]++
	}
	copies := make([][][]placement.GPU, L)
	for l := range copies {
		copies[l] = make([][]placement.GPU, E)
		for b, es := range block[l] {
			es = slices.Clone(es)
			slices.SortStableFunc(es, func(x, y int) int { return cmp.Compare(load[l][y], load[l][x]) })
			on, cnt := make([]float64, P), make([]int, P)
			for _, e := range es {
				g := -1
				for i := range P {
					if cnt[i] < S && (g < 0 || on[i] < on[g]) {
						g = i
					}
				}
				on[g] += load[l][e]
				cnt[g]++
				copies[l][e] = []placement.GPU{placement.GPU(b*P + g)}
			}
		}
	}
	return t, placement.FromReplicas(G, copies, "planted")
}
