package jointilp

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// DescentOptions bound a Descent: by Deadline, or when StepNodes > 0 by
// that many branch-and-bound nodes per step and MaxRounds rounds (a work
// budget).
type DescentOptions struct {
	Deadline  time.Time
	StepNodes int
	MaxRounds int
	// StepLimit is the time one layer's ILP gets; a step starts only with
	// at least MinLeft before the deadline.
	StepLimit, MinLeft time.Duration
	MIP                task.MIPSettings
}

// Descent improves a chain-flow assignment layer by layer with its
// neighbours fixed (block coordinate descent), iterated until a round
// changes nothing or the deadline passes. With layers l−1 and l+1 fixed,
// the traffic into and out of layer l is linear in x[l] over every
// transition pair, so each step is a small exact ILP (no pair variables).
// A step is kept only if the exact cost model (sc.Evaluate) says the whole
// plan got faster, so the result is never worse than the input.
func (jm *Model) Descent(ctx context.Context, sc costmodel.Scenario, backend mip.Backend, assign [][]int, opts DescentOptions) ([][]int, error) {
	cur := make([][]int, len(assign))
	for l := range assign {
		cur[l] = append([]int(nil), assign[l]...)
	}
	score := func(a [][]int) (float64, error) {
		rep, err := sc.Evaluate(AssignPlan(jm.G, a, ""))
		if err != nil {
			return 0, err
		}
		return rep.TimeSec, nil
	}
	best, err := score(cur)
	if err != nil {
		return nil, err
	}
	set := opts.MIP
	if opts.StepNodes > 0 {
		set.NodeLimit = opts.StepNodes
	}
	for round := 0; ; round++ {
		if opts.StepNodes > 0 && round >= opts.MaxRounds {
			return cur, nil
		}
		changed := false
		for l := range jm.L {
			left := time.Until(opts.Deadline)
			if (opts.StepNodes == 0 && left < opts.MinLeft) || ctx.Err() != nil {
				return cur, nil
			}
			b, lv := jm.buildChainLayer(l, cur)
			m := b.Model()
			start := make([]float64, len(m.Cost))
			for j := range start {
				if m.Lower[j] == m.Upper[j] {
					start[j] = m.Lower[j] // constants of the fixed neighbour
				}
			}
			for e, g := range cur[l] {
				start[lv.x[e][g]] = 1
			}
			fillEpigraphs(b, start)
			ss := task.RunMIP(ctx, backend, m, start, set, min(left, opts.StepLimit))
			if ss.Err != nil {
				return nil, ss.Err
			}
			if ss.Sol.X == nil {
				continue
			}
			trial := make([][]int, jm.L)
			copy(trial, cur)
			trial[l] = make([]int, jm.E)
			ReadAssign(ss.Sol.X, []LayerVars{lv}, []int{l}, trial)
			obj, err := score(trial)
			if err != nil {
				return nil, err
			}
			if obj < best*(1-1e-9) {
				cur, best, changed = trial, obj, true
			}
		}
		if !changed {
			return cur, nil
		}
	}
}

// fillEpigraphs sets every epigraph column of a start vector to the least
// value its ≤ rows allow, found by evaluating each row's activity without
// it; three passes let epigraphs that feed other epigraphs (Tc into T)
// settle.
func fillEpigraphs(f *form, x []float64) {
	m := f.Model()
	isEpi := make([]bool, len(m.Cost))
	for _, j := range f.epi {
		isEpi[j] = true
	}
	for pass := 0; pass < 3; pass++ {
		for i := range m.RowLower {
			if !math.IsInf(m.RowLower[i], -1) {
				continue
			}
			epi, act := -1, 0.0
			for k := m.RowStart[i]; k < m.RowStart[i+1]; k++ {
				c := m.RowIndex[k]
				if isEpi[c] && m.RowValue[k] == -1 {
					epi = c
					continue
				}
				act += m.RowValue[k] * x[c]
			}
			if epi >= 0 {
				if need := act - m.RowUpper[i]; need > x[epi] {
					x[epi] = need
				}
			}
		}
	}
}

