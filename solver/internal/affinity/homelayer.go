package affinity

import (
	"math"
	"slices"
	"sync/atomic"

	"github.com/moetuner/moetuner/costmodel"
)

// shape is what every layer of a home-flow search shares: the cluster,
// the cost coefficients and the token sample.
type shape struct {
	N, P, G, E, K int
	speed         []float64 // per GPU
	slots         []int     // per GPU
	// split is the dispatch model bound to the start plan
	// (costmodel.Scenario.Splitter): exact for the moves that keep a
	// dealt table's random stream where it was (every swap of copies
	// between GPUs), its closed form otherwise; vLLM's hash counted token
	// by token where the scenario counts it. perSource says whether its
	// split depends on the source (costmodel.Scenario.PerSource).
	split     costmodel.Splitter
	perSource bool
	// keepCounts: split deals a table over one random stream (SGLang's
	// static dispatch), so a move that changes an expert's copy count
	// re-deals that expert and every expert after it, in this layer and
	// the later ones, which other goroutines search at the same time: no
	// layer could price its moves exactly. The search then keeps every
	// expert's copy count (no retargets) and only moves copies, which
	// split prices exactly.
	keepCounts bool
	// inexact is set when split priced some copies on its closed form
	// (Splitter.Split returned false): in SGLang's node trees a loaded map
	// deals every rank on a stream of its own, which a rank's moving into
	// or out of an expert's deal shifts, so the search's loads are not
	// the plan's as dealt (see repairDealt).
	inexact atomic.Bool
	ones    []int32 // one slot per copy

	// terms are the cost model's coefficients and formulas (compute,
	// layer time); perTok is terms.PerTokenSec.
	terms   costmodel.Terms
	perTok  float64
	copySec float64 // NIC seconds of one token copy (bytes / NIC bandwidth)
	nicLat  float64
	// cap is Problem.MaxImbalance: the cost then charges capW seconds per
	// second of compute by which the busiest GPU (the busiest node's mean
	// GPU at the node level) exceeds the cap times the mean.
	cap  costmodel.Cap
	capW float64
	// spillNanos and spillRuns sum, over the layers searched so far
	// under a deadline, the time each ran past its phases' deadline (the
	// steps bounded by work, not by the clock: capDescent, evenOut): each
	// layer's phases leave their mean (spill).
	spillNanos, spillRuns atomic.Int64
	// nv: the state also counts every token's reach per GPU and the
	// NVLink ports (nvSec seconds a copy), for clusters whose NVLink can
	// set a phase's time (see nvlinkShare).
	nv    bool
	nvSec float64
	// nvRatio is every layer's NVLink-to-NIC time ratio in the start's
	// dispatch (nil when unknown).
	nvRatio []float64

	// The sample: T tokens, each with a source GPU (tokens without one are
	// given one, spread round-robin, so that the sample's homes are even)
	// and a weight (the sample's weights add up to the trace's tokens).
	T   int
	src []int32
	w   []float64

	// nodesCut is set when a layer's node phase ran out of its share
	// before its first pass priced every relocation: under that deadline
	// the layers after it give the phase's share to the GPU phase.
	nodesCut atomic.Bool
}

// layer is one layer's data: the sample's experts, which tokens use each
// expert (sorted by source, with offsets per source), the exact loads and
// where they come from.
type layer struct {
	sh   *shape
	l    int
	ex   []int16   // T×K
	ids  []int32   // tokens by expert, each expert's sorted by source
	off  []int32   // E×G+1: tokens of expert e from source h are ids[off[e·G+h]:off[e·G+h+1]]
	load []float64 // E: exact routed tokens
	// share[h·E+e] is the fraction of expert e's tokens sourced on GPU h
	// (what the cost model uses for per-source dispatch); nil = even.
	share []float64
	// bud, when set, bounds and prices the slots that differ from a
	// running plan (Problem.Current).
	bud *budget
}

func (ly *layer) tokensFrom(e, h int) []int32 {
	G := ly.sh.G
	return ly.ids[ly.off[e*G+h]:ly.off[e*G+h+1]]
}

func (ly *layer) srcShare(h, e int) float64 {
	if ly.share == nil {
		return 1 / float64(ly.sh.G)
	}
	return ly.share[h*ly.sh.E+e]
}

// newLayer indexes layer l of the sample (experts ex, T×K).
func newLayer(sh *shape, l int, ex []int16, load, share []float64) *layer {
	E, G, K := sh.E, sh.G, sh.K
	ly := &layer{sh: sh, l: l, ex: ex, load: load, share: share}
	cnt := make([]int32, E*G+1)
	for t := 0; t < sh.T; t++ {
		h := int(sh.src[t])
		for _, e := range ex[t*K : (t+1)*K] {
			cnt[int(e)*G+h+1]++
		}
	}
	for i := 1; i < len(cnt); i++ {
		cnt[i] += cnt[i-1]
	}
	ly.off = slices.Clone(cnt)
	ly.ids = make([]int32, cnt[E*G])
	for t := 0; t < sh.T; t++ {
		h := int(sh.src[t])
		for _, e := range ex[t*K : (t+1)*K] {
			i := int(e)*G + h
			ly.ids[cnt[i]] = int32(t)
			cnt[i]++
		}
	}
	return ly
}

