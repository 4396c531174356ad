package costmodel

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// engine holds a scenario's constants and scratch buffers and costs one
// layer from its masses (layerState). Evaluate builds every layer's masses
// from scratch; the incremental Evaluator keeps them and updates only what
// a move touches. It is not safe for concurrent use.
type engine struct {
	stats *routing.Stats
	c     Cluster
	opts  Options

	g, n, p, e, l, k int // GPUs, nodes, GPUs per node, experts, layers, top-k
	terms            Terms
	tb               float64 // bytes per token
	nvBW, nicBW      float64 // bytes/s per direction
	nvLat, nicLat    float64 // seconds
	usePatterns      bool
	// perSource: the split over an expert's copies depends on the source
	// GPU (every dispatch but even, TensorRT-LLM's and vLLM's expectation).
	perSource bool
	// sc is the scenario the engine costs, for binding its dispatch
	// (Scenario.Splitter).
	sc Scenario
	// fixed, when set, is the dispatch model of every plan: the model
	// does not depend on the plan (every dispatch but SGLang's tables), so
	// it is bound once and keeps its caches (vLLM's counted hash).
	fixed Splitter
	// split is the dispatch model, bound to the plan of planShares.
	split   Splitter
	srcFrac [][]float64 // per source: [L][G×E] share of Load[l][e] sourced on GPU h; nil = uniform

	// scratch
	pa, pb  probBuf
	tmat    []float64 // G×E (count-only chain)
	disp    []float64 // G×G
	comb    []float64 // G×G
	home    []float64 // G×G
	compute []float64 // G
	ports   [4][]float64
}

// massSet is the token mass of one all-to-all phase: mass[s·G+g] is the
// mass from source s needed on GPU g, nmass[s·N+B] the mass from s needed
// on node B; um and un are mass from sources spread evenly over the GPUs
// (each source gets 1/G of it), kept apart so that moves can update them
// incrementally.
type massSet struct {
	mass, nmass []float64
	um, un      []float64
}

func (m *massSet) init(G, N int) {
	m.mass = make([]float64, G*G)
	m.nmass = make([]float64, G*N)
	m.um = make([]float64, G)
	m.un = make([]float64, N)
}

func (m *massSet) reset() {
	clear(m.mass)
	clear(m.nmass)
	clear(m.um)
	clear(m.un)
}

func (m *massSet) copyFrom(o *massSet) {
	copy(m.mass, o.mass)
	copy(m.nmass, o.nmass)
	copy(m.um, o.um)
	copy(m.un, o.un)
}

// layerState is what a layer's time is computed from: routed tokens per
// GPU, the dispatch masses (from the homes, or in chain flow for l ≥ 1 the
// transition from layer l−1) and, in chain flow's last layer (L > 1), the
// home masses of its combine.
type layerState struct {
	tokens  []float64
	in, out massSet
}

func (st *layerState) init(G, N int) {
	st.tokens = make([]float64, G)
	st.in.init(G, N)
	st.out.init(G, N)
}

func (st *layerState) copyFrom(o *layerState) {
	copy(st.tokens, o.tokens)
	st.in.copyFrom(&o.in)
	st.out.copyFrom(&o.out)
}

