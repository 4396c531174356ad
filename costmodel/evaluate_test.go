package costmodel

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

func ptr[T any](x T) *T { return &x }

// tinyCluster: NVLink 1e9 B/s and NIC 0.5e9 B/s per direction, latencies
// 1 µs and 2 µs, 1 µs per token, 10 µs per expert, σ = 0.1.
func tinyCluster(nodes, gpn int) Cluster {
	return Cluster{Name: "tiny", Nodes: nodes, GPUsPerNode: gpn,
		NVLinkGBps: 2, NICGbps: 4,
		NVLinkLatency: time.Microsecond, NICLatency: 2 * time.Microsecond,
		TokenCost: time.Microsecond, ExpertCost: 10 * time.Microsecond,
		Sigma: ptr(0.1)}
}

// tinyModel has 1000 bytes per token.
func tinyModel(layers, experts, k int) Model {
	return Model{Name: "tiny", Layers: layers, Experts: experts, TopK: k,
		Hidden: 500, FFN: 1, BytesPerActivation: 2}
}

// singlePlan places expert e of layer l on GPU gpu[l][e].
func singlePlan(G int, gpu [][]int) *placement.Plan {
	p := &placement.Plan{GPUs: G, Experts: len(gpu[0])}
	for _, row := range gpu {
		var lp placement.LayerPlan
		for e, g := range row {
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
			lp.SlotGPU = append(lp.SlotGPU, placement.GPU(g))
		}
		p.Layers = append(p.Layers, lp)
	}
	return p
}

type pat struct {
	src   int32
	sets  [][]int16
	count float64
}

// patternStats builds Stats (loads, all-pairs transitions, patterns).
func patternStats(L, E, K int, pats []pat) *routing.Stats {
	s := &routing.Stats{Layers: L, Experts: E, TopK: K, Load: make([][]float64, L)}
	for l := range s.Load {
		s.Load[l] = make([]float64, E)
	}
	for l := 0; l+1 < L; l++ {
		s.Transitions = append(s.Transitions, make([]float64, E*E))
	}
	for _, p := range pats {
		var flat []int16
		for l, set := range p.sets {
			flat = append(flat, set...)
			for _, e := range set {
				s.Load[l][e] += p.count
			}
			if l+1 < L {
				for _, e1 := range set {
					for _, e2 := range p.sets[l+1] {
						s.Transitions[l][int(e1)*E+int(e2)] += p.count
					}
				}
			}
		}
		s.Tokens += p.count
		s.Patterns = append(s.Patterns, routing.Pattern{Source: p.src, Experts: flat, Count: p.count})
	}
	return s
}

func countOnly(s *routing.Stats) *routing.Stats {
	c := *s
	c.Patterns = nil
	return &c
}

func us(x float64) time.Duration { return time.Duration(math.Round(x * 1e3)) }

// Two GPUs on one node, four experts, top-2, two layers.
func twoGPU() (*placement.Plan, *routing.Stats) {
	plan := singlePlan(2, [][]int{{0, 0, 1, 1}, {0, 1, 0, 1}})
	st := patternStats(2, 4, 2, []pat{
		{0, [][]int16{{0, 1}, {0, 2}}, 10},
		{1, [][]int16{{0, 2}, {1, 3}}, 5},
		{-1, [][]int16{{2, 3}, {0, 1}}, 4},
	})
	return plan, st
}

func TestEvaluateTwoGPUHome(t *testing.T) {
	plan, st := twoGPU()
	rep, err := Evaluate(plan, st, tinyCluster(1, 2), tinyModel(2, 4, 2), Options{})
	require.NoError(t, err)
	require.Len(t, rep.Layers, 2)
	l0 := rep.Layers[0]
	assert.Equal(t, [][]float64{{0, 2000}, {5000, 0}}, l0.Dispatch)
	assert.Equal(t, [][]float64{{0, 5000}, {2000, 0}}, l0.Combine)
	assert.Equal(t, []float64{25, 13}, l0.Tokens)
	assert.Equal(t, []time.Duration{us(45), us(33)}, l0.Compute)
	assert.Equal(t, us(45), l0.ComputeTail)
	assert.Equal(t, us(6), l0.DispatchTime)
	assert.Equal(t, us(6), l0.CombineTime)
	assert.Equal(t, us(12), l0.CommTime)
	assert.Equal(t, us(57), l0.Sequential)
	assert.Equal(t, us(45), l0.Ideal)
	assert.Equal(t, us(52.5), l0.Overlapped) // max(45·1.1, 12) + 12/4
	assert.Equal(t, us(57), l0.Time)
	assert.InDelta(t, 57e-6, l0.TimeSec, 1e-15)
	assert.Zero(t, l0.CrossNodeBytes)
	assert.InDelta(t, 25/19.0, l0.Balance, 1e-12)

	l1 := rep.Layers[1]
	assert.Equal(t, [][]float64{{0, 2000}, {2000, 0}}, l1.Dispatch)
	assert.Equal(t, [][]float64{{0, 2000}, {2000, 0}}, l1.Combine)
	assert.Equal(t, []float64{24, 14}, l1.Tokens)
	assert.Equal(t, us(3), l1.DispatchTime)
	assert.Equal(t, us(50), l1.Sequential) // 3 + 44 + 3
	assert.Equal(t, us(44), l1.Ideal)
	assert.Equal(t, us(48.4+1.5), l1.Overlapped)

	assert.Equal(t, us(107), rep.Time)
	assert.Equal(t, us(89), rep.ComputeTail)
	assert.Equal(t, us(18), rep.CommTime)
	assert.InDelta(t, 107e-6, rep.TimeSec, 1e-15)
	assert.Equal(t, 49.0, rep.MaxTokensSum)

	over, err := Evaluate(plan, st, tinyCluster(1, 2), tinyModel(2, 4, 2), Options{Mode: Overlapped, Chunks: 2})
	require.NoError(t, err)
	assert.Equal(t, us(49.5+6), over.Layers[0].Time) // max(49.5, 12) + 12/2
	assert.Equal(t, Overlapped, over.Mode)
	assert.InDelta(t, 0.1, over.Sigma, 0)
}