// eps snaps fractions: a node fraction within eps of 1 is certain, within
// eps of 0 absent.
const eps = 1e-9

// copyset is where one expert's copies are and what that implies: nf[h·N+B]
// is the probability that a token from source h is served on node B, cl[i]
// the tokens copy i (on gpus[i]) computes.
type copyset struct {
	gpus []int32
	nf   []float64
	cl   []float64
	// gf[h·n+i] is the fraction of source h's tokens that copy i serves
	// (with shape.nv).
	gf []float64
	// one[h] is the node that serves all of source h's tokens when one
	// does (nf's row h is 1 there and 0 elsewhere), else −1: the counters'
	// passes add such a row with one increment.
	one []int16
}

// setOne fills cs.one from cs.nf (G sources, N nodes).
func (cs *copyset) setOne(G, N int) {
	cs.one = slices.Grow(cs.one[:0], G)[:G]
	for h := 0; h < G; h++ {
		at, ones, other := int16(-1), 0, false
		for b, q := range cs.nf[h*N : (h+1)*N] {
			switch {
			case q == 1:
				at, ones = int16(b), ones+1
			case q != 0:
				other = true
			}
		}
		if ones != 1 || other {
			at = -1
		}
		cs.one[h] = at
	}
}

// state is one layer's placement with the counters its cost is computed
// from: per token and node the number of certain experts (z) and the
// product of 1 − q over the uncertain ones (pr), the NIC ports and the
// GPUs' tokens.
type state struct {
	ly   *layer
	cs   []copyset // per expert
	held [][]int16 // per GPU: the experts of its slots
	z    []uint8   // T×N
	pr   []float64 // T×N
	out  []float64 // G: NIC copies sent per source GPU (sample-weighted)
	in   []float64 // G: NIC copies received per GPU
	tok  []float64 // G: routed tokens (exact loads)
	// With shape.nv, per token and GPU the certain copies (zg) and the
	// product of the others' misses (pg), and every GPU's NVLink copies
	// out and in (a token reaching GPU g enters g's node at the GPU x
	// with its home's local index, its home's node at the home itself,
	// and crosses NVLink from x to g when x ≠ g).
	zg    []uint8   // T×G
	pg    []float64 // T×G
	nvOut []float64 // G
	nvIn  []float64 // G
	// kappa is the NIC ports' imbalance (max/mean − 1) the search keeps
	// for free: the start plan's.
	kappa float64
	// tie, with kappa 0, breaks the busiest port's ties by the others.
	tie bool
	// capOff leaves the cap's charge out of the cost (an annealing's
	// starting temperature is the NIC and compute moves', not the cap's).
	capOff bool
	// closedForm is set when a fill priced copies on the table's closed
	// form (Splitter.Split returned false); dealtExactly clears it before
	// it fills a move's copy sets.
	closedForm bool
	// changed is the slots that differ from the running plan (with a
	// budget).
	changed int

	frac []float64 // scratch G×n
	tr   trial
}

// used is the probability that a node with z certain experts and product pr
// of the others' misses is reached.
func used(z uint8, pr float64) float64 {
	if z > 0 {
		return 1
	}
	return 1 - pr
}

// fill computes cs's node fractions and copy loads from cs.gpus.
func (s *state) fill(e int, cs *copyset) {
	sh := s.ly.sh
	G, N, P := sh.G, sh.N, sh.P
	n := len(cs.gpus)
	if cap(cs.nf) < G*N {
		cs.nf = make([]float64, G*N)
	}
	cs.nf = cs.nf[:G*N]
	clear(cs.nf)
	cs.cl = slices.Grow(cs.cl[:0], n)[:n]
	clear(cs.cl)
	if sh.nv {
		cs.gf = slices.Grow(cs.gf[:0], G*n)[:G*n]
	}
	if n == 1 {
		b := int(cs.gpus[0]) / P
		for h := 0; h < G; h++ {
			cs.nf[h*N+b] = 1
		}
		cs.cl[0] = s.ly.load[e]
		if sh.nv {
			for h := range cs.gf {
				cs.gf[h] = 1
			}
		}
		cs.setOne(G, N)
		return
	}
	if cap(s.frac) < G*n {
		s.frac = make([]float64, G*n)
	}
	frac := s.frac[:G*n]
	if !sh.split.Split(s.ly.l, e, cs.gpus, sh.ones[:n], frac) {
		sh.inexact.Store(true)
		s.closedForm = true
	}
	if sh.nv {
		for i, q := range frac {
			switch {
			case q >= 1-eps:
				q = 1
			case q <= eps:
				q = 0
			}
			cs.gf[i] = q
		}
	}
	x := s.ly.load[e]
	for h := 0; h < G; h++ {
		xh := x * s.ly.srcShare(h, e)
		row := frac[h*n : (h+1)*n]
		nf := cs.nf[h*N : (h+1)*N]
		for i, g := range cs.gpus {
			nf[int(g)/P] += row[i]
			cs.cl[i] += xh * row[i]
		}
		for b := range nf {
			switch {
			case nf[b] >= 1-eps:
				nf[b] = 1
			case nf[b] <= eps:
				nf[b] = 0
			}
		}
	}
	cs.setOne(G, N)
}

