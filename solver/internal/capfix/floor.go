package capfix

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/replica"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// imbalanceFloor is a lower bound on layer l's busiest/mean over every
// plan with lp's copy counts and slots per GPU: the GPU that holds a copy
// of expert e gets that copy's tokens (all of them with a single copy, its
// share under a split that does not depend on the source, such as even
// dispatch) and fills its other slots with copies that bring at least the
// least tokens there are (a single copy its expert's load, a copy of a
// replicated expert its share under such a split and nothing otherwise:
// static and local dispatch may send it none, vLLM's hash counted token
// by token less than its share; costmodel.Scenario.PerSource). It
// returns the bound and the expert that sets it (−1: none above 1).
func imbalanceFloor(p Problem, l int, lp placement.LayerPlan, speed []float64) (float64, int) {
	copies := make([]int, p.Stats.Experts)
	for _, e := range lp.SlotExpert {
		copies[e]++
	}
	perGPU := make([]int, len(speed))
	for _, g := range lp.SlotGPU {
		perGPU[g]++
	}
	return countsFloor(p, l, copies, perGPU, speed)
}

// countsFloor is imbalanceFloor for any plan with these copy counts and
// slots per GPU.
func countsFloor(p Problem, l int, copies, perGPU []int, speed []float64) (float64, int) {
	load := p.Stats.Load[l]
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
	fewest := slices.Min(perGPU)
	perSource := p.PerSource()
	// least[i]: what a slot brings at least, slots sorted by it.
	type slotMin struct {
		v float64
		e routing.Expert
	}
	var least []slotMin
	for e, c := range copies {
		v := 0.0
		if c == 1 || !perSource {
			v = load[e] / float64(max(c, 1))
		}
		for range c {
			least = append(least, slotMin{v, routing.Expert(e)})
		}
	}
	slices.SortFunc(least, func(x, y slotMin) int { return cmp.Compare(x.v, y.v) })
	fast := slices.Max(speed)
	floor, who := 1.0, -1
	for e, v := range load {
		c := copies[e]
		if c == 0 || (c > 1 && perSource) {
			continue // static and local dispatch and the counted hash may send a copy less than its share
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

// refuseProven returns a *task.Infeasible when one of the layers over the
// cap cannot be brought under it by any plan with these slots per GPU:
// its proven bound (the solve's certificate), or where every expert has
// one copy imbalanceFloor, which then holds for every plan, is above the
// cap. ratios are the plan's busiest/mean by layer. nil when no layer is
// proven out of reach.
func refuseProven(p Problem, plan *placement.Plan, over []int, proven, speed, ratios []float64) error {
	single := func(l int) (float64, int) {
		if lp := plan.Layers[l]; len(lp.SlotExpert) == p.Stats.Experts {
			return imbalanceFloor(p, l, lp, speed)
		}
		return 0, -1
	}
	return provenError(p, over, proven, single, ratios)
}

// Refuse returns a *task.Infeasible, before any search, when some layer
// cannot meet p.MaxImbalance with the slots per GPU of rp (the same
// problem as the replicated path sees it): the mean and the largest
// replica (replica.Bounds) hold under any dispatch and split, and without
// redundant slots, where every expert has one copy, imbalanceFloor holds
// for every plan. nil when no layer is out of reach by these bounds (the
// solve may still find none under the cap), and with workloads.
func Refuse(p Problem, rp replica.Problem) error {
	if len(rp.Workloads) > 0 {
		return nil
	}
	mean, bound, err := replica.Bounds(rp)
	if err != nil {
		return nil // the strategy reports the layout's error in its own words
	}
	slots, err := replica.Slots(rp)
	if err != nil {
		return nil
	}
	speed := make([]float64, len(slots))
	for g := range speed {
		speed[g] = p.Cluster.SpeedOf(g)
	}
	proven := make([]float64, len(mean))
	all := make([]int, len(mean))
	for l := range mean {
		all[l] = l
		if mean[l] > 0 {
			proven[l] = bound[l] / mean[l]
		}
	}
	total := 0
	for _, s := range slots {
		total += s
	}
	ones := make([]int, p.Stats.Experts)
	for e := range ones {
		ones[e] = 1
	}
	single := func(l int) (float64, int) {
		if total != p.Stats.Experts {
			return 0, -1
		}
		return countsFloor(p, l, ones, slots, speed)
	}
	return provenError(p, all, proven, single, nil)
}

// provenError is refuseProven's and Refuse's error: among
// layers, those whose floor, the larger of proven[l] (nil: none) and
// single(l) (a floor set by one expert, which it names), is above the
// cap, and the layer with the highest floor, the least cap that might be
// met. ratios, when not nil, give each layer's busiest/mean in the plan
// at hand. nil when no layer's floor is above the cap.
func provenError(p Problem, layers []int, proven []float64, single func(int) (float64, int), ratios []float64) error {
	const tol = 1e-9
	limit := p.MaxImbalance
	n, worst, expert, floor := 0, -1, -1, 0.0
	for _, l := range layers {
		f, e := 0.0, -1
		if proven != nil {
			f = proven[l]
		}
		if g, who := single(l); g > f {
			f, e = g, who
		}
		if f <= limit*(1+tol) {
			continue
		}
		n++
		if worst < 0 || f > floor {
			worst, expert, floor = l, e, f
		}
	}
	if worst < 0 {
		return nil
	}
	d := digitsAbove(floor, limit)
	lo, hi := roundTo(floor, d, math.Floor), roundTo(floor, d, math.Ceil)
	kept := "these slots per GPU"
	if p.ExpertGroups > 0 {
		kept += " and expert groups on nodes"
	}
	why := fmt.Sprintf("its certified bound puts its busiest GPU at no less than %s× the mean", lo)
	if expert >= 0 {
		why = fmt.Sprintf("expert %d gives its GPU at least %s× the mean, even with the lightest copies beside it", expert, lo)
	}
	at := ""
	if ratios != nil {
		at = ", is at " + roundTo(ratios[worst], d, math.Ceil)
	}
	return &task.Infeasible{Constraint: "max imbalance", Detail: fmt.Sprintf(
		"at least %d of %d layers cannot be brought under Problem.MaxImbalance %s by any plan with %s; the worst, layer %d%s: %s; raise Problem.MaxImbalance to at least %s or add redundant slots (Problem.RedundantSlots)",
		n, p.Stats.Layers, strconv.FormatFloat(limit, 'f', -1, 64), kept, worst, at, why, hi)}
}

// digitsAbove is the fewest decimals, from 4 to 9, at which x rounded
// down still reads above limit, so that a floor and the cap it exceeds
// print differently.
func digitsAbove(x, limit float64) int {
	d := 4
	for ; d < 9; d++ {
		if v, _ := strconv.ParseFloat(roundTo(x, d, math.Floor), 64); v > limit {
			break
		}
	}
	return d
}

// roundTo prints x with d decimals, rounded by round (math.Floor for a
// claim that must not overstate a bound, math.Ceil for a cap that must
// not understate it). x is first moved by a
// relative 1e-12 against the rounding, so that float noise on a value
// that prints exactly does not move it a whole decimal.
func roundTo(x float64, d int, round func(float64) float64) string {
	p := math.Pow(10, float64(d))
	nudge := 1 + 1e-12
	if round(0.5) > 0.5 { // rounding up
		nudge = 1 - 1e-12
	}
	return strconv.FormatFloat(round(x*p*nudge)/p, 'f', d, 64)
}