// newEngine checks stats, c, m and opts and prepares an engine. Chain flow
// needs stats.Patterns or stats.Transitions.
func newEngine(stats *routing.Stats, c Cluster, m Model, opts Options) (*engine, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if opts.Flow != FlowHome && opts.Flow != FlowChain {
		return nil, fmt.Errorf("costmodel: unknown flow %v", opts.Flow)
	}
	if opts.Mode != Sequential && opts.Mode != Overlapped {
		return nil, fmt.Errorf("costmodel: unknown mode %v", opts.Mode)
	}
	if !opts.Dispatch.Valid() {
		return nil, fmt.Errorf("costmodel: unknown dispatch %v", opts.Dispatch)
	}
	if opts.Dispatch.PerSource() && opts.Flow != FlowHome {
		return nil, fmt.Errorf("costmodel: %s dispatch is modeled for the home flow only (in chain flow a token has no single source GPU); use flow home or dispatch even", opts.Dispatch)
	}
	if opts.Chunks < 0 {
		return nil, fmt.Errorf("costmodel: chunks must be ≥ 0, have %d", opts.Chunks)
	}
	if opts.Chunks == 0 {
		opts.Chunks = DefaultChunks
	}
	if stats == nil {
		return nil, errors.New("costmodel: nil stats")
	}
	if err := checkStats(stats, c.GPUs(), opts.Flow); err != nil {
		return nil, err
	}
	if m.Experts != stats.Experts {
		return nil, fmt.Errorf("costmodel: model %q has %d experts, stats have %d", m.Name, m.Experts, stats.Experts)
	}
	ev := &engine{
		stats: stats, c: c, opts: opts,
		g: c.GPUs(), n: c.Nodes, p: c.GPUsPerNode, e: stats.Experts, l: stats.Layers, k: stats.TopK,
		tb:     m.TokenBytes(),
		nvBW:   c.NVLinkBytesPerSec(),
		nicBW:  c.NICBytesPerSec(),
		nvLat:  c.NVLinkLatency.Seconds(),
		nicLat: c.NICLatency.Seconds(),
		terms:  NewTerms(c, m, opts.Mode, opts.Chunks),
	}
	ev.sc = Scenario{Stats: stats, Cluster: c, Model: m, Flow: opts.Flow, Mode: opts.Mode, Dispatch: opts.Dispatch, Chunks: opts.Chunks}
	ev.usePatterns = stats.Patterns != nil
	if !opts.Dispatch.Dealt() {
		split, err := ev.sc.Splitter(nil)
		if err != nil {
			return nil, err
		}
		ev.fixed = split
	}
	// Scenario.PerSource, without checking the token order again.
	_, hashed := ev.fixed.(*hashSplit)
	ev.perSource = opts.Dispatch.PerSource() || hashed
	if ev.perSource && (ev.usePatterns || hashed) {
		ev.srcFrac = sourceFractions(stats, c.GPUs())
	}
	ev.initScratch()
	return ev, nil
}

// initScratch gives ev its own scratch buffers.
func (ev *engine) initScratch() {
	G, N := ev.g, ev.n
	ev.pa, ev.pb = probBuf{}, probBuf{}
	ev.pa.init(G, N)
	ev.pb.init(G, N)
	ev.tmat = nil
	if ev.opts.Flow == FlowChain && !ev.usePatterns {
		ev.tmat = make([]float64, ev.e*G)
	}
	ev.disp = make([]float64, G*G)
	ev.comb = make([]float64, G*G)
	ev.home = make([]float64, G*G)
	ev.compute = make([]float64, G)
	for i := range ev.ports {
		ev.ports[i] = make([]float64, G)
	}
}

// scratchCopy returns an engine that shares ev's read-only state (stats,
// coefficients, source fractions) and has scratch buffers of its own, for
// costing layers on another goroutine.
func (ev *engine) scratchCopy() *engine {
	w := *ev
	w.initScratch()
	return &w
}

func checkStats(s *routing.Stats, G int, flow Flow) error {
	if s.Layers < 1 || s.Experts < 1 {
		return fmt.Errorf("costmodel: stats have %d layers and %d experts, want ≥ 1 each", s.Layers, s.Experts)
	}
	if len(s.Load) != s.Layers {
		return fmt.Errorf("costmodel: stats have %d load rows for %d layers", len(s.Load), s.Layers)
	}
	for l, row := range s.Load {
		if len(row) != s.Experts {
			return fmt.Errorf("costmodel: stats layer %d has %d loads for %d experts", l, len(row), s.Experts)
		}
		for e, x := range row {
			if !(x >= 0) || math.IsInf(x, 0) {
				return fmt.Errorf("costmodel: stats layer %d expert %d: load %v", l, e, x)
			}
		}
	}
	if s.Patterns != nil {
		if s.TopK < 1 {
			return fmt.Errorf("costmodel: stats have patterns but top-k %d", s.TopK)
		}
		for i, p := range s.Patterns {
			if len(p.Experts) != s.Layers*s.TopK {
				return fmt.Errorf("costmodel: pattern %d has %d experts, want layers×top-k = %d", i, len(p.Experts), s.Layers*s.TopK)
			}
			if p.Source < -1 || int(p.Source) >= G {
				return fmt.Errorf("costmodel: pattern %d: source %d out of range [-1,%d)", i, p.Source, G)
			}
			if !(p.Count >= 0) || math.IsInf(p.Count, 0) {
				return fmt.Errorf("costmodel: pattern %d: count %v", i, p.Count)
			}
			for j, e := range p.Experts {
				if e < 0 || int(e) >= s.Experts {
					return fmt.Errorf("costmodel: pattern %d layer %d: expert %d out of range [0,%d)", i, j/s.TopK, e, s.Experts)
				}
			}
		}
	} else if flow == FlowChain && s.Layers > 1 {
		if s.Transitions == nil {
			return errors.New("costmodel: chain flow needs a per-token trace: stats have neither patterns nor transitions")
		}
		if len(s.Transitions) != s.Layers-1 {
			return fmt.Errorf("costmodel: stats have %d transition matrices for %d layers, want %d", len(s.Transitions), s.Layers, s.Layers-1)
		}
		for l, r := range s.Transitions {
			if len(r) != s.Experts*s.Experts {
				return fmt.Errorf("costmodel: transitions %d have %d entries, want %d", l, len(r), s.Experts*s.Experts)
			}
		}
	}
	return nil
}

