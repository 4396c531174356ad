package costmodel

import (
	"fmt"
	"math"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// Per-step cost with activated experts.
//
// Evaluate charges every GPU for every expert slot it holds (slots_g ·
// perExpert: each held expert's weights are read from HBM once per layer),
// which is right for aggregated statistics and for prefill, where a step's
// thousands of tokens reach every expert. In decode a GPU's tokens are few,
// and a copy that receives no token in a step is not read at all: its time
// follows the experts its tokens activate in that step, not the slots it
// holds, as the Janus and Lynx studies of MoE decoding found. With
// per-step loads the cost model counts them:
//
//	a_i        = min(1, n_e · s_i)        copy i of expert e, n_e tokens for e in the step,
//	                                      s_i its share (SlotShare, else 1/c_e of c_e copies)
//	activated_g = Σ_{copies i on g} a_i
//	Compute_g  = (tokens_g·perToken + activated_g·perExpert) / Speed[g]
//
// a_i is the probability that copy i serves at least one token when the
// n_e tokens are split evenly: every copy once n_e ≥ c_e, else n_e of the
// c_e copies, on average. For a prefill step (n_e ≥ c_e everywhere) this
// is Evaluate's compute term exactly.

// ActivatedExperts returns, for each of the gpus GPUs, the expected number
// of the layer's expert copies that one step's load (load[e] = tokens
// routed to expert e in the step) activates on it, a_i above summed per
// GPU. Slots whose expert or GPU is out of range are skipped (Validate
// reports them). It does not keep load.
func ActivatedExperts(lp placement.LayerPlan, gpus int, load []float64) []float64 {
	out := make([]float64, max(gpus, 0))
	addActivated(out, lp, load, copyCounts(lp, len(load)))
	return out
}

// copyCounts returns the number of slots of every expert of lp (experts
// of load's length).
func copyCounts(lp placement.LayerPlan, experts int) []int {
	cnt := make([]int, experts)
	for _, e := range lp.SlotExpert {
		if int(e) >= 0 && int(e) < experts {
			cnt[e]++
		}
	}
	return cnt
}

// addActivated adds each copy's activation a_i to act[its GPU].
func addActivated(act []float64, lp placement.LayerPlan, load []float64, cnt []int) {
	n := min(len(lp.SlotExpert), len(lp.SlotGPU))
	for s := range n {
		e, g := int(lp.SlotExpert[s]), int(lp.SlotGPU[s])
		if e < 0 || e >= len(load) || g < 0 || g >= len(act) {
			continue
		}
		share := 1 / float64(cnt[e])
		if lp.SlotShare != nil && s < len(lp.SlotShare) {
			share = lp.SlotShare[s]
		}
		act[g] += math.Min(1, load[e]*share)
	}
}

// addTokens adds each copy's tokens (its share of load) to tok[its GPU].
func addTokens(tok []float64, lp placement.LayerPlan, load []float64, cnt []int) {
	n := min(len(lp.SlotExpert), len(lp.SlotGPU))
	for s := range n {
		e, g := int(lp.SlotExpert[s]), int(lp.SlotGPU[s])
		if e < 0 || e >= len(load) || g < 0 || g >= len(tok) {
			continue
		}
		share := 1 / float64(cnt[e])
		if lp.SlotShare != nil && s < len(lp.SlotShare) {
			share = lp.SlotShare[s]
		}
		tok[g] += load[e] * share
	}
}

// StepCompute returns the modeled expert compute time, in seconds, of
// every GPU for one layer in one step (Compute_g above: routed tokens plus
// activated experts, divided by the GPU's speed) and its maximum, the
// layer's compute tail in that step. load[e] is the step's tokens for
// expert e; lp must hold plan slots on c.GPUs() GPUs.
func StepCompute(lp placement.LayerPlan, load []float64, c Cluster, m Model) (perGPU []float64, tail float64) {
	G := c.GPUs()
	t := NewTerms(c, m, Sequential, 0)
	cnt := copyCounts(lp, len(load))
	tok := make([]float64, G)
	act := make([]float64, G)
	addTokens(tok, lp, load, cnt)
	addActivated(act, lp, load, cnt)
	perGPU = tok // reused
	for g := range G {
		perGPU[g] = t.Compute(g, tok[g], act[g])
		tail = math.Max(tail, perGPU[g])
	}
	return perGPU, tail
}

// StepTime models one forward pass with the per-step loads load[l][e]
// (tokens routed to expert e at MoE layer l in that pass; topK is the
// model's routing top-k, used for the token count): Evaluate of plan on
// count-only statistics of that step, with each layer's compute tail
// replaced by StepCompute's, so that copies the step does not activate
// cost nothing (under a dispatch other than even, with every GPU's routed
// tokens as that dispatch deals them). Layer times then combine as in Evaluate (Sequential:
// dispatch + tail + combine; Overlapped: max(tail·(1+σ), comm) +
// comm/Chunks). It returns the seconds summed over layers, or an error
// when the inputs disagree (as Evaluate).
func StepTime(plan *placement.Plan, load [][]float64, topK int, c Cluster, m Model, opts Options) (float64, error) {
	sec, _, err := StepEvaluate(plan, load, topK, c, m, opts)
	return sec, err
}

// StepEvaluate is StepTime with the Evaluate report it builds on, whose
// layers' Balance (and MeanBalance) is the step's busiest GPU over the
// mean as opts.Dispatch deals its tokens. The report's times are
// Evaluate's, not the step's; the seconds are StepTime's.
func StepEvaluate(plan *placement.Plan, load [][]float64, topK int, c Cluster, m Model, opts Options) (float64, *Report, error) {
	if plan == nil {
		return 0, nil, fmt.Errorf("costmodel: step time: nil plan")
	}
	if len(load) != len(plan.Layers) {
		return 0, nil, fmt.Errorf("costmodel: step time: the step has %d layers, the plan %d", len(load), len(plan.Layers))
	}
	st := routing.StatsFromLoad(load, topK)
	rep, err := Evaluate(plan, st, c, m, opts)
	if err != nil {
		return 0, nil, err
	}
	tails := layerTails(plan, load, c, m, opts.Dispatch, func(l int) []float64 { return rep.Layers[l].Tokens })
	t := NewTerms(c, m, opts.Mode, opts.Chunks)
	total := 0.0
	for l, lr := range rep.Layers {
		total += t.LayerSec(tails[l], lr.DispatchTime.Seconds()+lr.CombineTime.Seconds(), 0)
	}
	return total, rep, nil
}

// StepTails returns the compute tail, in seconds, of every layer of plan
// in one step with loads load[l][e] (topK is the model's routing top-k):
// StepCompute's tail under even dispatch, under any other the tail with
// every GPU's routed tokens as opts.Dispatch deals them (the
// LayerReport.Tokens of Evaluate on count-only statistics of the step, up
// to rounding).
// They are the tails StepTime's seconds are built on. SGLang's tables deal
// the whole plan at once, so a layer's tail depends on the other layers'
// copies: score whole plans. It returns an error when the inputs disagree
// (as StepTime). To score many steps of one plan, NewStepScorer binds the
// dispatch once.
func StepTails(plan *placement.Plan, load [][]float64, topK int, c Cluster, m Model, opts Options) ([]float64, error) {
	sc, err := NewStepScorer(plan, topK, c, m, opts)
	if err != nil {
		return nil, err
	}
	return sc.Tails(load)
}

// A StepScorer is StepTails for one plan and many steps: the plan is
// checked and bound to the dispatch once (dealing SGLang's table is what
// costs, and it does not depend on the step), and each step's tails then
// cost one pass over the layers' copies. Count-only steps send an equal
// share of every expert's tokens from each source GPU, so the bound
// shares are averaged over the sources once: a step's GPU tokens are
// Evaluate's LayerReport.Tokens up to rounding. It keeps plan (which must
// not change meanwhile) and is not safe for concurrent use.
type StepScorer struct {
	plan *placement.Plan
	topK int
	c    Cluster
	m    Model
	opts Options
	// sh are the plan's shares bound to the dispatch and w[l][i] the
	// share of expert e's tokens that GPU sh[l].cg[i] computes, for i in
	// [sh[l].cs[e], sh[l].cs[e+1]), averaged over the sources (both nil
	// under even dispatch, which needs neither).
	sh  []shares
	w   [][]float64
	tok []float64
}

// NewStepScorer binds plan to c, m and opts.Dispatch for StepTails of its
// steps (topK is the model's routing top-k), or returns an error when
// plan does not fit them (as Evaluate).
func NewStepScorer(plan *placement.Plan, topK int, c Cluster, m Model, opts Options) (*StepScorer, error) {
	if plan == nil {
		return nil, fmt.Errorf("costmodel: step time: nil plan")
	}
	zero := make([][]float64, len(plan.Layers))
	for l := range zero {
		zero[l] = make([]float64, m.Experts)
	}
	ev, err := newEngine(routing.StatsFromLoad(zero, topK), c, m, opts)
	if err != nil {
		return nil, err
	}
	sh, err := ev.planShares(plan)
	if err != nil {
		return nil, err
	}
	s := &StepScorer{plan: plan, topK: topK, c: c, m: m, opts: opts, tok: make([]float64, c.GPUs())}
	if opts.Dispatch != placement.DispatchEven {
		s.sh, s.w = sh, sourceMeans(ev, sh)
	}
	return s, nil
}

// sourceMeans is every layer's shares of sh averaged over the source GPUs
// as ev's statistics source them (count-only: evenly), what addTokens
// adds up per source, summed once.
func sourceMeans(ev *engine, sh []shares) [][]float64 {
	w := make([][]float64, len(sh))
	G := ev.g
	for l := range sh {
		s := &sh[l]
		w[l] = make([]float64, len(s.cg))
		for e := range ev.e {
			a, b := int(s.cs[e]), int(s.cs[e+1])
			if !s.perSource {
				copy(w[l][a:b], s.cw[a:b])
				continue
			}
			n := b - a
			for h := range G {
				src := ev.srcShare(l, h, e)
				hw := s.hw[a*G+h*n : a*G+(h+1)*n]
				for i := range n {
					w[l][a+i] += src * hw[i]
				}
			}
		}
	}
	return w
}

// Tails returns StepTails of the bound plan for one step's loads
// load[l][e], or an error when they do not fit the plan and model.
func (s *StepScorer) Tails(load [][]float64) ([]float64, error) {
	if len(load) != len(s.plan.Layers) {
		return nil, fmt.Errorf("costmodel: step time: the step has %d layers, the plan %d", len(load), len(s.plan.Layers))
	}
	ev, err := newEngine(routing.StatsFromLoad(load, s.topK), s.c, s.m, s.opts)
	if err != nil {
		return nil, err
	}
	sh, w := s.sh, s.w
	if _, hashed := ev.fixed.(*hashSplit); hashed {
		// vLLM's hash counts the step's own tokens: bind it to them.
		if sh, err = ev.planShares(s.plan); err != nil {
			return nil, err
		}
		w = sourceMeans(ev, sh)
	}
	return layerTails(s.plan, load, s.c, s.m, s.opts.Dispatch, func(l int) []float64 {
		clear(s.tok)
		sl, wl := &sh[l], w[l]
		for e, x := range load[l] {
			for i := sl.cs[e]; i < sl.cs[e+1]; i++ {
				s.tok[sl.cg[i]] += x * wl[i]
			}
		}
		return s.tok
	}), nil
}

// layerTails is every layer's compute tail of plan in one step with loads
// load: StepCompute's under even dispatch d, under any other stepTail of
// tok(l), the GPUs' routed tokens at layer l as d deals them.
func layerTails(plan *placement.Plan, load [][]float64, c Cluster, m Model, d placement.Dispatch, tok func(l int) []float64) []float64 {
	out := make([]float64, len(plan.Layers))
	for l, lp := range plan.Layers {
		if d != placement.DispatchEven {
			// The dispatch decides which copy computes a token.
			if x := tok(l); len(x) == c.GPUs() {
				out[l] = stepTail(lp, load[l], x, c, m)
				continue
			}
		}
		_, out[l] = StepCompute(lp, load[l], c, m)
	}
	return out
}

// stepTail is StepCompute's tail with every GPU's routed tokens given
// (tok: as a dispatch deals them) instead of the even split.
func stepTail(lp placement.LayerPlan, load, tok []float64, c Cluster, m Model) float64 {
	t := NewTerms(c, m, Sequential, 0)
	act := make([]float64, c.GPUs())
	addActivated(act, lp, load, copyCounts(lp, len(load)))
	tail := 0.0
	for g := range act {
		tail = math.Max(tail, t.Compute(g, tok[g], act[g]))
	}
	return tail
}
