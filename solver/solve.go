package solver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/mip"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// Strategy names a placement method.
type Strategy string

const (
	StrategyJoint      Strategy = "joint"       // one ILP on modeled layer time (default)
	StrategyMoETuner   Strategy = "moetuner"    // arXiv 2502.06643, two ILPs, errata fixed
	StrategyGreedy     Strategy = "greedy"      // largest load first onto the lightest GPU
	StrategyContiguous Strategy = "contiguous"  // Megatron: e on GPU e/(E/G)
	StrategyRoundRobin Strategy = "round-robin" // e on GPU e mod G
	// StrategyEPLB is DeepSeek's EPLB, global policy (bit-exact port,
	// duplicate copies on one GPU repaired).
	StrategyEPLB Strategy = "eplb"
	// StrategyEPLBHierarchical is EPLB's hierarchical policy: expert
	// groups (Problem.ExpertGroups, else Model.ExpertGroups) stay on nodes.
	StrategyEPLBHierarchical Strategy = "eplb-hierarchical"
)

// Strategies lists every strategy in the order compare prints them.
var Strategies = []Strategy{StrategyContiguous, StrategyRoundRobin, StrategyGreedy, StrategyEPLB, StrategyEPLBHierarchical, StrategyMoETuner, StrategyJoint}

// ParseStrategy maps a name to a Strategy.
func ParseStrategy(s string) (Strategy, error) {
	for _, st := range Strategies {
		if string(st) == s {
			return st, nil
		}
	}
	if s == "roundrobin" {
		return StrategyRoundRobin, nil
	}
	return "", fmt.Errorf("solver: unknown strategy %q (want joint, moetuner, greedy, eplb, eplb-hierarchical, contiguous or round-robin)", s)
}

// Problem is what to place: statistics, hardware, model and token flow.
type Problem struct {
	Stats   *routing.Stats
	Cluster costmodel.Cluster
	Model   costmodel.Model
	// Flow and Mode choose the modeled layer time that joint minimises and
	// that every result is scored with.
	Flow costmodel.Flow
	Mode costmodel.Mode

	// RedundantSlots adds physical slots per layer beyond one per expert
	// (EPLB's num_replicas − E); the joint strategy then decides how many
	// copies each expert gets and where, tokens split evenly over copies.
	RedundantSlots int
	// SlotsPerGPU, when set, gives every GPU its own slot count per layer
	// (heterogeneous clusters); it overrides RedundantSlots.
	SlotsPerGPU []int
	// ExpertGroups > 0 keeps each group of E/ExpertGroups consecutive
	// experts, and all its copies, on one node (DeepSeek's group-limited
	// routing).
	ExpertGroups int
	// Scenarios, when set, are several workloads (same shape as Stats) the
	// plan must serve at once, combined by Across; Stats should be their
	// sum and is used for scoring.
	Scenarios []*routing.Stats
	Across    Across
	// Split is how an expert's tokens divide among its copies: SplitEven
	// (default, what the serving stacks do statically) or SplitOptimal
	// (SGLang's dispatch-time LP; plans then carry per-slot shares).
	Split Split
	// Dispatch is how the serving stack picks among an expert's copies
	// (placement.DispatchEven by default). Under DispatchLocal the joint
	// strategy also spreads copies of an expert over nodes, so that each
	// node's tokens reach a copy without crossing a NIC; home flow only.
	Dispatch placement.Dispatch
	// Current is the running plan for incremental re-placement: the joint
	// strategy starts from it and changes at most Options.MaxMoves slots
	// per layer.
	Current *placement.Plan
	// MoveCost, with Current, is what one changed slot costs in units of
	// busiest/mean load: a swap (two slots) is made only if it lowers the
	// per-layer busiest/mean by more than 2·MoveCost. 0: free moves.
	MoveCost float64
}

// replicated reports whether p needs the replicated (slot-based) solver.
func (p Problem) replicated() bool {
	return p.RedundantSlots > 0 || p.SlotsPerGPU != nil || p.ExpertGroups > 0 || len(p.Scenarios) > 0 || p.Current != nil
}