// newState places ly by copies (per expert, its GPUs) and computes every
// counter.
func newState(ly *layer, copies [][]int32) *state {
	sh := ly.sh
	s := &state{
		ly:   ly,
		cs:   make([]copyset, sh.E),
		held: make([][]int16, sh.G),
		z:    make([]uint8, sh.T*sh.N),
		pr:   make([]float64, sh.T*sh.N),
		out:  make([]float64, sh.G),
		in:   make([]float64, sh.G),
		tok:  make([]float64, sh.G),
	}
	if sh.nv {
		s.zg = make([]uint8, sh.T*sh.G)
		s.pg = make([]float64, sh.T*sh.G)
		s.nvOut = make([]float64, sh.G)
		s.nvIn = make([]float64, sh.G)
	}
	s.tr.init(sh)
	for e, gs := range copies {
		s.cs[e].gpus = slices.Clone(gs)
		slices.Sort(s.cs[e].gpus)
		for _, g := range gs {
			s.held[g] = append(s.held[g], int16(e))
		}
	}
	s.resync()
	s.kappa = s.portImbalance()
	if b := ly.bud; b != nil {
		for g, es := range s.held {
			for _, e := range es {
				s.changed += b.Off(g, int(e))
			}
		}
	}
	return s
}

// newStateKappa is newState keeping the NIC imbalance allowance kappa of
// the plan the search started from.
func newStateKappa(ly *layer, copies [][]int32, kappa float64) *state {
	s := newState(ly, copies)
	s.kappa = kappa
	return s
}

// resync recomputes every counter from the copies.
func (s *state) resync() {
	sh := s.ly.sh
	N, K, P := sh.N, sh.K, sh.P
	clear(s.tok)
	for e := range s.cs {
		s.fill(e, &s.cs[e])
		for i, g := range s.cs[e].gpus {
			s.tok[g] += s.cs[e].cl[i]
		}
	}
	clear(s.out)
	clear(s.in)
	for t := 0; t < sh.T; t++ {
		h := int(sh.src[t])
		z, pr := s.z[t*N:(t+1)*N], s.pr[t*N:(t+1)*N]
		clear(z)
		for b := range pr {
			pr[b] = 1
		}
		for _, e := range s.ly.ex[t*K : (t+1)*K] {
			cs := &s.cs[e]
			if b := cs.one[h]; b >= 0 {
				z[b]++
				continue
			}
			row := cs.nf[h*N : (h+1)*N]
			for b, q := range row {
				switch {
				case q == 1:
					z[b]++
				case q > 0:
					pr[b] *= 1 - q
				}
			}
		}
		home := h / P
		r := 0.0
		for b := 0; b < N; b++ {
			if b == home {
				continue
			}
			u := sh.w[t] * used(z[b], pr[b])
			r += u
			s.in[b*P+h%P] += u
		}
		s.out[h] += r
	}
	if sh.nv {
		s.resyncNV()
	}
}

// resyncNV recomputes the per-GPU reach and the NVLink ports.
func (s *state) resyncNV() {
	sh := s.ly.sh
	G, K, P := sh.G, sh.K, sh.P
	clear(s.nvOut)
	clear(s.nvIn)
	for t := 0; t < sh.T; t++ {
		h := int(sh.src[t])
		z, pr := s.zg[t*G:(t+1)*G], s.pg[t*G:(t+1)*G]
		clear(z)
		for g := range pr {
			pr[g] = 1
		}
		for _, e := range s.ly.ex[t*K : (t+1)*K] {
			cs := &s.cs[e]
			n := len(cs.gpus)
			for i, g := range cs.gpus {
				switch q := cs.gf[h*n+i]; {
				case q == 1:
					z[g]++
				case q > 0:
					pr[g] *= 1 - q
				}
			}
		}
		for g := 0; g < G; g++ {
			if x := g/P*P + h%P; x != g {
				u := sh.w[t] * used(z[g], pr[g])
				s.nvOut[x] += u
				s.nvIn[g] += u
			}
		}
	}
}

