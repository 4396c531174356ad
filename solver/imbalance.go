package solver

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/replica"
)

// layerRatio is a layer's busiest/mean load the way Problem.MaxImbalance
// measures it: the largest tokens/speed over Σ tokens / Σ speed.
func layerRatio(tok, speed []float64) (ratio float64, busiest int) {
	var sum, ssum, peak float64
	for g, t := range tok {
		sum += t
		ssum += speed[g]
		if v := t / speed[g]; v > peak {
			peak, busiest = v, g
		}
	}
	if sum <= 0 {
		return 1, busiest
	}
	return peak / (sum / ssum), busiest
}

// imbalanceFloor is a lower bound on layer l's busiest/mean over every
// plan with lp's copy counts and slots per GPU: the GPU that holds a copy
// of expert e gets that copy's tokens (all of them with a single copy, its
// share under even dispatch) and fills its other slots with copies that
// bring at least the least tokens there are (a single copy its expert's
// load, a copy of a replicated expert its share under even dispatch and
// nothing otherwise: static and local dispatch may send it none). It
// returns the bound and the expert that sets it (−1: none above 1).
func imbalanceFloor(p Problem, l int, lp placement.LayerPlan, speed []float64) (float64, int) {
	load := p.Stats.Load[l]
	copies := make([]int, len(load))
	for _, e := range lp.SlotExpert {
		copies[e]++
	}
	var sum, ssum float64
	for _, v := range load {
		sum += v
	}
	for _, s := range speed {
		ssum += s
	}
	if sum <= 0 {
		return 1, -1
	}
	perGPU := make([]int, len(speed))
	for _, g := range lp.SlotGPU {
		perGPU[g]++
	}
	fewest := slices.Min(perGPU)
	// least[i]: what a slot brings at least, slots sorted by it.
	type slotMin struct {
		v float64
		e routing.Expert
	}
	least := make([]slotMin, len(lp.SlotExpert))
	for s, e := range lp.SlotExpert {
		v := 0.0
		if c := copies[e]; c == 1 || p.Dispatch == placement.DispatchEven {
			v = load[e] / float64(c)
		}
		least[s] = slotMin{v, e}
	}
	slices.SortFunc(least, func(x, y slotMin) int { return cmp.Compare(x.v, y.v) })
	fast := slices.Max(speed)
	floor, who := 1.0, -1
	for e, v := range load {
		c := copies[e]
		if c == 0 || (c > 1 && p.Dispatch != placement.DispatchEven) {
			continue // static and local dispatch may send a copy less than its share
		}
		t := v / float64(c)
		n := 0
		for _, sm := range least {
			if n == fewest-1 {
				break
			}
			if int(sm.e) != e {
				t += sm.v
				n++
			}
		}
		if r := t / fast / (sum / ssum); r > floor {
			floor, who = r, e
		}
	}
	return floor, who
}

