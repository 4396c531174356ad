package highs

import (
	"fmt"
	"math"

	"github.com/moetuner/moetuner/mip"
)

// startTol is the absolute tolerance (scaled by 1+|bound|) within which a MIP
// start must meet bounds, integrality and rows to be handed to HiGHS.
const startTol = 1e-6

// maxHighsInt is the largest index HiGHS's 32-bit HighsInt can hold.
const maxHighsInt = math.MaxInt32

// validate checks the shape of m: slice lengths, CSR structure and index
// ranges. HiGHS would otherwise read past the ends of the arrays it gets.
func validate(m *mip.Model) error {
	if m == nil {
		return fmt.Errorf("highs: nil model")
	}
	n := len(m.Cost)
	if len(m.Lower) != n || len(m.Upper) != n {
		return fmt.Errorf("highs: %d costs but %d lower and %d upper bounds", n, len(m.Lower), len(m.Upper))
	}
	if m.Integer != nil && len(m.Integer) != n {
		return fmt.Errorf("highs: %d columns but %d integrality flags", n, len(m.Integer))
	}
	if m.Names != nil && len(m.Names) != n {
		return fmt.Errorf("highs: %d columns but %d names", n, len(m.Names))
	}
	rows := len(m.RowLower)
	if len(m.RowUpper) != rows {
		return fmt.Errorf("highs: %d row lower bounds but %d upper", rows, len(m.RowUpper))
	}
	if m.RowNames != nil && len(m.RowNames) != rows {
		return fmt.Errorf("highs: %d rows but %d row names", rows, len(m.RowNames))
	}
	if rows == 0 && len(m.RowStart) <= 1 && len(m.RowIndex) == 0 && len(m.RowValue) == 0 {
		return nil
	}
	if len(m.RowStart) != rows+1 {
		return fmt.Errorf("highs: %d rows need %d row starts, got %d", rows, rows+1, len(m.RowStart))
	}
	nz := len(m.RowIndex)
	if len(m.RowValue) != nz {
		return fmt.Errorf("highs: %d row indices but %d values", nz, len(m.RowValue))
	}
	if n > maxHighsInt || rows > maxHighsInt || nz > maxHighsInt {
		return fmt.Errorf("highs: model too large for 32-bit HighsInt (%d cols, %d rows, %d nonzeros)", n, rows, nz)
	}
	if m.RowStart[0] != 0 || m.RowStart[rows] != nz {
		return fmt.Errorf("highs: row starts must run from 0 to %d, got %d..%d", nz, m.RowStart[0], m.RowStart[rows])
	}
	for i := 0; i < rows; i++ {
		if m.RowStart[i+1] < m.RowStart[i] {
			return fmt.Errorf("highs: row starts decrease at row %d", i)
		}
	}
	for k, j := range m.RowIndex {
		if j < 0 || j >= n {
			return fmt.Errorf("highs: nonzero %d refers to column %d of %d", k, j, n)
		}
	}
	return nil
}

// rowActivities returns A·x for the rows of m.
func rowActivities(m *mip.Model, x []float64) []float64 {
	act := make([]float64, len(m.RowLower))
	for i := range act {
		s := 0.0
		for k := m.RowStart[i]; k < m.RowStart[i+1]; k++ {
			s += m.RowValue[k] * x[m.RowIndex[k]]
		}
		act[i] = s
	}
	return act
}

func within(v, lo, hi float64) bool {
	return v >= lo-startTol*(1+math.Abs(lo)) && v <= hi+startTol*(1+math.Abs(hi))
}

// cleanStart checks that start is a feasible point of m within startTol and
// returns it with integer columns rounded and every column clamped into its
// bounds, plus its row activities. ok is false when start must be skipped.
func cleanStart(m *mip.Model, start []float64) (x, act []float64, ok bool) {
	if len(start) != len(m.Cost) {
		return nil, nil, false
	}
	x = make([]float64, len(start))
	for j, v := range start {
		if math.IsNaN(v) || !within(v, m.Lower[j], m.Upper[j]) {
			return nil, nil, false
		}
		if m.Integer != nil && m.Integer[j] {
			r := math.Round(v)
			if math.Abs(v-r) > startTol {
				return nil, nil, false
			}
			v = r
		}
		x[j] = math.Min(math.Max(v, m.Lower[j]), m.Upper[j])
	}
	if len(m.RowLower) == 0 {
		return x, nil, true
	}
	act = rowActivities(m, x)
	for i, a := range act {
		if !within(a, m.RowLower[i], m.RowUpper[i]) {
			return nil, nil, false
		}
	}
	return x, act, true
}

// hasInteger reports whether m has an integer column.
func hasInteger(m *mip.Model) bool {
	for _, b := range m.Integer {
		if b {
			return true
		}
	}
	return false
}

// solveEmpty answers a model without columns: every row's activity is zero.
func solveEmpty(m *mip.Model) *mip.Solution {
	for i := range m.RowLower {
		if !within(0, m.RowLower[i], m.RowUpper[i]) {
			return &mip.Solution{Status: mip.Infeasible, Objective: math.Inf(1), Bound: math.Inf(1), Gap: math.Inf(1)}
		}
	}
	return &mip.Solution{Status: mip.Optimal, X: []float64{}, Objective: m.Offset, Bound: m.Offset}
}
