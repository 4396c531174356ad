package costmodel

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// MoveKind names what a Move does to one layer's slots.
type MoveKind int

const (
	// MoveSwap exchanges the GPUs of slots Slot and Other (two copies
	// trade places; every GPU keeps its slot count).
	MoveSwap MoveKind = iota
	// MoveRelocate puts slot Slot on GPU.
	MoveRelocate
	// MoveRetarget makes slot Slot hold a copy of Expert instead of its
	// expert: one copy fewer of the old expert, one more of Expert (copies
	// re-apportioned, the slot stays on its GPU).
	MoveRetarget
	// MoveAdd adds a slot holding a copy of Expert on GPU.
	MoveAdd
	// MoveDrop removes slot Slot (the last slot takes its index).
	MoveDrop
)

// String names the kind.
func (k MoveKind) String() string {
	switch k {
	case MoveSwap:
		return "swap"
	case MoveRelocate:
		return "relocate"
	case MoveRetarget:
		return "retarget"
	case MoveAdd:
		return "add"
	case MoveDrop:
		return "drop"
	}
	return fmt.Sprintf("MoveKind(%d)", int(k))
}

// Move is one change to one layer of a plan; fields a kind does not use
// are ignored.
type Move struct {
	Kind   MoveKind
	Layer  int
	Slot   int // the slot moved, retargeted or dropped; first of a swap
	Other  int // MoveSwap: the second slot
	GPU    placement.GPU
	Expert routing.Expert
}

// Evaluator holds a plan and the counters its modeled cost is computed
// from (routed tokens per GPU, token masses per source and destination
// GPU and node, per phase and layer) for one Scenario, and answers what a
// Move changes in time proportional to what the move touches: the tokens
// of the experts whose copies change (patterns), or those experts' loads
// (count-only home flow). Count-only chain flow recomputes the two
// transitions a move touches. Every search in moetuner drives one.
//
// Cost, LayerCost and Delta are exact up to floating-point rounding:
// Cost() equals Scenario.Evaluate(ev.Plan()).TimeSec within 1e-9
// relative, after any number of moves (Resync recomputes every counter).
// An Evaluator is not safe for concurrent use; searches use one per
// goroutine, or one per layer in the home flow where layers are
// independent.
type Evaluator struct {
	eng   *engine
	plan  *placement.Plan
	sh    []shares
	st    []layerState
	times []layerTimes
	// index[l] lists, per expert, the patterns that use it at layer l
	// (CSR: start[e]..start[e+1] into ids); built on first use of a layer.
	index []patternIndex

	// trial scratch: the moved layer's plan, shares and states of layers l
	// and l+1, and the move they belong to.
	trial struct {
		valid   bool
		m       Move
		lp      placement.LayerPlan
		sh      shares
		st      [2]layerState
		times   [2]layerTimes
		layers  int // 1, or 2 when layer l+1 changed too (chain flow)
		experts []int
		// global: the move moves a dispatch's random stream (a copy count
		// changed under SGLang's deal), so every later layer's split may
		// change: the trial is the whole plan's, rebound (all).
		global bool
		all    struct {
			split Splitter
			sh    []shares
			st    []layerState
			times []layerTimes
		}
	}
	stamp []uint32
	gen   uint32
	pats  []int32
	// destinations of one pattern at layer l−1, at layer l before and
	// after the move, and at layer l+1, and the change at layer l
	pPrev, pOld, pNew, pNext probBuf
	diff                     probDiff
	// TrialTokens' result
	tokBuf []float64
}

// probDiff is the change of one token's destination probabilities: dp[i]
// for GPU g[i], dq[i] for node b[i]; entries that do not change are left
// out.
type probDiff struct {
	g, b   []int32
	dp, dq []float64
	seen   []float64 // G: scratch
	nseen  []float64 // N
}