func TestEvaluateTwoGPUChain(t *testing.T) {
	plan, st := twoGPU()
	rep, err := Evaluate(plan, st, tinyCluster(1, 2), tinyModel(2, 4, 2), Options{Flow: FlowChain})
	require.NoError(t, err)
	l0, l1 := rep.Layers[0], rep.Layers[1]
	assert.Equal(t, [][]float64{{0, 2000}, {5000, 0}}, l0.Dispatch)
	assert.Equal(t, [][]float64{{0, 0}, {0, 0}}, l0.Combine)
	assert.Equal(t, us(6), l0.DispatchTime)
	assert.Zero(t, l0.CombineTime)
	assert.Equal(t, us(51), l0.Sequential)
	// P2: partial on GPU0 → GPU1 (5 tokens); P3: GPU1 → GPU0 (4 tokens).
	assert.Equal(t, [][]float64{{0, 5000}, {4000, 0}}, l1.Dispatch)
	assert.Equal(t, [][]float64{{0, 2000}, {2000, 0}}, l1.Combine)
	assert.Equal(t, us(6), l1.DispatchTime)
	assert.Equal(t, us(3), l1.CombineTime)
	assert.Equal(t, us(53), l1.Sequential)
}

func TestEvaluateTwoGPUCountOnly(t *testing.T) {
	plan, st := twoGPU()
	st = countOnly(st)
	rep, err := Evaluate(plan, st, tinyCluster(1, 2), tinyModel(2, 4, 2), Options{})
	require.NoError(t, err)
	// a = (25, 13), homes 1/2 each.
	assert.Equal(t, [][]float64{{0, 6500}, {12500, 0}}, rep.Layers[0].Dispatch)
	assert.Equal(t, [][]float64{{0, 12500}, {6500, 0}}, rep.Layers[0].Combine)
	assert.Equal(t, us(13.5), rep.Layers[0].DispatchTime)

	chain, err := Evaluate(plan, st, tinyCluster(1, 2), tinyModel(2, 4, 2), Options{Flow: FlowChain})
	require.NoError(t, err)
	assert.Equal(t, rep.Layers[0].Dispatch, chain.Layers[0].Dispatch)
	// M = Σ R·w·w: P2 adds 10 to (0,1), P3 adds 8 to (1,0).
	assert.Equal(t, [][]float64{{0, 10000}, {8000, 0}}, chain.Layers[1].Dispatch)
	assert.Equal(t, us(11), chain.Layers[1].DispatchTime)
	assert.Equal(t, rep.Layers[1].Combine, chain.Layers[1].Combine)

	st.Transitions = nil
	_, err = Evaluate(plan, st, tinyCluster(1, 2), tinyModel(2, 4, 2), Options{Flow: FlowChain})
	assert.ErrorContains(t, err, "chain flow needs a per-token trace")
}

// Four GPUs on two nodes, one expert per GPU.
func TestEvaluateTwoNodesHome(t *testing.T) {
	plan := singlePlan(4, [][]int{{0, 1, 2, 3}})
	st := patternStats(1, 4, 2, []pat{
		{0, [][]int16{{2, 3}}, 1},
		{1, [][]int16{{0, 3}}, 2},
		{3, [][]int16{{1, 2}}, 1},
	})
	rep, err := Evaluate(plan, st, tinyCluster(2, 2), tinyModel(1, 4, 2), Options{})
	require.NoError(t, err)
	l := rep.Layers[0]
	want := [][]float64{
		{0, 0, 1000, 0},
		{2000, 0, 0, 2000},
		{0, 0, 0, 1000},
		{0, 1000, 1000, 0},
	}
	assert.Equal(t, want, l.Dispatch)
	for s := range want {
		for d := range want {
			assert.Equal(t, want[s][d], l.Combine[d][s])
		}
	}
	// NIC busiest port: 2000 B at 0.5e9 B/s = 4 µs, + 2 µs NIC latency.
	assert.Equal(t, us(6), l.DispatchTime)
	assert.Equal(t, us(6), l.CombineTime)
	assert.Equal(t, 8000.0, l.CrossNodeBytes)
	assert.Equal(t, []float64{2, 1, 2, 3}, l.Tokens)
	assert.Equal(t, us(13), l.ComputeTail)
	assert.InDelta(t, 1.5, l.Balance, 1e-12)
	assert.Equal(t, us(25), l.Sequential)
	assert.Equal(t, us(13), l.Ideal)
	assert.Equal(t, us(14.3+3), l.Overlapped)
	assert.Equal(t, 8000.0, rep.CrossNodeBytes)

	// Count-only: a = (2,1,2,3) over homes 1/4 each, no node dedupe.
	co, err := Evaluate(plan, countOnly(st), tinyCluster(2, 2), tinyModel(1, 4, 2), Options{})
	require.NoError(t, err)
	// From home 0: NVLink 0→1: 1/4; NIC 0→2: (2+3)/4; forward 2→3: 3/4.
	// From home 2: NVLink 2→3: 3/4; NIC 2→0: 3/4; forward 0→1: 1/4.
	// Homes 1 and 3 mirror them (forward 1→0 and 3→2 add the second terms).
	wantCO := [][]float64{
		{0, 250 + 250, 1250, 0},
		{500 + 500, 0, 0, 1250},
		{750, 0, 0, 750 + 750},
		{0, 750, 500 + 500, 0},
	}
	for s := range wantCO {
		for d := range wantCO {
			assert.InDelta(t, wantCO[s][d], co.Layers[0].Dispatch[s][d], 1e-9, "%d→%d", s, d)
		}
	}
}

