package solver

import (
	"fmt"
	"math"
)

// builder assembles a MIP row by row. Column and row names are kept for LP
// exports; they cost little next to the solve.
type builder struct {
	m MIP
}

func (b *builder) col(name string, lo, hi, cost float64, integer bool) int {
	b.m.Names = append(b.m.Names, name)
	b.m.Lower = append(b.m.Lower, lo)
	b.m.Upper = append(b.m.Upper, hi)
	b.m.Cost = append(b.m.Cost, cost)
	b.m.Integer = append(b.m.Integer, integer)
	return len(b.m.Cost) - 1
}

func (b *builder) binary(name string) int { return b.col(name, 0, 1, 0, true) }

// row adds lo ≤ Σ val[i]·x[idx[i]] ≤ hi. Duplicate indices are summed and
// zero coefficients dropped so that backends get a clean matrix.
func (b *builder) row(name string, lo, hi float64, idx []int, val []float64) {
	if len(b.m.RowStart) == 0 {
		b.m.RowStart = append(b.m.RowStart, 0)
	}
	seen := make(map[int]int, len(idx))
	start := len(b.m.RowIndex)
	for i, j := range idx {
		if k, ok := seen[j]; ok {
			b.m.RowValue[start+k] += val[i]
			continue
		}
		seen[j] = len(b.m.RowIndex) - start
		b.m.RowIndex = append(b.m.RowIndex, j)
		b.m.RowValue = append(b.m.RowValue, val[i])
	}
	// Compact away zeros.
	w := start
	for r := start; r < len(b.m.RowIndex); r++ {
		if b.m.RowValue[r] != 0 {
			b.m.RowIndex[w] = b.m.RowIndex[r]
			b.m.RowValue[w] = b.m.RowValue[r]
			w++
		}
	}
	b.m.RowIndex = b.m.RowIndex[:w]
	b.m.RowValue = b.m.RowValue[:w]
	b.m.RowNames = append(b.m.RowNames, name)
	b.m.RowLower = append(b.m.RowLower, lo)
	b.m.RowUpper = append(b.m.RowUpper, hi)
	b.m.RowStart = append(b.m.RowStart, len(b.m.RowIndex))
}

func (b *builder) mip() *MIP {
	if len(b.m.RowStart) == 0 {
		b.m.RowStart = []int{0}
	}
	m := b.m
	return &m
}

var inf = math.Inf(1)

// Size reports the dimensions of m.
func (m *MIP) Size() (cols, intCols, rows, nonzeros int) {
	for _, isInt := range m.Integer {
		if isInt {
			intCols++
		}
	}
	return len(m.Cost), intCols, len(m.RowLower), len(m.RowIndex)
}

// Check returns nil when x satisfies every bound, integrality and row of m
// within tol, else an error naming the first violation.
func (m *MIP) Check(x []float64, tol float64) error {
	if len(x) != len(m.Cost) {
		return fmt.Errorf("solver: solution has %d values for %d columns", len(x), len(m.Cost))
	}
	for j, v := range x {
		if v < m.Lower[j]-tol || v > m.Upper[j]+tol || math.IsNaN(v) {
			return fmt.Errorf("solver: column %s = %g outside [%g, %g]", m.colName(j), v, m.Lower[j], m.Upper[j])
		}
		if m.Integer[j] && math.Abs(v-math.Round(v)) > tol {
			return fmt.Errorf("solver: integer column %s = %g", m.colName(j), v)
		}
	}
	for i := range m.RowLower {
		a := 0.0
		for k := m.RowStart[i]; k < m.RowStart[i+1]; k++ {
			a += m.RowValue[k] * x[m.RowIndex[k]]
		}
		scale := tol * math.Max(1, math.Abs(a))
		if a < m.RowLower[i]-scale || a > m.RowUpper[i]+scale {
			return fmt.Errorf("solver: row %s = %g outside [%g, %g]", m.rowName(i), a, m.RowLower[i], m.RowUpper[i])
		}
	}
	return nil
}

// Value returns the objective of x (with Offset).
func (m *MIP) Value(x []float64) float64 {
	v := m.Offset
	for j, c := range m.Cost {
		v += c * x[j]
	}
	return v
}

func (m *MIP) colName(j int) string {
	if j < len(m.Names) && m.Names[j] != "" {
		return m.Names[j]
	}
	return fmt.Sprintf("c%d", j)
}

func (m *MIP) rowName(i int) string {
	if i < len(m.RowNames) && m.RowNames[i] != "" {
		return m.RowNames[i]
	}
	return fmt.Sprintf("r%d", i)
}