// set makes d = nw − old.
func (d *probDiff) set(old, nw *probBuf) {
	d.g, d.dp, d.b, d.dq = d.g[:0], d.dp[:0], d.b[:0], d.dq[:0]
	for j, g := range nw.g {
		d.seen[g] = nw.p[j]
	}
	for j, g := range old.g {
		if v := d.seen[g] - old.p[j]; v != 0 {
			d.g, d.dp = append(d.g, g), append(d.dp, v)
		}
		d.seen[g] = math.NaN() // handled
	}
	for j, g := range nw.g {
		if !math.IsNaN(d.seen[g]) {
			d.g, d.dp = append(d.g, g), append(d.dp, nw.p[j])
		}
		d.seen[g] = 0
	}
	for _, g := range old.g {
		d.seen[g] = 0
	}
	for j, b := range nw.b {
		d.nseen[b] = nw.q[j]
	}
	for j, b := range old.b {
		if v := d.nseen[b] - old.q[j]; v != 0 {
			d.b, d.dq = append(d.b, b), append(d.dq, v)
		}
		d.nseen[b] = math.NaN()
	}
	for j, b := range nw.b {
		if !math.IsNaN(d.nseen[b]) {
			d.b, d.dq = append(d.b, b), append(d.dq, nw.q[j])
		}
		d.nseen[b] = 0
	}
	for _, b := range old.b {
		d.nseen[b] = 0
	}
}

// addHomeDiff adds pattern pt's change of home mass d (source-free split).
func (ev *engine) addHomeDiff(pt *routing.Pattern, d *probDiff, ms *massSet) {
	G, N := ev.g, ev.n
	c := pt.Count
	m, nm := ms.um, ms.un
	if pt.Source >= 0 {
		m, nm = ms.mass[int(pt.Source)*G:], ms.nmass[int(pt.Source)*N:]
	}
	for j, g := range d.g {
		m[g] += c * d.dp[j]
	}
	for j, b := range d.b {
		nm[b] += c * d.dq[j]
	}
}

// addTransDiffIn adds pattern pt's change of transition mass into a layer
// whose destinations changed by d, from partial results at pa.
func (ev *engine) addTransDiffIn(pt *routing.Pattern, pa *probBuf, d *probDiff, ms *massSet) {
	G, N := ev.g, ev.n
	for j1, g1 := range pa.g {
		c := pt.Count * pa.p[j1]
		m := ms.mass[int(g1)*G:]
		for j2, g2 := range d.g {
			m[g2] += c * d.dp[j2]
		}
		nm := ms.nmass[int(g1)*N:]
		for j2, b := range d.b {
			nm[b] += c * d.dq[j2]
		}
	}
}

// addTransDiffOut adds pattern pt's change of transition mass out of a
// layer whose destinations changed by d, into destinations pc.
func (ev *engine) addTransDiffOut(pt *routing.Pattern, d *probDiff, pc *probBuf, ms *massSet) {
	G, N := ev.g, ev.n
	for j1, g1 := range d.g {
		c := pt.Count * d.dp[j1]
		m := ms.mass[int(g1)*G:]
		for j2, g2 := range pc.g {
			m[g2] += c * pc.p[j2]
		}
		nm := ms.nmass[int(g1)*N:]
		for j2, b := range pc.b {
			nm[b] += c * pc.q[j2]
		}
	}
}

// NewEvaluator prepares an Evaluator for plan (copied) under s. It fails
// when s or plan is invalid for the cost model (see Evaluate) or plan
// carries slot shares, which moves cannot keep consistent.
func (s Scenario) NewEvaluator(plan *placement.Plan) (*Evaluator, error) {
	eng, err := newEngine(s.Stats, s.Cluster, s.Model, s.Options())
	if err != nil {
		return nil, err
	}
	if plan != nil {
		for l, lp := range plan.Layers {
			if lp.SlotShare != nil {
				return nil, fmt.Errorf("costmodel: plan layer %d carries slot shares; moves cannot keep them consistent, so evaluate such plans with Evaluate", l)
			}
		}
	}
	sh, err := eng.planShares(plan)
	if err != nil {
		return nil, err
	}
	ev := &Evaluator{eng: eng, plan: plan.Clone(), sh: sh}
	G, N := eng.g, eng.n
	ev.st = make([]layerState, eng.l)
	ev.times = make([]layerTimes, eng.l)
	for l := range ev.st {
		ev.st[l].init(G, N)
	}
	ev.trial.sh = shares{}
	for i := range ev.trial.st {
		ev.trial.st[i].init(G, N)
	}
	if eng.usePatterns {
		ev.index = make([]patternIndex, eng.l)
		ev.stamp = make([]uint32, len(eng.stats.Patterns))
	}
	for _, pb := range []*probBuf{&ev.pPrev, &ev.pOld, &ev.pNew, &ev.pNext} {
		pb.init(G, N)
	}
	ev.diff.seen = make([]float64, G)
	ev.diff.nseen = make([]float64, N)
	ev.Resync()
	return ev, nil
}

