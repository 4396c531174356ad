// Package assign solves the linear assignment problem exactly.
package assign

import "math"

// Min assigns each of n rows to a distinct one of m ≥ n columns so that
// Σ cost(row, column) is least (Kuhn–Munkres with potentials, O(n²·m)).
// It returns, for every column, its row (−1: none) and the number of
// inner scans (a work count). Ties go the same way every time.
func Min(n, m int, cost func(row, col int) float64) (rowOf []int, steps int) {
	inf := math.Inf(1)
	u, v := make([]float64, n+1), make([]float64, m+1)
	p, way := make([]int, m+1), make([]int, m+1) // p[col] = row (1-based)
	minv := make([]float64, m+1)
	used := make([]bool, m+1)
	for i := 1; i <= n; i++ {
		p[0] = i
		j0 := 0
		for j := range minv {
			minv[j], used[j] = inf, false
		}
		for {
			used[j0] = true
			i0, delta, j1 := p[j0], inf, 0
			for j := 1; j <= m; j++ {
				if used[j] {
					continue
				}
				steps++
				cur := cost(i0-1, j-1) - u[i0] - v[j]
				if cur < minv[j] {
					minv[j], way[j] = cur, j0
				}
				if minv[j] < delta {
					delta, j1 = minv[j], j
				}
			}
			for j := 0; j <= m; j++ {
				if used[j] {
					u[p[j]] += delta
					v[j] -= delta
				} else {
					minv[j] -= delta
				}
			}
			j0 = j1
			if p[j0] == 0 {
				break
			}
		}
		for j0 != 0 {
			j1 := way[j0]
			p[j0] = p[j1]
			j0 = j1
		}
	}
	rowOf = make([]int, m)
	for j := 1; j <= m; j++ {
		rowOf[j-1] = p[j] - 1
	}
	return rowOf, steps
}
