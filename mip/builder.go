package mip

import (
	"fmt"
	"math"
)

// Builder assembles a Model row by row. Column and row names are kept for
// LP exports; they cost little next to the solve. The zero value is an
// empty model.
type Builder struct {
	m Model
}

// Col adds a column with bounds [lo, hi] and objective coefficient cost
// and returns its index.
func (b *Builder) Col(name string, lo, hi, cost float64, integer bool) int {
	b.m.Names = append(b.m.Names, name)
	b.m.Lower = append(b.m.Lower, lo)
	b.m.Upper = append(b.m.Upper, hi)
	b.m.Cost = append(b.m.Cost, cost)
	b.m.Integer = append(b.m.Integer, integer)
	return len(b.m.Cost) - 1
}

// Binary adds a 0/1 integer column without cost.
func (b *Builder) Binary(name string) int { return b.Col(name, 0, 1, 0, true) }

// SetBounds sets column j's bounds.
func (b *Builder) SetBounds(j int, lo, hi float64) { b.m.Lower[j], b.m.Upper[j] = lo, hi }

// SetUpper sets column j's upper bound.
func (b *Builder) SetUpper(j int, hi float64) { b.m.Upper[j] = hi }

// AddCost adds c to column j's objective coefficient.
func (b *Builder) AddCost(j int, c float64) { b.m.Cost[j] += c }

// AddOffset adds v to the objective's constant.
func (b *Builder) AddOffset(v float64) { b.m.Offset += v }

// Row adds lo ≤ Σ val[i]·x[idx[i]] ≤ hi. Duplicate indices are summed and
// zero coefficients dropped so that backends get a clean matrix.
func (b *Builder) Row(name string, lo, hi float64, idx []int, val []float64) {
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

// Model returns the model built so far (its slices are shared with b).
func (b *Builder) Model() *Model {
	if len(b.m.RowStart) == 0 {
		b.m.RowStart = []int{0}
	}
	m := b.m
	return &m
}

// Size reports the dimensions of m.
func (m *Model) Size() (cols, intCols, rows, nonzeros int) {
	for _, isInt := range m.Integer {
		if isInt {
			intCols++
		}
	}
	return len(m.Cost), intCols, len(m.RowLower), len(m.RowIndex)
}

// Check returns nil when x satisfies every bound, integrality and row of m
// within tol, else an error naming the first violation.
func (m *Model) Check(x []float64, tol float64) error {
	if len(x) != len(m.Cost) {
		return fmt.Errorf("mip: solution has %d values for %d columns", len(x), len(m.Cost))
	}
	for j, v := range x {
		if v < m.Lower[j]-tol || v > m.Upper[j]+tol || math.IsNaN(v) {
			return fmt.Errorf("mip: column %s = %g outside [%g, %g]", m.ColName(j), v, m.Lower[j], m.Upper[j])
		}
		if m.Integer[j] && math.Abs(v-math.Round(v)) > tol {
			return fmt.Errorf("mip: integer column %s = %g", m.ColName(j), v)
		}
	}
	for i := range m.RowLower {
		a := 0.0
		for k := m.RowStart[i]; k < m.RowStart[i+1]; k++ {
			a += m.RowValue[k] * x[m.RowIndex[k]]
		}
		scale := tol * math.Max(1, math.Abs(a))
		if a < m.RowLower[i]-scale || a > m.RowUpper[i]+scale {
			return fmt.Errorf("mip: row %s = %g outside [%g, %g]", m.RowName(i), a, m.RowLower[i], m.RowUpper[i])
		}
	}
	return nil
}

// Value returns the objective of x (with Offset).
func (m *Model) Value(x []float64) float64 {
	v := m.Offset
	for j, c := range m.Cost {
		v += c * x[j]
	}
	return v
}

// ColName returns column j's name, or c<j> when it has none.
func (m *Model) ColName(j int) string {
	if j < len(m.Names) && m.Names[j] != "" {
		return m.Names[j]
	}
	return fmt.Sprintf("c%d", j)
}

// RowName returns row i's name, or r<i> when it has none.
func (m *Model) RowName(i int) string {
	if i < len(m.RowNames) && m.RowNames[i] != "" {
		return m.RowNames[i]
	}
	return fmt.Sprintf("r%d", i)
}

// Inf is +∞, for absent bounds.
var Inf = math.Inf(1)

// Ones returns n coefficients of 1, for rows that sum columns.
func Ones(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = 1
	}
	return v
}
