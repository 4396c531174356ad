package capfix

import (
	"cmp"
	"context"
	"math"
	"slices"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// repairLayer runs Cap's moves on layer l of ev and returns the
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
// when none meets the cap, it makes the one with the least excess. It
// stops, between two trials, when ctx ends or deadline passes.
func repairLayer(ctx context.Context, p Problem, ev *costmodel.Evaluator, l int, speed []float64, deadline time.Time) float64 {
	limit := p.MaxImbalance
	budget := p.Current != nil && p.MaxMoves > 0
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
		for i := range fits {
			fits[i] = cand{ratio: math.Inf(1)}
		}
		best := cand{ratio: math.Inf(1), exc: exc0}
		cands := repairCands(p, lp, l, tok, speed, gb)
		// The exact tokens of the most promising ones: as many as there
		// are GPUs, and on down the list until one lowers the excess.
		// The moves priced on their layer alone come first: under
		// SGLang's tables a move that shifts the deal's random stream
		// (Evaluator.Local) re-deals and scores the whole plan, and is
		// tried only when no local move lowers the excess.
		next := cloneLayer(lp)
		for _, localOnly := range []bool{true, false} {
			tried, skipped := 0, false
			for _, c := range cands {
				if tried >= len(speed) && best.exc < exc0 {
					break
				}
				if ctx.Err() != nil || time.Now().After(deadline) {
					// A trial re-deals the plan under SGLang's table
					// (tens of milliseconds on DeepSeek-V3): a step
					// that found no move lowering the excess would try
					// every candidate, minutes past the deadline.
					break
				}
				if budget && changedAfter(p.Current.Layers[l], next, c.m) > p.MaxMoves {
					continue
				}
				if local, err := ev.Local(c.m); err != nil || local != localOnly {
					skipped = skipped || err == nil
					continue
				}
				tried++
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
			if best.exc < exc0 || !localOnly || !skipped {
				break
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

// repairCands are repairLayer's candidate moves on layer l (lp, with tok
// its tokens per GPU) towards the busiest GPU gb's relief, ranked by the
// peak their shares predict: swaps of a copy on the busiest GPU with a
// copy of smaller share elsewhere, and, where an expert has copies to
// spare, retargets that give one of the busiest GPU's experts a copy more
// (a slot elsewhere whose expert has another copy) or take a spare copy
// off it.
func repairCands(p Problem, lp placement.LayerPlan, l int, tok, speed []float64, gb int) []repairCand {
	gpn := p.Cluster.GPUsPerNode
	load := p.Stats.Load[l]
	copies := make([]int, p.Stats.Experts)
	holds := make(map[[2]int32]bool, len(lp.SlotExpert))
	holders := make([][]placement.GPU, p.Stats.Experts)
	for s, e := range lp.SlotExpert {
		holders[e] = append(holders[e], lp.SlotGPU[s])
		copies[e]++
		holds[[2]int32{int32(lp.SlotGPU[s]), int32(e)}] = true
	}
	share := func(s int) float64 { e := lp.SlotExpert[s]; return load[e] / float64(copies[e]) }
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
	return cands
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