// planShares checks that plan fits the engine's scenario and builds every
// layer's shares.
func (ev *engine) planShares(plan *placement.Plan) ([]shares, error) {
	if plan == nil {
		return nil, errors.New("costmodel: nil plan")
	}
	if plan.GPUs != ev.g {
		return nil, fmt.Errorf("costmodel: plan has %d GPUs, cluster %q has %d", plan.GPUs, ev.c.Name, ev.g)
	}
	if plan.Experts != ev.e {
		return nil, fmt.Errorf("costmodel: plan has %d experts, stats have %d", plan.Experts, ev.e)
	}
	if len(plan.Layers) != ev.l {
		return nil, fmt.Errorf("costmodel: plan has %d layers, stats have %d", len(plan.Layers), ev.l)
	}
	split, err := ev.newSplitter(plan)
	if err != nil {
		return nil, err
	}
	ev.split = split
	return ev.bindShares(plan, split)
}

// bindShares builds every layer's shares of plan (checked by planShares)
// under split, bound to plan.
func (ev *engine) bindShares(plan *placement.Plan, split Splitter) ([]shares, error) {
	sh := make([]shares, ev.l)
	for l := range sh {
		if _, err := sh[l].build(l, plan.Layers[l], ev.e, ev.g, ev.p, ev.opts.Dispatch, split); err != nil {
			return nil, fmt.Errorf("costmodel: plan layer %d: %w", l, err)
		}
	}
	return sh, nil
}

// srcShare is the share of layer l's expert e tokens sourced on GPU h.
func (ev *engine) srcShare(l, h, e int) float64 {
	if ev.srcFrac == nil {
		return 1 / float64(ev.g)
	}
	return ev.srcFrac[l][h*ev.e+e]
}

// homeIn reports whether layer l's dispatch starts from the homes (home
// flow, or the first layer of chain flow).
func (ev *engine) homeIn(l int) bool { return ev.opts.Flow == FlowHome || l == 0 }

// homeOut reports whether layer l has separate home masses for its combine
// (chain flow's last layer when there are several).
func (ev *engine) homeOut(l int) bool {
	return ev.opts.Flow == FlowChain && l == ev.l-1 && l > 0
}

// layerMasses fills st from scratch for layer l under shares cur (and
// prev, layer l−1's shares, for chain flow with l ≥ 1).
func (ev *engine) layerMasses(l int, cur, prev *shares, st *layerState) {
	clear(st.tokens)
	for e := 0; e < ev.e; e++ {
		ev.addTokens(l, e, cur, 1, st.tokens)
	}
	st.in.reset()
	st.out.reset()
	if ev.homeIn(l) {
		ev.homeMasses(l, cur, &st.in)
	} else {
		ev.transMasses(l, prev, cur, &st.in)
	}
	if ev.homeOut(l) {
		ev.homeMasses(l, cur, &st.out)
	}
}

// addTokens adds sign × expert e's routed tokens to tokens under sh.
func (ev *engine) addTokens(l, e int, sh *shares, sign float64, tokens []float64) {
	x := ev.stats.Load[l][e]
	if x == 0 {
		return
	}
	a, b := int(sh.cs[e]), int(sh.cs[e+1])
	if !sh.perSource {
		x *= sign
		for i := a; i < b; i++ {
			tokens[sh.cg[i]] += x * sh.cw[i]
		}
		return
	}
	G, n := ev.g, b-a
	for h := 0; h < G; h++ {
		xh := sign * x * ev.srcShare(l, h, e)
		w := sh.hw[a*G+h*n : a*G+(h+1)*n]
		for i := a; i < b; i++ {
			tokens[sh.cg[i]] += xh * w[i-a]
		}
	}
}

