package jointilp

import (
	"fmt"
	"math"
	"sort"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// Model holds the constants of the joint ILP. Times are in
// microseconds inside the ILP (coefficients near 1) and converted to
// seconds in results.
type Model struct {
	stats               *routing.Stats
	L, E, G, N, perNode int // layers, experts, GPUs, nodes, GPUs per node
	alpha, beta         float64
	speed               []float64
	slots               []int
	tb                  float64 // bytes per token
	nv, nic             float64 // bytes per µs per direction
	lat                 float64 // µs per all-to-all phase
	sigma, chunks       float64
	terms               costmodel.Terms
	overlap             bool
	chain               bool
	pairs               [][]pair // home: co-activation pairs per layer
	trans               [][]pair // chain: transition pairs per layer l ≥ 1 (from l−1)
	rowSum              [][]float64
	colSum              [][]float64
}

// pair is a kept expert pair with its token count: (A, B) co-activated in
// one layer (home) or A at layer l−1 followed by B at layer l (chain).
type pair struct {
	A, B int
	W    float64
}

// New builds the joint ILP's constants for sc, keeping the maxPairs
// heaviest co-activation (home flow) or transition (chain flow) pairs per
// layer (0: 4·E).
func New(sc costmodel.Scenario, maxPairs int) (*Model, error) {
	s := sc.Stats
	c := sc.Cluster
	jm := &Model{
		stats: s, L: s.Layers, E: s.Experts, G: c.GPUs(), N: c.Nodes, perNode: c.GPUsPerNode,
		tb: sc.Model.TokenBytes(), nv: c.NVLinkBytesPerSec() / 1e6, nic: c.NICBytesPerSec() / 1e6,
		overlap: sc.Mode == costmodel.Overlapped, chain: sc.Flow == costmodel.FlowChain,
	}
	terms := sc.Terms()
	jm.terms = terms
	jm.sigma, jm.chunks = terms.Sigma, terms.Chunks
	jm.alpha, jm.beta = terms.PerTokenSec*1e6, terms.PerExpertSec*1e6
	if jm.tb <= 0 {
		return nil, fmt.Errorf("solver: model %q has no token size (hidden × bytes per activation)", sc.Model.Name)
	}
	if jm.E%jm.G != 0 {
		return nil, &task.Infeasible{Constraint: "slots", Detail: fmt.Sprintf("%d experts do not divide evenly over %d GPUs; pick a GPU count that divides %d", jm.E, jm.G, jm.E)}
	}
	jm.slots = make([]int, jm.G)
	jm.speed = make([]float64, jm.G)
	for g := range jm.G {
		jm.slots[g] = jm.E / jm.G
		jm.speed[g] = terms.Speed[g]
	}
	if jm.N > 1 {
		jm.lat = float64(c.NICLatency) / 1e3
	} else {
		jm.lat = float64(c.NVLinkLatency) / 1e3
	}
	if maxPairs <= 0 {
		maxPairs = 4 * jm.E
	}
	if jm.chain {
		if s.Transitions == nil {
			return nil, fmt.Errorf("solver: the chain flow needs adjacent-layer transitions; give a per-token trace (jsonl, npy or FLAME csv) instead of expert counts")
		}
		jm.trans = make([][]pair, jm.L)
		jm.rowSum = make([][]float64, jm.L)
		jm.colSum = make([][]float64, jm.L)
		for l := 1; l < jm.L; l++ {
			R := s.Transitions[l-1]
			rs, cs := make([]float64, jm.E), make([]float64, jm.E)
			var all []pair
			for e1 := range jm.E {
				for e2 := range jm.E {
					w := R[e1*jm.E+e2]
					rs[e1] += w
					cs[e2] += w
					if w > 0 {
						all = append(all, pair{e1, e2, w})
					}
				}
			}
			jm.rowSum[l], jm.colSum[l] = rs, cs
			jm.trans[l] = topPairs(all, maxPairs)
		}
	} else if s.CoActivation != nil {
		jm.pairs = make([][]pair, jm.L)
		for l := range jm.L {
			var all []pair
			for a := range jm.E {
				for b := a + 1; b < jm.E; b++ {
					if w := s.CoActivation[l][a*jm.E+b]; w > 0 {
						all = append(all, pair{a, b, w})
					}
				}
			}
			jm.pairs[l] = topPairs(all, maxPairs)
		}
	}
	return jm, nil
}

// topPairs keeps the k heaviest pairs, ties by (A, B), in a fixed order.
func topPairs(all []pair, k int) []pair {
	sort.Slice(all, func(i, j int) bool {
		if all[i].W != all[j].W {
			return all[i].W > all[j].W
		}
		if all[i].A != all[j].A {
			return all[i].A < all[j].A
		}
		return all[i].B < all[j].B
	})
	if len(all) > k {
		all = all[:k]
	}
	return all
}

func (jm *Model) node(g int) int { return g / jm.perNode }

// symmetric reports whether every GPU is interchangeable with every other
// up to node structure (equal speeds and slots).
func (jm *Model) symmetric() bool {
	for g := range jm.G {
		if jm.speed[g] != jm.speed[0] || jm.slots[g] != jm.slots[0] {
			return false
		}
	}
	return true
}

// order returns layer l's experts by load, heaviest first (ties: lower id).
func (jm *Model) order(l int) []int {
	load := jm.stats.Load[l]
	o := make([]int, jm.E)
	for e := range o {
		o[e] = e
	}
	sort.SliceStable(o, func(i, j int) bool { return load[o[i]] > load[o[j]] })
	return o
}

// Canonical relabels GPUs in assign (a copy) to satisfy the symmetry
// breaking of addLayer: per layer in the home flow, once for all layers
// (from layer 0) in the chain flow, where one relabelling must serve all.
func (jm *Model) Canonical(assign [][]int) [][]int {
	out := make([][]int, len(assign))
	for l := range assign {
		out[l] = append([]int(nil), assign[l]...)
	}
	if !jm.symmetric() {
		return out
	}
	perm := func(l int) []int {
		p := make([]int, jm.G)
		order := jm.order(l)
		if jm.N == 1 {
			for g := range p {
				p[g] = -1
			}
			next := 0
			for _, e := range order {
				if g := assign[l][e]; p[g] < 0 {
					p[g] = next
					next++
				}
			}
			for g := range p {
				if p[g] < 0 {
					p[g] = next
					next++
				}
			}
			return p
		}
		g0 := assign[l][order[0]]
		a, i := jm.node(g0), g0%jm.perNode
		for g := range p {
			nd, loc := jm.node(g), g%jm.perNode
			switch nd {
			case a:
				nd = 0
			case 0:
				nd = a
			}
			switch loc {
			case i:
				loc = 0
			case 0:
				loc = i
			}
			p[g] = nd*jm.perNode + loc
		}
		return p
	}
	var p []int
	for l := range out {
		if l == 0 || !jm.chain {
			p = perm(l)
		}
		for e, g := range assign[l] {
			out[l][e] = p[g]
		}
	}
	return out
}

// homeDispatch returns the dispatch-phase bottleneck (µs) of the home flow
// given distinct tokens per GPU (ng) and per node (mb).
func (jm *Model) homeDispatch(ng, mb []float64) float64 {
	worst := 0.0
	nodeSum := make([]float64, jm.N)
	for g := range jm.G {
		nodeSum[jm.node(g)] += ng[g]
	}
	fn := float64(jm.perNode)
	for g := range jm.G {
		in := (fn - 1) / fn * ng[g]
		out := (nodeSum[jm.node(g)] - ng[g]) / fn
		worst = math.Max(worst, math.Max(in, out)*jm.tb/jm.nv)
	}
	if jm.N > 1 {
		total := 0.0
		for _, m := range mb {
			total += m
		}
		for b := range jm.N {
			in := float64(jm.N-1) / float64(jm.G) * mb[b]
			out := (total - mb[b]) / float64(jm.G)
			worst = math.Max(worst, math.Max(in, out)*jm.tb/jm.nic)
		}
	}
	return worst
}

// layerTime combines compute and communication (µs) as the cost model does.
func (jm *Model) layerTime(tc, comm float64) float64 {
	return jm.terms.LayerSec(tc, comm, 0)
}

// Objective recomputes the ILP objective (µs) of a single-copy assignment
// assign[l][e] = GPU straight from the formulas in doc.go, independently of
// the row-building code.
func (jm *Model) Objective(assign [][]int) float64 {
	s := jm.stats
	total := 0.0
	loads := func(l int, pairs []pair) (tc float64, ng, mb []float64) {
		ng = make([]float64, jm.G)
		mb = make([]float64, jm.N)
		for e, g := range assign[l] {
			ng[g] += s.Load[l][e]
			mb[jm.node(g)] += s.Load[l][e]
		}
		for g := range jm.G {
			tc = math.Max(tc, 1e6*jm.terms.Compute(g, ng[g], float64(jm.slots[g])))
		}
		for _, pr := range pairs {
			ga, gb := assign[l][pr.A], assign[l][pr.B]
			if ga == gb {
				ng[ga] -= pr.W
			}
			if jm.node(ga) == jm.node(gb) {
				mb[jm.node(ga)] -= pr.W
			}
		}
		return tc, ng, mb
	}
	for l := range jm.L {
		if !jm.chain {
			var pairs []pair
			if jm.pairs != nil {
				pairs = jm.pairs[l]
			}
			tc, ng, mb := loads(l, pairs)
			comm := 2*jm.homeDispatch(ng, mb) + 2*jm.lat
			total += jm.layerTime(tc, comm)
			continue
		}
		tc, ng, mb := loads(l, nil)
		var comm float64
		if l == 0 {
			comm = jm.homeDispatch(ng, mb) + jm.lat
		} else {
			comm = jm.chainDispatch(l, assign[l-1], assign[l]) + jm.lat
		}
		if l == jm.L-1 {
			comm += jm.homeDispatch(ng, mb) + jm.lat
		}
		total += jm.layerTime(tc, comm)
	}
	return total
}

// chainDispatch is the proxy bottleneck (µs) of moving tokens from layer
// l−1's GPUs to layer l's.
func (jm *Model) chainDispatch(l int, prev, cur []int) float64 {
	out := make([]float64, jm.G)
	in := make([]float64, jm.G)
	for e := range jm.E {
		out[prev[e]] += jm.rowSum[l][e]
		in[cur[e]] += jm.colSum[l][e]
	}
	nodeOut := make([]float64, jm.N)
	nodeIn := make([]float64, jm.N)
	for g := range jm.G {
		nodeOut[jm.node(g)] += out[g]
		nodeIn[jm.node(g)] += in[g]
	}
	for _, pr := range jm.trans[l] {
		g1, g2 := prev[pr.A], cur[pr.B]
		if g1 == g2 {
			out[g1] -= pr.W
			in[g1] -= pr.W
		}
		if jm.node(g1) == jm.node(g2) {
			nodeOut[jm.node(g1)] -= pr.W
			nodeIn[jm.node(g1)] -= pr.W
		}
	}
	worst := 0.0
	for g := range jm.G {
		worst = math.Max(worst, math.Max(out[g], in[g])*jm.tb/jm.nv)
	}
	if jm.N > 1 {
		for b := range jm.N {
			worst = math.Max(worst, math.Max(nodeOut[b], nodeIn[b])/float64(jm.perNode)*jm.tb/jm.nic)
		}
	}
	return worst
}