// Resync recomputes every counter from the plan, discarding accumulated
// rounding.
func (ev *Evaluator) Resync() {
	for l := range ev.st {
		ev.eng.layerMasses(l, &ev.sh[l], ev.prevShares(l), &ev.st[l])
		ev.times[l] = ev.eng.finish(l, &ev.sh[l], &ev.st[l], nil)
	}
	ev.trial.valid = false
}

func (ev *Evaluator) prevShares(l int) *shares {
	if l > 0 {
		return &ev.sh[l-1]
	}
	return nil
}

// Cost returns the modeled end-to-end time in seconds (Σ of the layers'
// TimeSec, Report.TimeSec) of the current plan.
func (ev *Evaluator) Cost() float64 {
	t := 0.0
	for _, lt := range ev.times {
		t += lt.time
	}
	return t
}

// LayerCost returns layer l's modeled time in seconds (its TimeSec).
func (ev *Evaluator) LayerCost(l int) float64 { return ev.times[l].time }

// LayerTail returns layer l's compute tail in seconds: its busiest GPU's
// expert compute.
func (ev *Evaluator) LayerTail(l int) float64 { return ev.times[l].tail }

// LayerCrossNodeBytes returns layer l's NIC bytes over both phases.
func (ev *Evaluator) LayerCrossNodeBytes(l int) float64 { return ev.times[l].nicBytes }

// Tokens returns layer l's routed tokens per GPU. The slice is the
// evaluator's own: read it, do not keep or modify it.
func (ev *Evaluator) Tokens(l int) []float64 { return ev.st[l].tokens }

// Layers returns the number of layers.
func (ev *Evaluator) Layers() int { return ev.eng.l }

// Layer returns the current slots of layer l. The slices are the
// evaluator's own: read them, do not keep or modify them.
func (ev *Evaluator) Layer(l int) placement.LayerPlan { return ev.plan.Layers[l] }

// Plan returns a copy of the current plan.
func (ev *Evaluator) Plan() *placement.Plan { return ev.plan.Clone() }

// Options returns the evaluator's flow, mode, chunks and dispatch.
func (ev *Evaluator) Options() Options { return ev.eng.opts }

// Delta returns how much Cost would change if m were applied, without
// changing the plan. An error means the move is malformed (a slot or GPU
// out of range) or would leave an expert without a copy.
func (ev *Evaluator) Delta(m Move) (float64, error) {
	if err := ev.try(m); err != nil {
		return 0, err
	}
	t := &ev.trial
	d := 0.0
	if t.global {
		for i, lt := range t.all.times {
			d += lt.time - ev.times[i].time
		}
		return d, nil
	}
	for i := 0; i < t.layers; i++ {
		d += t.times[i].time - ev.times[m.Layer+i].time
	}
	return d, nil
}

// Apply applies m to the plan and updates every counter.
func (ev *Evaluator) Apply(m Move) error {
	if err := ev.try(m); err != nil {
		return err
	}
	t := &ev.trial
	l := m.Layer
	lp := &ev.plan.Layers[l]
	lp.SlotExpert = append(lp.SlotExpert[:0], t.lp.SlotExpert...)
	lp.SlotGPU = append(lp.SlotGPU[:0], t.lp.SlotGPU...)
	if t.global {
		ev.eng.split, ev.sh = t.all.split, t.all.sh
		ev.st, t.all.st = t.all.st, ev.st
		ev.times, t.all.times = t.all.times, ev.times
		t.all.sh, t.valid = nil, false
		return nil
	}
	ev.sh[l], t.sh = t.sh, ev.sh[l]
	for i := 0; i < t.layers; i++ {
		ev.st[l+i], t.st[i] = t.st[i], ev.st[l+i]
		ev.times[l+i] = t.times[i]
	}
	t.valid = false
	return nil
}

