package affinity

import (
	"slices"
)

// moveKind names the moves of the search.
type moveKind uint8

const (
	// moveSwap exchanges the experts of slot ia on GPU a and slot ib on
	// GPU b.
	moveSwap moveKind = iota
	// moveRetarget makes slot ia on GPU a hold expert f instead of its
	// expert, which must have another copy: copies re-apportioned.
	moveRetarget
)

// move is one change to a layer's slots.
type move struct {
	kind  moveKind
	a, ia int
	b, ib int
	f     int
}

// change is one expert's copies before (old, the state's) and after (nw)
// a move, and per source GPU the nodes whose fraction differs.
type change struct {
	e     int
	old   *copyset
	nw    copyset
	dOff  []int32 // G+1
	dNode []int16
	// With shape.nv, per source GPU h the GPUs whose copy serves a
	// different fraction of h's tokens: dGPU[gOff[h]:gOff[h+1]].
	gOff []int32 // G+1
	dGPU []gpuFrac
}

// gpuFrac is a GPU whose copy's fraction of one source's tokens goes from
// qo to qn.
type gpuFrac struct {
	g      int16
	qo, qn float64
}

// trial is the scratch of one tried move.
type trial struct {
	ch    [2]change
	nch   int
	stamp []uint32
	gen   uint32
	fac   [3][]factor
	dOut  []float64
	dIn   []float64
	dTok  []float64
	o2    []float64
	i2    []float64
	t2    []float64
	dR    float64 // change of the sample's remote-node copies
	valid bool
	mv    move
	// With shape.nv: per-GPU factors and the NVLink ports' changes.
	gfac       [3][]factor
	dNvO, dNvI []float64
	nvo2, nvi2 []float64
}

func (tr *trial) init(sh *shape) {
	tr.stamp = make([]uint32, sh.T)
	for i := range tr.ch {
		tr.ch[i].dOff = make([]int32, sh.G+1)
	}
	tr.dOut = make([]float64, sh.G)
	tr.dIn = make([]float64, sh.G)
	tr.dTok = make([]float64, sh.G)
	tr.o2 = make([]float64, sh.G)
	tr.i2 = make([]float64, sh.G)
	tr.t2 = make([]float64, sh.G)
	if sh.nv {
		for i := range tr.ch {
			tr.ch[i].gOff = make([]int32, sh.G+1)
		}
		tr.dNvO = make([]float64, sh.G)
		tr.dNvI = make([]float64, sh.G)
		tr.nvo2 = make([]float64, sh.G)
		tr.nvi2 = make([]float64, sh.G)
	}
}

// holds reports whether GPU g holds a copy of e.
func (s *state) holds(g, e int) bool {
	return slices.Contains(s.cs[e].gpus, int32(g))
}

// valid reports whether mv is a legal move in s.
func (s *state) valid(mv move) bool {
	if mv.a < 0 || mv.a >= len(s.held) || mv.ia < 0 || mv.ia >= len(s.held[mv.a]) {
		return false
	}
	e := int(s.held[mv.a][mv.ia])
	switch mv.kind {
	case moveSwap:
		if mv.b < 0 || mv.b >= len(s.held) || mv.ib < 0 || mv.ib >= len(s.held[mv.b]) || mv.a == mv.b {
			return false
		}
		f := int(s.held[mv.b][mv.ib])
		if e == f || s.holds(mv.b, e) || s.holds(mv.a, f) {
			return false
		}
	case moveRetarget:
		if mv.f < 0 || mv.f >= len(s.cs) || mv.f == e || len(s.cs[e].gpus) <= 1 || s.holds(mv.a, mv.f) {
			return false
		}
	default:
		return false
	}
	b := s.ly.bud
	return b == nil || b.Max <= 0 || s.changed+s.dChanged(mv) <= b.Max
}