// homeMasses adds layer l's home masses under sh to ms.
func (ev *engine) homeMasses(l int, sh *shares, ms *massSet) {
	if ev.usePatterns {
		for i := range ev.stats.Patterns {
			ev.addHomePattern(l, i, sh, 1, ms)
		}
		return
	}
	for e := 0; e < ev.e; e++ {
		ev.addHomeCount(l, e, sh, 1, ms)
	}
}

// addHomePattern adds sign × pattern i's home mass at layer l under sh.
func (ev *engine) addHomePattern(l, i int, sh *shares, sign float64, ms *massSet) {
	pt := &ev.stats.Patterns[i]
	if pt.Count == 0 {
		return
	}
	k := ev.k
	ex := pt.Experts[l*k : (l+1)*k]
	if sh.perSource {
		ev.addHomePerSource(pt, ex, sh, sign, ms)
		return
	}
	ev.pa.compute(ex, sh)
	ev.addHomeProbs(pt, &ev.pa, sign, ms)
}

// addHomePerSource adds sign × pattern pt's home mass under a per-source
// dispatch (its experts ex at the layer).
func (ev *engine) addHomePerSource(pt *routing.Pattern, ex []int16, sh *shares, sign float64, ms *massSet) {
	G, N := ev.g, ev.n
	h0, h1, c := int(pt.Source), int(pt.Source)+1, pt.Count
	if pt.Source < 0 {
		h0, h1, c = 0, G, pt.Count/float64(G)
	}
	c *= sign
	pb := &ev.pa
	for h := h0; h < h1; h++ {
		pb.computeFrom(ex, sh, h, G)
		m := ms.mass[h*G:]
		nm := ms.nmass[h*N:]
		for j, g := range pb.g {
			m[g] += c * pb.p[j]
		}
		for j, b := range pb.b {
			nm[b] += c * pb.q[j]
		}
	}
}

// addHomeProbs adds sign × pattern pt's home mass given its destination
// probabilities pb (source-free split).
func (ev *engine) addHomeProbs(pt *routing.Pattern, pb *probBuf, sign float64, ms *massSet) {
	G, N := ev.g, ev.n
	c := sign * pt.Count
	m, nm := ms.um, ms.un
	if pt.Source >= 0 {
		m, nm = ms.mass[int(pt.Source)*G:], ms.nmass[int(pt.Source)*N:]
	}
	for j, g := range pb.g {
		m[g] += c * pb.p[j]
	}
	for j, b := range pb.b {
		nm[b] += c * pb.q[j]
	}
}

// addHomeCount adds sign × expert e's home mass at layer l under sh for
// count-only stats, where every (token, expert) pair travels on its own.
func (ev *engine) addHomeCount(l, e int, sh *shares, sign float64, ms *massSet) {
	x := ev.stats.Load[l][e]
	if x == 0 {
		return
	}
	a, b := int(sh.cs[e]), int(sh.cs[e+1])
	na, nb := int(sh.ns[e]), int(sh.ns[e+1])
	if !sh.perSource {
		x *= sign
		for i := a; i < b; i++ {
			ms.um[sh.cg[i]] += x * sh.cw[i]
		}
		for i := na; i < nb; i++ {
			ms.un[sh.nb[i]] += x * sh.nw[i]
		}
		return
	}
	G, N := ev.g, ev.n
	n, nn := b-a, nb-na
	for h := 0; h < G; h++ {
		xh := sign * x * ev.srcShare(l, h, e)
		w := sh.hw[a*G+h*n : a*G+(h+1)*n]
		m := ms.mass[h*G : (h+1)*G]
		for i := a; i < b; i++ {
			m[sh.cg[i]] += xh * w[i-a]
		}
		nw := sh.hnw[na*G+h*nn : na*G+(h+1)*nn]
		nm := ms.nmass[h*N : (h+1)*N]
		for i := na; i < nb; i++ {
			nm[sh.nb[i]] += xh * nw[i-na]
		}
	}
}

