package baseline

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// readmeWeight is the example of deepseek-ai/EPLB's README.
var readmeWeight = [][]float64{
	{90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86},
	{20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27},
}

func TestRebalanceExpertsREADME(t *testing.T) {
	res, err := RebalanceExperts(readmeWeight, 16, 4, 2, 8)
	require.NoError(t, err)
	assert.Equal(t, [][]int{
		{5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1},
		{7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1},
	}, res.Phy2Log)
	assert.Equal(t, [][]int{
		{1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1},
		{1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1},
	}, res.LogCnt)
	checkMaps(t, res, 16)
	// log2phy is compared as slot sets: PyTorch's unstable sort may order
	// the replicas of an expert differently.
	for l, row := range res.Phy2Log {
		for e := range res.LogCnt[l] {
			var want []int
			for p, x := range row {
				if x == e {
					want = append(want, p)
				}
			}
			got := slices.DeleteFunc(slices.Clone(res.Log2Phy[l][e]), func(s int) bool { return s < 0 })
			slices.Sort(got)
			assert.Equal(t, want, got, "layer %d expert %d", l, e)
		}
	}
	assert.Equal(t, 2, len(res.Log2Phy[0][0]), "X is the largest logcnt")

	wantLoads := [][]float64{
		{121.5, 86.5, 125, 113, 147.5, 131.5, 156, 152},
		{173, 179.5, 120.5, 172, 123, 152, 118.5, 117.5},
	}
	for l := range readmeWeight {
		assert.InDeltaSlice(t, wantLoads[l], eplbGPULoads(readmeWeight[l], res.Phy2Log[l], res.LogCnt[l], 8), 1e-9, "layer %d", l)
	}
}

// eplbGPULoads sums the even-split replica loads of every GPU.
func eplbGPULoads(load []float64, phy2log, logcnt []int, gpus int) []float64 {
	out := make([]float64, gpus)
	per := len(phy2log) / gpus
	for p, e := range phy2log {
		out[p/per] += load[e] / float64(logcnt[e])
	}
	return out
}

// checkMaps checks that the three maps agree with each other and that
// every expert has a replica and the replicas fill the R slots.
func checkMaps(t *testing.T, res *placement.EPLBMaps, slots int) {
	t.Helper()
	x := 0
	for _, row := range res.LogCnt {
		x = max(x, slices.Max(row))
	}
	require.Equal(t, len(res.Phy2Log), len(res.LogCnt))
	require.Equal(t, len(res.Phy2Log), len(res.Log2Phy))
	for l, row := range res.Phy2Log {
		require.Len(t, row, slots)
		sum := 0
		for e, c := range res.LogCnt[l] {
			require.GreaterOrEqual(t, c, 1, "layer %d expert %d has no replica", l, e)
			sum += c
			l2p := res.Log2Phy[l][e]
			require.Len(t, l2p, x)
			for r, p := range l2p {
				if r < c {
					require.Equal(t, e, row[p], "log2phy[%d][%d][%d]", l, e, r)
					require.NotContains(t, l2p[:r], p)
				} else {
					require.Equal(t, -1, p)
				}
			}
		}
		require.Equal(t, slots, sum, "layer %d: Σ logcnt", l)
	}
}

// The reference below transcribes deepseek-ai/EPLB's eplb.py line by line
// (Python loops, fresh argmax over weight/logcnt, linear scan for the
// lightest pack, stable sorts), without any of the optimisations of
// RebalanceExperts. Group loads are summed in float32 in order, which is
// exact for the integer loads of the tests.

func refBalancedPacking(weight [][]float32, numPacks int) (pack, rank [][]int) {
	n := len(weight[0])
	per := n / numPacks
	pack, rank = make([][]int, len(weight)), make([][]int, len(weight))
	for i, w := range weight {
		pack[i], rank[i] = make([]int, n), make([]int, n)
		if per == 1 {
			for j := range n {
				pack[i][j] = j
			}
			continue
		}
		idx := make([]int, n)
		for j := range idx {
			idx[j] = j
		}
		sort.SliceStable(idx, func(a, b int) bool { return w[idx[a]] > w[idx[b]] })
		pw := make([]float32, numPacks)
		items := make([]int, numPacks)
		for _, g := range idx {
			best := -1
			for k := range numPacks {
				if items[k] < per && (best < 0 || pw[k] < pw[best]) {
					best = k
				}
			}
			pack[i][g], rank[i][g] = best, items[best]
			pw[best] += w[g]
			items[best]++
		}
	}
	return pack, rank
}