// dChanged is how many more slots differ from the running plan after mv
// (which must be valid; 0 without a budget).
func (s *state) dChanged(mv move) int {
	b := s.ly.bud
	if b == nil {
		return 0
	}
	e := int(s.held[mv.a][mv.ia])
	if mv.kind == moveRetarget {
		return b.Off(mv.a, mv.f) - b.Off(mv.a, e)
	}
	return b.SwapChanged(mv.a, e, mv.b, int(s.held[mv.b][mv.ib]))
}

// setChange fills change c for expert e whose copy on GPU from moves to GPU
// to (from < 0: a copy is added on to; to < 0: the copy on from is
// removed).
func (s *state) setChange(c *change, e, from, to int) {
	c.e = e
	c.old = &s.cs[e]
	gs := c.nw.gpus[:0]
	for _, g := range c.old.gpus {
		if int(g) != from {
			gs = append(gs, g)
		}
	}
	if to >= 0 {
		gs = append(gs, int32(to))
	}
	slices.Sort(gs)
	c.nw.gpus = gs
	s.fill(e, &c.nw)
	sh := s.ly.sh
	G, N := sh.G, sh.N
	c.dNode = c.dNode[:0]
	for h := 0; h < G; h++ {
		c.dOff[h] = int32(len(c.dNode))
		o, n := c.old.nf[h*N:(h+1)*N], c.nw.nf[h*N:(h+1)*N]
		for b := range o {
			if o[b] != n[b] {
				c.dNode = append(c.dNode, int16(b))
			}
		}
	}
	c.dOff[G] = int32(len(c.dNode))
	if sh.nv {
		s.setGPUChange(c)
	}
}

// setGPUChange fills c's per-GPU fraction changes for every source.
func (s *state) setGPUChange(c *change) {
	G := s.ly.sh.G
	og, ng := c.old.gpus, c.nw.gpus
	no, nn := len(og), len(ng)
	c.dGPU = c.dGPU[:0]
	for h := 0; h < G; h++ {
		c.gOff[h] = int32(len(c.dGPU))
		// Both lists are sorted: walk them together.
		i, j := 0, 0
		for i < no || j < nn {
			var g int32
			qo, qn := 0.0, 0.0
			switch {
			case j == nn || i < no && og[i] < ng[j]:
				g, qo = og[i], c.old.gf[h*no+i]
				i++
			case i == no || ng[j] < og[i]:
				g, qn = ng[j], c.nw.gf[h*nn+j]
				j++
			default:
				g, qo, qn = og[i], c.old.gf[h*no+i], c.nw.gf[h*nn+j]
				i++
				j++
			}
			if qo != qn {
				c.dGPU = append(c.dGPU, gpuFrac{g: int16(g), qo: qo, qn: qn})
			}
		}
	}
	c.gOff[G] = int32(len(c.dGPU))
}

// try scores mv (which must be valid) and returns the change of the
// surrogate cost at lv; the trial is kept for apply.
func (s *state) try(mv move, lv level) float64 {
	tr := &s.tr
	e := int(s.held[mv.a][mv.ia])
	switch mv.kind {
	case moveSwap:
		f := int(s.held[mv.b][mv.ib])
		s.setChange(&tr.ch[0], e, mv.a, mv.b)
		s.setChange(&tr.ch[1], f, mv.b, mv.a)
	case moveRetarget:
		s.setChange(&tr.ch[0], e, mv.a, -1)
		s.setChange(&tr.ch[1], mv.f, -1, mv.a)
	}
	tr.nch = 2
	tr.mv, tr.valid = mv, true
	s.tokenDeltas(false)
	clear(tr.dTok)
	for ci := 0; ci < tr.nch; ci++ {
		c := &tr.ch[ci]
		for i, g := range c.old.gpus {
			tr.dTok[g] -= c.old.cl[i]
		}
		for i, g := range c.nw.gpus {
			tr.dTok[g] += c.nw.cl[i]
		}
	}
	for g := range tr.t2 {
		tr.t2[g] = s.tok[g] + tr.dTok[g]
		tr.o2[g] = s.out[g] + tr.dOut[g]
		tr.i2[g] = s.in[g] + tr.dIn[g]
	}
	if s.ly.sh.nv {
		for g := range tr.nvo2 {
			tr.nvo2[g] = s.nvOut[g] + tr.dNvO[g]
			tr.nvi2[g] = s.nvIn[g] + tr.dNvI[g]
		}
	}
	d := s.cost(tr.t2, tr.o2, tr.i2, tr.nvo2, tr.nvi2, lv) - s.cost(s.tok, s.out, s.in, s.nvOut, s.nvIn, lv)
	if b := s.ly.bud; b != nil {
		d += b.SlotSec * float64(s.dChanged(mv))
	}
	return d
}

