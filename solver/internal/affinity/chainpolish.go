package affinity

import (
	"context"
	"math"
	"math/rand/v2"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// polishMoveUnits is how many work units one move of the chain's polish
// counts (a swap scored by the cost model's incremental evaluator, which
// prices two layers' all-to-alls over every GPU pair): the ratio of its
// time to an exact move's (chainProxyPerUnit) on the 32k-token DeepSeek-V3-shaped
// trace, 1.08 ms (BenchmarkChainSwap32k/evaluator) against 44 µs on
// 4 × 8 GPUs, 0.99 ms against 109 µs on 8 × 8. The larger ratio, so that
// a work budget's polish ends sooner than its units suggest, never later.
// At 1, `--effort 1` with a running plan, copies and a move budget gave
// the polish 0.95 M moves: 36 s on FLAME's first 256 tokens (2 × 8 GPUs),
// and, at 1.06 ms a move, about 17 minutes on the 32k trace.
const polishMoveUnits = 24

// polishChain refines res on the exact cost model, which the proxy only
// approximates (a clique expansion of each token's nodes): a simulated
// annealing of slot swaps scored by the incremental evaluator. By work it
// gets a tenth of the budget on top, and spare, what the proxy could not
// use; by time, what is left of the limit,
// when that covers building the evaluator (one evaluation) with one
// evaluation to spare, since the caller scores the result. It starts hot
// only when it can try every swap of the neighbourhood many times over,
// as the home flow's last annealing; else it refines what it was given.
// No layer's busiest GPU ends above the start's (the proxy's promise).
// The best plan it visits is kept; one no better leaves res as it is.
func polishChain(ctx context.Context, p Problem, opts Options, spare int64, res *Result, start *costmodel.Report, evalTime time.Duration) {
	lim := task.Limit{Work: opts.Limit.Work/10 + spare}
	if !opts.Limit.ByWork() {
		if evalTime <= 0 || time.Until(opts.Limit.Deadline) < 3*evalTime {
			return
		}
		lim = task.Limit{Deadline: opts.Limit.Deadline.Add(-evalTime)}
	} else if lim.Work == 0 {
		return
	} else {
		// Its moves, not its units.
		lim.Work = max(1, lim.Work/polishMoveUnits)
	}
	G := p.Cluster.GPUs()
	ev, err := p.NewEvaluator(placement.FromReplicas(G, res.Copies, "affinity"))
	if err != nil {
		return
	}
	L := ev.Layers()
	// No layer's compute tail goes above the start's (or, where the
	// search could not bring it back, above where it is now).
	tailCap := make([]float64, L)
	for l := range tailCap {
		tailCap[l] = max(start.Layers[l].ComputeTail.Seconds()+1e-9, ev.LayerTail(l)) * (1 + 1e-12)
	}
	rng := rand.New(rand.NewPCG(uint64(L), 0x706f6c))
	bud := newChainBudgets(p, res.Copies)
	pl := &chainPolisher{ev: ev, rng: rng, bud: bud, L: L}
	t0, ok := pl.temperature(p, lim)
	if !ok {
		return
	}
	sc := newSchedule(ctx, lim, 1)
	// The walk may pass through plans with a layer over its cap, paying
	// the excess tail once more on top of the time it adds; only plans
	// within every cap can become the best kept.
	cur := ev.Cost()
	for l := range bud {
		cur += bud[l].SlotSec * float64(bud[l].changed)
	}
	over := make([]float64, L) // tail above the cap per layer
	nOver := 0
	best, bestPlan := cur, (*placement.Plan)(nil)
	atBest := true
	for {
		prog, ok := sc.next()
		if !ok {
			break
		}
		m, dc, ok := pl.pick()
		if !ok {
			break
		}
		d, err := ev.Delta(m)
		if err != nil {
			return
		}
		d += pl.sec(m.Layer) * float64(dc)
		temp := t0 * math.Pow(coolTo, prog)
		u := rng.Float64()
		accept := func(x float64) bool { return x <= 0 || u < math.Exp(-x/temp) }
		l := m.Layer
		if over[l] == 0 && !accept(d) {
			continue // the penalty can only add to d
		}
		var snap *placement.Plan
		if atBest {
			snap = ev.Plan()
		}
		if err := ev.Apply(m); err != nil {
			return
		}
		o := max(0, ev.LayerTail(l)-tailCap[l])
		if !accept(d + o - over[l]) {
			if err := ev.Apply(m); err != nil { // a swap is its own inverse
				return
			}
			continue
		}
		cur += d
		if bud != nil {
			bud[l].changed += dc
		}
		switch {
		case o > 0 && over[l] == 0:
			nOver++
		case o == 0 && over[l] > 0:
			nOver--
		}
		over[l] = o
		if nOver == 0 && (cur < best*(1-1e-12) || (atBest && cur <= best)) {
			best, atBest, bestPlan = cur, true, nil
		} else if atBest {
			bestPlan, atBest = snap, false
		}
	}
	res.Tries += sc.done
	out := bestPlan
	if atBest || out == nil {
		out = ev.Plan()
	}
	for l := range res.Copies {
		res.Copies[l] = out.ExpertGPUs(l)
	}
}

// chainPolisher draws polishChain's moves: swaps of two slots of one
// layer of ev, within the move budget bud (nil: none).
type chainPolisher struct {
	ev  *costmodel.Evaluator
	rng *rand.Rand
	bud []*chainBudget
	L   int
}

// changed is the move budget's count of a slot swap (0 without one).
func (pl *chainPolisher) changed(l int, lp placement.LayerPlan, a, b int) int {
	if pl.bud == nil {
		return 0
	}
	return pl.bud[l].SwapChanged(int(lp.SlotGPU[a]), int(lp.SlotExpert[a]), int(lp.SlotGPU[b]), int(lp.SlotExpert[b]))
}

// movedSlot is a random slot of lp whose copy the running plan does not
// have there, or −1.
func (pl *chainPolisher) movedSlot(l int, lp placement.LayerPlan) int {
	b := pl.bud[l]
	if b.changed == 0 {
		return -1
	}
	n := pl.rng.IntN(b.changed)
	for i, e := range lp.SlotExpert {
		if b.Off(int(lp.SlotGPU[i]), int(e)) == 1 {
			if n == 0 {
				return i
			}
			n--
		}
	}
	return -1
}

// pick draws a swap of two slots of one layer that keeps the plan valid
// (different GPUs, different experts, neither already on the other's
// GPU) and within the move budget, with its count; under a nearly spent
// budget half of them start from a moved slot, and half of those take a
// moved partner (such a swap never adds to the count).
func (pl *chainPolisher) pick() (costmodel.Move, int, bool) {
	rng, bud := pl.rng, pl.bud
	for range 64 {
		l := rng.IntN(pl.L)
		lp := pl.ev.Layer(l)
		n := len(lp.SlotGPU)
		if n < 2 {
			continue
		}
		a, b := rng.IntN(n), rng.IntN(n)
		if bud != nil && bud[l].Max > 0 && bud[l].changed >= bud[l].Max-1 && rng.IntN(2) == 0 {
			if a = pl.movedSlot(l, lp); a < 0 {
				continue
			}
			if rng.IntN(2) == 0 {
				if b = pl.movedSlot(l, lp); b < 0 {
					continue
				}
			}
		}
		ga, gb, ea, eb := lp.SlotGPU[a], lp.SlotGPU[b], lp.SlotExpert[a], lp.SlotExpert[b]
		if ga == gb || ea == eb {
			continue
		}
		dc := pl.changed(l, lp, a, b)
		if bud != nil && bud[l].Max > 0 && bud[l].changed+dc > bud[l].Max {
			continue
		}
		clash := false
		for s := range lp.SlotGPU {
			if (lp.SlotGPU[s] == gb && lp.SlotExpert[s] == ea) || (lp.SlotGPU[s] == ga && lp.SlotExpert[s] == eb) {
				clash = true
				break
			}
		}
		if !clash {
			return costmodel.Move{Kind: costmodel.MoveSwap, Layer: l, Slot: a, Other: b}, dc, true
		}
	}
	return costmodel.Move{}, 0, false
}

// sec is a changed slot's charge in layer l.
func (pl *chainPolisher) sec(l int) float64 {
	if pl.bud == nil {
		return 0
	}
	return pl.bud[l].SlotSec
}

// temperature is the polish's starting temperature, the mean |Δ| of a
// sample of 4·L swaps, cooled to coolTo of it unless lim lets the
// annealing try every swap of the neighbourhood annealSweeps times (by
// the sample's rate when by time); false when the sample saw no change.
func (pl *chainPolisher) temperature(p Problem, lim task.Limit) (float64, bool) {
	L, G := pl.L, p.Cluster.GPUs()
	t0, n0 := 0.0, 0
	t1 := time.Now()
	for range 4 * L {
		if m, _, ok := pl.pick(); ok {
			if d, err := pl.ev.Delta(m); err == nil {
				t0 += math.Abs(d)
				n0++
			}
		}
	}
	// Swaps per second, from that sample.
	rate := float64(4*L) / max(time.Since(t1).Seconds(), 1e-9)
	if n0 == 0 || t0 == 0 {
		return 0, false
	}
	t0 /= float64(n0)
	slots := 0
	for _, v := range p.Slots {
		slots += v
	}
	if lim.ByWork() {
		if float64(lim.Work) < annealSweeps*float64(L*slots*G) {
			t0 *= coolTo
		}
	} else if rate*time.Until(lim.Deadline).Seconds() < annealSweeps*float64(L*slots*G) {
		t0 *= coolTo
	}
	return t0, true
}