// transMasses adds the masses of the transition from layer l−1 (shares
// prev) into layer l (shares cur) to ms.
func (ev *engine) transMasses(l int, prev, cur *shares, ms *massSet) {
	if ev.usePatterns && prev.unit && cur.unit && ev.g <= 64 {
		ev.transUnit(l, prev, cur, ms)
		return
	}
	if ev.usePatterns {
		for i := range ev.stats.Patterns {
			ev.addTransPattern(l, i, prev, cur, 1, ms)
		}
		return
	}
	ev.transCounts(l, prev, cur, ms)
}

// addTransPattern adds sign × pattern i's partial results on layer l−1's
// GPUs (prev) needed on layer l's GPUs and nodes (cur).
func (ev *engine) addTransPattern(l, i int, prev, cur *shares, sign float64, ms *massSet) {
	pt := &ev.stats.Patterns[i]
	if pt.Count == 0 {
		return
	}
	k := ev.k
	ev.pa.compute(pt.Experts[(l-1)*k:l*k], prev)
	ev.pb.compute(pt.Experts[l*k:(l+1)*k], cur)
	ev.addTransProbs(pt, &ev.pa, &ev.pb, sign, ms)
}

// addTransProbs adds sign × pattern pt's transition mass given where its
// partial results are (pa) and where they are needed (pb).
func (ev *engine) addTransProbs(pt *routing.Pattern, pa, pb *probBuf, sign float64, ms *massSet) {
	G, N := ev.g, ev.n
	for j1, g1 := range pa.g {
		c := sign * pt.Count * pa.p[j1]
		m := ms.mass[int(g1)*G:]
		for j2, g2 := range pb.g {
			m[g2] += c * pb.p[j2]
		}
		nm := ms.nmass[int(g1)*N:]
		for j2, b := range pb.b {
			nm[b] += c * pb.q[j2]
		}
	}
}

// transCounts is transMasses for count-only stats: mass = Wprevᵀ·R·Wcur,
// node mass its node sums.
func (ev *engine) transCounts(l int, prev, cur *shares, ms *massSet) {
	G, N, E := ev.g, ev.n, ev.e
	// U = Wprevᵀ·R first: contiguous row updates, G×E.
	R := ev.stats.Transitions[l-1]
	U := ev.tmat
	clear(U)
	for e1 := 0; e1 < E; e1++ {
		row := R[e1*E : (e1+1)*E]
		for i := prev.cs[e1]; i < prev.cs[e1+1]; i++ {
			w := prev.cw[i]
			u := U[int(prev.cg[i])*E : (int(prev.cg[i])+1)*E]
			for e2, x := range row {
				u[e2] += w * x
			}
		}
	}
	for g1 := 0; g1 < G; g1++ {
		u := U[g1*E : (g1+1)*E]
		m := ms.mass[g1*G : (g1+1)*G]
		for e2, x := range u {
			if x == 0 {
				continue
			}
			for i := cur.cs[e2]; i < cur.cs[e2+1]; i++ {
				m[cur.cg[i]] += x * cur.cw[i]
			}
		}
	}
	P := ev.p
	for g1 := 0; g1 < G; g1++ {
		m := ms.mass[g1*G : (g1+1)*G]
		nm := ms.nmass[g1*N : (g1+1)*N]
		for g2, x := range m {
			nm[g2/P] += x
		}
	}
}

// spread turns the masses into bytes in D[src][dst]: within the source's
// node directly over NVLink; to another node one NIC copy to the GPU with
// the same local index, then NVLink forwarding from there. Mass from
// evenly spread sources counts 1/G for every source.
func (ev *engine) spread(D []float64, ms *massSet) {
	G, N, P, tb := ev.g, ev.n, ev.p, ev.tb
	inv := 1 / float64(G)
	for s := 0; s < G; s++ {
		A, i := s/P, s%P
		m := ms.mass[s*G : (s+1)*G]
		row := D[s*G : (s+1)*G]
		for g := A * P; g < (A+1)*P; g++ {
			if g != s {
				row[g] += (m[g] + ms.um[g]*inv) * tb
			}
		}
		for B := 0; B < N; B++ {
			if B == A {
				continue
			}
			r := B*P + i
			row[r] += (ms.nmass[s*N+B] + ms.un[B]*inv) * tb
			fw := D[r*G : (r+1)*G]
			for g := B * P; g < (B+1)*P; g++ {
				if g != r {
					fw[g] += (m[g] + ms.um[g]*inv) * tb
				}
			}
		}
	}
}

