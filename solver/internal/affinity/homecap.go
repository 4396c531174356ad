package affinity

import (
	"cmp"
	"context"
	"math"
	"slices"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// capDescent brings a layer over the cap under it where swaps can: while
// the busiest GPU (per unit of speed) holds more than the cap allows, the
// swaps of one of its copies with a lighter copy on any other GPU, whose
// loads promise both GPUs less than the busiest holds now, are priced
// exactly in order of the peak they promise (lowest first), and the first
// that lowers the cost (the cap's charge with it) is made. A swap of two
// single-copy experts is priced from the counters (withinNode,
// acrossNodes), any other by a trial (a replicated copy's load as dealt
// changes with its GPU, so its promise is the load it has now). When none
// of the first capRefusals·G candidates lowers the cost, the rest are
// priced, then the swaps of the busiest GPU's experts' other copies
// (siblingCands; not with exact). It stops when the layer holds the cap,
// when no candidate lowers the cost, or when its work bound is spent,
// and returns the moves priced; without a cap it does nothing unless
// exact.
//
// The deeper steps run only on a layer the first candidates leave over
// the cap. Without them, `plan --nodes 8 --gpus-per-node 8
// --redundant-slots 64 --dispatch sglang-static --max-imbalance 1.02
// --time-limit 60s` on the 32k DeepSeek-V3 trace failed in 5 of 20 runs,
// one or two layers left at 1.021–1.072 that the plan-level repair could
// not bring under in the time left; with them it held in 5 of 5.
//
// The annealing draws half its moves off the busiest GPU while the layer
// is over the cap, but their partners at random: under a short limit on
// many GPUs (8 × 8, 64 slots, 32k DeepSeek-V3 trace, SGLang's table, 10 s,
// cap 1.02) it left 43 of 58 layers over the cap, and the plan-level
// repair, which re-deals the plan for every trial, could not bring them
// under in the time left. Without a cap the same descent, kept to swaps
// that send no more remote copies, took 15-49 ms a layer on 8 × 8 GPUs
// at 5 s and left the plans less balanced (1.087-1.112 against
// 1.054-1.103 in three runs each) for the time it took from the phases.
//
// With exact, only the swaps the dispatch prices exactly are made (a
// swap of two single-copy experts, which no table deals, or one that
// leaves the moved experts' deals as they were): none moves another
// expert's deal (repairDealt, on the plan's own table), and the descent
// goes on within the cap, or without one, off the busiest GPU, on every
// swap that lowers the cost: the search priced the plan partly on the table's
// closed form, and this is where its balance as dealt is set (32k
// DeepSeek-V3 trace, SGLang's newest tree, 60 s: 4 × 8 GPUs, 32 slots,
// 1.015 (1.027) → 1.003 (1.013) busiest/mean, remote copies 0.3-0.5 %
// up, modeled time 0.8 % down; 8 × 8, 64 slots, 1.145 (1.310) → 1.130
// (1.373) in the time the layers leave it, 1.105 (1.237) given all it
// takes).
func capDescent(ctx context.Context, s *state, exact bool) int64 {
	sh := s.ly.sh
	if !sh.cap.On() && !exact {
		return 0
	}
	S := slices.Max(sh.slots)
	se := &searcher{s: s, m: task.ByWork(ctx, int64(capSweeps*sh.G*S*S)), nodeLevel: levelNode, exact: exact}
	se.capDescent()
	return se.tries
}

// spill is the mean time the layers searched before ran past their
// phases' deadline (0 before the first): the steps after the phases, and
// what the phases take past it.
func (sh *shape) spill() time.Duration {
	n := sh.spillRuns.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(sh.spillNanos.Load() / n)
}

// spilled records that a layer ended d past its phases' deadline.
func (sh *shape) spilled(d time.Duration) {
	sh.spillNanos.Add(int64(max(d, 0)))
	sh.spillRuns.Add(1)
}

// capSweeps bounds capDescent by work, not by the clock (a plan must
// not depend on the machine): the moves it may price are capSweeps times
// every pair of the busiest GPU's slots with one GPU's, per GPU. Each swap
// it makes lowers the cost, so it ends on its own: the bound guards its
// time.
const capSweeps = 4

// capRefusals is how many candidates per GPU of the layer capDescent
// prices, none lowering the cost, before it stops. On 8 × 8 GPUs under a
// cap of 1.02 (32k DeepSeek-V3 trace, 10 s) 97 % of the swaps it made were
// among the first 8 candidates; without a cap (4 × 8 GPUs, 5 s), 9 % were
// found among candidates G to 2G, and allowing 4G found 1 % more beyond
// 2G with no change in balance.
const capRefusals = 2

type capCand struct {
	mv   move
	peak float64
}

func (se *searcher) capDescent() {
	s := se.s
	sh := s.ly.sh
	scratch := make([]float64, sh.G)
	var cands []capCand
	refusals := capRefusals * sh.G
	for !se.m.Done() {
		top := s.busiestOverCap()
		if se.exact {
			// The plan's own table: any swap off the busiest GPU that
			// lowers the cost, over the cap or within it.
			_, top = costmodel.BalanceAt(s.tok, sh.speed)
		}
		if top < 0 {
			return
		}
		cur := s.tok[top] / sh.speed[top]
		cands = cands[:0]
		for ia, e := range s.held[top] {
			lx := s.cs[e].loadOn(top)
			for g := 0; g < sh.G; g++ {
				if g == top {
					continue
				}
				for ib, f := range s.held[g] {
					dl := lx - s.cs[f].loadOn(g)
					if dl <= 0 {
						continue
					}
					peak := math.Max((s.tok[top]-dl)/sh.speed[top], (s.tok[g]+dl)/sh.speed[g])
					if !(peak < cur*(1-1e-12)) {
						continue
					}
					cands = append(cands, capCand{move{kind: moveSwap, a: top, ia: ia, b: g, ib: ib}, peak})
				}
			}
		}
		slices.SortFunc(cands, byPeak)
		made := se.firstCheaper(cands, refusals, scratch)
		if !made && !se.exact {
			// Still over the cap: the rest of the candidates, then the
			// swaps of the busiest GPU's experts' other copies, all of
			// them while the work bound lasts (a layer over the cap is
			// no plan, and the plan-level repair re-deals the whole plan
			// for each trial).
			if len(cands) > refusals {
				made = se.firstCheaper(cands[refusals:], len(cands), scratch)
			}
			if !made {
				sib := se.siblingCands(top, nil)
				slices.SortFunc(sib, byPeak)
				made = se.firstCheaper(sib, math.MaxInt, scratch)
			}
		}
		if !made {
			return
		}
	}
}

// byPeak orders candidates by the peak they promise, lowest first.
func byPeak(x, y capCand) int { return cmp.Compare(x.peak, y.peak) }

// firstCheaper prices cands exactly in their order (byPeak), at most
// limit of them, and makes the first that lowers the cost; it reports
// whether it made one.
func (se *searcher) firstCheaper(cands []capCand, limit int, scratch []float64) bool {
	s := se.s
	P := s.ly.sh.P
	now, base := s.costNow(levelGPU), s.baseCost()
	for i, c := range cands {
		if i >= limit || se.m.Done() {
			break
		}
		if !se.ok(c.mv) {
			continue
		}
		if se.exact && !s.dealtExactly(c.mv) {
			// Known before its tokens are walked: a trial of it
			// would be refused.
			se.spend()
			continue
		}
		var d float64
		if c.mv.a/P == c.mv.b/P {
			var t2 []float64
			if t2, d = s.withinNode(c.mv, scratch, base); t2 == nil {
				d = s.try(c.mv, levelGPU)
			}
		} else {
			d = s.price(c.mv, levelGPU)
		}
		se.spend()
		if d < -1e-15*math.Abs(now) {
			s.applyMove(c.mv)
			se.applied++
			return true
		}
	}
	return false
}

// siblingCands appends to cands the swaps that move another copy of a
// replicated expert on GPU top: the copy on h ≠ top trades places with a
// copy on a GPU g holding neither. Under a dealt table a replicated
// copy's load is the ranks the deal sends it, and which ranks are left
// for the deal (those without a copy on their own GPU) changes with
// where the expert's other copies sit, so such a swap can lower top
// without moving any of its copies; capDescent tries these when no swap
// off top lowers the cost. Their promise is the larger of h's and g's
// loads after the two copies trade their loads as they are now.
func (se *searcher) siblingCands(top int, cands []capCand) []capCand {
	s := se.s
	sh := s.ly.sh
	for _, e := range s.held[top] {
		cs := s.cs[e]
		if len(cs.gpus) < 2 {
			continue
		}
		for i, h32 := range cs.gpus {
			h := int(h32)
			if h == top {
				continue
			}
			ia := slices.Index(s.held[h], e)
			le := cs.cl[i]
			for g := 0; g < sh.G; g++ {
				if g == top || g == h || s.holds(g, int(e)) {
					continue
				}
				for ib, f := range s.held[g] {
					lf := s.cs[f].loadOn(g)
					peak := math.Max((s.tok[h]-le+lf)/sh.speed[h], (s.tok[g]-lf+le)/sh.speed[g])
					cands = append(cands, capCand{move{kind: moveSwap, a: h, ia: ia, b: g, ib: ib}, peak})
				}
			}
		}
	}
	return cands
}

// loadOn is the tokens the copy on GPU g holds (0 when none does).
func (cs *copyset) loadOn(g int) float64 {
	if i := slices.Index(cs.gpus, int32(g)); i >= 0 {
		return cs.cl[i]
	}
	return 0
}

// dealtExactly reports whether the dispatch prices the swap mv exactly:
// both experts' new copies are dealt without the table's closed form
// (Splitter.Split), read from their copy sets alone, before any token is
// walked. It leaves no trial (apply tries mv itself).
func (s *state) dealtExactly(mv move) bool {
	tr := &s.tr
	s.closedForm = false
	s.setChange(&tr.ch[0], int(s.held[mv.a][mv.ia]), mv.a, mv.b)
	s.setChange(&tr.ch[1], int(s.held[mv.b][mv.ib]), mv.b, mv.a)
	tr.valid = false
	return !s.closedForm
}