func refReplicate(weight [][]float32, numPhy int) (phy2log, rank, logcnt [][]int) {
	numLog := len(weight[0])
	for _, w := range weight {
		p2l, rk, cnt := make([]int, numPhy), make([]int, numPhy), make([]int, numLog)
		for i := range numPhy {
			p2l[i] = i
		}
		for e := range cnt {
			cnt[e] = 1
		}
		for i := numLog; i < numPhy; i++ {
			best := 0
			for e := range numLog {
				if w[e]/float32(cnt[e]) > w[best]/float32(cnt[best]) {
					best = e
				}
			}
			p2l[i], rk[i] = best, cnt[best]
			cnt[best]++
		}
		phy2log, rank, logcnt = append(phy2log, p2l), append(rank, rk), append(logcnt, cnt)
	}
	return phy2log, rank, logcnt
}

func inverse(perm []int) []int {
	inv := make([]int, len(perm))
	for i, x := range perm {
		inv[x] = i
	}
	return inv
}

func refHierarchical(weight [][]float32, numPhy, numGroups, numNodes, numGPUs int) (phy2log, rank, logcnt [][]int) {
	L, E := len(weight), len(weight[0])
	gsize, gpn, perGPU := E/numGroups, numGroups/numNodes, numPhy/numGPUs
	tokensPerGroup := make([][]float32, L)
	for l, w := range weight {
		tokensPerGroup[l] = make([]float32, numGroups)
		for j := range numGroups {
			for o := range gsize {
				tokensPerGroup[l][j] += w[j*gsize+o]
			}
		}
	}
	gpack, grank := refBalancedPacking(tokensPerGroup, numNodes)
	log2mlog, mlog2log := make([][]int, L), make([][]int, L)
	var tokensPerMlog [][]float32 // [L*N][E/N]
	for l := range L {
		log2mlog[l] = make([]int, E)
		for j := range numGroups {
			for o := range gsize {
				log2mlog[l][j*gsize+o] = (gpack[l][j]*gpn+grank[l][j])*gsize + o
			}
		}
		mlog2log[l] = inverse(log2mlog[l])
		for n := range numNodes {
			row := make([]float32, E/numNodes)
			for i := range row {
				row[i] = weight[l][mlog2log[l][n*E/numNodes+i]]
			}
			tokensPerMlog = append(tokensPerMlog, row)
		}
	}
	phy2mlog, phyrank, mlogcnt := refReplicate(tokensPerMlog, numPhy/numNodes)
	tokensPerPhy := make([][]float32, len(phy2mlog))
	for i, row := range phy2mlog {
		tokensPerPhy[i] = make([]float32, len(row))
		for k, m := range row {
			tokensPerPhy[i][k] = tokensPerMlog[i][m] / float32(mlogcnt[i][m])
		}
	}
	pack, rnk := refBalancedPacking(tokensPerPhy, numGPUs/numNodes)
	for l := range L {
		p2l, rk := make([]int, 0, numPhy), make([]int, 0, numPhy)
		for n := range numNodes {
			i := l*numNodes + n
			phy2pphy := make([]int, len(pack[i]))
			for k := range phy2pphy {
				phy2pphy[k] = pack[i][k]*perGPU + rnk[i][k]
			}
			pphy2phy := inverse(phy2pphy)
			for _, k := range pphy2phy {
				p2l = append(p2l, mlog2log[l][phy2mlog[i][k]+n*E/numNodes])
				rk = append(rk, phyrank[i][k])
			}
		}
		cnt := make([]int, E)
		for e := range E {
			m := log2mlog[l][e]
			cnt[e] = mlogcnt[l*numNodes+m/(E/numNodes)][m%(E/numNodes)]
		}
		phy2log, rank, logcnt = append(phy2log, p2l), append(rank, rk), append(logcnt, cnt)
	}
	return phy2log, rank, logcnt
}