// factor is what one move does to one token's counters at node b: z
// gains dz certain experts and pr is multiplied by mul.
type factor struct {
	b   int16
	dz  int8
	mul float64
}

// factors appends to dst, for source h, the factors of the changes in cs
// (applied together) at every node where one of them differs.
func factors(dst []factor, h, N int, cs ...*change) []factor {
	n0 := len(dst)
	for _, c := range cs {
		for _, b16 := range c.dNode[c.dOff[h]:c.dOff[h+1]] {
			b := int(b16)
			qo, qn := c.old.nf[h*N+b], c.nw.nf[h*N+b]
			i := n0
			for ; i < len(dst) && int(dst[i].b) != b; i++ {
			}
			if i == len(dst) {
				dst = append(dst, factor{b: b16, mul: 1})
			}
			f := &dst[i]
			switch {
			case qo == 1:
				f.dz--
			case qo > 0:
				f.mul /= 1 - qo
			}
			switch {
			case qn == 1:
				f.dz++
			case qn > 0:
				f.mul *= 1 - qn
			}
		}
	}
	return dst
}

// gpuFactors is factors at GPU level (with shape.nv): for source h, the
// factors of the changes in cs at every GPU where one of them differs.
func gpuFactors(dst []factor, h int, cs ...*change) []factor {
	n0 := len(dst)
	for _, c := range cs {
		for _, gf := range c.dGPU[c.gOff[h]:c.gOff[h+1]] {
			i := n0
			for ; i < len(dst) && dst[i].b != gf.g; i++ {
			}
			if i == len(dst) {
				dst = append(dst, factor{b: gf.g, mul: 1})
			}
			f := &dst[i]
			switch {
			case gf.qo == 1:
				f.dz--
			case gf.qo > 0:
				f.mul /= 1 - gf.qo
			}
			switch {
			case gf.qn == 1:
				f.dz++
			case gf.qn > 0:
				f.mul *= 1 - gf.qn
			}
		}
	}
	return dst
}

