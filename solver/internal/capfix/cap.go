package capfix

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// Problem is the plan's scenario and the cap with what bounds the repair.
type Problem struct {
	costmodel.Scenario
	// MaxImbalance is the cap on every layer's busiest/mean (positive).
	MaxImbalance float64
	// ExpertGroups, when positive, keeps every copy on its node (the
	// groups' nodes are fixed).
	ExpertGroups int
	// Current, with MaxMoves positive, is the running plan: the repair
	// then changes at most MaxMoves slots per layer against it.
	Current  *placement.Plan
	MaxMoves int
	// Redundant says the problem already has redundant slots (or slots
	// per GPU of its own), which the error's suggested fix then assumes.
	Redundant bool
}

// capTol is the relative slack within which a layer's busiest/mean counts
// as meeting the cap: the cost model's.
const capTol = costmodel.CapTol

// layerRatio is a layer's busiest/mean load the way the cap
// measures it: the cost model's Balance (per unit of speed).
func layerRatio(tok, speed []float64) (ratio float64, busiest int) {
	return costmodel.BalanceAt(tok, speed)
}

// LayersOver is how many layers of rep have a busiest/mean (per unit of
// c's GPU speeds) above limit (0 without a cap: limit ≤ 0).
func LayersOver(c costmodel.Cluster, rep *costmodel.Report, limit float64) int {
	if limit <= 0 {
		return 0
	}
	speed := make([]float64, c.GPUs())
	for g := range speed {
		speed[g] = c.SpeedOf(g)
	}
	n := 0
	for _, lr := range rep.Layers {
		if r, _ := layerRatio(lr.Tokens, speed); r > limit*(1+capTol) {
			n++
		}
	}
	return n
}

// Cap changes plan, in place, until every layer's busiest/mean
// (layerRatio; rep is plan's report, or nil) is at most
// p.MaxImbalance, by swapping copies between the busiest GPU and another
// and re-apportioning copies (within its node under expert groups; within
// p.MaxMoves changed slots of p.Current): repairLayer. A layer the
// moves cannot bring under the cap starts again from the balance-first baseline's layer (fallback),
// where its slots per GPU are the plan's. It stops at deadline; layers
// still above the cap make a *task.Infeasible naming the worst and what
// would fix it. proven, when not nil, is per layer a lower bound on
// busiest/mean that holds for every plan with these slots per GPU (the
// solve's certificate): a layer whose bound, or imbalanceFloor where every
// expert has one copy, is above the cap is refused at once, with no
// repair. It returns how many layers it changed.
func Cap(ctx context.Context, p Problem, plan *placement.Plan, rep *costmodel.Report, fallback *placement.Plan, proven []float64, deadline time.Time) (int, error) {
	limit := p.MaxImbalance
	const tol = capTol
	speed := make([]float64, plan.GPUs)
	for g := range speed {
		speed[g] = p.Cluster.SpeedOf(g)
	}
	// Without a report the evaluator, which the repair needs anyway, gives
	// the tokens.
	var ev *costmodel.Evaluator
	var err error
	// build is how long the evaluator took to build: a deal of the whole
	// plan, what setting a layer that moves SGLang's stream costs again.
	var build time.Duration
	newEvaluator := func() error {
		t0 := time.Now()
		ev, err = p.NewEvaluator(plan)
		build = time.Since(t0)
		return err
	}
	if rep == nil {
		if err := newEvaluator(); err != nil {
			return 0, err
		}
	}
	var over []int
	ratios := make([]float64, len(plan.Layers))
	for l := range plan.Layers {
		var tok []float64
		if ev != nil {
			tok = ev.Tokens(l)
		} else {
			tok = rep.Layers[l].Tokens
		}
		if ratios[l], _ = layerRatio(tok, speed); ratios[l] > limit*(1+tol) {
			over = append(over, l)
		}
	}
	if len(over) == 0 {
		return 0, nil
	}
	if err := refuseProven(p, plan, over, proven, speed, ratios); err != nil {
		return 0, err
	}
	if ev == nil {
		if err := newEvaluator(); err != nil {
			return 0, err
		}
	}
	var misses []miss
	changed := 0
	for _, l := range over {
		orig := cloneLayer(ev.Layer(l))
		r := repairLayer(ctx, p, ev, l, speed, deadline)
		// The fallback's layer is tried while time is left for it:
		// setting it, and setting the plan's own back, re-deals the plan
		// under SGLang's table, each about the evaluator's build (on 8 ×
		// 8 GPUs, 57 layers over a cap, 2.5 s past a 10 s limit; one
		// layer over at 60 s, 2.6–3.0 s past, when only time being left
		// was asked).
		expired := ctx.Err() != nil || time.Until(deadline) < 2*build
		if r > limit*(1+tol) && !expired && fallback != nil && sameSlotsPerGPU(fallback.Layers[l], orig, plan.GPUs) &&
			(p.Current == nil || p.MaxMoves <= 0 || placement.ChangedSlots(p.Current.Layers[l], fallback.Layers[l]) <= p.MaxMoves) {
			mine := cloneLayer(ev.Layer(l))
			if err := ev.SetLayer(l, fallback.Layers[l]); err != nil {
				return 0, err
			}
			if r2 := repairLayer(ctx, p, ev, l, speed, deadline); r2 < r {
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
		return changed, missError(p, ev, len(plan.Layers), misses, time.Until(deadline) < 2*build)
	}
	*plan = *ev.Plan()
	return changed, nil
}

// miss is a layer Cap left above the cap: its busiest/mean and, where
// one expert sets it, the floor that expert gives its GPU.
type miss struct {
	layer  int
	ratio  float64
	floor  float64
	expert int
}

// missError is Cap's *task.Infeasible for misses (of layers layers): the
// worst, why (timeUp: the time limit ended first) and what would fix it.
func missError(p Problem, ev *costmodel.Evaluator, layers int, misses []miss, timeUp bool) error {
	limit := p.MaxImbalance
	const tol = capTol
	worst := misses[0]
	for _, m := range misses[1:] {
		if m.ratio > worst.ratio {
			worst = m
		}
	}
	why := "the search found no plan under it"
	if timeUp {
		why = "the time limit ended before the search found a plan under it (raise Options.TimeLimit)"
	}
	d := digitsAbove(worst.ratio, limit)
	fix := fmt.Sprintf("raise Problem.MaxImbalance to %s", roundTo(worst.ratio, d, math.Ceil))
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
		why = fmt.Sprintf("%s gives its GPU at least %s× the mean, even with the lightest copies beside it", who, roundTo(worst.floor, digitsAbove(worst.floor, limit), math.Floor))
	}
	if !p.Redundant {
		fix += " or add redundant slots (Problem.RedundantSlots) so that hot experts get copies"
	} else {
		fix += " or add redundant slots (Problem.RedundantSlots)"
	}
	return &task.Infeasible{Constraint: "max imbalance", Detail: fmt.Sprintf(
		"%d of %d layers stay above Problem.MaxImbalance %s; the worst, layer %d, is at %s: %s; %s",
		len(misses), layers, strconv.FormatFloat(limit, 'f', -1, 64), worst.layer, roundTo(worst.ratio, d, math.Ceil), why, fix)}
}