// Local reports whether m is priced on its own layer (and the next, in
// chain flow), false when it moves a dispatch's random stream (under
// SGLang's tables a copy count changed, or in the node trees a copy moved
// into or out of a rank's deal): such a move re-deals the whole plan and
// scores every layer again, tens of times a local trial's work. An error
// means m is malformed, as for Delta.
func (ev *Evaluator) Local(m Move) (bool, error) {
	t := &ev.trial
	if !(t.valid && t.m == m) {
		if err := ev.prepare(m); err != nil {
			return false, err
		}
	}
	return !t.global, nil
}

// try computes the trial state of m (reusing it when m was just tried).
func (ev *Evaluator) try(m Move) error {
	t := &ev.trial
	if t.valid && t.m == m {
		return nil
	}
	if err := ev.prepare(m); err != nil {
		return err
	}
	if t.global {
		if err := ev.globalTrial(m.Layer); err != nil {
			return err
		}
	} else {
		ev.trialStates(m.Layer)
	}
	t.m, t.valid = m, true
	return nil
}

// TrialTokens returns the routed tokens per GPU of layer m.Layer after m
// (what Tokens(m.Layer) would return once m is applied) without pricing
// the move: only the moved experts' tokens are recomputed, so it costs a
// small part of Delta. The slice belongs to the evaluator and is valid
// until its next Delta, TrialTokens, Apply or SetLayer.
func (ev *Evaluator) TrialTokens(m Move) ([]float64, error) {
	t := &ev.trial
	if t.valid && t.m == m && !t.global {
		return t.st[0].tokens, nil
	}
	if err := ev.prepare(m); err != nil {
		return nil, err
	}
	l := m.Layer
	if t.global {
		if err := ev.try(m); err != nil {
			return nil, err
		}
		return t.all.st[l].tokens, nil
	}
	ev.tokBuf = append(ev.tokBuf[:0], ev.st[l].tokens...)
	for _, e := range t.experts {
		ev.eng.addTokens(l, e, &ev.sh[l], -1, ev.tokBuf)
		ev.eng.addTokens(l, e, &t.sh, 1, ev.tokBuf)
	}
	return ev.tokBuf, nil
}

