package onenode

import (
	"math"
	"math/rand/v2"
)

// coverLP is a small primal simplex for the column generation master of
// coverbound.go,
//
//	min Σ_j x_j  s.t.  Σ_{j: e∈S_j} x_j − s_e = 1 + δ_e (every row e),  x, s ≥ 0,
//
// with m = E rows, 0/1 columns and a dense basis inverse, warm-started
// between calls (new columns enter as nonbasic). δ_e ∈ [0, 1e-7) perturbs
// the right-hand side against degenerate cycling. Its duals only propose
// π: the bound's certificate is checked exhaustively in Go, so numerical
// trouble here can weaken the bound but never make it wrong.
type coverLP struct {
	m     int
	cols  [][]int   // column j's rows
	allow []bool    // column j may enter (its group fits the threshold)
	basis []int     // basic variable per row: j ≥ 0 a column, −1−e the surplus of row e
	binv  []float64 // m×m basis inverse, row-major
	rhs   []float64
	xb    []float64
	pivs  int
	w     []float64
	y     []float64
}

func newCoverLP(m int, rng *rand.Rand) *coverLP {
	lp := &coverLP{m: m, rhs: make([]float64, m), xb: make([]float64, m), w: make([]float64, m), y: make([]float64, m)}
	for e := range lp.rhs {
		lp.rhs[e] = 1 + 1e-7*rng.Float64()
	}
	return lp
}

// add appends a column (its rows) and returns its index; singletons of
// every row must be added first, as columns 0..m−1, for the start basis.
func (lp *coverLP) add(rows []int) int {
	lp.cols = append(lp.cols, rows)
	lp.allow = append(lp.allow, true)
	return len(lp.cols) - 1
}

// reset installs the singleton basis (columns 0..m−1), always feasible.
func (lp *coverLP) reset() {
	m := lp.m
	lp.basis = make([]int, m)
	lp.binv = make([]float64, m*m)
	for e := 0; e < m; e++ {
		lp.basis[e] = e
		lp.binv[e*m+e] = 1
		lp.xb[e] = lp.rhs[e]
	}
	lp.pivs = 0
}

// column writes variable v's column into dst (dense).
func (lp *coverLP) column(v int, dst []float64) {
	clear(dst)
	if v < 0 {
		dst[-1-v] = -1
		return
	}
	for _, e := range lp.cols[v] {
		dst[e] = 1
	}
}

// refactor recomputes the basis inverse and the basic values from
// scratch (Gauss–Jordan with partial pivoting); false when the basis is
// singular.
func (lp *coverLP) refactor() bool {
	m := lp.m
	a := make([]float64, m*m) // columns of B, stored row-major as B
	col := make([]float64, m)
	for i, v := range lp.basis {
		lp.column(v, col)
		for r := 0; r < m; r++ {
			a[r*m+i] = col[r]
		}
	}
	inv := make([]float64, m*m)
	for i := 0; i < m; i++ {
		inv[i*m+i] = 1
	}
	for c := 0; c < m; c++ {
		p := -1
		for r := c; r < m; r++ {
			if p < 0 || math.Abs(a[r*m+c]) > math.Abs(a[p*m+c]) {
				p = r
			}
		}
		if math.Abs(a[p*m+c]) < 1e-12 {
			return false
		}
		if p != c {
			for k := 0; k < m; k++ {
				a[p*m+k], a[c*m+k] = a[c*m+k], a[p*m+k]
				inv[p*m+k], inv[c*m+k] = inv[c*m+k], inv[p*m+k]
			}
		}
		f := 1 / a[c*m+c]
		for k := 0; k < m; k++ {
			a[c*m+k] *= f
			inv[c*m+k] *= f
		}
		for r := 0; r < m; r++ {
			if r == c || a[r*m+c] == 0 {
				continue
			}
			g := a[r*m+c]
			for k := 0; k < m; k++ {
				a[r*m+k] -= g * a[c*m+k]
				inv[r*m+k] -= g * inv[c*m+k]
			}
		}
	}
	lp.binv = inv
	for r := 0; r < m; r++ {
		s := 0.0
		for k := 0; k < m; k++ {
			s += inv[r*m+k] * lp.rhs[k]
		}
		lp.xb[r] = s
	}
	lp.pivs = 0
	return true
}

