package costmodel

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// DefaultChunks is the number of pipeline chunks Options.Chunks defaults to.
const DefaultChunks = 4

// Options are the optional settings of Evaluate; the zero value is home
// flow, sequential mode, DefaultChunks.
type Options struct {
	// Flow is the token flow (default FlowHome).
	Flow Flow
	// Mode selects Time: Sequential (default) or Overlapped.
	Mode Mode
	// Chunks is the number of pipeline chunks in overlapped execution; the
	// first dispatch and last combine chunk, CommTime/Chunks, stay exposed.
	// 0 means DefaultChunks; negative is an error.
	Chunks int
	// Dispatch is how sources choose among an expert's copies (default
	// placement.DispatchEven). DispatchLocal is modeled in the home flow
	// only and ignores no plan field: plans with SlotShare are rejected.
	Dispatch placement.Dispatch
}

// LayerReport is the modeled cost of one MoE layer. Byte matrices are
// indexed [src][dst] by GPU.
type LayerReport struct {
	Layer int
	// Tokens is the token-expert load per GPU, Σ_e Load[l][e]·w[e][g].
	Tokens                           []float64
	MaxTokens, MeanTokens, Imbalance float64 // Imbalance = MaxTokens/MeanTokens (1 when empty)
	// Compute is the expert compute time per GPU; ComputeTail its maximum.
	Compute     []time.Duration
	ComputeTail time.Duration
	// Dispatch and Combine are the bytes sent per GPU pair in the phase.
	Dispatch, Combine                   [][]float64
	DispatchTime, CombineTime, CommTime time.Duration
	// CrossNodeBytes is the NIC traffic of both phases.
	CrossNodeBytes                float64
	Sequential, Ideal, Overlapped time.Duration
	Time                          time.Duration // Sequential or Overlapped per Options.Mode
	TimeSec                       float64       // Time in float64 seconds, unrounded
}

// Report is the modeled cost of a plan; durations are sums over layers.
type Report struct {
	Flow   Flow
	Mode   Mode
	Sigma  float64
	Layers []LayerReport

	ComputeTail, CommTime, Sequential, Ideal, Overlapped, Time time.Duration
	// TimeSec is the sum of the layers' TimeSec.
	TimeSec        float64
	CrossNodeBytes float64
	// MeanImbalance and MaxImbalance summarize the layers' Imbalance.
	MeanImbalance, MaxImbalance float64
	// MaxTokensSum is Σ_l MaxTokens, the paper's token-processing tail.
	MaxTokensSum float64
	// Dispatch and Combine are the layers' byte matrices [src][dst] added
	// up: the whole model's traffic per GPU pair.
	Dispatch, Combine [][]float64
}

// Evaluate models the cost of plan on cluster c for model m under the
// routing stats (see the package doc for every formula); it is
// Scenario.Evaluate with the scenario spelled out. It returns an error,
// never panics, when the inputs disagree.
func Evaluate(plan *placement.Plan, stats *routing.Stats, c Cluster, m Model, opts Options) (*Report, error) {
	ev, err := NewEvaluator(stats, c, m, opts)
	if err != nil {
		return nil, err
	}
	if plan == nil {
		return nil, errors.New("costmodel: nil plan")
	}
	if plan.GPUs != ev.g {
		return nil, fmt.Errorf("costmodel: plan has %d GPUs, cluster %q has %d", plan.GPUs, c.Name, ev.g)
	}
	if plan.Experts != ev.e {
		return nil, fmt.Errorf("costmodel: plan has %d experts, stats have %d", plan.Experts, ev.e)
	}
	if len(plan.Layers) != ev.l {
		return nil, fmt.Errorf("costmodel: plan has %d layers, stats have %d", len(plan.Layers), ev.l)
	}
	sh := make([]shares, ev.l)
	for l := range sh {
		if err := sh[l].build(plan.Layers[l], ev.e, ev.g, c.GPUsPerNode, ev.local); err != nil {
			return nil, fmt.Errorf("costmodel: plan layer %d: %w", l, err)
		}
	}
	rep := &Report{Flow: opts.Flow, Mode: opts.Mode, Sigma: ev.sigma, Layers: make([]LayerReport, ev.l)}
	var tail, comm, seq, ideal, over, tm float64
	for l := range sh {
		var prev *shares
		if l > 0 {
			prev = &sh[l-1]
		}
		lr := &rep.Layers[l]
		r := ev.layer(l, &sh[l], prev, lr)
		tail += r.tail
		comm += r.disp + r.comb
		seq += r.seq
		ideal += r.ideal
		over += r.over
		tm += r.time
		rep.CrossNodeBytes += lr.CrossNodeBytes
		rep.MeanImbalance += lr.Imbalance
		rep.MaxImbalance = math.Max(rep.MaxImbalance, lr.Imbalance)
		rep.MaxTokensSum += lr.MaxTokens
		rep.Dispatch = addMatrix(rep.Dispatch, lr.Dispatch)
		rep.Combine = addMatrix(rep.Combine, lr.Combine)
	}
	rep.MeanImbalance /= float64(ev.l)
	rep.ComputeTail, rep.CommTime = dur(tail), dur(comm)
	rep.Sequential, rep.Ideal, rep.Overlapped, rep.Time = dur(seq), dur(ideal), dur(over), dur(tm)
	rep.TimeSec = tm
	return rep, nil
}