func TestEvaluateTwoNodesChain(t *testing.T) {
	plan := singlePlan(4, [][]int{{0, 1, 2, 3}, {0, 1, 2, 3}})
	st := patternStats(2, 4, 2, []pat{{0, [][]int16{{0, 1}, {2, 3}}, 1}})
	rep, err := Evaluate(plan, st, tinyCluster(2, 2), tinyModel(2, 4, 2), Options{Flow: FlowChain})
	require.NoError(t, err)
	assert.Equal(t, [][]float64{{0, 1000, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}}, rep.Layers[0].Dispatch)
	assert.Equal(t, [][]float64{{0, 0, 1000, 0}, {0, 0, 0, 1000}, {0, 0, 0, 1000}, {0, 0, 1000, 0}}, rep.Layers[1].Dispatch)
	assert.Equal(t, [][]float64{{0, 0, 0, 0}, {0, 0, 0, 0}, {1000, 0, 0, 0}, {0, 0, 1000, 0}}, rep.Layers[1].Combine)
	assert.Equal(t, us(2+2), rep.Layers[1].DispatchTime) // 1000 B NIC = 2 µs + 2 µs
	assert.Equal(t, us(4), rep.Layers[1].CombineTime)
	assert.Equal(t, 3000.0, rep.Layers[1].CrossNodeBytes)
	assert.Equal(t, us(2), rep.Layers[0].DispatchTime) // NVLink only
}

func TestEvaluateReplication(t *testing.T) {
	// Expert 0 on GPUs 0 and 1, expert 1 on GPU 1; top-1.
	plan := &placement.Plan{GPUs: 2, Experts: 2, Layers: []placement.LayerPlan{{
		SlotExpert: []routing.Expert{0, 0, 1}, SlotGPU: []placement.GPU{0, 1, 1}}}}
	st := patternStats(1, 2, 1, []pat{{0, [][]int16{{0}}, 4}})
	rep, err := Evaluate(plan, st, tinyCluster(1, 2), tinyModel(1, 2, 1), Options{})
	require.NoError(t, err)
	assert.Equal(t, [][]float64{{0, 2000}, {0, 0}}, rep.Layers[0].Dispatch)
	assert.Equal(t, []float64{2, 2}, rep.Layers[0].Tokens)
	assert.Equal(t, []time.Duration{us(12), us(22)}, rep.Layers[0].Compute)

	// Top-2 {0,1}: GPU1 is needed for sure (expert 1), so p_1 = 1.
	st2 := patternStats(1, 2, 2, []pat{{0, [][]int16{{0, 1}}, 4}})
	rep, err = Evaluate(plan, st2, tinyCluster(1, 2), tinyModel(1, 2, 2), Options{})
	require.NoError(t, err)
	assert.Equal(t, [][]float64{{0, 4000}, {0, 0}}, rep.Layers[0].Dispatch)

	// Two nodes: expert 0 on GPUs 0, 2, 3 (1/3 each), home 1.
	plan4 := &placement.Plan{GPUs: 4, Experts: 2, Layers: []placement.LayerPlan{{
		SlotExpert: []routing.Expert{0, 0, 0, 1}, SlotGPU: []placement.GPU{0, 2, 3, 1}}}}
	st4 := patternStats(1, 2, 1, []pat{{1, [][]int16{{0}}, 3}})
	rep, err = Evaluate(plan4, st4, tinyCluster(2, 2), tinyModel(1, 2, 1), Options{})
	require.NoError(t, err)
	d := rep.Layers[0].Dispatch
	assert.InDelta(t, 1000, d[1][0], 1e-9)
	assert.InDelta(t, 2000, d[1][3], 1e-9) // one NIC copy, q = 2/3
	assert.InDelta(t, 1000, d[3][2], 1e-9) // forwarded to GPU 2
	assert.InDelta(t, 2000, rep.Layers[0].CrossNodeBytes/2, 1e-9)

	// Two copies of expert 1 on the same GPU aggregate.
	planDup := &placement.Plan{GPUs: 2, Experts: 2, Layers: []placement.LayerPlan{{
		SlotExpert: []routing.Expert{0, 1, 1}, SlotGPU: []placement.GPU{0, 1, 1}}}}
	st5 := patternStats(1, 2, 1, []pat{{0, [][]int16{{1}}, 4}})
	rep, err = Evaluate(planDup, st5, tinyCluster(1, 2), tinyModel(1, 2, 1), Options{})
	require.NoError(t, err)
	assert.Equal(t, [][]float64{{0, 4000}, {0, 0}}, rep.Layers[0].Dispatch)
	assert.Equal(t, []float64{0, 4}, rep.Layers[0].Tokens)
}