// Options tune a solve. The zero value works.
type Options struct {
	// TimeLimit bounds the whole solve (default 60 s). It is passed to
	// HiGHS and enforced by a wall-clock watchdog as well.
	TimeLimit time.Duration
	// RelGap is the relative MIP gap at which HiGHS stops (default 1e-4
	// for joint, 0.025 for moetuner as in the paper; set a negative value
	// for 0).
	RelGap float64
	// Threads for HiGHS (default 1, deterministic). Independent layer
	// problems are also solved Parallel at a time.
	Threads int
	// Parallel is how many independent sub-problems run at once (default
	// 2, the cores of the reference machine).
	Parallel int
	// Seed is HiGHS's random seed (default 0).
	Seed int
	// MaxPairs caps the co-activation (home flow) or transition (chain
	// flow) expert pairs that get variables, per layer (default 4·E).
	MaxPairs int
	// MoETunerEqualSizes makes the moetuner strategy's ILP 1 give every
	// cluster E/G experts (as a third-party SGLang reproduction does), so
	// Eq. 13 always holds. Default false: the paper's unequal clusters,
	// with an *InfeasibleError when Eq. 13 cannot be met.
	MoETunerEqualSizes bool
	// MaxMoves bounds the slots per layer that incremental re-placement
	// (Problem.Current) may change; 0 means no bound.
	MaxMoves int
	// NoPolish skips the exact-cost local search after the ILP.
	NoPolish bool
	// Progress, when set, receives progress reports.
	Progress func(Progress)
}

// Progress is a progress report.
type Progress struct {
	Stage     string
	Objective float64
	Bound     float64
	Elapsed   time.Duration
}

// Status is the outcome of a solve.
type Status int

const (
	// StatusOptimal: every ILP was solved to within its gap.
	StatusOptimal Status = iota
	// StatusFeasible: a plan with a positive proven gap.
	StatusFeasible
	// StatusTimeLimit: the time limit stopped a solve; the plan is the
	// best found.
	StatusTimeLimit
	// StatusInfeasible: the constraints admit no plan.
	StatusInfeasible
	// StatusHeuristic: no ILP was involved (baselines).
	StatusHeuristic
)

// String names the status.
func (s Status) String() string {
	switch s {
	case StatusOptimal:
		return "optimal"
	case StatusFeasible:
		return "feasible"
	case StatusTimeLimit:
		return "time-limit"
	case StatusInfeasible:
		return "infeasible"
	case StatusHeuristic:
		return "heuristic"
	}
	return "unknown"
}

// Result is a solved placement with its evidence.
type Result struct {
	Strategy Strategy
	Plan     *placement.Plan
	Status   Status
	// Objective is the modeled end-to-end time (seconds, sum of layer
	// times) recomputed in Go by costmodel.Evaluate from the plan.
	Objective float64
	Report    *costmodel.Report
	// ModelObjective is the ILP's own objective (seconds) recomputed in Go
	// from the plan; Bound is the solver's dual bound on it and Gap =
	// (ModelObjective − Bound)/ModelObjective. NaN without an ILP.
	ModelObjective float64
	Bound          float64
	Gap            float64
	// Stage1Objective is the moetuner strategy's ILP 1 objective
	// Σ_l Σ_c |T_c − T̄| in tokens, recomputed in Go; Stage2Objective its
	// ILP 2 objective in seconds. NaN for other strategies.
	Stage1Objective float64
	Stage2Objective float64
	// Baseline names the warm start and BaselineObjective its Objective.
	Baseline          Strategy
	BaselineObjective float64
	// CostBound is a lower bound on Objective over every single-copy plan
	// (E/G experts per GPU), on the exact cost model, and CostGap =
	// Objective/CostBound − 1; NaN where no such bound is derived (see
	// homeLowerBound: home flow, one node, per-token patterns).
	CostBound, CostGap float64
	// corners are joint's certified per-layer lower bounds on the busiest
	// GPU's routed and distinct tokens (coverbound.go), folded into
	// CostBound.
	corners [][]homeCorner
	// Balance certifies a replicated plan's busiest-GPU load per layer
	// against a lower bound; nil for single-copy strategies.
	Balance *BalanceReport
	// Note qualifies the result, e.g. "equal cluster sizes" when the
	// moetuner strategy ran with Options.MoETunerEqualSizes.
	Note string
	// Model size of the ILP(s), summed over sub-problems.
	Cols, IntCols, Rows, Nonzeros int
	SolveTime                     time.Duration
}

// ErrInfeasible is returned (wrapped in *InfeasibleError) when no plan
// satisfies the constraints.
var ErrInfeasible = errors.New("infeasible")

// ErrNoSolution is wrapped by errors for solves that stopped at their time
// limit before finding any feasible plan (not a proof of infeasibility).
var ErrNoSolution = errors.New("no feasible solution found in time")

// InfeasibleError says which constraint made a problem infeasible and what
// would fix it.
type InfeasibleError struct {
	Constraint string
	Detail     string
}

