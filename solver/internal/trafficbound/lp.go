package trafficbound

import "math"

// group is a set of tokens with the same configurations: their total
// weight and the configurations open to each of them.
type group struct {
	weight  float64
	configs []config
}

// certify is the bound the multipliers nu ≥ 0 prove: every token pays at
// least min over its configurations of cost + nu·f, and the tokens' true
// moments add up to at most budget, so
//
//	Σ_t cost_t ≥ Σ_groups weight · min_c (cost_c + nu·f_c) − nu·budget.
//
// It holds for every nu ≥ 0 (negative entries are read as 0), however nu
// was found; this is the whole certificate.
func certify(groups []group, budget, nu []float64) float64 {
	v := 0.0
	for _, g := range groups {
		best := math.Inf(1)
		for _, c := range g.configs {
			x := c.cost
			for j, f := range c.f {
				x += max(nu[j], 0) * f
			}
			best = min(best, x)
		}
		v += g.weight * best
	}
	for j, b := range budget {
		v -= max(nu[j], 0) * b
	}
	return v
}

// multipliers returns nu ≥ 0 maximizing certify: the duals of the linear
// program
//
//	min Σ_g w_g Σ_c x_gc cost_c  s.t.  Σ_c x_gc = 1 (every group g),
//	Σ_g w_g Σ_c x_gc f_jc ≤ budget_j (every moment j),  x ≥ 0,
//
// (whose value equals the best certify by LP duality), polished by a
// coordinate search so that a numerically poor simplex end can only cost
// a little bound, never validity (certify is recomputed by the caller).
// pivots counts the simplex pivots.
func multipliers(groups []group, budget []float64) (nu []float64, pivots int) {
	d := len(budget)
	total := 0.0
	for _, g := range groups {
		total += g.weight
	}
	nu = make([]float64, d)
	if total <= 0 {
		return nu, 0
	}
	if y, p, ok := simplexDuals(groups, budget, total); ok {
		nu = y
		pivots = p
	}
	// Coordinate polish: steps from 1 down to 1e-6 in each direction.
	cur := certify(groups, budget, nu)
	for step := 1.0; step > 1e-6; step /= 2 {
		for improved := true; improved; {
			improved = false
			for j := range nu {
				for _, s := range [2]float64{step, -step} {
					old := nu[j]
					nu[j] = max(0, old+s)
					if v := certify(groups, budget, nu); v > cur+1e-12*math.Abs(cur) {
						cur, improved = v, true
					} else {
						nu[j] = old
					}
				}
			}
		}
	}
	return nu, pivots
}

// simplexDuals solves the program of multipliers, scaled by 1/total, with
// a dense two-phase simplex (Bland's rule) and returns the duals of the
// moment rows; ok is false when it did not reach an optimum (infeasible
// budgets, or numerical trouble).
func simplexDuals(groups []group, budget []float64, total float64) ([]float64, int, bool) {
	G, d := len(groups), len(budget)
	m := G + d
	n := 0
	for _, g := range groups {
		n += len(g.configs)
	}
	// Columns: n structural, d slacks, G artificials.
	cols := n + d + G
	w := cols + 1 // last entry: right-hand side
	tab := make([]float64, (m+1)*w)
	row := func(i int) []float64 { return tab[(i+1)*w : (i+2)*w] }
	cost := make([]float64, cols)
	j := 0
	for gi, g := range groups {
		wg := g.weight / total
		for _, c := range g.configs {
			row(gi)[j] = 1
			for k, f := range c.f {
				row(G + k)[j] = wg * f
			}
			cost[j] = wg * c.cost
			j++
		}
		row(gi)[n+d+gi] = 1
		row(gi)[cols] = 1
	}
	for k, b := range budget {
		row(G + k)[n+k] = 1
		row(G + k)[cols] = max(b/total, 0)
	}
	basis := make([]int, m)
	for gi := range G {
		basis[gi] = n + d + gi
	}
	for k := range d {
		basis[G+k] = n + k
	}
	const eps = 1e-10
	pivots := 0
	run := func(c []float64, allowed int) bool {
		obj := tab[:w]
		clear(obj)
		copy(obj, c)
		for i, b := range basis {
			if cb := c[b]; cb != 0 {
				r := row(i)
				for k := range obj {
					obj[k] -= cb * r[k]
				}
			}
		}
		for iter := 0; iter < 50*(m+cols); iter++ {
			enter := -1
			for k := 0; k < allowed; k++ {
				if obj[k] < -eps {
					enter = k
					break
				}
			}
			if enter < 0 {
				return true
			}
			leave, best := -1, math.Inf(1)
			for i := range m {
				if a := row(i)[enter]; a > eps {
					if r := row(i)[cols] / a; r < best-eps || (r <= best+eps && leave >= 0 && basis[i] < basis[leave]) {
						leave, best = i, r
					}
				}
			}
			if leave < 0 {
				return false // unbounded: cannot happen with x in simplices
			}
			pr := row(leave)
			inv := 1 / pr[enter]
			for k := range pr {
				pr[k] *= inv
			}
			for i := -1; i < m; i++ {
				if i == leave {
					continue
				}
				r := tab[(i+1)*w : (i+2)*w]
				if f := r[enter]; f != 0 {
					for k := range r {
						r[k] -= f * pr[k]
					}
				}
			}
			basis[leave] = enter
			pivots++
		}
		return false
	}
	phase1 := make([]float64, cols)
	for k := n + d; k < cols; k++ {
		phase1[k] = 1
	}
	if !run(phase1, cols) || -tab[cols] > 1e-8 {
		return nil, pivots, false
	}
	// Artificials left basic at 0 are harmless; phase 2 never lets one
	// enter again.
	phase2 := make([]float64, cols)
	copy(phase2, cost)
	if !run(phase2, n+d) {
		return nil, pivots, false
	}
	nu := make([]float64, d)
	for k := range d {
		nu[k] = max(0, tab[n+k]) // reduced cost of slack k = −(dual of its row)
	}
	return nu, pivots, true
}
