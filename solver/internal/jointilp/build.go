package jointilp

import (
	"fmt"

	"github.com/moetuner/moetuner/mip"
)

// form is a MIP under construction with what a start vector needs: its
// product columns, what each multiplies, and its epigraph columns.
type form struct {
	mip.Builder
	prods []product
	epi   []int
}

// epiCol adds an epigraph column (a layer's time terms, set to the least
// value their rows allow in a start vector).
func (f *form) epiCol(name string, lo, hi, cost float64, integer bool) int {
	j := f.Col(name, lo, hi, cost, integer)
	f.epi = append(f.epi, j)
	return j
}

type prodKind int

const (
	gpuPair   prodKind = iota // y: co-activated pair k of layer l both on GPU at
	nodePair                  // yn: both on node at
	gpuTrans                  // v: transition k from layer l−1 to l stays on GPU at
	nodeTrans                 // vn: stays on node at
)

// product is one linearised product column.
type product struct {
	col      int
	kind     prodKind
	l, k, at int
}

// LayerVars indexes the columns of one layer's assignment.
type LayerVars struct {
	x  [][]int // [e][g]
	tc int
	td int // dispatch (chain: transition into this layer)
	tb int // chain, last layer: combine; -1 otherwise
	t  int // overlap epigraph; -1 when sequential
}

// addLayer adds x, Tc, Td (and T) and the assignment, capacity and compute
// rows of layer l; the caller adds the communication rows.
func (jm *Model) addLayer(b *form, l int, breakSymmetry bool) LayerVars {
	s := jm.stats
	lv := LayerVars{tb: -1, t: -1}
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
	lv.tc = b.epiCol(fmt.Sprintf("Tc_%d", l), 0, mip.Inf, 0, false)
	lv.td = b.epiCol(fmt.Sprintf("Td_%d", l), 0, mip.Inf, 0, false)
	for e := range jm.E {
		b.Row(fmt.Sprintf("assign_%d_%d", l, e), 1, 1, lv.x[e], mip.Ones(jm.G))
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
		b.Row(fmt.Sprintf("compute_%d_%d", l, g), -mip.Inf, -jm.beta*sl/jm.speed[g], idx, val)
	}
	return lv
}

// addHomeComm adds rows making td ≥ the home-flow dispatch bottleneck of
// layer l, with pair savings when pairs is non-nil.
func (jm *Model) addHomeComm(b *form, l int, lv LayerVars, td int, pairs []pair) {
	s := jm.stats
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
			b.prods = append(b.prods, product{col: y, kind: gpuPair, l: l, k: k, at: g})
			b.Row(name("ya", k*jm.G+g), -mip.Inf, 0, []int{y, lv.x[pr.A][g]}, []float64{1, -1})
			b.Row(name("yb", k*jm.G+g), -mip.Inf, 0, []int{y, lv.x[pr.B][g]}, []float64{1, -1})
			ng[g] = append(ng[g], y)
			ngv[g] = append(ngv[g], -pr.W)
			star[[2]int{pr.A, g}] = append(star[[2]int{pr.A, g}], y)
			star[[2]int{pr.B, g}] = append(star[[2]int{pr.B, g}], y)
		}
		if jm.N > 1 {
			for nb := range jm.N {
				y := b.Col(fmt.Sprintf("yn_%d_%d_%d", l, k, nb), 0, 1, 0, false)
				b.prods = append(b.prods, product{col: y, kind: nodePair, l: l, k: k, at: nb})
				ia, va := []int{y}, []float64{1}
				ib, vb := []int{y}, []float64{1}
				for g := nb * jm.perNode; g < (nb+1)*jm.perNode; g++ {
					ia, va = append(ia, lv.x[pr.A][g]), append(va, -1)
					ib, vb = append(ib, lv.x[pr.B][g]), append(vb, -1)
				}
				b.Row(name("yna", k*jm.N+nb), -mip.Inf, 0, ia, va)
				b.Row(name("ynb", k*jm.N+nb), -mip.Inf, 0, ib, vb)
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
			val := append(mip.Ones(len(ys)), -float64(jm.slots[g]-1))
			b.Row(name("star", a*jm.G+g), -mip.Inf, 0, idx, val)
		}
	}
	fn := float64(jm.perNode)
	nvs := jm.tb / jm.nv
	for g := range jm.G {
		// In: (n−1)/n · N_g.
		idx, val := scaled(ng[g], ngv[g], (fn-1)/fn*nvs)
		b.Row(name("nvin", g), -mip.Inf, 0, append(idx, td), append(val, -1))
		// Out: (Σ_{g'∈node, g'≠g} N_g')/n.
		idx, val = nil, nil
		nb := jm.node(g)
		for g2 := nb * jm.perNode; g2 < (nb+1)*jm.perNode; g2++ {
			if g2 == g {
				continue
			}
			i2, v2 := scaled(ng[g2], ngv[g2], nvs/fn)
			idx, val = append(idx, i2...), append(val, v2...)
		}
		if len(idx) > 0 {
			b.Row(name("nvout", g), -mip.Inf, 0, append(idx, td), append(val, -1))
		}
	}
	if jm.N > 1 {
		nics := jm.tb / jm.nic
		for nb := range jm.N {
			idx, val := scaled(mb[nb], mbv[nb], float64(jm.N-1)/float64(jm.G)*nics)
			b.Row(name("nicin", nb), -mip.Inf, 0, append(idx, td), append(val, -1))
			idx, val = nil, nil
			for o := range jm.N {
				if o != nb {
					i2, v2 := scaled(mb[o], mbv[o], nics/float64(jm.G))
					idx, val = append(idx, i2...), append(val, v2...)
				}
			}
			b.Row(name("nicout", nb), -mip.Inf, 0, append(idx, td), append(val, -1))
		}
	}
}

