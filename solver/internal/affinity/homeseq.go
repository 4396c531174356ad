package affinity

import (
	"cmp"
	"context"
	"math"
	"slices"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
)

// repairSequential is repairDealt for a plan under a cap
// (Problem.MaxImbalance) and no move budget in SGLang's trees that deal a
// loaded map on one stream per rank (costmodel.DealtPerRank), where a
// copy moved into or out of a rank's node moves that rank's stream for
// every later deal. It settles the layers in the order SGLang deals them
// (costmodel.SequentialDeal): once the layers before l are settled, every
// rank's stream before l is known, so layer l is dealt exactly for any
// copies, and swaps that move streams, which repairDealt must leave
// alone, can be made (rerollStep); what they move in the layers after l
// is dealt when those layers' turn comes. Each layer gets, on its own
// table, repairDealt's moves (descendDealt) within its share of the time
// left and, while it stays over the cap, rerollStep. It returns the moves
// priced, and false when the plan cannot be dealt sequentially (the
// caller then repairs as repairDealt does).
//
// On the 32k DeepSeek-V3 trace (8 × 8 GPUs, 64 slots, cap 1.02, 60 s)
// the search's plan as dealt is at 1.02-1.31 busiest/mean per layer; with
// repairDealt 9 of 58 layers stayed over the cap after the plan-level
// repair, with this none (1.007 (1.019) as dealt).
func repairSequential(ctx context.Context, p Problem, res *Result, opts Options) (int64, bool) {
	q := p
	q.Start = placement.FromReplicas(p.Cluster.GPUs(), res.Copies, "joint")
	sd, err := p.SequentialDeal(q.Start)
	if err != nil {
		return 0, false
	}
	sh, err := newShape(q)
	if err != nil {
		return 0, false
	}
	sh.split = sd.Splitter()
	L := len(res.Copies)
	S := slices.Max(p.Slots)
	work := int64(repairSweeps * sh.G * S * S)
	var tries int64
	var base time.Duration // the layers' time before their rerolls
	limit := math.MaxInt   // reroll candidates a step: under a deadline, what the time allows
	if opts.Limit.ByWork() {
		limit = capRefusals * sh.G
	}
	for l := 0; l < L; l++ {
		if ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		cp := int32Copies(res.Copies[l])
		if sd.Bind(l, cp) != nil {
			return tries, true
		}
		lctx, cancel := ctx, context.CancelFunc(func() {})
		if !opts.Limit.ByWork() {
			left := time.Until(opts.Limit.Deadline)
			lctx, cancel = context.WithTimeout(ctx, max(left, 0)/time.Duration(L-l))
		}
		ly := buildLayer(q, sh, l)
		s := newStateKappa(ly, cp, 0)
		before := s.costNow(levelGPU)
		var n int64
		s, n = descendDealt(ctx, lctx, s, work)
		tries += n
		cancel()
		base += time.Since(t0)
		if s.overCap() > 0 && ctx.Err() == nil {
			// Over the cap still: swaps that move streams, each with the
			// descent after it, within eight shares of the time left, and
			// never into the time the later layers need (what the layers
			// so far took without this, with half as much again): a
			// reroll moves their deals, and a layer left unrepaired after
			// one is dealt as nobody searched it.
			rctx, rcancel := ctx, context.CancelFunc(func() {})
			if !opts.Limit.ByWork() {
				left := time.Until(opts.Limit.Deadline)
				need := base * time.Duration(3*(L-l-1)) / time.Duration(2*(l+1))
				rctx, rcancel = context.WithTimeout(ctx, max(min(8*left/time.Duration(L-l), left-need), 0))
			}
			for rctx.Err() == nil && s.overCap() > 0 {
				s2, n := rerollStep(rctx, s, sd, l, limit)
				tries += n
				if s2 == nil {
					break
				}
				s = s2
			}
			rcancel()
		}
		if s.costNow(levelGPU) <= before {
			res.Copies[l] = gpuCopiesOf(s.copies())
			res.Remote[l] = s.remote()
		}
		if sd.Bind(l, int32Copies(res.Copies[l])) != nil || sd.Commit(l) != nil {
			return tries, true
		}
	}
	return tries, true
}