// capImbalance changes plan, in place, until every layer's busiest/mean
// (layerRatio; rep is plan's report, or nil) is at most
// p.MaxImbalance, by swapping copies between the busiest GPU and another
// and re-apportioning copies (within its node under expert groups; within
// Options.MaxMoves changed slots of p.Current): repairLayer. A layer the
// moves cannot bring under the cap starts again from the balance-first baseline's layer (fallback),
// where its slots per GPU are the plan's. It stops at deadline; layers
// still above the cap make an *InfeasibleError naming the worst and what
// would fix it. It returns how many layers it changed.
func capImbalance(ctx context.Context, p Problem, opts Options, plan *placement.Plan, rep *costmodel.Report, fallback *placement.Plan, deadline time.Time) (int, error) {
	limit := p.MaxImbalance
	const tol = 1e-9
	speed := make([]float64, plan.GPUs)
	for g := range speed {
		speed[g] = p.Cluster.SpeedOf(g)
	}
	// Without a report the evaluator, which the repair needs anyway, gives
	// the tokens.
	var ev *costmodel.Evaluator
	var err error
	if rep == nil {
		if ev, err = p.Scenario().NewEvaluator(plan); err != nil {
			return 0, err
		}
	}
	var over []int
	for l := range plan.Layers {
		var tok []float64
		if ev != nil {
			tok = ev.Tokens(l)
		} else {
			tok = rep.Layers[l].Tokens
		}
		if r, _ := layerRatio(tok, speed); r > limit*(1+tol) {
			over = append(over, l)
		}
	}
	if len(over) == 0 {
		return 0, nil
	}
	if ev == nil {
		if ev, err = p.Scenario().NewEvaluator(plan); err != nil {
			return 0, err
		}
	}
	type miss struct {
		layer  int
		ratio  float64
		floor  float64
		expert int
	}
	var misses []miss
	changed := 0
	for _, l := range over {
		orig := cloneLayer(ev.Layer(l))
		r := repairLayer(ctx, p, opts, ev, l, speed, deadline)
		if r > limit*(1+tol) && fallback != nil && sameSlotsPerGPU(fallback.Layers[l], orig, plan.GPUs) &&
			(p.Current == nil || opts.MaxMoves <= 0 || placement.ChangedSlots(p.Current.Layers[l], fallback.Layers[l]) <= opts.MaxMoves) {
			mine := cloneLayer(ev.Layer(l))
			if err := ev.SetLayer(l, fallback.Layers[l]); err != nil {
				return 0, err
			}
			if r2 := repairLayer(ctx, p, opts, ev, l, speed, deadline); r2 < r {
				r = r2
			} else if err := ev.SetLayer(l, mine); err != nil {
				return 0, err
			}
		}
		if !layerEqual(orig, ev.Layer(l)) {
			changed++
		}
		if r > limit*(1+tol) {
			f, e := imbalanceFloor(p, l, ev.Layer(l), speed)
			misses = append(misses, miss{l, r, f, e})
		}
	}
	if len(misses) > 0 {
		worst := misses[0]
		for _, m := range misses[1:] {
			if m.ratio > worst.ratio {
				worst = m
			}
		}
		why := "the search found no plan under it"
		if time.Now().After(deadline) {
			why = "the time limit ended before the search found a plan under it (raise Options.TimeLimit)"
		}
		fix := fmt.Sprintf("raise Problem.MaxImbalance to %.4g", worst.ratio)
		if worst.floor > limit*(1+tol) && worst.expert >= 0 {
			who := fmt.Sprintf("expert %d", worst.expert)
			if lp := ev.Layer(worst.layer); len(lp.SlotExpert) > p.Stats.Experts {
				// With copies the bound holds for the plan's copy counts,
				// which the repair's retargets could not change enough.
				n := 0
				for _, e := range lp.SlotExpert {
					if int(e) == worst.expert {
						n++
					}
				}
				who += fmt.Sprintf(" with its %d %s", n, map[bool]string{true: "copy", false: "copies"}[n == 1])
			}
			why = fmt.Sprintf("%s gives its GPU at least %.4g× the mean, even with the lightest copies beside it", who, worst.floor)
		}
		if p.RedundantSlots == 0 && p.SlotsPerGPU == nil {
			fix += " or add redundant slots (Problem.RedundantSlots) so that hot experts get copies"
		} else {
			fix += " or add redundant slots (Problem.RedundantSlots)"
		}
		return changed, &InfeasibleError{Constraint: "max imbalance", Detail: fmt.Sprintf(
			"%d of %d layers stay above Problem.MaxImbalance %.4g; the worst, layer %d, is at %.4g: %s; %s",
			len(misses), len(plan.Layers), limit, worst.layer, worst.ratio, why, fix)}
	}
	*plan = *ev.Plan()
	return changed, nil
}