// Error names the constraint and the fix.
func (e *InfeasibleError) Error() string {
	return "solver: infeasible: " + e.Constraint + ": " + e.Detail
}

// Unwrap lets errors.Is(err, ErrInfeasible) work.
func (e *InfeasibleError) Unwrap() error { return ErrInfeasible }

func (o Options) withDefaults(st Strategy) Options {
	if o.TimeLimit <= 0 {
		o.TimeLimit = 60 * time.Second
	}
	if o.RelGap == 0 {
		o.RelGap = 1e-4
		if st == StrategyMoETuner {
			o.RelGap = 0.025
		}
	}
	if o.RelGap < 0 {
		o.RelGap = 0
	}
	if o.Threads <= 0 {
		o.Threads = 1
	}
	if o.Parallel <= 0 {
		o.Parallel = 2
	}
	return o
}

func (p Problem) check() error {
	s := p.Stats
	if s == nil {
		return errors.New("solver: problem has no statistics")
	}
	if err := p.Cluster.Validate(); err != nil {
		return err
	}
	g := p.Cluster.GPUs()
	if s.Experts < g && !p.replicated() {
		return &InfeasibleError{Constraint: "gpus", Detail: fmt.Sprintf("%d experts per layer cannot fill %d GPUs without replication; use at most %d GPUs", s.Experts, g, s.Experts)}
	}
	if len(s.Load) != s.Layers || s.Layers == 0 {
		return fmt.Errorf("solver: statistics have %d load rows for %d layers", len(s.Load), s.Layers)
	}
	switch p.Dispatch {
	case placement.DispatchEven:
	case placement.DispatchLocal:
		if p.Flow != costmodel.FlowHome {
			return errors.New("solver: local dispatch is modeled for the home flow only; use flow home or dispatch even")
		}
		if p.Split == SplitOptimal {
			return errors.New("solver: split optimal (SGLang's dispatch LP) and local dispatch are two different dispatch policies; choose one")
		}
	default:
		return fmt.Errorf("solver: unknown dispatch %v", p.Dispatch)
	}
	return nil
}

// evalOpts returns the cost-model options of p.
func (p Problem) evalOpts() costmodel.Options {
	return costmodel.Options{Flow: p.Flow, Mode: p.Mode, Dispatch: p.Dispatch}
}

// Score evaluates plan on p with the cost model and returns the report and
// the modeled end-to-end time in seconds.
func Score(p Problem, plan *placement.Plan) (*costmodel.Report, float64, error) {
	rep, err := costmodel.Evaluate(plan, p.Stats, p.Cluster, p.Model, p.evalOpts())
	if err != nil {
		return nil, 0, err
	}
	return rep, rep.TimeSec, nil
}

// Solve places experts with strategy st. Every returned plan has been
// validated and its cost recomputed in Go; solver objectives are never
// trusted. backend may be nil for the baselines.
func Solve(ctx context.Context, p Problem, st Strategy, backend mip.Backend, opts Options) (*Result, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults(st)
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, opts.TimeLimit+opts.TimeLimit/10+time.Second)
	defer cancel()
	var res *Result
	var err error
	switch st {
	case StrategyContiguous, StrategyRoundRobin, StrategyGreedy, StrategyEPLB, StrategyEPLBHierarchical:
		var plan *placement.Plan
		plan, err = Baseline(p, st)
		if err == nil {
			res = &Result{Plan: plan, Status: StatusHeuristic}
		}
	case StrategyMoETuner:
		if backend == nil {
			return nil, errors.New("solver: the moetuner strategy needs a MIP backend (solver/highs)")
		}
		res, err = solveMoETuner(ctx, p, backend, opts)
		if err == nil && opts.MoETunerEqualSizes {
			res.Note = "E/G experts per cluster"
		}
	case StrategyJoint:
		if backend == nil && !p.replicated() {
			return nil, errors.New("solver: the joint strategy needs a MIP backend (solver/highs)")
		}
		if p.replicated() {
			res, err = solveReplicated(ctx, p, backend, opts, start)
			break
		}
		res, err = solveJoint(ctx, p, backend, opts, start)
	default:
		return nil, fmt.Errorf("solver: unknown strategy %q", st)
	}
	if err != nil {
		return nil, err
	}
	res.Strategy = st
	if p.Split == SplitOptimal {
		applyOptimalSplit(p, res)
	}
	res.Plan.Strategy = string(st)
	if err := res.Plan.Validate(placement.ValidateOptions{Experts: p.Stats.Experts, Layers: p.Stats.Layers}); err != nil {
		return nil, fmt.Errorf("solver: %s produced an invalid plan: %w", st, err)
	}
	rep, obj, err := Score(p, res.Plan)
	if err != nil {
		return nil, err
	}
	res.Report, res.Objective = rep, obj
	res.CostBound, res.CostGap = math.NaN(), math.NaN()
	if lb, ok := homeLowerBoundWith(p, res.corners); ok && lb > 0 {
		res.CostBound, res.CostGap = lb, obj/lb-1
	}
	if st != StrategyJoint {
		res.ModelObjective, res.Bound, res.Gap = nan(res.ModelObjective), nan(res.Bound), nan(res.Gap)
	}
	if st != StrategyMoETuner {
		res.Stage1Objective, res.Stage2Objective = math.NaN(), math.NaN()
	}
	res.SolveTime = time.Since(start)
	return res, nil
}