func refRebalance(weight [][]float64, numReplicas, numGroups, numNodes, numGPUs int) *placement.EPLBMaps {
	w := make([][]float32, len(weight))
	for l, row := range weight {
		w[l] = make([]float32, len(row))
		for e, x := range row {
			w[l][e] = float32(x)
		}
	}
	if numGroups%numNodes != 0 {
		numGroups, numNodes = 1, 1
	}
	phy2log, rank, logcnt := refHierarchical(w, numReplicas, numGroups, numNodes, numGPUs)
	x := 0
	for _, row := range logcnt {
		x = max(x, slices.Max(row))
	}
	log2phy := make([][][]int, len(w))
	for l := range w {
		log2phy[l] = make([][]int, len(w[l]))
		for e := range log2phy[l] {
			log2phy[l][e] = slices.Repeat([]int{-1}, x)
		}
		for p, e := range phy2log[l] {
			log2phy[l][e][rank[l][p]] = p
		}
	}
	return &placement.EPLBMaps{Phy2Log: phy2log, Log2Phy: log2phy, LogCnt: logcnt}
}

func TestRefREADME(t *testing.T) {
	// The reference itself reproduces the README, so that agreeing with it
	// means something.
	res := refRebalance(readmeWeight, 16, 4, 2, 8)
	assert.Equal(t, []int{5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1}, res.Phy2Log[0])
	assert.Equal(t, []int{7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1}, res.Phy2Log[1])
}

type eplbCase struct {
	layers, experts, replicas, groups, nodes, gpus int
}

var eplbCases = []eplbCase{
	{2, 12, 16, 4, 2, 8},
	{3, 12, 12, 4, 2, 4},    // no redundancy
	{2, 12, 24, 3, 2, 8},    // 3 groups on 2 nodes: global fallback
	{3, 16, 24, 1, 1, 4},    // global
	{2, 16, 32, 16, 16, 16}, // one group and one GPU per node
	{2, 8, 8, 8, 4, 8},      // one slot per GPU
	{4, 64, 80, 8, 4, 16},
	{5, 256, 288, 8, 4, 32}, // DeepSeek-V3 prefill shape, hierarchical
	{5, 256, 288, 8, 2, 32},
	{5, 256, 288, 1, 1, 32},  // global
	{20, 256, 288, 8, 4, 32}, // enough work for several goroutines
	{3, 32, 64, 4, 1, 2},     // hierarchical on one node
}

func randomWeight(r *rand.Rand, layers, experts int, kind int) [][]float64 {
	w := make([][]float64, layers)
	for l := range w {
		w[l] = make([]float64, experts)
		perm := r.Perm(experts)
		for i, e := range perm {
			switch kind {
			case 0: // few values: many ties
				w[l][e] = float64(r.IntN(4))
			case 1: // Zipf-like skew
				w[l][e] = float64(100000 / (i + 1))
			default: // wide uniform counts
				w[l][e] = float64(r.IntN(1 << 20))
			}
		}
	}
	return w
}

func TestRebalanceExpertsMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range eplbCases {
		for kind := range 3 {
			for rep := range 4 {
				name := fmt.Sprintf("%+v/kind%d/%d", c, kind, rep)
				w := randomWeight(r, c.layers, c.experts, kind)
				got, err := RebalanceExperts(w, c.replicas, c.groups, c.nodes, c.gpus)
				require.NoError(t, err, name)
				want := refRebalance(w, c.replicas, c.groups, c.nodes, c.gpus)
				require.Equal(t, want.Phy2Log, got.Phy2Log, name)
				require.Equal(t, want.LogCnt, got.LogCnt, name)
				require.Equal(t, want.Log2Phy, got.Log2Phy, name)
			}
		}
	}
}

func TestRebalanceExpertsProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range eplbCases {
		for kind := range 3 {
			name := fmt.Sprintf("%+v/kind%d", c, kind)
			w := randomWeight(r, c.layers, c.experts, kind)
			res, err := RebalanceExperts(w, c.replicas, c.groups, c.nodes, c.gpus)
			require.NoError(t, err, name)
			checkMaps(t, res, c.replicas)
			if c.groups%c.nodes != 0 {
				continue
			}
			// Hierarchical: all replicas of a group's experts on one node.
			gsize, perNode := c.experts/c.groups, c.replicas/c.nodes
			for l, row := range res.Phy2Log {
				node := make([]int, c.groups)
				for j := range node {
					node[j] = -1
				}
				for p, e := range row {
					j := e / gsize
					if node[j] < 0 {
						node[j] = p / perNode
					}
					require.Equal(t, node[j], p/perNode, "%s: layer %d group %d spans nodes", name, l, j)
				}
			}
		}
	}
}