// repairLayer runs capImbalance's moves on layer l of ev and returns the
// layer's busiest/mean at the end. A step ranks, by the busiest GPU their
// shares (load over copies) predict, the swaps between a copy on the
// busiest GPU and a copy with a smaller share elsewhere, and the
// retargets: a slot elsewhere whose expert has another copy takes a copy
// of an expert on the busiest GPU, or a spare copy on the busiest GPU
// holds an expert whose share would be smaller. It reads the exact tokens
// (TrialTokens: the dispatch may send a copy more or less than its share)
// of the first ones, as many as there are GPUs and on until one lowers
// the GPUs' excess over the cap. Of those that meet the cap it prices, on
// the full cost (Delta), the one with the lowest busiest GPU towards each
// node, the part of the cost a move changes most, and makes the cheapest;
// when none meets the cap, it makes the one with the least excess.
func repairLayer(ctx context.Context, p Problem, opts Options, ev *costmodel.Evaluator, l int, speed []float64, deadline time.Time) float64 {
	limit := p.MaxImbalance
	gpn := p.Cluster.GPUsPerNode
	load := p.Stats.Load[l]
	budget := p.Current != nil && opts.MaxMoves > 0
	type cand struct {
		m          costmodel.Move
		ratio, exc float64
	}
	var level float64 // the cap in tokens per unit of speed
	{
		var sum, ssum float64
		for g, t := range ev.Tokens(l) {
			sum, ssum = sum+t, ssum+speed[g]
		}
		level = limit * sum / ssum
	}
	// excess is what the moves lower: the GPUs' squared tokens per unit
	// of speed above the cap, 0 once it is met. Unlike the busiest GPU
	// alone it falls when one of several GPUs at the peak comes down.
	excess := func(tok []float64) float64 {
		x := 0.0
		for g, t := range tok {
			if d := t/speed[g] - level; d > 0 {
				x += d * d
			}
		}
		return x
	}
	fits := make([]cand, p.Cluster.Nodes)
	for {
		tok := ev.Tokens(l)
		ratio, gb := layerRatio(tok, speed)
		if ratio <= limit || ctx.Err() != nil || time.Now().After(deadline) {
			return ratio
		}
		exc0 := excess(tok)
		lp := ev.Layer(l)
		copies := make([]int, p.Stats.Experts)
		holds := make(map[[2]int32]bool, len(lp.SlotExpert))
		holders := make([][]placement.GPU, p.Stats.Experts)
		for s, e := range lp.SlotExpert {
			holders[e] = append(holders[e], lp.SlotGPU[s])
			copies[e]++
			holds[[2]int32{int32(lp.SlotGPU[s]), int32(e)}] = true
		}
		share := func(s int) float64 { e := lp.SlotExpert[s]; return load[e] / float64(copies[e]) }
		for i := range fits {
			fits[i] = cand{ratio: math.Inf(1)}
		}
		best := cand{ratio: math.Inf(1), exc: exc0}
		// The candidates, by the peak their shares predict: swaps of a
		// copy on the busiest GPU with a copy of smaller share elsewhere,
		// and, where an expert has copies to spare, retargets that give
		// one of the busiest GPU's experts a copy more (a slot elsewhere
		// whose expert has another copy) or take a spare copy off it.
		var cands []repairCand
		onNode := func(f routing.Expert, g int) bool { // f has a copy on g's node
			return slices.ContainsFunc(holders[f], func(x placement.GPU) bool { return int(x)/gpn == g/gpn })
		}
		after := func(e routing.Expert, c int) float64 { return load[e] / float64(c) }
		// gain is the busiest of e's copies but the one on GPU x once each
		// takes d tokens more (e lost a copy), per unit of speed.
		gain := func(e routing.Expert, x int, d float64) float64 {
			peak := 0.0
			for _, g := range holders[e] {
				if int(g) != x {
					peak = max(peak, (tok[g]+d)/speed[g])
				}
			}
			return peak
		}
		for a, ga := range lp.SlotGPU {
			if int(ga) != gb {
				continue
			}
			f := lp.SlotExpert[a]
			sa := share(a)
			for b, gh := range lp.SlotGPU {
				h := int(gh)
				if h == gb || (p.ExpertGroups > 0 && h/gpn != gb/gpn) {
					continue
				}
				e := lp.SlotExpert[b]
				sb := share(b)
				if sb < sa && !holds[[2]int32{int32(h), int32(f)}] && !holds[[2]int32{int32(gb), int32(e)}] {
					cands = append(cands, repairCand{
						m:    costmodel.Move{Kind: costmodel.MoveSwap, Layer: l, Slot: a, Other: b},
						node: h / gpn, est: max((tok[gb]-sa+sb)/speed[gb], (tok[h]-sb+sa)/speed[h])})
				}
				// Slot b takes a copy of f: f's share on the busiest GPU
				// falls, e's other copies take b's share.
				if e != f && copies[e] > 1 && !holds[[2]int32{int32(h), int32(f)}] {
					nf := after(f, copies[f]+1)
					est := max((tok[gb]-sa+nf)/speed[gb], (tok[h]-sb+nf)/speed[h], gain(e, h, after(e, copies[e]-1)-sb))
					cands = append(cands, repairCand{
						m:    costmodel.Move{Kind: costmodel.MoveRetarget, Layer: l, Slot: b, Expert: f},
						node: h / gpn, est: est})
				}
			}
			// Slot a, a spare copy, holds another expert instead.
			if copies[f] < 2 {
				continue
			}
			for e := range p.Stats.Experts {
				ex := routing.Expert(e)
				if ex == f || holds[[2]int32{int32(gb), int32(e)}] || (p.ExpertGroups > 0 && !onNode(ex, gb)) {
					continue
				}
				if nf := after(ex, copies[e]+1); nf < sa {
					cands = append(cands, repairCand{
						m:    costmodel.Move{Kind: costmodel.MoveRetarget, Layer: l, Slot: a, Expert: ex},
						node: gb / gpn, est: max((tok[gb]-sa+nf)/speed[gb], gain(f, gb, after(f, copies[f]-1)-sa))})
				}
			}
		}
		slices.SortFunc(cands, func(x, y repairCand) int { return cmp.Compare(x.est, y.est) })
		// The exact tokens of the most promising ones: as many as there
		// are GPUs, and on down the list until one lowers the excess.
		next := cloneLayer(lp)
		for i, c := range cands {
			if i >= len(speed) && best.exc < exc0 {
				break
			}
			if budget && changedAfter(p.Current.Layers[l], next, c.m) > opts.MaxMoves {
				continue
			}
			nt, err := ev.TrialTokens(c.m)
			if err != nil {
				continue
			}
			x := excess(nt)
			if x >= exc0*(1-1e-12) {
				continue
			}
			r, _ := layerRatio(nt, speed)
			if r <= limit && r < fits[c.node].ratio {
				fits[c.node] = cand{c.m, r, x}
			}
			if x < best.exc {
				best = cand{c.m, r, x}
			}
		}
		pick, cost := best, math.Inf(1)
		for _, c := range fits {
			if math.IsInf(c.ratio, 1) {
				continue
			}
			if d, err := ev.Delta(c.m); err == nil && d < cost {
				pick, cost = c, d
			}
		}
		if pick.exc >= exc0 {
			return ratio
		}
		if err := ev.Apply(pick.m); err != nil {
			return ratio
		}
	}
}