// solve runs the simplex to optimality (or maxIter pivots) from the
// current basis and returns the objective, the duals y (≥ 0 at the
// optimum) and ok. Basic columns that are no longer allowed force a
// restart from the singleton basis.
func (lp *coverLP) solve(maxIter int) (float64, []float64, bool) {
	m := lp.m
	if lp.basis == nil {
		lp.reset()
	}
	for _, v := range lp.basis {
		if v >= 0 && !lp.allow[v] {
			lp.reset()
			break
		}
	}
	inBasis := make(map[int]bool, m)
	for _, v := range lp.basis {
		inBasis[v] = true
	}
	y, w := lp.y, lp.w
	for it := 0; it < maxIter; it++ {
		// Duals y = c_B·B⁻¹ (c = 1 for columns, 0 for surpluses).
		clear(y)
		for i, v := range lp.basis {
			if v >= 0 {
				row := lp.binv[i*m : (i+1)*m]
				for k := range y {
					y[k] += row[k]
				}
			}
		}
		// Entering variable: most negative reduced cost.
		enter, best := 0, -1e-9
		found := false
		for j, rows := range lp.cols {
			if !lp.allow[j] || inBasis[j] {
				continue
			}
			d := 1.0
			for _, e := range rows {
				d -= y[e]
			}
			if d < best {
				enter, best, found = j, d, true
			}
		}
		for e := 0; e < m; e++ {
			if v := -1 - e; !inBasis[v] && y[e] < best {
				enter, best, found = v, y[e], true
			}
		}
		if !found {
			obj := 0.0
			for i, v := range lp.basis {
				if v >= 0 {
					obj += lp.xb[i]
				}
			}
			return obj, y, true
		}
		// w = B⁻¹·a_enter.
		clear(w)
		if enter < 0 {
			e := -1 - enter
			for i := 0; i < m; i++ {
				w[i] = -lp.binv[i*m+e]
			}
		} else {
			for i := 0; i < m; i++ {
				row := lp.binv[i*m : (i+1)*m]
				s := 0.0
				for _, e := range lp.cols[enter] {
					s += row[e]
				}
				w[i] = s
			}
		}
		// Ratio test (largest pivot among ties).
		leave, ratio := -1, math.Inf(1)
		for i := 0; i < m; i++ {
			if w[i] > 1e-9 {
				r := math.Max(0, lp.xb[i]) / w[i]
				if r < ratio-1e-12 || (r <= ratio+1e-12 && leave >= 0 && w[i] > w[leave]) {
					leave, ratio = i, r
				}
			}
		}
		if leave < 0 {
			return 0, nil, false // unbounded: impossible for this LP
		}
		// Pivot.
		piv := w[leave]
		lrow := lp.binv[leave*m : (leave+1)*m]
		for k := range lrow {
			lrow[k] /= piv
		}
		xl := lp.xb[leave] / piv
		for i := 0; i < m; i++ {
			if i == leave || w[i] == 0 {
				continue
			}
			f := w[i]
			row := lp.binv[i*m : (i+1)*m]
			for k := range row {
				row[k] -= f * lrow[k]
			}
			lp.xb[i] -= f * xl
		}
		lp.xb[leave] = xl
		delete(inBasis, lp.basis[leave])
		lp.basis[leave] = enter
		inBasis[enter] = true
		lp.pivs++
		if lp.pivs >= 100 && !lp.refactor() {
			lp.reset()
			inBasis = make(map[int]bool, m)
			for _, v := range lp.basis {
				inBasis[v] = true
			}
		}
	}
	return 0, nil, false
}

// primal returns the value of column j (0 when nonbasic).
func (lp *coverLP) primal() map[int]float64 {
	out := map[int]float64{}
	for i, v := range lp.basis {
		if v >= 0 && lp.xb[i] > 1e-9 {
			out[v] = lp.xb[i]
		}
	}
	return out
}