func TestEvaluateErrors(t *testing.T) {
	plan, st := twoGPU()
	c, m := tinyCluster(1, 2), tinyModel(2, 4, 2)
	badSlot := *plan
	badSlot.Layers = []placement.LayerPlan{plan.Layers[0], {
		SlotExpert: []routing.Expert{0, 1, 2}, SlotGPU: []placement.GPU{0, 1, 1}}}
	outOfRange := *plan
	outOfRange.Layers = []placement.LayerPlan{plan.Layers[0], {
		SlotExpert: []routing.Expert{0, 1, 2, 3}, SlotGPU: []placement.GPU{0, 1, 2, 1}}}
	badSrc := *st
	badSrc.Patterns = append([]routing.Pattern{{Source: 2, Experts: []int16{0, 1, 0, 1}, Count: 1}}, st.Patterns...)
	tests := []struct {
		name  string
		plan  *placement.Plan
		stats *routing.Stats
		c     Cluster
		opts  Options
		want  string
	}{
		{"nil plan", nil, st, c, Options{}, "nil plan"},
		{"nil stats", plan, nil, c, Options{}, "nil stats"},
		{"gpus", plan, st, tinyCluster(2, 2), Options{}, "plan has 2 GPUs"},
		{"layers", &placement.Plan{GPUs: 2, Experts: 4, Layers: plan.Layers[:1]}, st, c, Options{}, "plan has 1 layers, stats have 2"},
		{"experts", &placement.Plan{GPUs: 2, Experts: 3, Layers: plan.Layers}, st, c, Options{}, "plan has 3 experts"},
		{"missing expert", &badSlot, st, c, Options{}, "layer 1: expert 3 has no slot"},
		{"gpu range", &outOfRange, st, c, Options{}, "GPU 2 out of range"},
		{"source", plan, &badSrc, c, Options{}, "source 2 out of range [-1,2)"},
		{"chunks", plan, st, c, Options{Chunks: -1}, "chunks"},
		{"flow", plan, st, c, Options{Flow: 7}, "unknown flow"},
		{"cluster", plan, st, Cluster{Name: "x"}, Options{}, `cluster "x": nodes must be ≥ 1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Evaluate(tt.plan, tt.stats, tt.c, m, tt.opts)
			assert.ErrorContains(t, err, tt.want)
		})
	}
	_, err := Evaluate(plan, st, c, tinyModel(2, 5, 2), Options{})
	assert.ErrorContains(t, err, "model \"tiny\" has 5 experts")
}

// ---- brute force: tokens one by one ----

type bruteMats struct{ disp, comb [][][]float64 }

func newMats(L, G int) bruteMats {
	b := bruteMats{make([][][]float64, L), make([][][]float64, L)}
	for l := 0; l < L; l++ {
		b.disp[l], b.comb[l] = make([][]float64, G), make([][]float64, G)
		for g := 0; g < G; g++ {
			b.disp[l][g], b.comb[l][g] = make([]float64, G), make([]float64, G)
		}
	}
	return b
}

// slotsOf lists the GPU of every slot of expert e (duplicates kept).
func slotsOf(lp placement.LayerPlan, e int) []int {
	var out []int
	for s, x := range lp.SlotExpert {
		if int(x) == e {
			out = append(out, int(lp.SlotGPU[s]))
		}
	}
	return out
}

// choices enumerates every way the experts of set pick one slot each, with
// its probability, as the set of GPUs reached.
func choices(lp placement.LayerPlan, set []int16, f func(gpus map[int]bool, w float64)) {
	var rec func(i int, gpus []int, w float64)
	rec = func(i int, gpus []int, w float64) {
		if i == len(set) {
			m := map[int]bool{}
			for _, g := range gpus {
				m[g] = true
			}
			f(m, w)
			return
		}
		sl := slotsOf(lp, int(set[i]))
		for _, g := range sl {
			rec(i+1, append(gpus, g), w/float64(len(sl)))
		}
	}
	rec(0, nil, 1)
}

// send routes one unit of data from src to every GPU in dst (one copy per
// remote node, then forwarding), adding w·tb.
func send(D [][]float64, P, src int, dst map[int]bool, w float64) {
	nodes := map[int]bool{}
	for g := range dst {
		if g == src {
			continue
		}
		if g/P == src/P {
			D[src][g] += w * 1000
		} else {
			nodes[g/P] = true
		}
	}
	for B := range nodes {
		r := B*P + src%P
		D[src][r] += w * 1000
		for g := range dst {
			if g/P == B && g != r {
				D[r][g] += w * 1000
			}
		}
	}
}

func bruteForce(plan *placement.Plan, st *routing.Stats, P int, flow Flow) bruteMats {
	G, L, K := plan.GPUs, st.Layers, st.TopK
	b := newMats(L, G)
	homeDispatch := func(D [][]float64, l int) {
		if st.Patterns == nil {
			for h := 0; h < G; h++ {
				for e, x := range st.Load[l] {
					sl := slotsOf(plan.Layers[l], e)
					for _, g := range sl {
						send(D, P, h, map[int]bool{g: true}, x/float64(G)/float64(len(sl)))
					}
				}
			}
			return
		}
		for _, pt := range st.Patterns {
			set := pt.Experts[l*K : (l+1)*K]
			for tok := 0; tok < int(pt.Count); tok++ {
				for h := 0; h < G; h++ {
					hw := 1.0 / float64(G)
					if pt.Source >= 0 {
						if h != int(pt.Source) {
							continue
						}
						hw = 1
					}
					choices(plan.Layers[l], set, func(gpus map[int]bool, w float64) {
						send(D, P, h, gpus, hw*w)
					})
				}
			}
		}
	}
	transpose := func(dst, src [][]float64) {
		for s := range src {
			for d := range src {
				dst[d][s] += src[s][d]
			}
		}
	}
	for l := 0; l < L; l++ {
		if flow == FlowHome || l == 0 {
			homeDispatch(b.disp[l], l)
			if flow == FlowHome || l == L-1 {
				transpose(b.comb[l], b.disp[l])
			}
			continue
		}
		if st.Patterns == nil {
			R := st.Transitions[l-1]
			E := st.Experts
			for e1 := 0; e1 < E; e1++ {
				for e2 := 0; e2 < E; e2++ {
					s1, s2 := slotsOf(plan.Layers[l-1], e1), slotsOf(plan.Layers[l], e2)
					for _, g1 := range s1 {
						for _, g2 := range s2 {
							send(b.disp[l], P, g1, map[int]bool{g2: true}, R[e1*E+e2]/float64(len(s1)*len(s2)))
						}
					}
				}
			}
		} else {
			for _, pt := range st.Patterns {
				for tok := 0; tok < int(pt.Count); tok++ {
					choices(plan.Layers[l-1], pt.Experts[(l-1)*K:l*K], func(from map[int]bool, w1 float64) {
						choices(plan.Layers[l], pt.Experts[l*K:(l+1)*K], func(to map[int]bool, w2 float64) {
							for g1 := range from {
								send(b.disp[l], P, g1, to, w1*w2)
							}
						})
					})
				}
			}
		}
		if l == L-1 {
			H := newMats(1, G).disp[0]
			homeDispatch(H, l)
			transpose(b.comb[l], H)
		}
	}
	return b
}

func randomInstance(rng *rand.Rand, nodes, gpn int, replicate bool) (*placement.Plan, *routing.Stats, Model) {
	G := nodes * gpn
	E := G + rng.IntN(5)
	K := 1 + rng.IntN(min(3, E))
	L := 1 + rng.IntN(3)
	plan := &placement.Plan{GPUs: G, Experts: E}
	for l := 0; l < L; l++ {
		var lp placement.LayerPlan
		for e := 0; e < E; e++ {
			copies := 1
			if replicate && rng.IntN(2) == 0 {
				copies = 2
			}
			for c := 0; c < copies; c++ {
				lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
				lp.SlotGPU = append(lp.SlotGPU, placement.GPU(rng.IntN(G)))
			}
		}
		rng.Shuffle(len(lp.SlotExpert), func(i, j int) {
			lp.SlotExpert[i], lp.SlotExpert[j] = lp.SlotExpert[j], lp.SlotExpert[i]
			lp.SlotGPU[i], lp.SlotGPU[j] = lp.SlotGPU[j], lp.SlotGPU[i]
		})
		plan.Layers = append(plan.Layers, lp)
	}
	var pats []pat
	for i := 1 + rng.IntN(6); i > 0; i-- {
		pats = append(pats, pat{src: int32(rng.IntN(G+1) - 1), count: float64(1 + rng.IntN(3)), sets: randomSets(rng, L, E, K)})
	}
	return plan, patternStats(L, E, K, pats), tinyModel(L, E, K)
}

// randomSets is a token's experts in each of L layers: K distinct of E,
// sorted, drawn uniformly.
func randomSets(rng *rand.Rand, L, E, K int) [][]int16 {
	sets := make([][]int16, L)
	for l := range sets {
		perm := rng.Perm(E)[:K]
		set := make([]int16, K)
		for j := range set {
			set[j] = int16(perm[j])
		}
		slicesSort(set)
		sets[l] = set
	}
	return sets
}

func slicesSort(s []int16) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func TestEvaluateBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	shapes := []struct{ nodes, gpn int }{{1, 2}, {1, 4}, {2, 2}, {2, 3}, {3, 2}}
	for it := 0; it < 200; it++ {
		sh := shapes[it%len(shapes)]
		replicate := it%2 == 1
		plan, st, m := randomInstance(rng, sh.nodes, sh.gpn, replicate)
		c := tinyCluster(sh.nodes, sh.gpn)
		for _, flow := range []Flow{FlowHome, FlowChain} {
			for _, counts := range []bool{false, true} {
				s := st
				if counts {
					s = countOnly(st)
				}
				name := fmt.Sprintf("it%d/%dx%d/rep=%v/%v/countonly=%v", it, sh.nodes, sh.gpn, replicate, flow, counts)
				rep, err := Evaluate(plan, s, c, m, Options{Flow: flow, Mode: Mode(it % 2)})
				require.NoError(t, err, name)
				want := bruteForce(plan, s, sh.gpn, flow)
				for l, lr := range rep.Layers {
					var nic float64
					for src := range lr.Dispatch {
						for dst := range lr.Dispatch {
							require.InDelta(t, want.disp[l][src][dst], lr.Dispatch[src][dst], 1e-7, "%s layer %d dispatch %d→%d", name, l, src, dst)
							require.InDelta(t, want.comb[l][src][dst], lr.Combine[src][dst], 1e-7, "%s layer %d combine %d→%d", name, l, src, dst)
							if src/sh.gpn != dst/sh.gpn {
								nic += want.disp[l][src][dst] + want.comb[l][src][dst]
							}
						}
					}
					require.InDelta(t, nic, lr.CrossNodeBytes, 1e-7, name)
				}
				checkEvaluator(t, name, plan, s, c, m, Options{Flow: flow, Mode: Mode(it % 2)}, rep)
			}
		}
	}
}

// checkEvaluator checks that the incremental Evaluator starts from every
// layer's TimeSec exactly and that the layer times obey their
// definitions.
func checkEvaluator(t *testing.T, name string, plan *placement.Plan, st *routing.Stats, c Cluster, m Model, opts Options, rep *Report) {
	t.Helper()
	sc := Scenario{Stats: st, Cluster: c, Model: m, Flow: opts.Flow, Mode: opts.Mode, Dispatch: opts.Dispatch, Chunks: opts.Chunks}
	ev, err := sc.NewEvaluator(plan)
	require.NoError(t, err)
	var sum float64
	for l, lr := range rep.Layers {
		require.Equal(t, lr.TimeSec, ev.LayerCost(l), "%s layer %d", name, l)
		sum += lr.TimeSec
		assert.LessOrEqual(t, lr.Ideal, lr.Sequential+1)
		assert.LessOrEqual(t, lr.Ideal, lr.Overlapped+1)
		assert.InDelta(t, float64(lr.DispatchTime+lr.CombineTime), float64(lr.CommTime), 1)
	}
	assert.InDelta(t, sum, rep.TimeSec, 1e-15)
	assert.InDelta(t, rep.TimeSec, ev.Cost(), 1e-15)
}

func TestEvaluatorInvalid(t *testing.T) {
	plan, st := twoGPU()
	sc := Scenario{Stats: st, Cluster: tinyCluster(1, 2), Model: tinyModel(2, 4, 2), Flow: FlowChain}
	ev, err := sc.NewEvaluator(plan)
	require.NoError(t, err)
	for _, tc := range []struct {
		m    Move
		want string
	}{
		{Move{Kind: MoveSwap, Layer: 2}, "move on layer 2 of 2"},
		{Move{Kind: MoveSwap, Layer: 0, Slot: 0, Other: 9}, "slot 9 out of range [0,4)"},
		{Move{Kind: MoveRelocate, Layer: 1, Slot: 0, GPU: 5}, "GPU 5 out of range [0,2)"},
		{Move{Kind: MoveRetarget, Layer: 1, Slot: 0, Expert: 7}, "expert 7 out of range [0,4)"},
		{Move{Kind: MoveDrop, Layer: 1, Slot: 0}, "expert 0 has no slot"},
		{Move{Kind: MoveKind(9)}, "unknown move kind MoveKind(9)"},
	} {
		_, err := ev.Delta(tc.m)
		assert.ErrorContains(t, err, tc.want, "%+v", tc.m)
		assert.ErrorContains(t, ev.Apply(tc.m), tc.want, "%+v", tc.m)
	}
	shared := plan.Clone()
	shared.Layers[0].SlotShare = []float64{1, 1}
	_, err = sc.NewEvaluator(shared)
	assert.ErrorContains(t, err, "carries slot shares")
}

func TestFlowModeStrings(t *testing.T) {
	for _, f := range []Flow{FlowHome, FlowChain} {
		got, err := ParseFlow(f.String())
		require.NoError(t, err)
		assert.Equal(t, f, got)
	}
	for _, m := range []Mode{Sequential, Overlapped} {
		got, err := ParseMode(m.String())
		require.NoError(t, err)
		assert.Equal(t, m, got)
	}
	_, err := ParseFlow("x")
	assert.ErrorContains(t, err, `unknown flow "x"`)
	_, err = ParseMode("x")
	assert.ErrorContains(t, err, `unknown mode "x"`)
	assert.Equal(t, "Flow(9)", Flow(9).String())
}

func TestReportTotalsMatrices(t *testing.T) {
	stats := &routing.Stats{Layers: 2, Experts: 2, TopK: 1, Tokens: 10, Load: [][]float64{{6, 4}, {5, 5}}}
	plan := &placement.Plan{GPUs: 2, Experts: 2, Layers: []placement.LayerPlan{
		{SlotExpert: []routing.Expert{0, 1}, SlotGPU: []placement.GPU{0, 1}},
		{SlotExpert: []routing.Expert{0, 1}, SlotGPU: []placement.GPU{1, 0}},
	}}
	c, err := ClusterPreset("h100x8")
	require.NoError(t, err)
	c.GPUsPerNode = 2
	m, err := ModelPreset("mixtral-8x7b")
	require.NoError(t, err)
	m.Experts = 2
	rep, err := Evaluate(plan, stats, c, m, Options{})
	require.NoError(t, err)
	for i := range 2 {
		for j := range 2 {
			assert.InDelta(t, rep.Layers[0].Dispatch[i][j]+rep.Layers[1].Dispatch[i][j], rep.Dispatch[i][j], 1e-9)
			assert.InDelta(t, rep.Layers[0].Combine[i][j]+rep.Layers[1].Combine[i][j], rep.Combine[i][j], 1e-9)
		}
	}
}

// localFrac is an independent statement of placement.DispatchLocal for one
// expert on the distinct GPUs gpus: own GPU, else own node evenly, else the
// water level (found by bisection) that evens out the copies.
func localFrac(gpus []int, G, P, h int) []float64 {
	n := len(gpus)
	src := func(h int) []float64 {
		f := make([]float64, n)
		for i, g := range gpus {
			if g == h {
				f[i] = 1
				return f
			}
		}
		k := 0
		for _, g := range gpus {
			if g/P == h/P {
				k++
			}
		}
		if k == 0 {
			return nil
		}
		for i, g := range gpus {
			if g/P == h/P {
				f[i] = 1 / float64(k)
			}
		}
		return f
	}
	if f := src(h); f != nil {
		return f
	}
	a := make([]float64, n)
	R := 0.0
	for s := 0; s < G; s++ {
		f := src(s)
		if f == nil {
			R++
			continue
		}
		for i := range a {
			a[i] += f[i]
		}
	}
	lo, hi := 0.0, float64(G)
	for it := 0; it < 200; it++ {
		mid := (lo + hi) / 2
		s := 0.0
		for _, x := range a {
			s += math.Max(0, mid-x)
		}
		if s < R {
			lo = mid
		} else {
			hi = mid
		}
	}
	f := make([]float64, n)
	for i, x := range a {
		f[i] = math.Max(0, lo-x) / R
	}
	return f
}

func distinctGPUs(lp placement.LayerPlan, e int) []int {
	var out []int
	for _, g := range slotsOf(lp, e) {
		if !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	return out
}

// bruteLocal is bruteForce's home flow under local dispatch, with the
// tokens per GPU.
func bruteLocal(plan *placement.Plan, st *routing.Stats, P int, frac func(gpus []int, G, P, h int) []float64) (b bruteMats, tokens [][]float64) {
	G, L, K, E := plan.GPUs, st.Layers, st.TopK, st.Experts
	b = newMats(L, G)
	for l := 0; l < L; l++ {
		lp := plan.Layers[l]
		D := b.disp[l]
		tok := make([]float64, G)
		// Source shares of each expert's load.
		share := make([][]float64, G)
		for h := range share {
			share[h] = make([]float64, E)
		}
		tot := make([]float64, E)
		anySrc := false
		for _, pt := range st.Patterns {
			if pt.Source >= 0 {
				anySrc = true
			}
		}
		for h := 0; h < G; h++ {
			for e := 0; e < E; e++ {
				share[h][e] = 1 / float64(G)
			}
		}
		if anySrc {
			for h := range share {
				clear(share[h])
			}
			for _, pt := range st.Patterns {
				for _, e := range pt.Experts[l*K : (l+1)*K] {
					tot[e] += pt.Count
					for h := 0; h < G; h++ {
						if pt.Source < 0 {
							share[h][e] += pt.Count / float64(G)
						} else if h == int(pt.Source) {
							share[h][e] += pt.Count
						}
					}
				}
			}
			for h := range share {
				for e := range share[h] {
					if tot[e] > 0 {
						share[h][e] /= tot[e]
					} else {
						share[h][e] = 1 / float64(G)
					}
				}
			}
		}
		for e, x := range st.Load[l] {
			gs := distinctGPUs(lp, e)
			for h := 0; h < G; h++ {
				f := frac(gs, G, P, h)
				for i, g := range gs {
					tok[g] += x * share[h][e] * f[i]
					if st.Patterns == nil {
						send(D, P, h, map[int]bool{g: true}, x/float64(G)*f[i])
					}
				}
			}
		}
		tokens = append(tokens, tok)
		if st.Patterns != nil {
			for _, pt := range st.Patterns {
				set := pt.Experts[l*K : (l+1)*K]
				for h := 0; h < G; h++ {
					hw := 1.0 / float64(G)
					if pt.Source >= 0 {
						if h != int(pt.Source) {
							continue
						}
						hw = 1
					}
					var rec func(i int, gpus map[int]bool, w float64)
					rec = func(i int, gpus map[int]bool, w float64) {
						if w == 0 {
							return
						}
						if i == len(set) {
							send(D, P, h, gpus, pt.Count*hw*w)
							return
						}
						gs := distinctGPUs(lp, int(set[i]))
						f := frac(gs, G, P, h)
						for j, g := range gs {
							m := maps.Clone(gpus)
							m[g] = true
							rec(i+1, m, w*f[j])
						}
					}
					rec(0, map[int]bool{}, 1)
				}
			}
		}
		for s := range D {
			for d := range D {
				b.comb[l][d][s] += D[s][d]
			}
		}
	}
	return b, tokens
}

// staticFrac is static dispatch's split for source h: its own copy, else
// every copy evenly.
func staticFrac(gpus []int, G, P, h int) []float64 {
	f := make([]float64, len(gpus))
	if i := slices.Index(gpus, h); i >= 0 {
		f[i] = 1
		return f
	}
	for i := range f {
		f[i] = 1 / float64(len(gpus))
	}
	return f
}

// TestEvaluatePerSourceBruteForce enumerates every token's destinations
// under local and static dispatch and compares the bytes, tokens and NIC
// traffic with Evaluate's.
func TestEvaluatePerSourceBruteForce(t *testing.T) {
	for _, d := range []struct {
		dispatch placement.Dispatch
		frac     func(gpus []int, G, P, h int) []float64
	}{{placement.DispatchLocal, localFrac}, {placement.DispatchStaticMean, staticFrac}} {
		t.Run(d.dispatch.String(), func(t *testing.T) { testPerSourceBruteForce(t, d.dispatch, d.frac) })
	}
}

func testPerSourceBruteForce(t *testing.T, dispatch placement.Dispatch, frac func(gpus []int, G, P, h int) []float64) {
	rng := rand.New(rand.NewPCG(3, 4))
	shapes := []struct{ nodes, gpn int }{{1, 3}, {2, 2}, {2, 3}, {3, 2}, {4, 2}}
	for it := 0; it < 150; it++ {
		sh := shapes[it%len(shapes)]
		plan, st, m := randomInstance(rng, sh.nodes, sh.gpn, true)
		c := tinyCluster(sh.nodes, sh.gpn)
		for _, counts := range []bool{false, true} {
			s := st
			if counts {
				s = countOnly(st)
			}
			name := fmt.Sprintf("it%d/%dx%d/countonly=%v", it, sh.nodes, sh.gpn, counts)
			opts := Options{Flow: FlowHome, Mode: Mode(it % 2), Dispatch: dispatch}
			rep, err := Evaluate(plan, s, c, m, opts)
			require.NoError(t, err, name)
			want, tokens := bruteLocal(plan, s, sh.gpn, frac)
			for l, lr := range rep.Layers {
				var nic float64
				for src := range lr.Dispatch {
					require.InDelta(t, tokens[l][src], lr.Tokens[src], 1e-7, "%s layer %d tokens on %d", name, l, src)
					for dst := range lr.Dispatch {
						require.InDelta(t, want.disp[l][src][dst], lr.Dispatch[src][dst], 1e-7, "%s layer %d dispatch %d→%d", name, l, src, dst)
						require.InDelta(t, want.comb[l][src][dst], lr.Combine[src][dst], 1e-7, "%s layer %d combine %d→%d", name, l, src, dst)
						if src/sh.gpn != dst/sh.gpn {
							nic += want.disp[l][src][dst] + want.comb[l][src][dst]
						}
					}
				}
				require.InDelta(t, nic, lr.CrossNodeBytes, 1e-7, name)
			}
			checkEvaluator(t, name, plan, s, c, m, opts, rep)
		}
	}
}

// Copies on every node keep a count-only expert off the NICs under local
// dispatch; even dispatch sends half of it across.
func TestLocalDispatchSavesNIC(t *testing.T) {
	st := &routing.Stats{Layers: 1, Experts: 2, TopK: 1, Load: [][]float64{{8, 8}}}
	plan := &placement.Plan{GPUs: 4, Experts: 2, Layers: []placement.LayerPlan{{
		SlotExpert: []routing.Expert{0, 0, 1, 1},
		SlotGPU:    []placement.GPU{0, 2, 1, 3},
	}}}
	c := tinyCluster(2, 2)
	m := tinyModel(1, 2, 1)
	even, err := Evaluate(plan, st, c, m, Options{})
	require.NoError(t, err)
	local, err := Evaluate(plan, st, c, m, Options{Dispatch: placement.DispatchLocal})
	require.NoError(t, err)
	// Even: 16 tokens, half of every source's share crosses, both phases.
	assert.InDelta(t, 2*8*1000.0, even.CrossNodeBytes, 1e-9)
	assert.Zero(t, local.CrossNodeBytes)
	assert.Equal(t, []float64{4, 4, 4, 4}, local.Layers[0].Tokens)

	_, err = Evaluate(plan, st, c, m, Options{Flow: FlowChain, Dispatch: placement.DispatchLocal})
	require.ErrorContains(t, err, "home flow only")
	shared := plan.Clone()
	shared.Layers[0].SlotShare = []float64{0.5, 0.5, 0.5, 0.5}
	_, err = Evaluate(shared, st, c, m, Options{Dispatch: placement.DispatchLocal})
	require.ErrorContains(t, err, "slot shares")
}