// nan keeps set values and turns unset zeros into NaN for non-ILP results.
func nan(v float64) float64 {
	if v == 0 {
		return math.NaN()
	}
	return v
}

// Baseline builds a non-ILP plan.
func Baseline(p Problem, st Strategy) (*placement.Plan, error) {
	s := p.Stats
	g := p.Cluster.GPUs()
	switch st {
	case StrategyContiguous:
		return baseline.Contiguous(s.Layers, s.Experts, g)
	case StrategyRoundRobin:
		return baseline.RoundRobin(s.Layers, s.Experts, g)
	case StrategyGreedy:
		return baseline.Greedy(s, g, baseline.GreedyOptions{Speed: p.Cluster.Speed})
	case StrategyEPLB:
		return baseline.EPLB(s, g, baseline.EPLBOptions{RedundantSlots: p.RedundantSlots, Nodes: p.Cluster.Nodes, FixDuplicates: true})
	case StrategyEPLBHierarchical:
		groups := p.ExpertGroups
		if groups == 0 {
			groups = p.Model.ExpertGroups
		}
		if groups == 0 || groups%p.Cluster.Nodes != 0 {
			return nil, fmt.Errorf("solver: eplb-hierarchical needs expert groups that are a multiple of the %d nodes (model %q has %d); pass --expert-groups", p.Cluster.Nodes, p.Model.Name, groups)
		}
		return baseline.EPLB(s, g, baseline.EPLBOptions{RedundantSlots: p.RedundantSlots, Groups: groups, Nodes: p.Cluster.Nodes, FixDuplicates: true})
	}
	return nil, fmt.Errorf("solver: %q is not a baseline", st)
}

// bestBaseline returns the baseline with the lowest modeled time.
func bestBaseline(p Problem) (Strategy, *placement.Plan, float64, error) {
	var best *placement.Plan
	var bestSt Strategy
	bestObj := math.Inf(1)
	var firstErr error
	for _, st := range []Strategy{StrategyGreedy, StrategyEPLB, StrategyContiguous, StrategyRoundRobin} {
		plan, err := Baseline(p, st)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		_, obj, err := Score(p, plan)
		if err != nil {
			return "", nil, 0, err
		}
		if obj < bestObj {
			best, bestSt, bestObj = plan, st, obj
		}
	}
	if best == nil {
		return "", nil, 0, firstErr
	}
	return bestSt, best, bestObj, nil
}

// applyOptimalSplit keeps every copy where it is and splits each expert's
// tokens over its copies to minimise the busiest GPU, as SGLang's
// dispatch-time LP would (any strategy, so comparisons stay fair). Layers
// with one copy per expert are left alone.
func applyOptimalSplit(p Problem, res *Result) {
	speed := make([]float64, res.Plan.GPUs)
	for g := range speed {
		speed[g] = p.Cluster.SpeedOf(g)
	}
	for l := range res.Plan.Layers {
		lp := &res.Plan.Layers[l]
		if len(lp.SlotExpert) == res.Plan.Experts {
			continue
		}
		shares, busiest := optimalShares(p.Stats.Load[l], *lp, speed)
		lp.SlotShare = shares
		if b := res.Balance; b != nil {
			b.Layers[l].Busiest = math.Min(b.Layers[l].Busiest, busiest)
		}
	}
	if b := res.Balance; b != nil {
		b.MaxGap, b.MeanGap = 0, 0
		for _, lb := range b.Layers {
			b.MaxGap = math.Max(b.MaxGap, lb.Gap())
			b.MeanGap += lb.Gap() / float64(len(b.Layers))
		}
		res.Gap = b.MaxGap
	}
}