// repairCand is one of repairLayer's moves: the node it moves tokens
// towards and the busiest GPU per unit of speed its shares predict.
type repairCand struct {
	m    costmodel.Move
	node int
	est  float64
}

// changedAfter is placement.ChangedSlots(prev, next after m), with next
// back as it was on return; m is a swap or a retarget of next's slots.
func changedAfter(prev, next placement.LayerPlan, m costmodel.Move) int {
	switch m.Kind {
	case costmodel.MoveSwap:
		a, b := m.Slot, m.Other
		next.SlotGPU[a], next.SlotGPU[b] = next.SlotGPU[b], next.SlotGPU[a]
		n := placement.ChangedSlots(prev, next)
		next.SlotGPU[a], next.SlotGPU[b] = next.SlotGPU[b], next.SlotGPU[a]
		return n
	case costmodel.MoveRetarget:
		old := next.SlotExpert[m.Slot]
		next.SlotExpert[m.Slot] = m.Expert
		n := placement.ChangedSlots(prev, next)
		next.SlotExpert[m.Slot] = old
		return n
	}
	return math.MaxInt
}

func cloneLayer(lp placement.LayerPlan) placement.LayerPlan {
	return placement.LayerPlan{SlotExpert: slices.Clone(lp.SlotExpert), SlotGPU: slices.Clone(lp.SlotGPU), SlotShare: slices.Clone(lp.SlotShare)}
}