// addMatrix returns sum + m, allocating sum on first use.
func addMatrix(sum, m [][]float64) [][]float64 {
	if sum == nil {
		sum = make([][]float64, len(m))
		for i := range m {
			sum[i] = make([]float64, len(m[i]))
		}
	}
	for i, row := range m {
		for j, v := range row {
			sum[i][j] += v
		}
	}
	return sum
}

func dur(sec float64) time.Duration { return time.Duration(math.Round(sec * 1e9)) }

// Evaluator costs single layers of candidate plans against fixed stats,
// cluster, model and options, reusing its buffers: a solver's local search
// re-costs one layer per move. It is not safe for concurrent use.
type Evaluator struct {
	stats *routing.Stats
	c     Cluster
	opts  Options

	g, n, p, e, l, k int // GPUs, nodes, GPUs per node, experts, layers, top-k
	perTok, perExp   float64
	tb               float64 // bytes per token
	nvBW, nicBW      float64 // bytes/s per direction
	nvLat, nicLat    float64 // seconds
	sigma            float64
	chunks           float64
	speed            []float64
	usePatterns      bool
	local            bool        // DispatchLocal
	srcFrac          [][]float64 // local: [L][G×E] share of Load[l][e] sourced on GPU h; nil = uniform

	// scratch
	cur, prev shares
	pa, pb    probBuf
	mass      []float64 // G×G
	nmass     []float64 // G×N
	umass     []float64 // G
	unmass    []float64 // N
	tmat      []float64 // G×E (count-only chain)
	disp      []float64 // G×G
	comb      []float64 // G×G
	home      []float64 // G×G
	tokens    []float64 // G
	compute   []float64 // G
	ports     [4][]float64
}