func TestRebalanceExpertsDeterministic(t *testing.T) {
	w := randomWeight(rand.New(rand.NewPCG(5, 6)), 58, 256, 2)
	first, err := RebalanceExperts(w, 288, 8, 4, 32)
	require.NoError(t, err)
	for range 5 {
		again, err := RebalanceExperts(w, 288, 8, 4, 32)
		require.NoError(t, err)
		require.Equal(t, first, again)
	}
}

func TestRebalanceExpertsErrors(t *testing.T) {
	w := [][]float64{{1, 2, 3, 4, 5, 6, 7, 8}}
	for _, tc := range []struct {
		name                          string
		weight                        [][]float64
		replicas, groups, nodes, gpus int
		want                          string
	}{
		{"no layers", nil, 8, 1, 1, 2, "no layers"},
		{"no experts", [][]float64{{}}, 8, 1, 1, 2, "0 experts per layer"},
		{"ragged", [][]float64{{1, 2}, {1}}, 2, 1, 1, 1, "weight[1] has 1 experts but weight[0] has 2"},
		{"negative", [][]float64{{1, -2}}, 2, 1, 1, 1, "weight[0][1] is -2"},
		{"beyond float32", [][]float64{{1, 1e39}}, 2, 1, 1, 1, "weight[0][1] is 1e+39; loads must be non-negative and finite in float32"},
		{"zero gpus", w, 8, 1, 1, 0, "0 GPUs"},
		{"zero groups", w, 8, 0, 1, 2, "0 expert groups"},
		{"zero nodes", w, 8, 1, 0, 2, "0 nodes"},
		{"experts % groups", w, 8, 3, 1, 2, "8 experts do not split into 3 equal groups"},
		{"gpus % nodes", w, 12, 2, 2, 3, "3 GPUs do not split evenly over 2 nodes"},
		{"replicas % gpus", w, 10, 2, 2, 4, "10 physical slots do not split evenly over 4 GPUs"},
		{"replicas < experts", w, 4, 2, 2, 4, "4 physical slots for 8 experts"},
		{"global: replicas % gpus", w, 9, 3, 2, 2, "9 physical slots do not split evenly over 2 GPUs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := RebalanceExperts(tc.weight, tc.replicas, tc.groups, tc.nodes, tc.gpus)
			assert.ErrorContains(t, err, tc.want)
			assert.ErrorContains(t, err, "baseline: eplb: ")
		})
	}
	// groups % nodes != 0 is not an error: EPLB falls back to the global
	// policy, where the GPU count need not be a multiple of the nodes.
	_, err := RebalanceExperts(w, 9, 3, 2, 3)
	assert.NoError(t, err)
}

func TestEPLBPlanREADME(t *testing.T) {
	p, err := EPLB(routing.StatsFromLoad(readmeWeight, 0), 8, EPLBOptions{RedundantSlots: 4, Groups: 4, Nodes: 2})
	require.NoError(t, err)
	require.NoError(t, p.Validate(placement.ValidateOptions{EqualSlots: true}))
	assert.Equal(t, "eplb-hierarchical", p.Strategy)
	assert.Equal(t, map[string]string{"eplb_policy": "hierarchical", "redundant_slots": "4", "expert_groups": "4", "nodes": "2"}, p.Meta)
	assert.Equal(t, ex(5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1), p.Layers[0].SlotExpert)
	assert.Equal(t, gp(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), p.Layers[1].SlotGPU)

	m, err := p.EPLBMaps()
	require.NoError(t, err)
	res, err := RebalanceExperts(readmeWeight, 16, 4, 2, 8)
	require.NoError(t, err)
	assert.Equal(t, res.Phy2Log, m.Phy2Log)
	assert.Equal(t, res.LogCnt, m.LogCnt)
	checkMaps(t, m, 16)

	// The global policy puts two copies of expert 1 on GPU 7 here.
	_, err = EPLB(routing.StatsFromLoad(readmeWeight, 0), 8, EPLBOptions{RedundantSlots: 4})
	assert.ErrorContains(t, err, "layer 0: EPLB put two copies of expert 1 on GPU 7 (slots 14 and 15)")
	g, err := EPLB(routing.StatsFromLoad(readmeWeight, 0), 8, EPLBOptions{RedundantSlots: 4, FixDuplicates: true})
	require.NoError(t, err)
	assert.Equal(t, "eplb", g.Strategy)
	assert.Equal(t, "global", g.Meta["eplb_policy"])
	// Groups not a multiple of nodes: EPLB's global fallback.
	f, err := EPLB(routing.StatsFromLoad(readmeWeight, 0), 8, EPLBOptions{RedundantSlots: 4, Groups: 3, Nodes: 2, FixDuplicates: true})
	require.NoError(t, err)
	assert.Equal(t, "eplb", f.Strategy)
	assert.Equal(t, g.Layers, f.Layers)
}