// phase returns the time of one all-to-all phase with bytes D, its NIC
// bytes and its busiest NIC port's bytes.
func (ev *engine) phase(D []float64) (sec, nicBytes, nicMax float64) {
	G, P := ev.g, ev.p
	nvOut, nvIn, nicOut, nicIn := ev.ports[0], ev.ports[1], ev.ports[2], ev.ports[3]
	clear(nvOut)
	clear(nvIn)
	clear(nicOut)
	clear(nicIn)
	anyNV := false
	for s := 0; s < G; s++ {
		row := D[s*G : (s+1)*G]
		for d, b := range row {
			if b == 0 {
				continue
			}
			if s/P == d/P {
				nvOut[s] += b
				nvIn[d] += b
				anyNV = true
			} else {
				nicOut[s] += b
				nicIn[d] += b
				nicBytes += b
			}
		}
	}
	var nv, nic float64
	for g := 0; g < G; g++ {
		nv = max(nv, nvOut[g], nvIn[g])
		nic = max(nic, nicOut[g], nicIn[g])
	}
	if nv > 0 {
		sec = nv / ev.nvBW
	}
	if nic > 0 {
		sec = max(sec, nic/ev.nicBW)
	}
	switch {
	case nicBytes > 0:
		sec += ev.nicLat
	case anyNV:
		sec += ev.nvLat
	}
	return sec, nicBytes, nic
}

type layerTimes struct {
	tail, disp, comb, seq, ideal, over, time float64
	nicBytes, dispNIC, dispMax               float64
}

func transpose(dst, src []float64, G int) {
	for s := 0; s < G; s++ {
		for d := 0; d < G; d++ {
			dst[d*G+s] = src[s*G+d]
		}
	}
}

// finish costs layer l with shares cur from its masses st, filling out
// when non-nil.
func (ev *engine) finish(l int, cur *shares, st *layerState, out *LayerReport) layerTimes {
	G := ev.g
	var r layerTimes
	for g := 0; g < G; g++ {
		ev.compute[g] = ev.terms.Compute(g, st.tokens[g], cur.slots[g])
		r.tail = max(r.tail, ev.compute[g])
	}
	clear(ev.disp)
	clear(ev.comb)
	last := l == ev.l-1
	ev.spread(ev.disp, &st.in)
	switch {
	case ev.opts.Flow == FlowHome || (l == 0 && last):
		transpose(ev.comb, ev.disp, G)
	case last:
		clear(ev.home)
		ev.spread(ev.home, &st.out)
		transpose(ev.comb, ev.home, G)
	}
	var nicC float64
	r.disp, r.dispNIC, r.dispMax = ev.phase(ev.disp)
	r.comb, nicC, _ = ev.phase(ev.comb)
	r.nicBytes = r.dispNIC + nicC
	comm := r.disp + r.comb
	r.seq, r.ideal, r.over = ev.terms.Times(r.tail, r.disp, r.comb)
	r.time = r.seq
	if ev.opts.Mode == Overlapped {
		r.time = r.over
	}
	if out == nil {
		return r
	}
	out.Layer = l
	out.Tokens = append([]float64(nil), st.tokens...)
	out.Compute = make([]time.Duration, G)
	var sum float64
	for g := 0; g < G; g++ {
		out.Compute[g] = dur(ev.compute[g])
		out.MaxTokens = max(out.MaxTokens, st.tokens[g])
		sum += st.tokens[g]
	}
	out.MeanTokens = sum / float64(G)
	out.Balance = Balance(st.tokens, ev.terms.Speed)
	out.ComputeTail = dur(r.tail)
	out.Dispatch = matrix(ev.disp, G)
	out.Combine = matrix(ev.comb, G)
	out.DispatchTime, out.CombineTime, out.CommTime = dur(r.disp), dur(r.comb), dur(comm)
	out.CrossNodeBytes = r.nicBytes
	if ev.tb > 0 {
		out.RemoteCopies, out.BusiestNIC = r.dispNIC/ev.tb, r.dispMax/ev.tb
	}
	out.Sequential, out.Ideal, out.Overlapped, out.Time = dur(r.seq), dur(r.ideal), dur(r.over), dur(r.time)
	out.TimeSec = r.time
	return r
}

func matrix(flat []float64, G int) [][]float64 {
	back := append([]float64(nil), flat...)
	m := make([][]float64, G)
	for s := range m {
		m[s] = back[s*G : (s+1)*G : (s+1)*G]
	}
	return m
}