// tokenDeltas computes, for every sampled token whose reach the trial's
// changes alter, the change of the NIC ports and of the remote-node
// copies; with commit it also updates the tokens' counters.
func (s *state) tokenDeltas(commit bool) {
	tr := &s.tr
	sh := s.ly.sh
	N, G := sh.N, sh.G
	tr.gen += 2
	if tr.gen < 2 {
		clear(tr.stamp)
		tr.gen = 2
	}
	both, done := tr.gen, tr.gen+1
	clear(tr.dOut)
	clear(tr.dIn)
	nv := sh.nv
	if nv {
		clear(tr.dNvO)
		clear(tr.dNvI)
	}
	tr.dR = 0
	c0 := &tr.ch[0]
	var c1 *change
	if tr.nch == 2 {
		c1 = &tr.ch[1]
	}
	diff := func(c *change, h int) bool {
		return c != nil && (c.dOff[h+1] > c.dOff[h] || nv && c.gOff[h+1] > c.gOff[h])
	}
	visit := func(t, h int, fs, gs []factor) { s.visitToken(t, h, fs, gs, commit) }
	var f0, f1, f01, g0, g1, g01 []factor
	for h := 0; h < G; h++ {
		d0, d1 := diff(c0, h), diff(c1, h)
		if !d0 && !d1 {
			continue
		}
		switch {
		case d0 && !d1:
			// A token using both experts sees only c0's change here.
			f0 = factors(tr.fac[0][:0], h, N, c0)
			tr.fac[0] = f0
			if nv {
				g0 = gpuFactors(tr.gfac[0][:0], h, c0)
				tr.gfac[0] = g0
			}
			for _, t := range s.ly.tokensFrom(c0.e, h) {
				visit(int(t), h, f0, g0)
			}
		case d1 && !d0:
			f1 = factors(tr.fac[1][:0], h, N, c1)
			tr.fac[1] = f1
			if nv {
				g1 = gpuFactors(tr.gfac[1][:0], h, c1)
				tr.gfac[1] = g1
			}
			for _, t := range s.ly.tokensFrom(c1.e, h) {
				visit(int(t), h, f1, g1)
			}
		default:
			f0 = factors(tr.fac[0][:0], h, N, c0)
			f1 = factors(tr.fac[1][:0], h, N, c1)
			f01 = factors(tr.fac[2][:0], h, N, c0, c1)
			tr.fac[0], tr.fac[1], tr.fac[2] = f0, f1, f01
			if nv {
				g0 = gpuFactors(tr.gfac[0][:0], h, c0)
				g1 = gpuFactors(tr.gfac[1][:0], h, c1)
				g01 = gpuFactors(tr.gfac[2][:0], h, c0, c1)
				tr.gfac[0], tr.gfac[1], tr.gfac[2] = g0, g1, g01
			}
			for _, t := range s.ly.tokensFrom(c1.e, h) {
				tr.stamp[t] = both
			}
			for _, t32 := range s.ly.tokensFrom(c0.e, h) {
				t := int(t32)
				if tr.stamp[t] == both {
					tr.stamp[t] = done
					visit(t, h, f01, g01)
					continue
				}
				visit(t, h, f0, g0)
			}
			for _, t32 := range s.ly.tokensFrom(c1.e, h) {
				if t := int(t32); tr.stamp[t] != done {
					visit(t, h, f1, g1)
				}
			}
		}
	}
}

// visitToken applies the factors fs (nodes) and gs (GPUs) of the trial's
// changes to token t from source h (tokenDeltas); with commit it also
// updates the token's counters.
func (s *state) visitToken(t, h int, fs, gs []factor, commit bool) {
	tr := &s.tr
	sh := s.ly.sh
	N, P, G := sh.N, sh.P, sh.G
	home, port := h/P, h%P
	w := sh.w[t]
	dr := 0.0
	for _, f := range fs {
		b := int(f.b)
		k := t*N + b
		oz, op := s.z[k], s.pr[k]
		nz, np := uint8(int(oz)+int(f.dz)), op*f.mul
		if commit {
			s.z[k], s.pr[k] = nz, np
		}
		if b == home {
			continue
		}
		du := used(nz, np) - used(oz, op)
		dr += du
		tr.dIn[b*P+port] += w * du
	}
	tr.dOut[h] += w * dr
	tr.dR += w * dr
	for _, f := range gs {
		g := int(f.b)
		k := t*G + g
		oz, op := s.zg[k], s.pg[k]
		nz, np := uint8(int(oz)+int(f.dz)), op*f.mul
		if commit {
			s.zg[k], s.pg[k] = nz, np
		}
		if x := g/P*P + port; x != g {
			du := w * (used(nz, np) - used(oz, op))
			tr.dNvO[x] += du
			tr.dNvI[g] += du
		}
	}
}

// apply makes the last tried move (which must be mv) part of the state.
func (s *state) apply(mv move) {
	tr := &s.tr
	if !tr.valid || tr.mv != mv {
		s.try(mv, levelGPU)
	}
	s.changed += s.dChanged(mv)
	s.tokenDeltas(true)
	for g := range s.tok {
		s.tok[g] += tr.dTok[g]
		s.out[g] += tr.dOut[g]
		s.in[g] += tr.dIn[g]
	}
	for g := range s.nvOut {
		s.nvOut[g] += tr.dNvO[g]
		s.nvIn[g] += tr.dNvI[g]
	}
	for ci := 0; ci < tr.nch; ci++ {
		c := &tr.ch[ci]
		s.cs[c.e], c.nw = c.nw, s.cs[c.e]
		c.old = nil
	}
	e := s.held[mv.a][mv.ia]
	switch mv.kind {
	case moveSwap:
		s.held[mv.a][mv.ia], s.held[mv.b][mv.ib] = s.held[mv.b][mv.ib], e
	case moveRetarget:
		s.held[mv.a][mv.ia] = int16(mv.f)
	}
	tr.valid = false
}

