package paper

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// ErrNoSolution is wrapped when ILP 2 stops at its time limit without any
// mapping that meets Eq. 13 (not a proof of infeasibility).
var ErrNoSolution = errors.New("no feasible solution found in time")

// Options are the settings of one solve; the solver facade fills them from
// its budget table.
type Options struct {
	TimeLimit time.Duration
	// Stage1 is the deadline offset for ILP 1's layers; ILP 2 gets the rest
	// of TimeLimit.
	Stage1 time.Duration
	// MinLayerLimit is the least time one layer's ILP 1 gets.
	MinLayerLimit time.Duration
	Parallel      int
	MIP           task.MIPSettings
	// Stage1Nodes and Stage2Nodes, when positive, bound each ILP 1 and the
	// ILP 2 by branch-and-bound nodes instead of the clock (a work budget).
	Stage1Nodes, Stage2Nodes int
	// EqualSizes gives every cluster E/G experts (a third-party
	// reproduction's choice, not the paper's), so Eq. 13 always holds.
	EqualSizes bool
}

// Result is the paper's plan with its stage objectives, recomputed in Go:
// Stage1 = Σ_l Σ_c |T_c − T̄| in tokens, Stage2 in seconds.
type Result struct {
	Plan           *placement.Plan
	Stage1, Stage2 float64
	Tally          task.Tally
}

func toGPUs(assign [][]int) [][]placement.GPU {
	out := make([][]placement.GPU, len(assign))
	for l, row := range assign {
		out[l] = make([]placement.GPU, len(row))
		for e, g := range row {
			out[l][e] = placement.GPU(g)
		}
	}
	return out
}