// portImbalance is max(NIC port)/mean − 1 (0 without NIC traffic).
func (s *state) portImbalance() float64 {
	tot, mx := 0.0, 0.0
	for g := range s.out {
		tot += s.out[g]
		mx = math.Max(mx, math.Max(s.out[g], s.in[g]))
	}
	if tot <= 0 {
		return 0
	}
	return mx/(tot/float64(len(s.out))) - 1
}

// remote returns the sample's expected remote-node copies.
func (s *state) remote() float64 {
	tot := 0.0
	for _, v := range s.out {
		tot += v
	}
	return tot
}

// level selects the compute term of the objective: the busiest GPU, or
// the busiest node's mean GPU (what perfect balance within nodes would
// give: the node phase's view).
type level int

const (
	levelGPU level = iota
	levelNode
)

// cost is the surrogate layer time in seconds from GPU tokens tok and NIC
// ports out, in: the busiest GPU's (or node's) compute, and two all-to-all
// phases whose NIC time is the mean port plus whatever the busiest port
// exceeds the start's imbalance by (with no allowance left, the busiest
// port's, plus half the mean's where tie asks to break its ties).
func (s *state) cost(tok, out, in, nvo, nvi []float64, lv level) float64 {
	sh := s.ly.sh
	tail := 0.0
	if lv == levelGPU {
		for g, x := range tok {
			tail = math.Max(tail, sh.terms.Compute(g, x, float64(sh.slots[g])))
		}
	} else {
		for b := 0; b < sh.N; b++ {
			x, sl, sp := 0.0, 0.0, 0.0
			for g := b * sh.P; g < (b+1)*sh.P; g++ {
				x += tok[g]
				sl += float64(sh.slots[g])
				sp += sh.speed[g]
			}
			tail = math.Max(tail, sh.terms.ComputeAt(x, sl, sp))
		}
	}
	over := 0.0
	if sh.cap.On() && !s.capOff {
		group := 1
		if lv == levelNode {
			group = sh.P
		}
		over = sh.capW * sh.perTok * sh.cap.Excess(tok, sh.speed, group)
	}
	tot, mx := 0.0, 0.0
	for g := range out {
		tot += out[g]
		mx = math.Max(mx, math.Max(out[g], in[g]))
	}
	mean := tot / float64(len(out))
	nic := mean + math.Max(0, mx-(1+s.kappa)*mean)
	if s.kappa == 0 && s.tie {
		// The busiest port's, its ties broken by every copy at 1/(2G)
		// of one on the busiest (its chance of landing there among the
		// 2G ports): Σ out/(2G) is half the mean.
		nic = mx + mean/2
	}
	phase := nic * sh.copySec
	if sh.nv {
		nv := 0.0
		for g := range nvo {
			nv = math.Max(nv, math.Max(nvo[g], nvi[g]))
		}
		phase = math.Max(phase, nv*sh.nvSec)
	}
	if tot > 0 {
		phase += sh.nicLat
	}
	return sh.terms.LayerSec(tail, 2*phase, 0) + over
}

// overCap is how many tokens per unit of speed s's busiest GPU holds
// above the cap (0 within it or without one).
func (s *state) overCap() float64 {
	sh := s.ly.sh
	return sh.cap.Excess(s.tok, sh.speed, 1)
}

// busiestOverCap is the GPU with the most tokens per unit of speed when
// it holds more than the cap allows, else −1.
func (s *state) busiestOverCap() int {
	sh := s.ly.sh
	if sh.cap.Holds(s.tok, sh.speed) {
		return -1
	}
	_, top := costmodel.BalanceAt(s.tok, sh.speed)
	return top
}

// Cost is the current surrogate cost.
func (s *state) costNow(lv level) float64 {
	c := s.cost(s.tok, s.out, s.in, s.nvOut, s.nvIn, lv)
	if b := s.ly.bud; b != nil {
		c += b.Charge(s.changed)
	}
	return c
}

// imbalance is the busiest GPU's (or node's mean GPU's) tokens over the
// mean.
func (s *state) imbalance(lv level) float64 {
	sh := s.ly.sh
	tot, mx := 0.0, 0.0
	for _, x := range s.tok {
		tot += x
	}
	if lv == levelGPU {
		for _, x := range s.tok {
			mx = math.Max(mx, x)
		}
	} else {
		for b := 0; b < sh.N; b++ {
			c := 0.0
			for g := b * sh.P; g < (b+1)*sh.P; g++ {
				c += s.tok[g]
			}
			mx = math.Max(mx, c/float64(sh.P))
		}
	}
	if tot == 0 {
		return 1
	}
	return mx / (tot / float64(len(s.tok)))
}