// buildChainLayer builds the ILP of layer l in the chain flow with every
// other layer fixed at assign: its compute tail, the transition from layer
// l−1 (or the home dispatch for l = 0), the transition into layer l+1 and,
// for the last layer, the home combine; layer l+1's compute tail is a
// constant.
func (jm *Model) buildChainLayer(l int, assign [][]int) (*form, LayerVars) {
	b := &form{}
	lv := jm.addLayer(b, l, false)
	s := jm.stats
	transition := func(td int, tl int, srcFixed bool) { jm.chainTransition(b, lv, assign, td, tl, srcFixed) }
	// Into layer l.
	if l == 0 {
		jm.addHomeComm(b, l, lv, lv.td, nil)
	} else {
		transition(lv.td, l, true)
	}
	phases, mult, nlat := []int{lv.td}, []float64{1}, 1
	if l == jm.L-1 {
		lv.tb = b.epiCol(fmt.Sprintf("Tb_%d", l), 0, mip.Inf, 0, false)
		jm.addHomeComm(b, l, lv, lv.tb, nil)
		phases, mult, nlat = append(phases, lv.tb), append(mult, 1), 2
	}
	jm.addObjective(b, l, &lv, phases, mult, nlat)
	// Out of layer l into the fixed layer l+1, whose compute is constant.
	if l+1 < jm.L {
		td2 := b.epiCol(fmt.Sprintf("Td_%d", l+1), 0, mip.Inf, 0, false)
		transition(td2, l+1, false)
		tc2 := 0.0
		load := make([]float64, jm.G)
		for e, g := range assign[l+1] {
			load[g] += s.Load[l+1][e]
		}
		for g := range jm.G {
			tc2 = max(tc2, (jm.alpha*load[g]+jm.beta*float64(jm.slots[g]))/jm.speed[g])
		}
		tcCol := b.epiCol(fmt.Sprintf("Tc_%d", l+1), tc2, tc2, 0, false)
		nl := LayerVars{tc: tcCol, td: td2, tb: -1, t: -1}
		ph, mu, nlt := []int{td2}, []float64{1}, 1
		if l+1 == jm.L-1 {
			// The last layer's combine depends only on layer l+1: constant.
			tb := b.epiCol(fmt.Sprintf("Tb_%d", l+1), 0, mip.Inf, 0, false)
			ng := make([]float64, jm.G)
			mb := make([]float64, jm.N)
			for e, g := range assign[l+1] {
				ng[g] += s.Load[l+1][e]
				mb[jm.node(g)] += s.Load[l+1][e]
			}
			v := jm.homeDispatch(ng, mb)
			b.SetBounds(tb, v, v)
			ph, mu, nlt = append(ph, tb), append(mu, 1), 2
		}
		jm.addObjective(b, l+1, &nl, ph, mu, nlt)
	}
	return b, lv
}