// Solve runs the paper's two stages with errata E1–E6 fixed (see
// doc.go): ILP 1 clusters each layer's experts into G non-empty clusters
// minimising Σ_c |T_c − T̄|; ILP 2 maps clusters to GPUs per layer
// minimising Σ_l max_{g1≠g2} V_{g1,g2,l}/B_{g1,g2} under Eq. 13.
func Solve(ctx context.Context, sc costmodel.Scenario, backend mip.Backend, opts Options) (*Result, error) {
	s := sc.Stats
	L, E, G := s.Layers, s.Experts, sc.Cluster.GPUs()
	if (E*L)%G != 0 {
		return nil, &task.Infeasible{Constraint: "Eq. 13 (memory balance)", Detail: fmt.Sprintf("E·L = %d·%d = %d experts cannot be split evenly over %d GPUs; use a GPU count that divides %d", E, L, E*L, G, E*L)}
	}
	deadline := time.Now().Add(opts.TimeLimit)
	res := &Result{}
	// Stage 1, per layer, in parallel.
	clusters := make([][]int, L) // [l][e] = cluster
	subs := make([]task.Sub, L)
	set1, set2 := opts.MIP, opts.MIP
	set1.NodeLimit, set2.NodeLimit = opts.Stage1Nodes, opts.Stage2Nodes
	task.Layers(L, opts.Parallel, time.Now().Add(opts.Stage1), opts.MinLayerLimit, func(l int, limit time.Duration) {
		m, xs, start := buildILP1(s.Load[l], G, l, opts.EqualSizes)
		subs[l] = task.RunMIP(ctx, backend, m, start, set1, limit)
		if subs[l].Err == nil && subs[l].Sol.X != nil {
			clusters[l] = make([]int, E)
			for e := range E {
				for c := range G {
					if subs[l].Sol.X[xs[c][e]] > 0.5 {
						clusters[l][e] = c
					}
				}
			}
		}
	})
	for _, ss := range subs {
		if _, err := res.Tally.Add(ss, "ILP 1"); err != nil {
			return nil, err
		}
	}
	res.Stage1 = stage1Objective(s.Load, clusters, G)

	// Stage 2.
	sizes := make([][]int, L)
	for l := range L {
		sizes[l] = make([]int, G)
		for _, c := range clusters[l] {
			sizes[l][c]++
		}
	}
	C := clusterTransitions(s, clusters, G)
	B := pairSeconds(sc) // seconds per token for g1 → g2
	built := time.Now()
	mapping := startMapping(sizes, E*L/G)
	m, cols := buildILP2(sizes, C, B, E*L/G, func() bool { return mapping != nil && !time.Now().Before(deadline) })
	// HiGHS takes about as long to load the model as it took to build, and
	// as long again to presolve it, without looking at its clock or a
	// cancel meanwhile (measured on FLAME-MoE with 16 GPUs: 1.3 s to build,
	// 2 s past a HiGHS limit): it gets what is left less twice the build, with nothing left the warm start
	// (a feasible mapping) is the plan rather than a run past the limit.
	var limit time.Duration
	if m != nil {
		limit = max(time.Until(deadline)-2*time.Since(built), 0)
	}
	gpuOf := mapping // [l][c] = GPU
	objective := math.Inf(1)
	if m == nil {
		// Out of time while building: the greedy mapping is the plan.
		res.Tally.TimedOut = true
	} else {
		ss := task.RunMIP(ctx, backend, m, startVector(m, cols, mapping), set2, limit)
		if ss.Err != nil {
			return nil, ss.Err
		}
		if ss.Sol.Status == mip.Infeasible {
			return nil, &task.Infeasible{Constraint: "Eq. 13 (memory balance)", Detail: fmt.Sprintf("no cluster-to-GPU mapping gives every GPU %d experts over the model with ILP 1's cluster sizes; the paper has no fallback: use the joint strategy or another GPU count", E*L/G)}
		}
		if ss.Sol.Status == mip.NoSolution {
			return nil, fmt.Errorf("solver: ILP 2 found no mapping that meets Eq. 13 (every GPU %d experts over the model) with ILP 1's unequal cluster sizes before the time limit: %w; raise the time limit or use equal cluster sizes", E*L/G, ErrNoSolution)
		}
		if _, err := res.Tally.Add(ss, "ILP 2"); err != nil {
			return nil, err
		}
		objective = ss.Sol.Objective
		gpuOf = make([][]int, L)
		for l := range L {
			gpuOf[l] = make([]int, G)
			for c := range G {
				for g := range G {
					if ss.Sol.X[cols.y[l][c][g]] > 0.5 {
						gpuOf[l][c] = g
					}
				}
			}
		}
	}
	stage2 := stage2Objective(C, B, gpuOf, G) // µs
	if C != nil && objective < stage2*(1-1e-6)-1e-6 {
		return nil, fmt.Errorf("solver: internal error: ILP 2 objective %.9g µs below the plan's recomputed %.9g µs", objective, stage2)
	}
	res.Stage2 = stage2 / 1e6
	assign := make([][]int, L)
	for l := range L {
		assign[l] = make([]int, E)
		for e, c := range clusters[l] {
			assign[l][e] = gpuOf[l][c]
		}
	}
	res.Plan = placement.FromAssignment(G, toGPUs(assign), "moetuner")
	return res, nil
}

// buildILP1 returns the corrected ILP 1 of one layer, its x[c][e] columns
// and a feasible start (contiguous clusters).
func buildILP1(load []float64, G, l int, equalSizes bool) (*mip.Model, [][]int, []float64) {
	E := len(load)
	b := &mip.Builder{}
	mean := 0.0
	for _, v := range load {
		mean += v
	}
	mean /= float64(G)
	xs := make([][]int, G)
	d := make([]int, G)
	for c := range G {
		xs[c] = make([]int, E)
		for e := range E {
			xs[c][e] = b.Binary(fmt.Sprintf("x_%d_%d_%d", l, c, e))
		}
		d[c] = b.Col(fmt.Sprintf("d_%d_%d", l, c), 0, mip.Inf, 1, false)
	}
	for e := range E {
		idx := make([]int, G)
		for c := range G {
			idx[c] = xs[c][e]
		}
		b.Row(fmt.Sprintf("one_%d", e), 1, 1, idx, mip.Ones(G)) // E1
	}
	for c := range G {
		if equalSizes && E%G == 0 {
			// Optional (not the paper's design): E/G experts per cluster,
			// which always satisfies Eq. 13.
			b.Row(fmt.Sprintf("size_%d", c), float64(E/G), float64(E/G), xs[c], mip.Ones(E))
		} else {
			b.Row(fmt.Sprintf("nonempty_%d", c), 1, mip.Inf, xs[c], mip.Ones(E)) // Eq. 7
		}
		idx := append([]int{d[c]}, xs[c]...)
		pos := append([]float64{1}, negate(load)...)
		b.Row(fmt.Sprintf("dev_pos_%d", c), -mean, mip.Inf, idx, pos)
		b.Row(fmt.Sprintf("dev_neg_%d", c), mean, mip.Inf, idx, append([]float64{1}, load...))
		if c+1 < G { // symmetry breaking: T_0 ≥ T_1 ≥ …
			idx := append(append([]int{}, xs[c]...), xs[c+1]...)
			val := append(append([]float64{}, load...), negate(load)...)
			b.Row(fmt.Sprintf("order_%d", c), 0, mip.Inf, idx, val)
		}
	}
	m := b.Model()
	// Start: contiguous blocks sorted by load to respect the ordering rows.
	per := E / G
	block := make([]int, E)
	for e := range E {
		c := e / max(per, 1)
		if c >= G {
			c = G - 1
		}
		block[e] = c
	}
	tot := make([]float64, G)
	for e, c := range block {
		tot[c] += load[e]
	}
	rank := sortedDesc(tot)
	start := make([]float64, len(m.Cost))
	for e, c := range block {
		start[xs[rank[c]][e]] = 1
	}
	for c := range G {
		start[d[rank[c]]] = math.Abs(tot[c] - mean)
	}
	if E < G {
		start = nil
	}
	return m, xs, start
}