func layerEqual(a, b placement.LayerPlan) bool {
	return slices.Equal(a.SlotExpert, b.SlotExpert) && slices.Equal(a.SlotGPU, b.SlotGPU)
}

// sameSlotsPerGPU reports whether a and b give every GPU as many slots.
func sameSlotsPerGPU(a, b placement.LayerPlan, G int) bool {
	n := make([]int, G)
	for _, g := range a.SlotGPU {
		n[g]++
	}
	for _, g := range b.SlotGPU {
		n[g]--
	}
	for _, v := range n {
		if v != 0 {
			return false
		}
	}
	return true
}

// imbalanceEvals is how many evaluations of the plan the repair behind
// Problem.MaxImbalance is given at the end of a solve (0 without a cap):
// building its evaluator (up to two), scoring the repaired plan (one),
// and one step on a quarter of the layers, a step pricing one swap
// towards each node at about a layer's part of an evaluation each
// (Nodes/4 evaluations in all). On the 32k DeepSeek-V3 trace, 4 × 8 GPUs,
// the search left 13 of 58 layers above a cap of 1.004 (home flow, 32
// redundant slots, static dispatch) and 4 above 1.2 (chain flow). Layers
// the time does not reach take the balance-first baseline's layer
// (capImbalance), which costs a layer's part of an evaluation.
func imbalanceEvals(p Problem) float64 {
	if p.MaxImbalance <= 0 {
		return 0
	}
	return 3 + float64(p.Cluster.Nodes)/4
}

// capPlan is capImbalance with the balance-first baseline of p's shape as
// the fallback: hierarchical EPLB under expert groups, EPLB with
// redundant slots, greedy without.
func capPlan(ctx context.Context, p Problem, opts Options, plan *placement.Plan, rep *costmodel.Report, deadline time.Time) (int, error) {
	var fallback *placement.Plan
	var err error
	switch {
	case p.ExpertGroups > 0:
		fallback, err = Baseline(p, StrategyEPLBHierarchical)
	case p.replicated():
		fallback, err = Baseline(p, StrategyEPLB)
	default:
		fallback, err = Baseline(p, StrategyGreedy)
	}
	if err != nil {
		fallback = nil // capImbalance then repairs the plan's own layers only
	}
	return capImbalance(ctx, p, opts, plan, rep, fallback, deadline)
}

// enforceImbalance caps res.Plan's layers at p.MaxImbalance
// (capPlan, until ctx ends) and, where it changed the plan, drops
// what described the old one: the strategy's report, the layers'
// certified balance and the gap are recomputed from the new plan.
func enforceImbalance(ctx context.Context, p Problem, opts Options, res *Result) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(opts.TimeLimit)
	}
	changed, err := capPlan(ctx, p, opts, res.Plan, res.report, deadline)
	if err != nil || changed == 0 {
		return err
	}
	rep, err := p.Scenario().Evaluate(res.Plan)
	if err != nil {
		return err
	}
	res.report = rep
	if res.Balance != nil {
		// Certified as the path that made the plan certifies it.
		var bal *BalanceReport
		if useAffinity(p, defaultBudget) {
			bal, err = balanceOf(p, rep)
		} else {
			var rb *replica.BalanceReport
			rb, err = replica.Certify(replicaProblem(p, opts), res.Plan)
			if err == nil {
				bal = publicBalance(rb)
			}
		}
		if err != nil {
			return err
		}
		res.Balance, res.Gap = bal, bal.MaxGap
	}
	res.Note = strings.TrimPrefix(res.Note+fmt.Sprintf("; %d layers repaired to meet Problem.MaxImbalance", changed), "; ")
	return nil
}