// chainTransition adds buildChainLayer's rows for one transition (lv the
// variable layer's columns): td ≥ the port loads of the traffic
// Transitions[tl−1] from layer tl−1 to layer tl, where exactly one of
// them is the variable layer and the other is fixed in assign (the
// sources when srcFixed).
func (jm *Model) chainTransition(b *form, lv LayerVars, assign [][]int, td int, tl int, srcFixed bool) {
	nvs := jm.tb / jm.nv
	nics := jm.tb / jm.nic / float64(jm.perNode)
	// u[e][B]: x summed over node B's GPUs, as (idx, val) terms.
	nodeTerms := func(e, nb int, coef float64) ([]int, []float64) {
		var idx []int
		var val []float64
		for g := nb * jm.perNode; g < (nb+1)*jm.perNode; g++ {
			idx, val = append(idx, lv.x[e][g]), append(val, coef)
		}
		return idx, val
	}
	R := jm.stats.Transitions[tl-1]
	E := jm.E
	fixed := assign[tl-1] // the sources, when they are the fixed side
	if !srcFixed {
		fixed = assign[tl] // else the destinations
	}
	// pairWeight is the transition weight between variable expert e
	// and the fixed experts f with on(fixed[f]).
	pairWeight := func(e int, on func(gpu int) bool) float64 {
		w := 0.0
		for f := range E {
			if !on(fixed[f]) {
				continue
			}
			if srcFixed {
				w += R[f*E+e]
			} else {
				w += R[e*E+f]
			}
		}
		return w
	}
	for g := range jm.G {
		// Pairs whose fixed end is on g.
		var stayIdx []int
		var stayVal []float64
		constOut, constIn := 0.0, 0.0
		var outIdx, inIdx []int
		var outVal, inVal []float64
		for e := range E {
			// weight of variable expert e paired with fixed experts on g
			w := pairWeight(e, func(gpu int) bool { return gpu == g })
			if srcFixed {
				// out of g: fixed sources on g minus those staying;
				// into g: variable destinations on g minus staying.
				inIdx, inVal = append(inIdx, lv.x[e][g]), append(inVal, jm.colSum[tl][e])
				constOut += w
			} else {
				outIdx, outVal = append(outIdx, lv.x[e][g]), append(outVal, jm.rowSum[tl][e])
				constIn += w
			}
			if w != 0 {
				stayIdx, stayVal = append(stayIdx, lv.x[e][g]), append(stayVal, -w)
			}
		}
		// out_g = (const or Σ rowsum·x) − stay; in_g likewise.
		oi := append(append(append([]int{}, outIdx...), stayIdx...), td)
		ov := append(append(append([]float64{}, scaledVals(outVal, nvs)...), scaledVals(stayVal, nvs)...), -1)
		b.Row(fmt.Sprintf("dout_%d_%d_%d", tl, td, g), -mip.Inf, -constOut*nvs, oi, ov)
		ii := append(append(append([]int{}, inIdx...), stayIdx...), td)
		iv := append(append(append([]float64{}, scaledVals(inVal, nvs)...), scaledVals(stayVal, nvs)...), -1)
		b.Row(fmt.Sprintf("din_%d_%d_%d", tl, td, g), -mip.Inf, -constIn*nvs, ii, iv)
	}
	if jm.N > 1 {
		for nb := range jm.N {
			var idx []int
			var val []float64
			constOut, constIn := 0.0, 0.0
			var vIdx []int
			var vVal []float64
			for e := range E {
				w := pairWeight(e, func(gpu int) bool { return jm.node(gpu) == nb })
				if srcFixed {
					i2, v2 := nodeTerms(e, nb, jm.colSum[tl][e])
					vIdx, vVal = append(vIdx, i2...), append(vVal, v2...)
					constOut += w
				} else {
					i2, v2 := nodeTerms(e, nb, jm.rowSum[tl][e])
					vIdx, vVal = append(vIdx, i2...), append(vVal, v2...)
					constIn += w
				}
				if w != 0 {
					i2, v2 := nodeTerms(e, nb, -w)
					idx, val = append(idx, i2...), append(val, v2...)
				}
			}
			if srcFixed {
				b.Row(fmt.Sprintf("dnout_%d_%d_%d", tl, td, nb), -mip.Inf, -constOut*nics, append(append([]int{}, idx...), td), append(scaledVals(val, nics), -1))
				b.Row(fmt.Sprintf("dnin_%d_%d_%d", tl, td, nb), -mip.Inf, -constIn*nics, append(append(append([]int{}, vIdx...), idx...), td), append(append(scaledVals(vVal, nics), scaledVals(val, nics)...), -1))
			} else {
				b.Row(fmt.Sprintf("dnout_%d_%d_%d", tl, td, nb), -mip.Inf, -constOut*nics, append(append(append([]int{}, vIdx...), idx...), td), append(append(scaledVals(vVal, nics), scaledVals(val, nics)...), -1))
				b.Row(fmt.Sprintf("dnin_%d_%d_%d", tl, td, nb), -mip.Inf, -constIn*nics, append(append([]int{}, idx...), td), append(scaledVals(val, nics), -1))
			}
		}
	}
}

func scaledVals(v []float64, f float64) []float64 {
	o := make([]float64, len(v))
	for i, x := range v {
		o[i] = x * f
	}
	return o
}