// sortedDesc returns, for each index, its position in descending order.
func sortedDesc(v []float64) []int {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	for i := 1; i < len(idx); i++ {
		for j := i; j > 0 && (v[idx[j]] > v[idx[j-1]] || (v[idx[j]] == v[idx[j-1]] && idx[j] < idx[j-1])); j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
	pos := make([]int, len(v))
	for p, i := range idx {
		pos[i] = p
	}
	return pos
}

func negate(v []float64) []float64 {
	o := make([]float64, len(v))
	for i, x := range v {
		o[i] = -x
	}
	return o
}

// stage1Objective recomputes Σ_l Σ_c |T_c − T̄_l| from clusters.
func stage1Objective(load [][]float64, clusters [][]int, G int) float64 {
	total := 0.0
	for l, cl := range clusters {
		t := make([]float64, G)
		sum := 0.0
		for e, c := range cl {
			t[c] += load[l][e]
			sum += load[l][e]
		}
		for c := range G {
			total += math.Abs(t[c] - sum/float64(G))
		}
	}
	return total
}

// clusterTransitions aggregates R to clusters (Eq. 9 with erratum E3):
// C[l][c1*G+c2] = Σ R[l][e1][e2] over e1 in cluster c1 of layer l and e2 in
// cluster c2 of layer l+1. Nil without transitions.
func clusterTransitions(s *routing.Stats, clusters [][]int, G int) [][]float64 {
	if s.Transitions == nil {
		return nil
	}
	C := make([][]float64, s.Layers-1)
	for l := range C {
		C[l] = make([]float64, G*G)
		for e1 := range s.Experts {
			for e2 := range s.Experts {
				C[l][clusters[l][e1]*G+clusters[l+1][e2]] += s.Transitions[l][e1*s.Experts+e2]
			}
		}
	}
	return C
}

// pairSeconds returns the seconds per token from g1 to g2: TokenBytes over
// NVLink (same node) or NIC bandwidth; 0 on the diagonal (erratum E5).
func pairSeconds(sc costmodel.Scenario) [][]float64 {
	c := sc.Cluster
	G := c.GPUs()
	B := make([][]float64, G)
	for g1 := range G {
		B[g1] = make([]float64, G)
		for g2 := range G {
			switch {
			case g1 == g2:
			case c.NodeOf(g1) == c.NodeOf(g2):
				B[g1][g2] = sc.Model.TokenBytes() / c.NVLinkBytesPerSec()
			default:
				B[g1][g2] = sc.Model.TokenBytes() / c.NICBytesPerSec()
			}
		}
	}
	return B
}

// buildILP2 returns the corrected ILP 2 (McCormick with the RLT equalities)
// and its y[l][c][g] columns. Times are in µs inside the MIP.
func buildILP2(sizes [][]int, C [][]float64, B [][]float64, perGPU int, stop func() bool) (*mip.Model, ilp2Cols) {
	L := len(sizes)
	G := len(B)
	b := &mip.Builder{}
	ys := make([][][]int, L)
	cols := ilp2Cols{y: ys, z: make([][][][][]int, max(L-1, 0)), m: make([]int, max(L-1, 0))}
	for l := range L {
		ys[l] = make([][]int, G)
		for c := range G {
			ys[l][c] = make([]int, G)
			for g := range G {
				ys[l][c][g] = b.Binary(fmt.Sprintf("y_%d_%d_%d", l, c, g))
			}
			b.Row(fmt.Sprintf("cl_%d_%d", l, c), 1, 1, ys[l][c], mip.Ones(G)) // Eq. 14
		}
		for g := range G {
			idx := make([]int, G)
			for c := range G {
				idx[c] = ys[l][c][g]
			}
			b.Row(fmt.Sprintf("gpu_%d_%d", l, g), 1, 1, idx, mip.Ones(G)) // Eq. 15
		}
	}
	for g := range G { // Eq. 13
		var idx []int
		var val []float64
		for l := range L {
			for c := range G {
				idx = append(idx, ys[l][c][g])
				val = append(val, float64(sizes[l][c]))
			}
		}
		b.Row(fmt.Sprintf("mem_%d", g), float64(perGPU), float64(perGPU), idx, val)
	}
	if C == nil {
		return b.Model(), cols
	}
	for l := 0; l+1 < L; l++ {
		if stop() {
			return nil, cols
		}
		z := make([][][][]int, G) // [c1][g1][c2][g2]
		cols.z[l] = z
		for c1 := range G {
			z[c1] = make([][][]int, G)
			for g1 := range G {
				z[c1][g1] = make([][]int, G)
				for c2 := range G {
					z[c1][g1][c2] = make([]int, G)
					for g2 := range G {
						z[c1][g1][c2][g2] = b.Col(fmt.Sprintf("z_%d_%d_%d_%d_%d", l, c1, g1, c2, g2), 0, 1, 0, false)
					}
				}
			}
		}
		// RLT: Σ_c2 z = y[l][c1][g1] for every g2; Σ_c1 z = y[l+1][c2][g2] for every g1.
		for c1 := range G {
			for g1 := range G {
				for g2 := range G {
					idx := []int{ys[l][c1][g1]}
					val := []float64{-1}
					for c2 := range G {
						idx = append(idx, z[c1][g1][c2][g2])
						val = append(val, 1)
					}
					b.Row(fmt.Sprintf("rlt1_%d_%d_%d_%d", l, c1, g1, g2), 0, 0, idx, val)
				}
			}
		}
		for c2 := range G {
			for g2 := range G {
				for g1 := range G {
					idx := []int{ys[l+1][c2][g2]}
					val := []float64{-1}
					for c1 := range G {
						idx = append(idx, z[c1][g1][c2][g2])
						val = append(val, 1)
					}
					b.Row(fmt.Sprintf("rlt2_%d_%d_%d_%d", l, c2, g2, g1), 0, 0, idx, val)
				}
			}
		}
		M := b.Col(fmt.Sprintf("M_%d", l), 0, mip.Inf, 1, false)
		cols.m[l] = M
		for g1 := range G {
			for g2 := range G {
				if g1 == g2 {
					continue
				}
				idx := []int{M}
				val := []float64{-1}
				for c1 := range G {
					for c2 := range G {
						if w := C[l][c1*G+c2] * B[g1][g2] * 1e6; w != 0 {
							idx = append(idx, z[c1][g1][c2][g2])
							val = append(val, w)
						}
					}
				}
				b.Row(fmt.Sprintf("bott_%d_%d_%d", l, g1, g2), -mip.Inf, 0, idx, val)
			}
		}
	}
	return b.Model(), cols
}

// ilp2Cols are ILP 2's column indices: y[l][c][g] (cluster c of layer l on
// GPU g), z[l][c1][g1][c2][g2] (its product with y[l+1][c2][g2]) and m[l]
// (layer pair l's bottleneck M_l).
type ilp2Cols struct {
	y [][][]int
	z [][][][][]int
	m []int
}

// stage2Objective recomputes Σ_l max_{g1≠g2} V_{g1,g2,l}·B in µs.
func stage2Objective(C [][]float64, B [][]float64, gpuOf [][]int, G int) float64 {
	if C == nil {
		return 0
	}
	total := 0.0
	for l := range C {
		V := make([]float64, G*G)
		for c1 := range G {
			for c2 := range G {
				V[gpuOf[l][c1]*G+gpuOf[l+1][c2]] += C[l][c1*G+c2]
			}
		}
		worst := 0.0
		for g1 := range G {
			for g2 := range G {
				if g1 != g2 {
					worst = math.Max(worst, V[g1*G+g2]*B[g1][g2]*1e6)
				}
			}
		}
		total += worst
	}
	return total
}

// startMapping finds a mapping that meets Eq. 13 greedily (per layer, the
// largest clusters to the GPUs with the fewest experts so far, then swaps
// that repair the per-GPU totals): gpuOf[l][c], or nil when it misses
// Eq. 13.
func startMapping(sizes [][]int, perGPU int) [][]int {
	L, G := len(sizes), len(sizes[0])
	count := make([]int, G)
	gpuOf := make([][]int, L)
	for l := range L {
		order := make([]int, G)
		for c := range order {
			order[c] = c
		}
		sort.SliceStable(order, func(i, j int) bool { return sizes[l][order[i]] > sizes[l][order[j]] })
		used := make([]bool, G)
		gpuOf[l] = make([]int, G)
		for _, c := range order {
			best := -1
			for g := range G {
				if !used[g] && (best < 0 || count[g] < count[best]) {
					best = g
				}
			}
			used[best] = true
			gpuOf[l][c] = best
			count[best] += sizes[l][c]
		}
	}
	// Repair: swap two clusters' GPUs within a layer while that brings the
	// per-GPU totals closer to E·L/G.
	dev := func() int {
		d := 0
		for _, n := range count {
			d += abs(n - perGPU)
		}
		return d
	}
	for cur, improved := dev(), true; cur > 0 && improved; {
		improved = false
		for l := 0; l < L && cur > 0; l++ {
			for c1 := range G {
				for c2 := c1 + 1; c2 < G; c2++ {
					g1, g2 := gpuOf[l][c1], gpuOf[l][c2]
					delta := sizes[l][c1] - sizes[l][c2]
					if delta == 0 {
						continue
					}
					count[g1] -= delta
					count[g2] += delta
					if d := dev(); d < cur {
						cur, improved = d, true
						gpuOf[l][c1], gpuOf[l][c2] = g2, g1
					} else {
						count[g1] += delta
						count[g2] -= delta
					}
				}
			}
		}
	}
	for _, n := range count {
		if n != perGPU {
			return nil
		}
	}
	return gpuOf
}

// startVector is ILP 2's column vector of the mapping gpuOf (nil: none, or
// one that breaks a row of m).
func startVector(m *mip.Model, cols ilp2Cols, gpuOf [][]int) []float64 {
	if gpuOf == nil {
		return nil
	}
	x := make([]float64, len(m.Cost))
	for l, yl := range cols.y {
		for c := range yl {
			x[yl[c][gpuOf[l][c]]] = 1
		}
	}
	for l, zl := range cols.z {
		if zl == nil {
			continue
		}
		for c1 := range zl {
			for c2 := range zl[c1][gpuOf[l][c1]] {
				x[zl[c1][gpuOf[l][c1]][c2][gpuOf[l+1][c2]]] = 1
			}
		}
	}
	// M_l: the largest activity of the bottleneck rows that hold it.
	isM := make([]bool, len(m.Cost))
	for _, j := range cols.m {
		isM[j] = true
	}
	for i := range m.RowLower {
		mcol, act := -1, 0.0
		for k := m.RowStart[i]; k < m.RowStart[i+1]; k++ {
			if isM[m.RowIndex[k]] {
				mcol = m.RowIndex[k]
				continue
			}
			act += m.RowValue[k] * x[m.RowIndex[k]]
		}
		if mcol >= 0 && act > x[mcol] {
			x[mcol] = act
		}
	}
	if m.Check(x, 1e-9) != nil {
		return nil
	}
	return x
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}