// prepare builds the trial plan, moved experts and shares of m, and
// marks the trial's states stale.
func (ev *Evaluator) prepare(m Move) error {
	t := &ev.trial
	t.valid = false
	eng := ev.eng
	l := m.Layer
	if l < 0 || l >= eng.l {
		return fmt.Errorf("costmodel: move on layer %d of %d", l, eng.l)
	}
	cur := ev.plan.Layers[l]
	S := len(cur.SlotExpert)
	t.lp.SlotExpert = append(t.lp.SlotExpert[:0], cur.SlotExpert...)
	t.lp.SlotGPU = append(t.lp.SlotGPU[:0], cur.SlotGPU...)
	t.experts = t.experts[:0]
	slot := func(s int) error {
		if s < 0 || s >= S {
			return fmt.Errorf("costmodel: move on layer %d: slot %d out of range [0,%d)", l, s, S)
		}
		return nil
	}
	gpu := func(g placement.GPU) error {
		if g < 0 || int(g) >= eng.g {
			return fmt.Errorf("costmodel: move on layer %d: GPU %d out of range [0,%d)", l, g, eng.g)
		}
		return nil
	}
	expert := func(e routing.Expert) error {
		if e < 0 || int(e) >= eng.e {
			return fmt.Errorf("costmodel: move on layer %d: expert %d out of range [0,%d)", l, e, eng.e)
		}
		return nil
	}
	switch m.Kind {
	case MoveSwap:
		if err := errors.Join(slot(m.Slot), slot(m.Other)); err != nil {
			return err
		}
		a, b := m.Slot, m.Other
		t.lp.SlotGPU[a], t.lp.SlotGPU[b] = t.lp.SlotGPU[b], t.lp.SlotGPU[a]
		if cur.SlotGPU[a] != cur.SlotGPU[b] && cur.SlotExpert[a] != cur.SlotExpert[b] {
			t.experts = append(t.experts, int(cur.SlotExpert[a]), int(cur.SlotExpert[b]))
		}
	case MoveRelocate:
		if err := errors.Join(slot(m.Slot), gpu(m.GPU)); err != nil {
			return err
		}
		t.lp.SlotGPU[m.Slot] = m.GPU
		t.experts = append(t.experts, int(cur.SlotExpert[m.Slot]))
	case MoveRetarget:
		if err := errors.Join(slot(m.Slot), expert(m.Expert)); err != nil {
			return err
		}
		t.lp.SlotExpert[m.Slot] = m.Expert
		if old := cur.SlotExpert[m.Slot]; old != m.Expert {
			t.experts = append(t.experts, int(old), int(m.Expert))
		}
	case MoveAdd:
		if err := errors.Join(gpu(m.GPU), expert(m.Expert)); err != nil {
			return err
		}
		t.lp.SlotExpert = append(t.lp.SlotExpert, m.Expert)
		t.lp.SlotGPU = append(t.lp.SlotGPU, m.GPU)
		t.experts = append(t.experts, int(m.Expert))
	case MoveDrop:
		if err := slot(m.Slot); err != nil {
			return err
		}
		last := S - 1
		t.lp.SlotExpert[m.Slot], t.lp.SlotGPU[m.Slot] = t.lp.SlotExpert[last], t.lp.SlotGPU[last]
		t.lp.SlotExpert, t.lp.SlotGPU = t.lp.SlotExpert[:last], t.lp.SlotGPU[:last]
		t.experts = append(t.experts, int(cur.SlotExpert[m.Slot]))
	default:
		return fmt.Errorf("costmodel: unknown move kind %v", m.Kind)
	}
	exact, err := t.sh.build(l, t.lp, eng.e, eng.g, eng.p, eng.opts.Dispatch, eng.split)
	if err != nil {
		return fmt.Errorf("costmodel: move on layer %d: %w", l, err)
	}
	t.global = !exact
	return nil
}

// globalTrial costs the plan with layer l's trial slots in full, rebinding
// the dispatch to it (trial.global).
func (ev *Evaluator) globalTrial(l int) error {
	eng, t := ev.eng, &ev.trial
	plan := ev.plan.Clone()
	plan.Layers[l] = placement.LayerPlan{SlotExpert: slices.Clone(t.lp.SlotExpert), SlotGPU: slices.Clone(t.lp.SlotGPU)}
	split, err := eng.newSplitter(plan)
	if err != nil {
		return fmt.Errorf("costmodel: move on layer %d: %w", l, err)
	}
	sh, err := eng.bindShares(plan, split)
	if err != nil {
		return fmt.Errorf("costmodel: move on layer %d: %w", l, err)
	}
	a := &t.all
	a.split, a.sh = split, sh
	if len(a.st) != eng.l {
		a.st = make([]layerState, eng.l)
		for i := range a.st {
			a.st[i].init(eng.g, eng.n)
		}
		a.times = make([]layerTimes, eng.l)
	}
	for i := range a.st {
		var prev *shares
		if i > 0 {
			prev = &sh[i-1]
		}
		eng.layerMasses(i, &sh[i], prev, &a.st[i])
		a.times[i] = eng.finish(i, &sh[i], &a.st[i], nil)
	}
	return nil
}