// copies returns the layer's copies per expert.
func (s *state) copies() [][]int32 {
	out := make([][]int32, len(s.cs))
	for e := range s.cs {
		out[e] = slices.Clone(s.cs[e].gpus)
	}
	return out
}

// price is try's change of the cost at lv for mv, read from the counters
// without a trial where mv swaps two single-copy experts between nodes
// (acrossNodes) and through try otherwise. A price read so leaves no
// trial for apply, which then tries mv itself.
func (s *state) price(mv move, lv level) float64 {
	if d, ok := s.acrossNodes(mv, lv); ok {
		return d
	}
	return s.try(mv, lv)
}

// acrossNodes prices a swap of two single-copy experts e (on GPU a, node
// A) and f (on GPU b, node B ≠ A) from the token counters: a token of e
// without f stops reaching A through e and reaches B, one of f without e
// the other way round, and one with both reaches the same nodes; each
// reach that changes moves the token's NIC copies out of its source and
// into the port of its source's local index on that node. The GPUs'
// tokens change by the two loads. It returns try's change of the cost at
// lv (to rounding) and leaves the change of the remote copies in s.tr.dR,
// as try does; false where it does not apply: other moves, replicated
// experts, one node, or NVLink ports modeled (they see the GPUs).
func (s *state) acrossNodes(mv move, lv level) (float64, bool) {
	sh := s.ly.sh
	if sh.nv || mv.kind != moveSwap || mv.a/sh.P == mv.b/sh.P {
		return 0, false
	}
	e, f := int(s.held[mv.a][mv.ia]), int(s.held[mv.b][mv.ib])
	ce, cf := &s.cs[e], &s.cs[f]
	if len(ce.gpus) != 1 || len(cf.gpus) != 1 {
		return 0, false
	}
	tr := &s.tr
	tr.valid = false
	N, P, K := sh.N, sh.P, sh.K
	A, B := mv.a/P, mv.b/P
	clear(tr.dOut)
	clear(tr.dIn)
	walk := func(x, other, from, to int) {
		for h := 0; h < sh.G; h++ {
			home, port := h/P, h%P
			for _, t32 := range s.ly.tokensFrom(x, h) {
				t := int(t32)
				if slices.Contains(s.ly.ex[t*K:(t+1)*K], int16(other)) {
					continue
				}
				z, pr := s.z[t*N:(t+1)*N], s.pr[t*N:(t+1)*N]
				w := sh.w[t]
				dr := 0.0
				if from != home {
					du := leaves(z, pr, from)
					dr += du
					tr.dIn[from*P+port] += w * du
				}
				if to != home {
					du := joins(z, pr, to)
					dr += du
					tr.dIn[to*P+port] += w * du
				}
				tr.dOut[h] += w * dr
				tr.dR += w * dr
			}
		}
	}
	tr.dR = 0
	walk(e, f, A, B)
	walk(f, e, B, A)
	ta, tb, _ := s.swapLoads(mv)
	copy(tr.t2, s.tok)
	tr.t2[mv.a], tr.t2[mv.b] = ta, tb
	for g := range tr.o2 {
		tr.o2[g] = s.out[g] + tr.dOut[g]
		tr.i2[g] = s.in[g] + tr.dIn[g]
	}
	d := s.cost(tr.t2, tr.o2, tr.i2, nil, nil, lv) - s.cost(s.tok, s.out, s.in, nil, nil, lv)
	if b := s.ly.bud; b != nil {
		d += b.SlotSec * float64(s.dChanged(mv))
	}
	return d, true
}