// addChainComm adds rows making lv.td ≥ the transition bottleneck from
// layer l−1 (prev) into layer l (lv).
func (jm *Model) addChainComm(b *form, l int, prev, lv LayerVars) {
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
			b.prods = append(b.prods, product{col: v, kind: gpuTrans, l: l, k: k, at: g})
			b.Row(fmt.Sprintf("va_%d_%d_%d", l, k, g), -mip.Inf, 0, []int{v, prev.x[pr.A][g]}, []float64{1, -1})
			b.Row(fmt.Sprintf("vb_%d_%d_%d", l, k, g), -mip.Inf, 0, []int{v, lv.x[pr.B][g]}, []float64{1, -1})
			out[g], outv[g] = append(out[g], v), append(outv[g], -pr.W)
			in[g], inv[g] = append(in[g], v), append(inv[g], -pr.W)
		}
		if jm.N > 1 {
			for nb := range jm.N {
				v := b.Col(fmt.Sprintf("vn_%d_%d_%d", l, k, nb), 0, 1, 0, false)
				b.prods = append(b.prods, product{col: v, kind: nodeTrans, l: l, k: k, at: nb})
				ia, va := []int{v}, []float64{1}
				ib, vb := []int{v}, []float64{1}
				for g := nb * jm.perNode; g < (nb+1)*jm.perNode; g++ {
					ia, va = append(ia, prev.x[pr.A][g]), append(va, -1)
					ib, vb = append(ib, lv.x[pr.B][g]), append(vb, -1)
				}
				b.Row(fmt.Sprintf("vna_%d_%d_%d", l, k, nb), -mip.Inf, 0, ia, va)
				b.Row(fmt.Sprintf("vnb_%d_%d_%d", l, k, nb), -mip.Inf, 0, ib, vb)
				nout[nb], noutv[nb] = append(nout[nb], v), append(noutv[nb], -pr.W)
				nin[nb], ninv[nb] = append(nin[nb], v), append(ninv[nb], -pr.W)
			}
		}
	}
	nvs := jm.tb / jm.nv
	for g := range jm.G {
		idx, val := scaled(out[g], outv[g], nvs)
		b.Row(fmt.Sprintf("chout_%d_%d", l, g), -mip.Inf, 0, append(idx, lv.td), append(val, -1))
		idx, val = scaled(in[g], inv[g], nvs)
		b.Row(fmt.Sprintf("chin_%d_%d", l, g), -mip.Inf, 0, append(idx, lv.td), append(val, -1))
	}
	if jm.N > 1 {
		nics := jm.tb / jm.nic / float64(jm.perNode)
		for nb := range jm.N {
			idx, val := scaled(nout[nb], noutv[nb], nics)
			b.Row(fmt.Sprintf("chnout_%d_%d", l, nb), -mip.Inf, 0, append(idx, lv.td), append(val, -1))
			idx, val = scaled(nin[nb], ninv[nb], nics)
			b.Row(fmt.Sprintf("chnin_%d_%d", l, nb), -mip.Inf, 0, append(idx, lv.td), append(val, -1))
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

// addObjective sets the cost of one layer: Tc + comm (sequential) or
// T + comm/chunks with T ≥ (1+σ)Tc, T ≥ comm (overlapped), where comm is
// the sum of the given phase columns times mult. Latency is an offset.
func (jm *Model) addObjective(b *form, l int, lv *LayerVars, phases []int, mult []float64, phasesLat int) {
	lat := float64(phasesLat) * jm.lat
	if !jm.overlap {
		b.AddCost(lv.tc, 1)
		for i, ph := range phases {
			b.AddCost(ph, mult[i])
		}
		b.AddOffset(lat)
		return
	}
	lv.t = b.epiCol(fmt.Sprintf("T_%d", l), 0, mip.Inf, 1, false)
	b.Row(fmt.Sprintf("ovc_%d", l), -mip.Inf, 0, []int{lv.tc, lv.t}, []float64{1 + jm.sigma, -1})
	idx := append([]int{lv.t}, phases...)
	val := []float64{-1}
	for i := range phases {
		val = append(val, mult[i])
		b.AddCost(phases[i], mult[i]/jm.chunks)
	}
	b.Row(fmt.Sprintf("ovm_%d", l), -mip.Inf, -lat, idx, val)
	b.AddOffset(lat / jm.chunks)
}

// buildHomeLayer builds the independent ILP of one layer in the home flow.
func (jm *Model) buildHomeLayer(l int) (*form, LayerVars) {
	b := &form{}
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
func (jm *Model) buildChain() (*form, []LayerVars) {
	b := &form{}
	lvs := make([]LayerVars, jm.L)
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
			lv.tb = b.epiCol(fmt.Sprintf("Tb_%d", l), 0, mip.Inf, 0, false)
			jm.addHomeComm(b, l, *lv, lv.tb, nil)
			phases, mult, nlat = append(phases, lv.tb), append(mult, 1), 2
		}
		jm.addObjective(b, l, lv, phases, mult, nlat)
	}
	return b, lvs
}

// Start builds a feasible MIP start for f from an assignment of layers
// (lvs their columns) by setting every auxiliary column to the value the
// formulas give: products at their upper envelope, epigraphs at the least
// value their rows allow.
func (jm *Model) Start(f *form, assign [][]int, layers []int, lvs []LayerVars) []float64 {
	m := f.Model()
	x := make([]float64, len(m.Cost))
	for i, l := range layers {
		for e, g := range assign[l] {
			x[lvs[i].x[e][g]] = 1
		}
	}
	for _, pr := range f.prods {
		var on bool
		switch pr.kind {
		case gpuPair:
			p := jm.pairs[pr.l][pr.k]
			on = assign[pr.l][p.A] == pr.at && assign[pr.l][p.B] == pr.at
		case nodePair:
			p := jm.pairs[pr.l][pr.k]
			on = jm.node(assign[pr.l][p.A]) == pr.at && jm.node(assign[pr.l][p.B]) == pr.at
		case gpuTrans:
			p := jm.trans[pr.l][pr.k]
			on = assign[pr.l-1][p.A] == pr.at && assign[pr.l][p.B] == pr.at
		case nodeTrans:
			p := jm.trans[pr.l][pr.k]
			on = jm.node(assign[pr.l-1][p.A]) == pr.at && jm.node(assign[pr.l][p.B]) == pr.at
		}
		x[pr.col] = b2f(on)
	}
	fillEpigraphs(f, x)
	return x
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