// NewEvaluator checks stats, c, m and opts and prepares an Evaluator. Chain
// flow needs stats.Patterns or stats.Transitions.
func NewEvaluator(stats *routing.Stats, c Cluster, m Model, opts Options) (*Evaluator, error) {
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
	switch opts.Dispatch {
	case placement.DispatchEven:
	case placement.DispatchLocal:
		if opts.Flow != FlowHome {
			return nil, errors.New("costmodel: local dispatch is modeled for the home flow only (in chain flow a token has no single source GPU); use flow home or dispatch even")
		}
	default:
		return nil, fmt.Errorf("costmodel: unknown dispatch %v", opts.Dispatch)
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
	ev := &Evaluator{
		stats: stats, c: c, opts: opts,
		g: c.GPUs(), n: c.Nodes, p: c.GPUsPerNode, e: stats.Experts, l: stats.Layers, k: stats.TopK,
		tb:     m.TokenBytes(),
		nvBW:   c.NVLinkBytesPerSec(),
		nicBW:  c.NICBytesPerSec(),
		nvLat:  c.NVLinkLatency.Seconds(),
		nicLat: c.NICLatency.Seconds(),
		sigma:  c.SigmaValue(),
		chunks: float64(opts.Chunks),
	}
	ev.perTok, ev.perExp = c.Coefficients(m)
	ev.usePatterns = stats.Patterns != nil
	ev.local = opts.Dispatch == placement.DispatchLocal
	if ev.local && ev.usePatterns {
		ev.srcFrac = sourceFractions(stats, c.GPUs())
	}
	G, N := ev.g, ev.n
	ev.speed = make([]float64, G)
	for g := range ev.speed {
		ev.speed[g] = c.SpeedOf(g)
	}
	ev.pa.init(G, N)
	ev.pb.init(G, N)
	ev.mass = make([]float64, G*G)
	ev.nmass = make([]float64, G*N)
	ev.umass = make([]float64, G)
	ev.unmass = make([]float64, N)
	if opts.Flow == FlowChain && !ev.usePatterns {
		ev.tmat = make([]float64, ev.e*G)
	}
	ev.disp = make([]float64, G*G)
	ev.comb = make([]float64, G*G)
	ev.home = make([]float64, G*G)
	ev.tokens = make([]float64, G)
	ev.compute = make([]float64, G)
	for i := range ev.ports {
		ev.ports[i] = make([]float64, G)
	}
	return ev, nil
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

// LayerTime returns layer l's modeled Time in seconds (Options.Mode) under
// layer plan lp; exactly the TimeSec that Evaluate reports for that layer.
// In chain flow, prev must be layer l−1's plan for l ≥ 1 (a change to layer
// l also changes layer l+1's time); it is ignored otherwise. An invalid lp,
// a missing prev or l out of range gives +Inf.
func (ev *Evaluator) LayerTime(l int, lp placement.LayerPlan, prev *placement.LayerPlan) float64 {
	if l < 0 || l >= ev.l {
		return math.Inf(1)
	}
	if ev.cur.build(lp, ev.e, ev.g, ev.p, ev.local) != nil {
		return math.Inf(1)
	}
	var psh *shares
	if ev.opts.Flow == FlowChain && l > 0 {
		if prev == nil || ev.prev.build(*prev, ev.e, ev.g, ev.p, false) != nil {
			return math.Inf(1)
		}
		psh = &ev.prev
	}
	return ev.layer(l, &ev.cur, psh, nil).time
}

// shares is one layer plan as even-split weights: expert e sends the
// fraction cw[i] of its tokens to GPU cg[i] for i in [cs[e], cs[e+1]), and
// nw[i] to node nb[i] for i in [ns[e], ns[e+1]).
type shares struct {
	cs, ns []int32
	cg, nb []int32
	cw, nw []float64
	cnt    []int32
	tmp    []int32
	slots  []float64
	// With local dispatch, hw[cs[e]·G + h·n + i] (n = cs[e+1]−cs[e]) is
	// the fraction of expert e's tokens from source GPU h that go to GPU
	// cg[cs[e]+i]; hnw likewise per node entry.
	local   bool
	hw, hnw []float64
}

func (s *shares) build(lp placement.LayerPlan, E, G, P int, local bool) error {
	if len(lp.SlotExpert) != len(lp.SlotGPU) {
		return fmt.Errorf("%d slot experts but %d slot GPUs", len(lp.SlotExpert), len(lp.SlotGPU))
	}
	s.cnt = resize(s.cnt, E+1)
	s.slots = resizeF(s.slots, G)
	for i, e := range lp.SlotExpert {
		g := lp.SlotGPU[i]
		if e < 0 || int(e) >= E {
			return fmt.Errorf("slot %d: expert %d out of range [0,%d)", i, e, E)
		}
		if g < 0 || int(g) >= G {
			return fmt.Errorf("slot %d: GPU %d out of range [0,%d)", i, g, G)
		}
		s.cnt[e+1]++
		s.slots[g]++
	}
	for e := 0; e < E; e++ {
		if s.cnt[e+1] == 0 {
			return fmt.Errorf("expert %d has no slot", e)
		}
		s.cnt[e+1] += s.cnt[e]
	}
	if lp.SlotShare != nil && len(lp.SlotShare) != len(lp.SlotExpert) {
		return fmt.Errorf("%d slot shares for %d slots", len(lp.SlotShare), len(lp.SlotExpert))
	}
	// Bucket the slots by expert (cnt becomes the bucket ends).
	S := len(lp.SlotExpert)
	s.tmp = resize(s.tmp, S)
	for i, e := range lp.SlotExpert {
		s.tmp[s.cnt[e]] = int32(i)
		s.cnt[e]++
	}
	s.cs, s.ns = resize(s.cs, E+1), resize(s.ns, E+1)
	s.cg, s.cw = s.cg[:0], s.cw[:0]
	s.nb, s.nw = s.nb[:0], s.nw[:0]
	lo := int32(0)
	for e := 0; e < E; e++ {
		hi := s.cnt[e]
		seg := s.tmp[lo:hi] // slot indices of expert e
		gpu := func(k int) int32 { return int32(lp.SlotGPU[seg[k]]) }
		for i := 1; i < len(seg); i++ { // insertion sort by GPU: few copies
			for j := i; j > 0 && gpu(j) < gpu(j-1); j-- {
				seg[j], seg[j-1] = seg[j-1], seg[j]
			}
		}
		s.cs[e] = int32(len(s.cg))
		s.ns[e] = int32(len(s.nb))
		for i := range seg {
			g := gpu(i)
			// Even split unless the plan gives each slot its share.
			w := 1 / float64(len(seg))
			if lp.SlotShare != nil {
				w = lp.SlotShare[seg[i]]
			}
			if i > 0 && g == gpu(i-1) {
				s.cw[len(s.cw)-1] += w
			} else {
				s.cg = append(s.cg, g)
				s.cw = append(s.cw, w)
			}
			b := g / int32(P)
			if len(s.nb) > int(s.ns[e]) && s.nb[len(s.nb)-1] == b {
				s.nw[len(s.nw)-1] += w
			} else {
				s.nb = append(s.nb, b)
				s.nw = append(s.nw, w)
			}
		}
		lo = hi
	}
	s.cs[E] = int32(len(s.cg))
	s.ns[E] = int32(len(s.nb))
	s.local = local
	if !local {
		return nil
	}
	if lp.SlotShare != nil {
		return errors.New("the plan carries slot shares (a chosen split), but local dispatch decides the split itself; use dispatch even, or a plan without slot_share")
	}
	s.hw = resizeF(s.hw, G*len(s.cg))
	s.hnw = resizeF(s.hnw, G*len(s.nb))
	for e := 0; e < E; e++ {
		a, b := int(s.cs[e]), int(s.cs[e+1])
		n := b - a
		frac := s.hw[a*G : b*G]
		placement.LocalSplit(s.cg[a:b], G, P, frac)
		na, nb := int(s.ns[e]), int(s.ns[e+1])
		nn := nb - na
		nf := s.hnw[na*G : nb*G]
		for i := 0; i < n; i++ {
			node := s.cg[a+i] / int32(P)
			j := 0
			for s.nb[na+j] != node {
				j++
			}
			for h := 0; h < G; h++ {
				nf[h*nn+j] += frac[h*n+i]
			}
		}
	}
	return nil
}

// sourceFractions returns per layer the share of each expert's tokens
// sourced on each GPU, [L][h·E+e], from patterns with a source (patterns
// without one count evenly for every GPU); nil when no pattern has a
// source, meaning uniform.
func sourceFractions(st *routing.Stats, G int) [][]float64 {
	any := false
	for i := range st.Patterns {
		if st.Patterns[i].Source >= 0 {
			any = true
			break
		}
	}
	if !any {
		return nil
	}
	L, E, k := st.Layers, st.Experts, st.TopK
	out := make([][]float64, L)
	tot := make([]float64, E)
	for l := range out {
		f := make([]float64, G*E)
		clear(tot)
		for i := range st.Patterns {
			pt := &st.Patterns[i]
			for _, e := range pt.Experts[l*k : (l+1)*k] {
				tot[e] += pt.Count
				if pt.Source >= 0 {
					f[int(pt.Source)*E+int(e)] += pt.Count
				} else {
					for h := 0; h < G; h++ {
						f[h*E+int(e)] += pt.Count / float64(G)
					}
				}
			}
		}
		for h := 0; h < G; h++ {
			for e := 0; e < E; e++ {
				if tot[e] > 0 {
					f[h*E+e] /= tot[e]
				} else {
					f[h*E+e] = 1 / float64(G)
				}
			}
		}
		out[l] = f
	}
	return out
}

// srcShare is the share of layer l's expert e tokens sourced on GPU h.
func (ev *Evaluator) srcShare(l, h, e int) float64 {
	if ev.srcFrac == nil {
		return 1 / float64(ev.g)
	}
	return ev.srcFrac[l][h*ev.e+e]
}

func resize(x []int32, n int) []int32 {
	if cap(x) < n {
		return make([]int32, n)
	}
	x = x[:n]
	clear(x)
	return x
}

func resizeF(x []float64, n int) []float64 {
	if cap(x) < n {
		return make([]float64, n)
	}
	x = x[:n]
	clear(x)
	return x
}

// probBuf computes one token's destination probabilities: p_g for the GPUs
// in g (others 0) and q_B for the nodes in b.
type probBuf struct {
	prod, nprod   []float64
	stamp, nstamp []uint32
	gen           uint32
	g, b          []int32
	p, q          []float64
}

func (pb *probBuf) init(G, N int) {
	pb.prod = make([]float64, G)
	pb.nprod = make([]float64, N)
	pb.stamp = make([]uint32, G)
	pb.nstamp = make([]uint32, N)
}

// compute fills pb for a token whose layer experts are ex under shares sh.
func (pb *probBuf) compute(ex []int16, sh *shares) { pb.computeFrom(ex, sh, -1, 0) }

// computeFrom is compute for a token sourced on GPU h under local
// dispatch (sh.local, G GPUs); h < 0 uses the source-free split.
func (pb *probBuf) computeFrom(ex []int16, sh *shares, h, G int) {
	pb.gen++
	if pb.gen == 0 {
		clear(pb.stamp)
		clear(pb.nstamp)
		pb.gen = 1
	}
	pb.g, pb.b = pb.g[:0], pb.b[:0]
	for _, e := range ex {
		a, b := int(sh.cs[e]), int(sh.cs[e+1])
		n := b - a
		w := sh.cw[a:b]
		if h >= 0 {
			w = sh.hw[a*G+h*n : a*G+(h+1)*n]
		}
		for i := a; i < b; i++ {
			g := sh.cg[i]
			if pb.stamp[g] != pb.gen {
				pb.stamp[g] = pb.gen
				pb.prod[g] = 1
				pb.g = append(pb.g, g)
			}
			pb.prod[g] *= 1 - w[i-a]
		}
		na, nb := int(sh.ns[e]), int(sh.ns[e+1])
		nn := nb - na
		nw := sh.nw[na:nb]
		if h >= 0 {
			nw = sh.hnw[na*G+h*nn : na*G+(h+1)*nn]
		}
		for i := na; i < nb; i++ {
			bn := sh.nb[i]
			if pb.nstamp[bn] != pb.gen {
				pb.nstamp[bn] = pb.gen
				pb.nprod[bn] = 1
				pb.b = append(pb.b, bn)
			}
			pb.nprod[bn] *= 1 - nw[i-na]
		}
	}
	pb.p = pb.p[:0]
	for _, g := range pb.g {
		pb.p = append(pb.p, 1-pb.prod[g])
	}
	pb.q = pb.q[:0]
	for _, b := range pb.b {
		pb.q = append(pb.q, 1-pb.nprod[b])
	}
}

// homeMassLocal is homeMass under local dispatch: each source GPU has its
// own split over an expert's copies. It also fills tokens.
func (ev *Evaluator) homeMassLocal(l int, sh *shares) {
	G, N := ev.g, ev.n
	clear(ev.mass)
	clear(ev.nmass)
	if ev.usePatterns {
		k := ev.k
		pb := &ev.pa
		for i := range ev.stats.Patterns {
			pt := &ev.stats.Patterns[i]
			if pt.Count == 0 {
				continue
			}
			ex := pt.Experts[l*k : (l+1)*k]
			h0, h1, c := int(pt.Source), int(pt.Source)+1, pt.Count
			if pt.Source < 0 {
				h0, h1, c = 0, G, pt.Count/float64(G)
			}
			for h := h0; h < h1; h++ {
				pb.computeFrom(ex, sh, h, G)
				m := ev.mass[h*G:]
				nm := ev.nmass[h*N:]
				for j, g := range pb.g {
					m[g] += c * pb.p[j]
				}
				for j, b := range pb.b {
					nm[b] += c * pb.q[j]
				}
			}
		}
	}
	// Tokens per GPU (and, count-only, the masses: every (token, expert)
	// pair travels on its own).
	clear(ev.tokens)
	for e, x := range ev.stats.Load[l] {
		if x == 0 {
			continue
		}
		a, b := int(sh.cs[e]), int(sh.cs[e+1])
		n := b - a
		na, nb := int(sh.ns[e]), int(sh.ns[e+1])
		nn := nb - na
		for h := 0; h < G; h++ {
			xh := x * ev.srcShare(l, h, e)
			w := sh.hw[a*G+h*n : a*G+(h+1)*n]
			for i := a; i < b; i++ {
				ev.tokens[sh.cg[i]] += xh * w[i-a]
			}
			if ev.usePatterns {
				continue
			}
			m := ev.mass[h*G : (h+1)*G]
			for i := a; i < b; i++ {
				m[sh.cg[i]] += xh * w[i-a]
			}
			nw := sh.hnw[na*G+h*nn : na*G+(h+1)*nn]
			nm := ev.nmass[h*N : (h+1)*N]
			for i := na; i < nb; i++ {
				nm[sh.nb[i]] += xh * nw[i-na]
			}
		}
	}
}

// homeMass fills mass[h][g] (token mass from home h needed on GPU g) and
// nmass[h][B] (mass needing node B) for layer l.
func (ev *Evaluator) homeMass(l int, sh *shares) {
	G, N := ev.g, ev.n
	clear(ev.mass)
	clear(ev.nmass)
	um, un := ev.umass, ev.unmass
	clear(um)
	clear(un)
	if ev.usePatterns {
		k := ev.k
		pb := &ev.pa
		for i := range ev.stats.Patterns {
			pt := &ev.stats.Patterns[i]
			if pt.Count == 0 {
				continue
			}
			pb.compute(pt.Experts[l*k:(l+1)*k], sh)
			c := pt.Count
			if pt.Source >= 0 {
				m := ev.mass[int(pt.Source)*G:]
				nm := ev.nmass[int(pt.Source)*N:]
				for j, g := range pb.g {
					m[g] += c * pb.p[j]
				}
				for j, b := range pb.b {
					nm[b] += c * pb.q[j]
				}
			} else {
				for j, g := range pb.g {
					um[g] += c * pb.p[j]
				}
				for j, b := range pb.b {
					un[b] += c * pb.q[j]
				}
			}
		}
	} else {
		// Count-only: every (token, expert) pair travels on its own.
		load := ev.stats.Load[l]
		for e, x := range load {
			if x == 0 {
				continue
			}
			for i := sh.cs[e]; i < sh.cs[e+1]; i++ {
				um[sh.cg[i]] += x * sh.cw[i]
			}
			for i := sh.ns[e]; i < sh.ns[e+1]; i++ {
				un[sh.nb[i]] += x * sh.nw[i]
			}
		}
	}
	inv := 1 / float64(G)
	for h := 0; h < G; h++ {
		m := ev.mass[h*G : (h+1)*G]
		for g, x := range um {
			m[g] += x * inv
		}
		nm := ev.nmass[h*N : (h+1)*N]
		for b, x := range un {
			nm[b] += x * inv
		}
	}
}

// transMass fills mass[g1][g2] (partial results on g1 after layer l−1
// needed on g2 at layer l) and nmass[g1][B].
func (ev *Evaluator) transMass(l int, prev, cur *shares) {
	G, N, E := ev.g, ev.n, ev.e
	clear(ev.mass)
	clear(ev.nmass)
	if ev.usePatterns {
		k := ev.k
		pa, pb := &ev.pa, &ev.pb
		for i := range ev.stats.Patterns {
			pt := &ev.stats.Patterns[i]
			if pt.Count == 0 {
				continue
			}
			pa.compute(pt.Experts[(l-1)*k:l*k], prev)
			pb.compute(pt.Experts[l*k:(l+1)*k], cur)
			for j1, g1 := range pa.g {
				c := pt.Count * pa.p[j1]
				m := ev.mass[int(g1)*G:]
				for j2, g2 := range pb.g {
					m[g2] += c * pb.p[j2]
				}
				nm := ev.nmass[int(g1)*N:]
				for j2, b := range pb.b {
					nm[b] += c * pb.q[j2]
				}
			}
		}
		return
	}
	// Count-only: mass = Wprevᵀ · R · Wcur, node mass = its node sums.
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
		m := ev.mass[g1*G : (g1+1)*G]
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
		m := ev.mass[g1*G : (g1+1)*G]
		nm := ev.nmass[g1*N : (g1+1)*N]
		for g2, x := range m {
			nm[g2/P] += x
		}
	}
}

// spread turns the masses into bytes in D[src][dst]: within the source's
// node directly over NVLink; to another node one NIC copy to the GPU with
// the same local index, then NVLink forwarding from there.
func (ev *Evaluator) spread(D []float64) {
	G, N, P, tb := ev.g, ev.n, ev.p, ev.tb
	for s := 0; s < G; s++ {
		A, i := s/P, s%P
		m := ev.mass[s*G : (s+1)*G]
		row := D[s*G : (s+1)*G]
		for g := A * P; g < (A+1)*P; g++ {
			if g != s {
				row[g] += m[g] * tb
			}
		}
		for B := 0; B < N; B++ {
			if B == A {
				continue
			}
			r := B*P + i
			row[r] += ev.nmass[s*N+B] * tb
			fw := D[r*G : (r+1)*G]
			for g := B * P; g < (B+1)*P; g++ {
				if g != r {
					fw[g] += m[g] * tb
				}
			}
		}
	}
}

// phase returns the time of one all-to-all phase with bytes D and its NIC
// bytes.
func (ev *Evaluator) phase(D []float64) (sec, nicBytes float64) {
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
	return sec, nicBytes
}

type layerTimes struct {
	tail, disp, comb, seq, ideal, over, time float64
}

func transpose(dst, src []float64, G int) {
	for s := 0; s < G; s++ {
		for d := 0; d < G; d++ {
			dst[d*G+s] = src[s*G+d]
		}
	}
}

// layer costs layer l with shares cur (and prev for chain flow, l ≥ 1),
// filling out when non-nil.
func (ev *Evaluator) layer(l int, cur, prev *shares, out *LayerReport) layerTimes {
	G := ev.g
	if ev.local {
		// Masses and tokens both depend on the source; the home flow is
		// the only one local dispatch supports.
		ev.homeMassLocal(l, cur)
	} else {
		load := ev.stats.Load[l]
		clear(ev.tokens)
		for e, x := range load {
			if x == 0 {
				continue
			}
			for i := cur.cs[e]; i < cur.cs[e+1]; i++ {
				ev.tokens[cur.cg[i]] += x * cur.cw[i]
			}
		}
	}
	var r layerTimes
	for g := 0; g < G; g++ {
		ev.compute[g] = (ev.tokens[g]*ev.perTok + cur.slots[g]*ev.perExp) / ev.speed[g]
		r.tail = max(r.tail, ev.compute[g])
	}

	clear(ev.disp)
	clear(ev.comb)
	last := l == ev.l-1
	if ev.opts.Flow == FlowHome || l == 0 {
		if !ev.local {
			ev.homeMass(l, cur)
		}
		ev.spread(ev.disp)
		if ev.opts.Flow == FlowHome || last {
			transpose(ev.comb, ev.disp, G)
		}
	} else {
		ev.transMass(l, prev, cur)
		ev.spread(ev.disp)
		if last {
			ev.homeMass(l, cur)
			clear(ev.home)
			ev.spread(ev.home)
			transpose(ev.comb, ev.home, G)
		}
	}
	var nicD, nicC float64
	r.disp, nicD = ev.phase(ev.disp)
	r.comb, nicC = ev.phase(ev.comb)
	comm := r.disp + r.comb
	r.seq = r.disp + r.tail + r.comb
	r.ideal = max(r.tail, comm)
	r.over = max(r.tail*(1+ev.sigma), comm) + comm/ev.chunks
	r.time = r.seq
	if ev.opts.Mode == Overlapped {
		r.time = r.over
	}
	if out == nil {
		return r
	}
	out.Layer = l
	out.Tokens = append([]float64(nil), ev.tokens...)
	out.Compute = make([]time.Duration, G)
	var sum float64
	for g := 0; g < G; g++ {
		out.Compute[g] = dur(ev.compute[g])
		out.MaxTokens = max(out.MaxTokens, ev.tokens[g])
		sum += ev.tokens[g]
	}
	out.MeanTokens = sum / float64(G)
	out.Imbalance = 1
	if out.MeanTokens > 0 {
		out.Imbalance = out.MaxTokens / out.MeanTokens
	}
	out.ComputeTail = dur(r.tail)
	out.Dispatch = matrix(ev.disp, G)
	out.Combine = matrix(ev.comb, G)
	out.DispatchTime, out.CombineTime, out.CommTime = dur(r.disp), dur(r.comb), dur(comm)
	out.CrossNodeBytes = nicD + nicC
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