func TestEPLBOptionErrors(t *testing.T) {
	st := routing.StatsFromLoad(readmeWeight, 0)
	for _, tc := range []struct {
		name  string
		stats *routing.Stats
		gpus  int
		opts  EPLBOptions
		want  string
	}{
		{"nil stats", nil, 8, EPLBOptions{}, "nil stats"},
		{"negative redundancy", st, 4, EPLBOptions{RedundantSlots: -1}, "RedundantSlots is -1"},
		{"negative groups", st, 4, EPLBOptions{Groups: -1}, "Groups is -1"},
		{"negative nodes", st, 4, EPLBOptions{Nodes: -2}, "Nodes is -2"},
		{"slots % gpus", st, 8, EPLBOptions{RedundantSlots: 3}, "15 physical slots do not split evenly over 8 GPUs"},
		{"layers mismatch", &routing.Stats{Layers: 3, Experts: 12, Load: readmeWeight}, 4, EPLBOptions{}, "stats.Load has 2 layers"},
		{"nan", routing.StatsFromLoad([][]float64{{1, nan()}}, 0), 2, EPLBOptions{}, "stats.Load[0][1] is NaN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := EPLB(tc.stats, tc.gpus, tc.opts)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

func nan() float64 {
	var zero float64
	return zero / zero
}

// dupWeight is a layer for which EPLB's packing puts two copies of one
// expert on one GPU (deepseek-ai/EPLB#22): replica loads 2, 2, 1.5, 1.5, 1,
// 1 on 3 GPUs of 2 slots; both copies of expert 0 (1.5 each) arrive when
// the GPU holding the first one is the lightest with room.
var dupWeight = [][]float64{{3, 2, 2, 2}}

func TestEPLBDuplicate(t *testing.T) {
	res, err := RebalanceExperts(dupWeight, 6, 1, 1, 3)
	require.NoError(t, err)
	assert.Equal(t, []int{2, 1, 3, 1, 0, 0}, res.Phy2Log[0], "bit-exact EPLB keeps the duplicate")

	st := routing.StatsFromLoad(dupWeight, 0)
	_, err = EPLB(st, 3, EPLBOptions{RedundantSlots: 2})
	assert.EqualError(t, err, "baseline: eplb: layer 0: EPLB put two copies of expert 0 on GPU 2 (slots 4 and 5), a known defect of its packing (deepseek-ai/EPLB#22); set EPLBOptions.FixDuplicates to repair the plan by swapping slots within the node")

	p, err := EPLB(st, 3, EPLBOptions{RedundantSlots: 2, FixDuplicates: true})
	require.NoError(t, err)
	require.NoError(t, p.Validate(placement.ValidateOptions{EqualSlots: true}))
	// Every swap leaves some GPU at 3.5 (no two replicas other than
	// expert 0's sum to 3); the first such swap is with slot 0.
	assert.Equal(t, ex(0, 1, 3, 1, 0, 2), p.Layers[0].SlotExpert)
	assert.Equal(t, "1", p.Meta["duplicates_fixed"])
	assert.InDeltaSlice(t, []float64{2.5, 3, 3.5}, eplbGPULoads(dupWeight[0], []int{0, 1, 3, 1, 0, 2}, res.LogCnt[0], 3), 1e-9)

	// More copies than GPUs in the node: no swap can help.
	_, err = EPLB(routing.StatsFromLoad([][]float64{{100, 1, 1, 1}}, 0), 2, EPLBOptions{RedundantSlots: 4, FixDuplicates: true})
	assert.EqualError(t, err, "baseline: eplb: layer 0: expert 0 has 5 copies on GPUs 0-1, more than their 2 GPUs, so no swap within GPUs 0-1 can separate them; use fewer redundant slots or fewer nodes")
}

// zipfLayer is one DeepSeek-V3-sized layer with Zipf-like loads, in
// integers so that it is the same on every platform.
func zipfLayer(seed uint64) []float64 {
	r := rand.New(rand.NewPCG(seed, 7))
	w := make([]float64, 256)
	for i, e := range r.Perm(256) {
		w[e] = float64(100000 / (i + 1))
	}
	return w
}

func TestEPLBDuplicateDeepSeekShape(t *testing.T) {
	// The shape of deepseek-ai/EPLB#22: 1 layer × 256 (+32) experts, 32
	// GPUs, 2 nodes; skewed loads give duplicates under both policies.
	for _, opts := range []EPLBOptions{
		{RedundantSlots: 32, Groups: 8, Nodes: 2},
		{RedundantSlots: 32, Nodes: 2},
	} {
		for seed := range uint64(10) {
			w := [][]float64{zipfLayer(seed)}
			st := routing.StatsFromLoad(w, 8)
			name := fmt.Sprintf("%+v seed %d", opts, seed)
			res, err := RebalanceExperts(w, 288, max(opts.Groups, 1), opts.Nodes, 32)
			require.NoError(t, err)
			dup := false
			for g := range 32 {
				gpu := slices.Clone(res.Phy2Log[0][g*9 : (g+1)*9])
				slices.Sort(gpu)
				dup = dup || len(slices.Compact(gpu)) < 9
			}
			_, err = EPLB(st, 32, opts)
			if dup {
				assert.ErrorContains(t, err, "deepseek-ai/EPLB#22", name)
			} else {
				assert.NoError(t, err, name)
			}
			opts := opts
			opts.FixDuplicates = true
			p, err := EPLB(st, 32, opts)
			require.NoError(t, err, name)
			require.NoError(t, p.Validate(placement.ValidateOptions{EqualSlots: true}), name)
			if seed == 0 {
				require.True(t, dup, "%s: seed 0 should reproduce the duplicate", name)
			}
			// The repair keeps every copy's node (groups stay on nodes) and
			// the replica counts; it only swaps slots.
			before, after := slices.Clone(res.Phy2Log[0]), make([]int, 288)
			for s, e := range p.Layers[0].SlotExpert {
				after[s] = int(e)
			}
			for n := range 2 {
				a, b := slices.Clone(before[n*144:(n+1)*144]), slices.Clone(after[n*144:(n+1)*144])
				slices.Sort(a)
				slices.Sort(b)
				require.Equal(t, a, b, "%s: node %d lost or gained copies", name, n)
			}
			// Balance stays close to EPLB's.
			loadsBefore := eplbGPULoads(w[0], before, res.LogCnt[0], 32)
			loadsAfter := eplbGPULoads(w[0], after, res.LogCnt[0], 32)
			assert.LessOrEqual(t, slices.Max(loadsAfter), slices.Max(loadsBefore)*1.25, name)
		}
	}
}

func TestEPLBPlanProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	for _, c := range eplbCases {
		for kind := range 3 {
			name := fmt.Sprintf("%+v/kind%d", c, kind)
			w := randomWeight(r, c.layers, c.experts, kind)
			opts := EPLBOptions{RedundantSlots: c.replicas - c.experts, Groups: c.groups, Nodes: c.nodes, FixDuplicates: true}
			p, err := EPLB(routing.StatsFromLoad(w, 0), c.gpus, opts)
			if err != nil {
				// Only an expert with more copies than its node has GPUs
				// cannot be repaired.
				require.ErrorContains(t, err, "so no swap within GPUs", name)
				continue
			}
			require.NoError(t, p.Validate(placement.ValidateOptions{EqualSlots: true, Layers: c.layers, Experts: c.experts}), name)
			m, err := p.EPLBMaps()
			require.NoError(t, err, name)
			checkMaps(t, m, c.replicas)
			res, err := RebalanceExperts(w, c.replicas, c.groups, c.nodes, c.gpus)
			require.NoError(t, err)
			assert.Equal(t, res.LogCnt, m.LogCnt, name)
		}
	}
}

func TestEPLBPlanFileRoundTrip(t *testing.T) {
	p, err := EPLB(routing.StatsFromLoad(readmeWeight, 0), 8, EPLBOptions{RedundantSlots: 4, Groups: 4, Nodes: 2})
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, placement.Write(&buf, p, placement.FormatEPLB))
	q, err := placement.ReadEPLB(bytes.NewReader(buf.Bytes()), 8)
	require.NoError(t, err)
	assert.Equal(t, p.Layers, q.Layers)
	assert.Contains(t, buf.String(), "    [5,6,5,7,8,4,3,4,10,9,10,2,0,1,11,1],\n")
}
