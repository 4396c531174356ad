package mip

import "context"

// Model is a mixed-integer linear program in column form, built in Go and
// handed to a Backend once:
//
//	min  Σ_j Cost[j]·x_j + Offset
//	s.t. RowLower[i] ≤ Σ_j A[i][j]·x_j ≤ RowUpper[i]
//	     Lower[j] ≤ x_j ≤ Upper[j],  x_j integer where Integer[j]
//
// Rows are stored sparse (CSR). Use math.Inf for absent bounds.
type Model struct {
	Names   []string // column names (for LP files); may be nil
	Cost    []float64
	Lower   []float64
	Upper   []float64
	Integer []bool
	Offset  float64

	RowNames []string
	RowLower []float64
	RowUpper []float64
	RowStart []int // len rows+1
	RowIndex []int
	RowValue []float64
}

// Options are the backend settings for one solve. The zero value means no
// limit, the backend's default gap, one thread, seed 0.
type Options struct {
	TimeLimitSec float64 // 0: none
	// NodeLimit caps the branch-and-bound nodes (0: none): a work limit,
	// so that a solve stopped by it is reproducible where one stopped by
	// the clock is not.
	NodeLimit int
	// IterationLimit caps the simplex iterations (0: none), the other
	// work limit: a node limit alone does not bound the root node.
	IterationLimit int
	RelGap         float64 // 0: backend default
	Threads        int     // 0: 1
	Seed           int
	// Start is a feasible assignment of every column used as the incumbent
	// (MIP start); nil for none.
	Start []float64
	// Progress, when set, receives the incumbent objective and the dual
	// bound as the search goes on.
	Progress func(objective, bound float64)
	// NoPresolve turns the backend's presolve off (small LPs solved many
	// times, where presolve costs more than it saves).
	NoPresolve bool
}

// Status is a backend's verdict.
type Status int

const (
	Optimal    Status = iota // proven optimal within RelGap
	Feasible                 // stopped (time limit, interrupt) with an incumbent
	Infeasible               // proven infeasible
	NoSolution               // stopped without any incumbent
	Error                    // the backend failed
)

// String names the status.
func (s Status) String() string {
	switch s {
	case Optimal:
		return "optimal"
	case Feasible:
		return "feasible"
	case Infeasible:
		return "infeasible"
	case NoSolution:
		return "no solution"
	case Error:
		return "error"
	}
	return "unknown"
}

// Solution is what a backend returns.
type Solution struct {
	Status    Status
	X         []float64 // column values; nil without an incumbent
	Objective float64   // backend's objective (never trusted: recompute)
	Bound     float64   // dual bound (≤ optimum)
	Gap       float64   // backend's relative gap
	TimedOut  bool      // stopped by the time limit or the watchdog
	// RowDual are the row duals of a pure LP (no integer columns) solved
	// to optimality; nil otherwise. Never trusted as a certificate: callers
	// that derive bounds from them verify the bound in Go.
	RowDual []float64
}

// Backend solves models. mip/highs provides the HiGHS one, a cgo binding
// that a build without cgo (CGO_ENABLED=0) leaves out.
type Backend interface {
	Solve(ctx context.Context, m *Model, opts Options) (*Solution, error)
}