// trialStates fills the trial states of layer l (and l+1 in chain flow)
// from the current ones, replacing the contributions of the experts in
// trial.experts (old shares ev.sh[l], new trial.sh).
func (ev *Evaluator) trialStates(l int) {
	eng, t := ev.eng, &ev.trial
	old, nw := &ev.sh[l], &t.sh
	chain := eng.opts.Flow == FlowChain
	t.layers = 1
	if chain && l+1 < eng.l {
		t.layers = 2
	}
	st := &t.st[0]
	st.copyFrom(&ev.st[l])
	for _, e := range t.experts {
		eng.addTokens(l, e, old, -1, st.tokens)
		eng.addTokens(l, e, nw, 1, st.tokens)
	}
	var next *layerState
	if t.layers == 2 {
		next = &t.st[1]
		next.copyFrom(&ev.st[l+1])
	}
	if eng.usePatterns {
		k := eng.k
		for _, i := range ev.affected(l, t.experts) {
			pt := &eng.stats.Patterns[i]
			if pt.Count == 0 {
				continue
			}
			ex := pt.Experts[l*k : (l+1)*k]
			if old.perSource {
				// Home flow only: one home mass per source.
				eng.addHomePerSource(pt, ex, old, -1, &st.in)
				eng.addHomePerSource(pt, ex, nw, 1, &st.in)
				continue
			}
			ev.pOld.compute(ex, old)
			ev.pNew.compute(ex, nw)
			d := &ev.diff
			d.set(&ev.pOld, &ev.pNew)
			if len(d.g) == 0 && len(d.b) == 0 {
				continue // the move does not change where this token goes
			}
			if eng.homeIn(l) {
				eng.addHomeDiff(pt, d, &st.in)
			} else {
				ev.pPrev.compute(pt.Experts[(l-1)*k:l*k], &ev.sh[l-1])
				eng.addTransDiffIn(pt, &ev.pPrev, d, &st.in)
			}
			if eng.homeOut(l) {
				eng.addHomeDiff(pt, d, &st.out)
			}
			if next != nil {
				ev.pNext.compute(pt.Experts[(l+1)*k:(l+2)*k], &ev.sh[l+1])
				eng.addTransDiffOut(pt, d, &ev.pNext, &next.in)
			}
		}
	} else {
		homeCount := func(ms *massSet) {
			for _, e := range t.experts {
				eng.addHomeCount(l, e, old, -1, ms)
				eng.addHomeCount(l, e, nw, 1, ms)
			}
		}
		if eng.homeIn(l) {
			homeCount(&st.in)
		} else {
			st.in.reset()
			eng.transCounts(l, &ev.sh[l-1], nw, &st.in)
		}
		if eng.homeOut(l) {
			homeCount(&st.out)
		}
		if next != nil {
			next.in.reset()
			eng.transCounts(l+1, nw, &ev.sh[l+1], &next.in)
		}
	}
	t.times[0] = eng.finish(l, nw, st, nil)
	if next != nil {
		t.times[1] = eng.finish(l+1, &ev.sh[l+1], next, nil)
	}
}

// SetLayer replaces layer l's slots by lp (copied) and recomputes the
// counters it affects (layer l, and layer l+1's transition in chain flow).
func (ev *Evaluator) SetLayer(l int, lp placement.LayerPlan) error {
	eng := ev.eng
	if l < 0 || l >= eng.l {
		return fmt.Errorf("costmodel: layer %d of %d", l, eng.l)
	}
	if lp.SlotShare != nil {
		return fmt.Errorf("costmodel: layer %d carries slot shares; evaluate such plans with Evaluate", l)
	}
	var sh shares
	exact, err := sh.build(l, lp, eng.e, eng.g, eng.p, eng.opts.Dispatch, eng.split)
	if err != nil {
		return fmt.Errorf("costmodel: layer %d: %w", l, err)
	}
	dst := &ev.plan.Layers[l]
	dst.SlotExpert = append(dst.SlotExpert[:0], lp.SlotExpert...)
	dst.SlotGPU = append(dst.SlotGPU[:0], lp.SlotGPU...)
	if !exact {
		// The dispatch's stream moved: rebind it to the new plan.
		all, err := eng.planShares(ev.plan)
		if err != nil {
			return fmt.Errorf("costmodel: layer %d: %w", l, err)
		}
		ev.sh = all
		ev.Resync()
		return nil
	}
	ev.sh[l] = sh
	for i := l; i <= l+1 && i < eng.l; i++ {
		if i > l && eng.opts.Flow != FlowChain {
			break
		}
		eng.layerMasses(i, &ev.sh[i], ev.prevShares(i), &ev.st[i])
		ev.times[i] = eng.finish(i, &ev.sh[i], &ev.st[i], nil)
	}
	ev.trial.valid = false
	return nil
}
