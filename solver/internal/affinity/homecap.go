package affinity

import (
	"cmp"
	"context"
	"math"

	"github.com/moetuner/moetuner/costmodel"
	"slices"
	"time"

	"github.com/moetuner/moetuner/solver/internal/task"
)

// peakDescent lowers the layer's busiest GPU (per unit of speed): while
// one of the swaps of a copy on it with a lighter copy on any other GPU,
// whose loads promise both GPUs less than the busiest holds now, lowers
// the cost, the first such swap is made. The candidates are priced
// exactly, in order of the peak they promise (lowest first): a swap of
// two single-copy experts from the counters (withinNode, acrossNodes),
// any other by a trial (a replicated copy's load as dealt changes with
// its GPU, so its promise is the load it has now). Over the cap any swap
// that lowers the cost (the cap's charge with it) is taken; within it, or
// without one, only a swap that sends no more remote-node copies: the
// balance is not bought with NIC traffic. It stops when no candidate of
// the first peakRefusals·G lowers the cost, or when its work bound is
// spent, and returns the moves priced.
//
// The annealing draws half its moves off the busiest GPU while the layer
// is over the cap, but their partners at random: under a short limit on
// many GPUs (8 × 8, 64 slots, 32k DeepSeek-V3 trace, SGLang's table, 10 s,
// cap 1.02) it left 43 of 58 layers over the cap, and the plan-level
// repair, which re-deals the plan for every trial, could not bring them
// under in the time left.
func peakDescent(ctx context.Context, s *state) int64 {
	sh := s.ly.sh
	S := slices.Max(sh.slots)
	se := &searcher{s: s, m: task.ByWork(ctx, int64(peakSweeps*sh.G*S*S)), nodeLevel: levelNode}
	se.peakDescent()
	return se.tries
}

// spill is the mean time the layers searched before took past their
// phases' deadline (0 before the first).
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

// peakSweeps bounds peakDescent by work, not by the clock (a plan must
// not depend on the machine): the moves it may price are peakSweeps times
// every pair of the busiest GPU's slots with one GPU's, per GPU. Each swap
// it makes lowers the cost, so it ends on its own: the bound guards its
// time.
const peakSweeps = 4

// peakRefusals is how many candidates per GPU of the layer peakDescent
// prices, none lowering the cost, before it stops. On the 32k DeepSeek-V3
// trace (5 s, 4 × 8 GPUs, 32 slots) 9 % of the swaps it made were found
// among candidates G to 2G; allowing 4G found 1 % more beyond 2G and
// left the busiest/mean as it was (1.003-1.004); on 8 × 8 GPUs under a
// cap of 1.02 (10 s) 97 % were among the first 8.
const peakRefusals = 2

type peakCand struct {
	mv   move
	peak float64
}

func (se *searcher) peakDescent() {
	s := se.s
	sh := s.ly.sh
	P := sh.P
	scratch := make([]float64, sh.G)
	var cands []peakCand
	for !se.m.Done() {
		top := s.busiestOverCap()
		if !sh.cap.On() {
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
					cands = append(cands, peakCand{move{kind: moveSwap, a: top, ia: ia, b: g, ib: ib}, peak})
				}
			}
		}
		slices.SortFunc(cands, func(x, y peakCand) int { return cmp.Compare(x.peak, y.peak) })
		now, base := s.costNow(levelGPU), s.baseCost()
		made := false
		for i, c := range cands {
			if i >= peakRefusals*sh.G || se.m.Done() {
				break
			}
			if !se.ok(c.mv) {
				continue
			}
			var d float64
			dR := 0.0
			if c.mv.a/P == c.mv.b/P {
				var t2 []float64
				if t2, d = s.withinNode(c.mv, scratch, base); t2 == nil {
					d, dR = s.try(c.mv, levelGPU), s.tr.dR
				}
			} else {
				d, dR = s.price(c.mv, levelGPU), s.tr.dR
			}
			se.spend()
			if d < -1e-15*math.Abs(now) && (sh.cap.On() || dR <= 1e-9) {
				s.applyMove(c.mv)
				se.applied++
				made = true
				break
			}
		}
		if !made {
			return
		}
	}
}

// loadOn is the tokens the copy on GPU g holds (0 when none does).
func (cs *copyset) loadOn(g int) float64 {
	if i := slices.Index(cs.gpus, int32(g)); i >= 0 {
		return cs.cl[i]
	}
	return 0
}