// rerollStep is for a layer over the cap that capDescent's exact mode
// leaves there. A swap that moves ranks' streams deals the rest of the
// layer anew, which undoes what the descent did there, so each such swap
// is judged after capDescent's exact mode on its own deal. The candidates
// are the swaps of a copy on the busiest GPU with one on another node,
// and those of another copy of one of its experts with one on another
// node than that copy's (which changes the ranks the busiest GPU's copy
// is dealt), ordered by the load they promise the busiest GPU alone (a
// moved copy of a replicated expert at its expert's mean per copy; the
// descent sees to the other GPUs). It returns the first of the first
// limit whose descended state costs less than s (sd bound to it), or nil
// (sd bound to s's copies), and the moves priced.
func rerollStep(ctx context.Context, s *state, sd *costmodel.SequentialDeal, l, limit int) (*state, int64) {
	sh := s.ly.sh
	_, top := costmodel.BalanceAt(s.tok, sh.speed)
	cur := s.tok[top] / sh.speed[top]
	fair := func(e int) float64 { return s.ly.load[e] / float64(len(s.cs[e].gpus)) }
	var cands []capCand
	add := func(mv move, topLoad float64) {
		if p := topLoad / sh.speed[top]; p < cur*(1-1e-12) && s.valid(mv) && !s.dealtExactly(mv) {
			cands = append(cands, capCand{mv, p})
		}
	}
	for ia, e16 := range s.held[top] {
		e := int(e16)
		lx := s.cs[e].loadOn(top)
		for g := 0; g < sh.G; g++ {
			if g/sh.P == top/sh.P {
				continue
			}
			for ib, f16 := range s.held[g] {
				add(move{kind: moveSwap, a: top, ia: ia, b: g, ib: ib}, s.tok[top]-lx+fair(int(f16)))
			}
		}
		for _, y32 := range s.cs[e].gpus {
			y := int(y32)
			if y == top {
				continue
			}
			iy := slices.Index(s.held[y], e16)
			for g := 0; g < sh.G; g++ {
				if g == top || g/sh.P == y/sh.P {
					continue
				}
				for ib := range s.held[g] {
					add(move{kind: moveSwap, a: y, ia: iy, b: g, ib: ib}, s.tok[top]-lx+fair(e))
				}
			}
		}
	}
	slices.SortStableFunc(cands, func(x, y capCand) int { return cmp.Compare(x.peak, y.peak) })
	base := s.costNow(levelGPU)
	cp := s.copies()
	var n int64
	// The node a copy moves to sets how its expert, and the ranks whose
	// streams that moves, are dealt; the GPU within the node and the
	// partner mostly what the descent then evens out. One candidate per
	// copy and node, the best promised, before any second one.
	type key struct{ a, ia, node int }
	seen := make(map[key]bool)
	first, rest := cands[:0:0], cands[:0:0]
	for _, c := range cands {
		if k := (key{c.mv.a, c.mv.ia, c.mv.b / sh.P}); !seen[k] {
			seen[k] = true
			first = append(first, c)
			continue
		}
		rest = append(rest, c)
	}
	cands = append(first, rest...)
	for i, c := range cands {
		if i >= limit || ctx.Err() != nil {
			break
		}
		e, f := int(s.held[c.mv.a][c.mv.ia]), int(s.held[c.mv.b][c.mv.ib])
		trial := slices.Clone(cp)
		trial[e] = swapGPU(cp[e], int32(c.mv.a), int32(c.mv.b))
		trial[f] = swapGPU(cp[f], int32(c.mv.b), int32(c.mv.a))
		if sd.Bind(l, trial) != nil {
			return nil, n
		}
		s2 := newStateKappa(s.ly, trial, 0)
		n += 1 + capDescent(ctx, s2, true)
		if s2.costNow(levelGPU) < base-1e-12*math.Abs(base) {
			if sd.Bind(l, s2.copies()) != nil {
				return nil, n
			}
			return s2, n
		}
	}
	if sd.Bind(l, cp) != nil {
		return nil, n
	}
	return nil, n
}

// swapGPU is gs with from replaced by to.
func swapGPU(gs []int32, from, to int32) []int32 {
	out := slices.Clone(gs)
	out[slices.Index(out, from)] = to
	return out
}
