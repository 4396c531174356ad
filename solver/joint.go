package solver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/moetuner/moetuner/mip"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
)

// jointModel holds the constants of the joint ILP. Times are in
// microseconds inside the ILP (coefficients near 1) and converted to
// seconds in results.
type jointModel struct {
	p             Problem
	L, E, G, N, n int // layers, experts, GPUs, nodes, GPUs per node
	alpha, beta   float64
	speed         []float64
	slots         []int
	tb            float64 // bytes per token
	nv, nic       float64 // bytes per µs per direction
	lat           float64 // µs per all-to-all phase
	sigma, chunks float64
	overlap       bool
	chain         bool
	pairs         [][]pair // home: co-activation pairs per layer
	trans         [][]pair // chain: transition pairs per layer l ≥ 1 (from l−1)
	rowSum        [][]float64
	colSum        [][]float64
}

// pair is a kept expert pair with its token count: (A, B) co-activated in
// one layer (home) or A at layer l−1 followed by B at layer l (chain).
type pair struct {
	A, B int
	W    float64
}

func newJointModel(p Problem, maxPairs int) (*jointModel, error) {
	s := p.Stats
	c := p.Cluster
	jm := &jointModel{
		p: p, L: s.Layers, E: s.Experts, G: c.GPUs(), N: c.Nodes, n: c.GPUsPerNode,
		tb: p.Model.TokenBytes(), nv: c.NVLinkBytesPerSec() / 1e6, nic: c.NICBytesPerSec() / 1e6,
		sigma: c.SigmaValue(), chunks: 4, overlap: p.Mode == costmodel.Overlapped, chain: p.Flow == costmodel.FlowChain,
	}
	a, b := c.Coefficients(p.Model)
	jm.alpha, jm.beta = a*1e6, b*1e6
	if jm.tb <= 0 {
		return nil, fmt.Errorf("solver: model %q has no token size (hidden × bytes per activation)", p.Model.Name)
	}
	if jm.E%jm.G != 0 {
		return nil, &InfeasibleError{Constraint: "slots", Detail: fmt.Sprintf("%d experts do not divide evenly over %d GPUs; pick a GPU count that divides %d", jm.E, jm.G, jm.E)}
	}
	jm.slots = make([]int, jm.G)
	jm.speed = make([]float64, jm.G)
	for g := range jm.G {
		jm.slots[g] = jm.E / jm.G
		jm.speed[g] = c.SpeedOf(g)
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

func (jm *jointModel) node(g int) int { return g / jm.n }

// symmetric reports whether every GPU is interchangeable with every other
// up to node structure (equal speeds and slots).
func (jm *jointModel) symmetric() bool {
	for g := range jm.G {
		if jm.speed[g] != jm.speed[0] || jm.slots[g] != jm.slots[0] {
			return false
		}
	}
	return true
}

// order returns layer l's experts by load, heaviest first (ties: lower id).
func (jm *jointModel) order(l int) []int {
	load := jm.p.Stats.Load[l]
	o := make([]int, jm.E)
	for e := range o {
		o[e] = e
	}
	sort.SliceStable(o, func(i, j int) bool { return load[o[i]] > load[o[j]] })
	return o
}

// canonical relabels GPUs in assign (a copy) to satisfy the symmetry
// breaking of addLayer: per layer in the home flow, once for all layers
// (from layer 0) in the chain flow, where one relabelling must serve all.
func (jm *jointModel) canonical(assign [][]int) [][]int {
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
		a, i := jm.node(g0), g0%jm.n
		for g := range p {
			nd, loc := jm.node(g), g%jm.n
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
			p[g] = nd*jm.n + loc
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
func (jm *jointModel) homeDispatch(ng, mb []float64) float64 {
	worst := 0.0
	nodeSum := make([]float64, jm.N)
	for g := range jm.G {
		nodeSum[jm.node(g)] += ng[g]
	}
	fn := float64(jm.n)
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
func (jm *jointModel) layerTime(tc, comm float64) float64 {
	if jm.overlap {
		return math.Max((1+jm.sigma)*tc, comm) + comm/jm.chunks
	}
	return tc + comm
}

// objective recomputes the ILP objective (µs) of a single-copy assignment
// assign[l][e] = GPU straight from the formulas in doc.go, independently of
// the row-building code.
func (jm *jointModel) objective(assign [][]int) float64 {
	s := jm.p.Stats
	total := 0.0
	loads := func(l int, pairs []pair) (tc float64, ng, mb []float64) {
		ng = make([]float64, jm.G)
		mb = make([]float64, jm.N)
		for e, g := range assign[l] {
			ng[g] += s.Load[l][e]
			mb[jm.node(g)] += s.Load[l][e]
		}
		for g := range jm.G {
			tc = math.Max(tc, (jm.alpha*ng[g]+jm.beta*float64(jm.slots[g]))/jm.speed[g])
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
func (jm *jointModel) chainDispatch(l int, prev, cur []int) float64 {
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
			worst = math.Max(worst, math.Max(nodeOut[b], nodeIn[b])/float64(jm.n)*jm.tb/jm.nic)
		}
	}
	return worst
}

// layerVars indexes the columns of one layer's assignment.
type layerVars struct {
	x  [][]int // [e][g]
	tc int
	td int // dispatch (chain: transition into this layer)
	tb int // chain, last layer: combine; -1 otherwise
	t  int // overlap epigraph; -1 when sequential
}

// addLayer adds x, Tc, Td (and T) and the assignment, capacity and compute
// rows of layer l; the caller adds the communication rows.
func (jm *jointModel) addLayer(b *mip.Builder, l int, breakSymmetry bool) layerVars {
	s := jm.p.Stats
	lv := layerVars{tb: -1, t: -1}
	lv.x = make([][]int, jm.E)
	for e := range jm.E {
		lv.x[e] = make([]int, jm.G)
		for g := range jm.G {
			lv.x[e][g] = b.Binary(fmt.Sprintf("x_%d_%d_%d", l, e, g))
		}
	}
	if breakSymmetry && jm.symmetric() {
		// GPUs are interchangeable: on one node the k-th heaviest expert
		// may only use GPUs 0..k (bins in order of first use); across
		// nodes (permute nodes, then local ranks) the heaviest expert sits
		// on GPU 0. canonical() relabels warm starts the same way.
		order := jm.order(l)
		for k, e := range order {
			for g := range jm.G {
				if (jm.N == 1 && g > k) || (jm.N > 1 && k == 0 && g != 0) {
					b.SetUpper(lv.x[e][g], 0)
				}
			}
			if k >= jm.G {
				break
			}
		}
	}
	lv.tc = b.Col(fmt.Sprintf("Tc_%d", l), 0, inf, 0, false)
	lv.td = b.Col(fmt.Sprintf("Td_%d", l), 0, inf, 0, false)
	for e := range jm.E {
		b.Row(fmt.Sprintf("assign_%d_%d", l, e), 1, 1, lv.x[e], ones(jm.G))
	}
	for g := range jm.G {
		idx := make([]int, 0, jm.E+1)
		val := make([]float64, 0, jm.E+1)
		for e := range jm.E {
			idx = append(idx, lv.x[e][g])
			val = append(val, 1)
		}
		sl := float64(jm.slots[g])
		b.Row(fmt.Sprintf("slots_%d_%d", l, g), sl, sl, idx, val)
		idx, val = idx[:0], val[:0]
		for e := range jm.E {
			idx = append(idx, lv.x[e][g])
			val = append(val, jm.alpha*s.Load[l][e]/jm.speed[g])
		}
		idx = append(idx, lv.tc)
		val = append(val, -1)
		b.Row(fmt.Sprintf("compute_%d_%d", l, g), -inf, -jm.beta*sl/jm.speed[g], idx, val)
	}
	return lv
}

// addHomeComm adds rows making td ≥ the home-flow dispatch bottleneck of
// layer l, with pair savings when pairs is non-nil.
func (jm *jointModel) addHomeComm(b *mip.Builder, l int, lv layerVars, td int, pairs []pair) {
	s := jm.p.Stats
	name := func(k string, i int) string { return fmt.Sprintf("%s_%d_%d_%d", k, l, td, i) }
	// Distinct-token expressions N_g and M_B as (idx, val) lists.
	ng := make([][]int, jm.G)
	ngv := make([][]float64, jm.G)
	mb := make([][]int, jm.N)
	mbv := make([][]float64, jm.N)
	for g := range jm.G {
		for e := range jm.E {
			ng[g] = append(ng[g], lv.x[e][g])
			ngv[g] = append(ngv[g], s.Load[l][e])
			mb[jm.node(g)] = append(mb[jm.node(g)], lv.x[e][g])
			mbv[jm.node(g)] = append(mbv[jm.node(g)], s.Load[l][e])
		}
	}
	// star[a][g]: the y columns of pairs containing expert a on GPU g.
	star := make(map[[2]int][]int)
	for k, pr := range pairs {
		for g := range jm.G {
			y := b.Col(fmt.Sprintf("y_%d_%d_%d", l, k, g), 0, 1, 0, false)
			b.Row(name("ya", k*jm.G+g), -inf, 0, []int{y, lv.x[pr.A][g]}, []float64{1, -1})
			b.Row(name("yb", k*jm.G+g), -inf, 0, []int{y, lv.x[pr.B][g]}, []float64{1, -1})
			ng[g] = append(ng[g], y)
			ngv[g] = append(ngv[g], -pr.W)
			star[[2]int{pr.A, g}] = append(star[[2]int{pr.A, g}], y)
			star[[2]int{pr.B, g}] = append(star[[2]int{pr.B, g}], y)
		}
		if jm.N > 1 {
			for nb := range jm.N {
				y := b.Col(fmt.Sprintf("yn_%d_%d_%d", l, k, nb), 0, 1, 0, false)
				ia, va := []int{y}, []float64{1}
				ib, vb := []int{y}, []float64{1}
				for g := nb * jm.n; g < (nb+1)*jm.n; g++ {
					ia, va = append(ia, lv.x[pr.A][g]), append(va, -1)
					ib, vb = append(ib, lv.x[pr.B][g]), append(vb, -1)
				}
				b.Row(name("yna", k*jm.N+nb), -inf, 0, ia, va)
				b.Row(name("ynb", k*jm.N+nb), -inf, 0, ib, vb)
				mb[nb] = append(mb[nb], y)
				mbv[nb] = append(mbv[nb], -pr.W)
			}
		}
	}
	// Valid star inequalities: on GPU g expert a shares the GPU with at
	// most slots−1 others, so Σ_b y[a][b][g] ≤ (slots−1)·x[a][g]. They cut
	// off fractional points that claim every pair's saving at once.
	for a := range jm.E {
		for g := range jm.G {
			ys := star[[2]int{a, g}]
			if len(ys) < jm.slots[g] {
				continue // cannot bind
			}
			idx := append(append([]int{}, ys...), lv.x[a][g])
			val := append(ones(len(ys)), -float64(jm.slots[g]-1))
			b.Row(name("star", a*jm.G+g), -inf, 0, idx, val)
		}
	}
	fn := float64(jm.n)
	nvs := jm.tb / jm.nv
	for g := range jm.G {
		// In: (n−1)/n · N_g.
		idx, val := scaled(ng[g], ngv[g], (fn-1)/fn*nvs)
		b.Row(name("nvin", g), -inf, 0, append(idx, td), append(val, -1))
		// Out: (Σ_{g'∈node, g'≠g} N_g')/n.
		idx, val = nil, nil
		nb := jm.node(g)
		for g2 := nb * jm.n; g2 < (nb+1)*jm.n; g2++ {
			if g2 == g {
				continue
			}
			i2, v2 := scaled(ng[g2], ngv[g2], nvs/fn)
			idx, val = append(idx, i2...), append(val, v2...)
		}
		if len(idx) > 0 {
			b.Row(name("nvout", g), -inf, 0, append(idx, td), append(val, -1))
		}
	}
	if jm.N > 1 {
		nics := jm.tb / jm.nic
		for nb := range jm.N {
			idx, val := scaled(mb[nb], mbv[nb], float64(jm.N-1)/float64(jm.G)*nics)
			b.Row(name("nicin", nb), -inf, 0, append(idx, td), append(val, -1))
			idx, val = nil, nil
			for o := range jm.N {
				if o != nb {
					i2, v2 := scaled(mb[o], mbv[o], nics/float64(jm.G))
					idx, val = append(idx, i2...), append(val, v2...)
				}
			}
			b.Row(name("nicout", nb), -inf, 0, append(idx, td), append(val, -1))
		}
	}
}

// addChainComm adds rows making lv.td ≥ the transition bottleneck from
// layer l−1 (prev) into layer l (lv).
func (jm *jointModel) addChainComm(b *mip.Builder, l int, prev, lv layerVars) {
	out := make([][]int, jm.G)
	outv := make([][]float64, jm.G)
	in := make([][]int, jm.G)
	inv := make([][]float64, jm.G)
	nout := make([][]int, jm.N)
	noutv := make([][]float64, jm.N)
	nin := make([][]int, jm.N)
	ninv := make([][]float64, jm.N)
	for g := range jm.G {
		nb := jm.node(g)
		for e := range jm.E {
			out[g] = append(out[g], prev.x[e][g])
			outv[g] = append(outv[g], jm.rowSum[l][e])
			in[g] = append(in[g], lv.x[e][g])
			inv[g] = append(inv[g], jm.colSum[l][e])
			nout[nb] = append(nout[nb], prev.x[e][g])
			noutv[nb] = append(noutv[nb], jm.rowSum[l][e])
			nin[nb] = append(nin[nb], lv.x[e][g])
			ninv[nb] = append(ninv[nb], jm.colSum[l][e])
		}
	}
	for k, pr := range jm.trans[l] {
		for g := range jm.G {
			v := b.Col(fmt.Sprintf("v_%d_%d_%d", l, k, g), 0, 1, 0, false)
			b.Row(fmt.Sprintf("va_%d_%d_%d", l, k, g), -inf, 0, []int{v, prev.x[pr.A][g]}, []float64{1, -1})
			b.Row(fmt.Sprintf("vb_%d_%d_%d", l, k, g), -inf, 0, []int{v, lv.x[pr.B][g]}, []float64{1, -1})
			out[g], outv[g] = append(out[g], v), append(outv[g], -pr.W)
			in[g], inv[g] = append(in[g], v), append(inv[g], -pr.W)
		}
		if jm.N > 1 {
			for nb := range jm.N {
				v := b.Col(fmt.Sprintf("vn_%d_%d_%d", l, k, nb), 0, 1, 0, false)
				ia, va := []int{v}, []float64{1}
				ib, vb := []int{v}, []float64{1}
				for g := nb * jm.n; g < (nb+1)*jm.n; g++ {
					ia, va = append(ia, prev.x[pr.A][g]), append(va, -1)
					ib, vb = append(ib, lv.x[pr.B][g]), append(vb, -1)
				}
				b.Row(fmt.Sprintf("vna_%d_%d_%d", l, k, nb), -inf, 0, ia, va)
				b.Row(fmt.Sprintf("vnb_%d_%d_%d", l, k, nb), -inf, 0, ib, vb)
				nout[nb], noutv[nb] = append(nout[nb], v), append(noutv[nb], -pr.W)
				nin[nb], ninv[nb] = append(nin[nb], v), append(ninv[nb], -pr.W)
			}
		}
	}
	nvs := jm.tb / jm.nv
	for g := range jm.G {
		idx, val := scaled(out[g], outv[g], nvs)
		b.Row(fmt.Sprintf("chout_%d_%d", l, g), -inf, 0, append(idx, lv.td), append(val, -1))
		idx, val = scaled(in[g], inv[g], nvs)
		b.Row(fmt.Sprintf("chin_%d_%d", l, g), -inf, 0, append(idx, lv.td), append(val, -1))
	}
	if jm.N > 1 {
		nics := jm.tb / jm.nic / float64(jm.n)
		for nb := range jm.N {
			idx, val := scaled(nout[nb], noutv[nb], nics)
			b.Row(fmt.Sprintf("chnout_%d_%d", l, nb), -inf, 0, append(idx, lv.td), append(val, -1))
			idx, val = scaled(nin[nb], ninv[nb], nics)
			b.Row(fmt.Sprintf("chnin_%d_%d", l, nb), -inf, 0, append(idx, lv.td), append(val, -1))
		}
	}
}

func scaled(idx []int, val []float64, f float64) ([]int, []float64) {
	oi := append([]int(nil), idx...)
	ov := make([]float64, len(val))
	for i, v := range val {
		ov[i] = v * f
	}
	return oi, ov
}

func ones(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

// addObjective sets the cost of one layer: Tc + comm (sequential) or
// T + comm/chunks with T ≥ (1+σ)Tc, T ≥ comm (overlapped), where comm is
// the sum of the given phase columns times mult. Latency is an offset.
func (jm *jointModel) addObjective(b *mip.Builder, l int, lv *layerVars, phases []int, mult []float64, phasesLat int) {
	lat := float64(phasesLat) * jm.lat
	if !jm.overlap {
		b.AddCost(lv.tc, 1)
		for i, ph := range phases {
			b.AddCost(ph, mult[i])
		}
		b.AddOffset(lat)
		return
	}
	lv.t = b.Col(fmt.Sprintf("T_%d", l), 0, inf, 1, false)
	b.Row(fmt.Sprintf("ovc_%d", l), -inf, 0, []int{lv.tc, lv.t}, []float64{1 + jm.sigma, -1})
	idx := append([]int{lv.t}, phases...)
	val := []float64{-1}
	for i := range phases {
		val = append(val, mult[i])
		b.AddCost(phases[i], mult[i]/jm.chunks)
	}
	b.Row(fmt.Sprintf("ovm_%d", l), -inf, -lat, idx, val)
	b.AddOffset(lat / jm.chunks)
}

// buildHomeLayer builds the independent ILP of one layer in the home flow.
func (jm *jointModel) buildHomeLayer(l int) (*mip.Builder, layerVars) {
	b := &mip.Builder{}
	lv := jm.addLayer(b, l, true)
	var pairs []pair
	if jm.pairs != nil {
		pairs = jm.pairs[l]
	}
	jm.addHomeComm(b, l, lv, lv.td, pairs)
	// Combine mirrors dispatch, so comm = 2·Td.
	jm.addObjective(b, l, &lv, []int{lv.td}, []float64{2}, 2)
	return b, lv
}

// buildChain builds the coupled ILP over all layers in the chain flow.
func (jm *jointModel) buildChain() (*mip.Builder, []layerVars) {
	b := &mip.Builder{}
	lvs := make([]layerVars, jm.L)
	for l := range jm.L {
		lvs[l] = jm.addLayer(b, l, l == 0)
	}
	for l := range jm.L {
		lv := &lvs[l]
		if l == 0 {
			jm.addHomeComm(b, l, *lv, lv.td, nil)
		} else {
			jm.addChainComm(b, l, lvs[l-1], *lv)
		}
		phases, mult, nlat := []int{lv.td}, []float64{1}, 1
		if l == jm.L-1 {
			lv.tb = b.Col(fmt.Sprintf("Tb_%d", l), 0, inf, 0, false)
			jm.addHomeComm(b, l, *lv, lv.tb, nil)
			phases, mult, nlat = append(phases, lv.tb), append(mult, 1), 2
		}
		jm.addObjective(b, l, lv, phases, mult, nlat)
	}
	return b, lvs
}

// startVector builds a feasible MIP start from an assignment by setting
// every auxiliary column to the value the formulas give.
func (jm *jointModel) startVector(m *mip.Model, assign [][]int, layers []int, lvs []layerVars) []float64 {
	x := make([]float64, len(m.Cost))
	idx := make(map[string]int, len(m.Names))
	for j, n := range m.Names {
		idx[n] = j
	}
	for i, l := range layers {
		for e, g := range assign[l] {
			x[lvs[i].x[e][g]] = 1
		}
	}
	// Products y, yn, v, vn: at their upper envelope.
	for j, n := range m.Names {
		var l, k, g int
		switch {
		case scan(n, "y_%d_%d_%d", &l, &k, &g):
			pr := jm.pairs[l][k]
			x[j] = b2f(assign[l][pr.A] == g && assign[l][pr.B] == g)
		case scan(n, "yn_%d_%d_%d", &l, &k, &g):
			pr := jm.pairs[l][k]
			x[j] = b2f(jm.node(assign[l][pr.A]) == g && jm.node(assign[l][pr.B]) == g)
		case scan(n, "v_%d_%d_%d", &l, &k, &g):
			pr := jm.trans[l][k]
			x[j] = b2f(assign[l-1][pr.A] == g && assign[l][pr.B] == g)
		case scan(n, "vn_%d_%d_%d", &l, &k, &g):
			pr := jm.trans[l][k]
			x[j] = b2f(jm.node(assign[l-1][pr.A]) == g && jm.node(assign[l][pr.B]) == g)
		}
	}
	fillEpigraphs(m, x)
	return x
}

func isEpigraph(n string) bool {
	return len(n) > 1 && n[0] == 'T'
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func scan(s, format string, args ...*int) bool {
	// Cheap prefix test before Sscanf.
	p := format[:len(format)-len("_%d_%d_%d")]
	if len(s) <= len(p) || s[:len(p)] != p || s[len(p)] != '_' {
		return false
	}
	ptrs := make([]any, len(args))
	for i, a := range args {
		ptrs[i] = a
	}
	n, err := fmt.Sscanf(s, format, ptrs...)
	return err == nil && n == len(args)
}

// readAssign extracts assign[l][e] from a solution vector.
func readAssign(sol []float64, lvs []layerVars, layers []int, assign [][]int) {
	for i, l := range layers {
		for e := range lvs[i].x {
			best, bv := 0, -1.0
			for g, j := range lvs[i].x[e] {
				if sol[j] > bv {
					best, bv = g, sol[j]
				}
			}
			assign[l][e] = best
		}
	}
}

func planAssign(plan *placement.Plan) [][]int {
	out := make([][]int, len(plan.Layers))
	for l := range plan.Layers {
		a := plan.Assignment(l)
		out[l] = make([]int, len(a))
		for e, g := range a {
			out[l][e] = int(g)
		}
	}
	return out
}

func assignPlan(gpus int, assign [][]int) *placement.Plan {
	a := make([][]placement.GPU, len(assign))
	for l := range assign {
		a[l] = make([]placement.GPU, len(assign[l]))
		for e, g := range assign[l] {
			a[l][e] = placement.GPU(g)
		}
	}
	return placement.FromAssignment(gpus, a, string(StrategyJoint))
}

// subSolve is one MIP solve with its bookkeeping.
type subSolve struct {
	sol                   *mip.Solution
	cols, ints, rows, nnz int
	err                   error
}

// parallelLayers runs fn(l, limit) for l = 0..L−1 on workers goroutines.
// Each layer's limit is a fair share of the time left before deadline:
// what remains, times the workers, over the layers not yet started (at
// least 50 ms).
func parallelLayers(L, workers int, deadline time.Time, fn func(l int, limit time.Duration)) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	jobs := make(chan int)
	left := L
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l := range jobs {
				mu.Lock()
				limit := time.Until(deadline) * time.Duration(workers) / time.Duration(left)
				left--
				mu.Unlock()
				limit = min(limit, time.Until(deadline))
				fn(l, max(limit, 50*time.Millisecond))
			}
		}()
	}
	for l := range L {
		jobs <- l
	}
	close(jobs)
	wg.Wait()
}

// mipStatus summarises the sub-solves of a strategy.
func mipStatus(allOptimal, timedOut bool) Status {
	switch {
	case timedOut:
		return StatusTimeLimit
	case allOptimal:
		return StatusOptimal
	}
	return StatusFeasible
}

// absorb checks a finished sub-solve and adds its size and status to res;
// it returns the solution.
func (res *Result) absorb(ss subSolve, allOptimal, timedOut *bool) (*mip.Solution, error) {
	if ss.err != nil {
		return nil, ss.err
	}
	if err := mipVerdict(ss.sol); err != nil {
		return nil, err
	}
	res.Cols += ss.cols
	res.IntCols += ss.ints
	res.Rows += ss.rows
	res.Nonzeros += ss.nnz
	*allOptimal = *allOptimal && ss.sol.Status == mip.Optimal
	*timedOut = *timedOut || ss.sol.TimedOut
	return ss.sol, nil
}

func runMIP(ctx context.Context, backend mip.Backend, m *mip.Model, start []float64, opts Options, limit time.Duration) subSolve {
	var ss subSolve
	ss.cols, ss.ints, ss.rows, ss.nnz = m.Size()
	gap := opts.RelGap
	if gap == 0 {
		gap = 1e-12 // exact: the backend's 0 means its own default
	}
	mo := mip.Options{TimeLimitSec: limit.Seconds(), RelGap: gap, Threads: opts.Threads, Seed: opts.Seed, Start: start}
	if start != nil {
		if err := m.Check(start, 1e-6); err != nil {
			ss.err = fmt.Errorf("solver: internal error: warm start infeasible: %w", err)
			return ss
		}
	}
	ss.sol, ss.err = backend.Solve(ctx, m, mo)
	if ss.err != nil && errors.Is(ss.err, context.DeadlineExceeded) && ss.sol != nil && ss.sol.X != nil {
		// The watchdog stopped a solve that had an incumbent: a result
		// with a gap, not an error.
		ss.err = nil
		ss.sol.TimedOut = true
		if ss.sol.Status == mip.Optimal {
			ss.sol.Status = mip.Feasible
		}
	}
	if ss.err == nil && ss.sol.X != nil {
		if err := m.Check(ss.sol.X, 1e-5); err != nil {
			ss.err = fmt.Errorf("solver: backend returned an infeasible solution: %w", err)
		}
	}
	return ss
}

func solveJoint(ctx context.Context, p Problem, backend mip.Backend, opts Options, start time.Time) (*Result, error) {
	jm, err := newJointModel(p, opts.MaxPairs)
	if err != nil {
		return nil, err
	}
	baseSt, basePlan, baseObj, err := bestBaseline(p)
	if err != nil {
		return nil, err
	}
	report := func(stage string, obj, bound float64) {
		if opts.Progress != nil {
			opts.Progress(Progress{Stage: stage, Objective: obj, Bound: bound, Elapsed: time.Since(start)})
		}
	}
	report("baseline "+string(baseSt), baseObj, math.NaN())
	warm := jm.canonical(planAssign(basePlan))
	assign := planAssign(basePlan)
	// The ILP gets 80 % of the time; polishing the rest.
	ilpBudget := opts.TimeLimit * 8 / 10
	if jm.chain {
		ilpBudget = opts.TimeLimit / 2 // then layer-by-layer descent to 80 %
	}
	// Home flow on one node with per-token patterns: the layer cost depends
	// only on the two busiest GPUs' counts, which annealing optimises
	// directly and column generation bounds (homepolish.go, coverbound.go),
	// so the ILP gets 2 %, polishing to 3 %, annealing to 25 % and the
	// bound the rest (time its converged layers leave goes to annealing).
	_, exactHome := homeCost(p)
	var cls []*coverLayer // token bitsets per layer, built once for both
	if exactHome && !jm.chain && !opts.NoPolish {
		cls, _ = coverLayers(p)
	}
	exactHome = cls != nil
	polishEnd := start.Add(opts.TimeLimit)
	if exactHome {
		ilpBudget = opts.TimeLimit / 50
		polishEnd = start.Add(opts.TimeLimit * 3 / 100)
	}
	if opts.NoPolish {
		ilpBudget = opts.TimeLimit
	}
	res := &Result{Baseline: baseSt, BaselineObjective: baseObj}
	var bound float64
	allOptimal, timedOut := true, false
	if jm.chain {
		b, lvs := jm.buildChain()
		m := b.Model()
		layers := make([]int, jm.L)
		for l := range layers {
			layers[l] = l
		}
		sol, err := res.absorb(runMIP(ctx, backend, m, jm.startVector(m, warm, layers, lvs), opts, ilpBudget), &allOptimal, &timedOut)
		if err != nil {
			return nil, err
		}
		readAssign(sol.X, lvs, layers, assign)
		bound = sol.Bound
	} else {
		results := make([]subSolve, jm.L)
		lvsAll := make([]layerVars, jm.L)
		parallelLayers(jm.L, opts.Parallel, time.Now().Add(ilpBudget), func(l int, limit time.Duration) {
			b, lv := jm.buildHomeLayer(l)
			m := b.Model()
			lvsAll[l] = lv
			results[l] = runMIP(ctx, backend, m, jm.startVector(m, warm, []int{l}, []layerVars{lv}), opts, limit)
		})
		for l, ss := range results {
			sol, err := res.absorb(ss, &allOptimal, &timedOut)
			if err != nil {
				return nil, err
			}
			readAssign(sol.X, []layerVars{lvsAll[l]}, []int{l}, assign)
			// A layer stopped before HiGHS had a dual bound (−Inf) still
			// has the trivial one: its model time is never negative.
			bound += math.Max(sol.Bound, 0)
		}
	}
	modelObj := jm.objective(assign) / 1e6
	bound /= 1e6
	report("ilp", modelObj, bound)
	// Never trust the solver: the model objective is recomputed in Go; the
	// warm start's model objective bounds it from above.
	if warmObj := jm.objective(warm) / 1e6; modelObj > warmObj*(1+1e-9)+1e-12 {
		return nil, fmt.Errorf("solver: internal error: ILP plan (%.9g s) is worse than its warm start (%.9g s) under the ILP's own model", modelObj, warmObj)
	}
	res.ModelObjective = modelObj
	res.Bound = math.Min(bound, modelObj)
	res.Gap = 0
	if modelObj > 0 {
		res.Gap = (modelObj - res.Bound) / modelObj
	}
	res.Status = mipStatus(allOptimal, timedOut)
	if jm.chain && !opts.NoPolish {
		// The monolithic ILP keeps only the heaviest transition pairs; with
		// neighbours fixed every pair is linear, so descend layer by layer.
		better, err := chainDescent(ctx, p, jm, backend, opts, assign, start.Add(opts.TimeLimit*8/10))
		if err != nil {
			return nil, err
		}
		if mo := jm.objective(better) / 1e6; mo != res.ModelObjective {
			res.ModelObjective = mo
			if mo > 0 {
				res.Gap = math.Max(0, (mo-res.Bound)/mo)
			}
		}
		assign = better
		report("descent", math.NaN(), math.NaN())
	}
	plan := assignPlan(jm.G, assign)
	// The ILP's model is a proxy for the exact cost model where tokens
	// share GPUs beyond pairs; a local search on the exact model, started
	// from the ILP plan and from the baseline, keeps the best.
	best, bestObj := plan, math.Inf(1)
	// keep scores cand on the exact cost model and keeps the better plan.
	keep := func(cand *placement.Plan) error {
		_, obj, err := Score(p, cand)
		if err != nil {
			return err
		}
		if obj < bestObj-1e-15 {
			best, bestObj = cand, obj
		}
		return nil
	}
	for _, c := range []*placement.Plan{plan, basePlan} {
		cand := c
		if !opts.NoPolish {
			cand, err = polish(ctx, p, c, polishEnd, opts.Parallel)
			if err != nil {
				return nil, err
			}
		}
		if err := keep(cand); err != nil {
			return nil, err
		}
	}
	report("polish", bestObj, math.NaN())
	if exactHome {
		annealed, _ := homeAnneal(ctx, p, cls, best, 100000*p.Stats.Experts, 2, opts.Parallel, start.Add(opts.TimeLimit*25/100), uint64(opts.Seed))
		if err := keep(annealed); err != nil {
			return nil, err
		}
		report("anneal", bestObj, math.NaN())
		res.corners, err = homeBottleneck(ctx, p, cls, backend, best, start.Add(opts.TimeLimit), opts.Parallel, uint64(opts.Seed))
		if err != nil {
			return nil, err
		}
		// Layers whose bound converged early leave time: anneal again
		// from the best plan.
		if left := time.Until(start.Add(opts.TimeLimit)); left > opts.TimeLimit/20 && ctx.Err() == nil {
			again, _ := homeAnneal(ctx, p, cls, best, 100000*p.Stats.Experts, 1, opts.Parallel, start.Add(opts.TimeLimit), uint64(opts.Seed)+1)
			if err := keep(again); err != nil {
				return nil, err
			}
			report("anneal", bestObj, math.NaN())
		}
	}
	if best != plan {
		// The returned plan differs from the ILP's; report the ILP model
		// objective of the returned plan, and the bound stays valid.
		a := planAssign(best)
		res.ModelObjective = jm.objective(a) / 1e6
		if res.ModelObjective > 0 {
			res.Gap = math.Max(0, (res.ModelObjective-res.Bound)/res.ModelObjective)
		}
	}
	res.Plan = best
	return res, nil
}

func mipVerdict(sol *mip.Solution) error {
	switch sol.Status {
	case mip.Infeasible:
		return &InfeasibleError{Constraint: "joint ILP", Detail: "no assignment meets the slot and capacity constraints; check experts per GPU"}
	case mip.NoSolution:
		return fmt.Errorf("solver: the MIP stopped at its time limit without a feasible solution; raise the time limit")
	case mip.Error:
		return fmt.Errorf("solver: the MIP backend failed")
	}
	if sol.X == nil {
		return fmt.Errorf("solver: the MIP backend reported %s without a solution", sol.Status)
	}
	return nil
}

// JointMIPs builds the joint strategy's ILP(s) for p without solving them:
// one per layer in the home flow, one for all layers in the chain flow. It
// is meant for debugging (write them with MIP.WriteLP).
func JointMIPs(p Problem, opts Options) ([]*mip.Model, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	jm, err := newJointModel(p, opts.MaxPairs)
	if err != nil {
		return nil, err
	}
	if jm.chain {
		b, _ := jm.buildChain()
		return []*mip.Model{b.Model()}, nil
	}
	var out []*mip.Model
	for l := range jm.L {
		b, _ := jm.buildHomeLayer(l)
		out = append(out, b.Model())
	}
	return out, nil
}

// JointModelObjective recomputes, in seconds, the joint ILP's model
// objective of a single-copy plan (the quantity Result.ModelObjective and
// Result.Bound refer to), with opts.MaxPairs as in the solve.
func JointModelObjective(p Problem, plan *placement.Plan, opts Options) (float64, error) {
	if err := p.check(); err != nil {
		return 0, err
	}
	jm, err := newJointModel(p, opts.MaxPairs)
	if err != nil {
		return 0, err
	}
	if len(plan.Layers) != jm.L || plan.GPUs != jm.G {
		return 0, fmt.Errorf("solver: plan has %d layers on %d GPUs, problem %d on %d", len(plan.Layers), plan.GPUs, jm.L, jm.G)
	}
	assign := planAssign(plan)
	for l, a := range assign {
		for e, g := range a {
			if g < 0 {
				return 0, fmt.Errorf("solver: layer %d: expert %d does not have exactly one copy", l, e)
			}
		}
	}
	return jm.objective(assign) / 1e6, nil
}
