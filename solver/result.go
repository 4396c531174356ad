package solver

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/onenode"
	"github.com/moetuner/moetuner/solver/internal/replica"
	"github.com/moetuner/moetuner/solver/internal/task"
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

// Progress is a progress report: Solve sends one as each stage of a
// strategy ends (see Options.Progress).
type Progress struct {
	// Stage names the stage that ended: "baseline greedy", "ilp",
	// "descent", "polish", "anneal", "bound", "affinity", "replicas", ….
	Stage string
	// Objective is the stage's incumbent in seconds, on the exact cost
	// model unless ILPModel is set; NaN when the stage has none.
	Objective float64
	// Bound is a lower bound on the same model as Objective (the ILP's
	// dual bound, or after "bound" the certified bound on the exact cost
	// model); NaN when the stage proves none.
	Bound float64
	// ILPModel says that Objective and Bound are the joint ILP's model
	// (a proxy of the exact cost model: "ilp" and "descent").
	ILPModel bool
	// Elapsed is the time since Solve started.
	Elapsed time.Duration
}

// Gap is the relative gap between Objective and Bound as Result states
// it: (Objective − Bound) / Objective on the ILP's model (as Result.Gap),
// Objective / Bound − 1 on the exact cost model (as Result.CostGap). It
// is NaN when the report has no bound, or no positive objective and bound.
func (p Progress) Gap() float64 {
	if math.IsNaN(p.Bound) || !(p.Objective > 0) || math.IsInf(p.Objective, 0) {
		return math.NaN()
	}
	if p.ILPModel {
		return math.Max(0, (p.Objective-p.Bound)/p.Objective)
	}
	if !(p.Bound > 0) {
		return math.NaN()
	}
	return math.Max(0, p.Objective/p.Bound-1)
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
	// StatusStopped: the context's deadline or a cancel cut the solve
	// short; the plan is the best validated one found by then (with Note
	// saying so when it is a baseline).
	StatusStopped
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
	case StatusStopped:
		return "stopped"
	}
	return "unknown"
}

// Result is a solved placement with its evidence.
type Result struct {
	Strategy Strategy
	Plan     *placement.Plan
	Status   Status
	// Model is the model the plan was made and scored for:
	// Problem.Model, or when that is zero the preset Solve inferred from
	// the statistics (costmodel.InferModel).
	Model costmodel.Model
	// Layout is where Plan sits in the model (Problem.Layout with Model):
	// pass it to placement.WriteFileWith for the formats indexed by
	// decoder layer (SGLang, TensorRT-LLM).
	Layout placement.Layout
	// Objective is the modeled end-to-end time (seconds, sum of layer
	// times) recomputed in Go by costmodel from the plan.
	Objective float64
	Report    *costmodel.Report
	// ModelObjective is the joint ILP's own objective (seconds) of the
	// returned plan, recomputed in Go, and Bound the backend's dual bound
	// on it (it holds for every plan). Both are set only where the joint
	// strategy solved its ILP (single-copy problems not on the affinity
	// search's path); NaN otherwise, the moetuner strategy included (its
	// ILPs' objectives are Stage1Objective and Stage2Objective).
	ModelObjective float64
	Bound          float64
	// Gap is a relative gap; what it measures depends on how the plan was
	// made:
	//   - joint's ILP path: (ModelObjective − Bound)/ModelObjective, the
	//     gap on the ILP's model (0 when proved optimal), also after the
	//     repair to Problem.MaxImbalance;
	//   - joint with a Balance report (the replicated path, and the
	//     affinity search with redundant slots): Balance.MaxGap, the
	//     largest per-layer busiest GPU load over its lower bound, minus
	//     1 (recomputed after the MaxImbalance repair, and under
	//     SplitOptimal from the optimal split's loads);
	//   - NaN otherwise: the baselines, moetuner, the affinity search
	//     without redundant slots, a running plan kept (Problem.Current)
	//     and a baseline returned because the solve was stopped.
	// Result.CostGap is the gap on the exact cost model.
	Gap float64
	// Stage1Objective is the moetuner strategy's ILP 1 objective
	// Σ_l Σ_c |T_c − T̄| in tokens, recomputed in Go; Stage2Objective its
	// ILP 2 objective in seconds. NaN for other strategies.
	Stage1Objective float64
	Stage2Objective float64
	// Baseline names the warm start and BaselineObjective its Objective.
	Baseline          Strategy
	BaselineObjective float64
	// CurrentReport is the cost model's report of Problem.Current where
	// the strategy scored it on the way (the affinity search starts from
	// it under a move budget; planning afresh compares against it), so
	// that a caller need not score it again; nil otherwise.
	CurrentReport *costmodel.Report
	// CostBound is a lower bound on Objective over every single-copy plan
	// (E/G experts per GPU), on the exact cost model, and CostGap =
	// Objective/CostBound − 1; NaN where no such bound is derived (home
	// flow, one node, per-token patterns only).
	CostBound, CostGap float64
	// corners are joint's certified per-layer lower bounds on the busiest
	// GPU's routed and distinct tokens, folded into CostBound.
	corners [][]onenode.Corner
	// remoteBound: RemoteBound was computed.
	remoteBound bool
	// report, when set, is the cost model's report of Plan, computed by
	// the strategy from the plan itself (not taken from a solver's
	// objective): the facade uses it instead of evaluating Plan again.
	report *costmodel.Report
	// Balance certifies a replicated plan's busiest-GPU load per layer
	// against a lower bound; nil for single-copy strategies.
	Balance *BalanceReport
	// RemoteBound is a certified lower bound on the remote-node copies
	// per token and layer (Report.RemoteCopies over Tokens·layers) of any
	// plan with the problem's slots (home flow) or with one copy of every
	// expert (chain flow: cross-node transitions); NaN when not computed
	// (the affinity search computes it).
	RemoteBound float64
	// RemoteBoundLayers is how many layers RemoteBound bounds: fewer than
	// the layers when its share of the time ran out first (the others
	// count 0, so it is still a bound, only a weaker one).
	RemoteBoundLayers int
	// RemoteBoundCap, when not 0, restricts RemoteBound to the plans that
	// also meet Problem.MaxImbalance in every layer (the joint plan does):
	// the home flow's bound then uses the nodes' balance.
	RemoteBoundCap float64
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

// public turns the internal packages' infeasibility into InfeasibleError.
func public(err error) error {
	var inf *task.Infeasible
	if errors.As(err, &inf) {
		return &InfeasibleError{Constraint: inf.Constraint, Detail: inf.Detail}
	}
	return err
}

// Across says how a plan made for several workloads (Problem.Workloads)
// combines them.
type Across int

const (
	// AcrossMean minimises the mean over workloads of the per-layer
	// busiest/mean GPU load.
	AcrossMean Across = iota
	// AcrossWorst minimises the worst workload's busiest/mean.
	AcrossWorst
)

// String returns "mean" or "worst".
func (a Across) String() string {
	if a == AcrossWorst {
		return "worst"
	}
	return "mean"
}

// ParseAcross maps "mean" or "worst" to an Across.
func ParseAcross(s string) (Across, error) {
	switch s {
	case "mean":
		return AcrossMean, nil
	case "worst":
		return AcrossWorst, nil
	}
	return 0, fmt.Errorf("solver: --across %q: want mean or worst", s)
}

// Split says how an expert's tokens divide among its copies.
type Split int

const (
	// SplitEven: every copy serves the same share, as vLLM (by token
	// position), SGLang's static dispatch and EPLB's own model assume.
	SplitEven Split = iota
	// SplitOptimal: the split is chosen per layer to minimise the busiest
	// GPU's load, as SGLang's dispatch-time LP (--ep-dispatch-algorithm lp)
	// does per batch; plans then carry LayerPlan.SlotShare.
	SplitOptimal
)

// ParseSplit maps "even" or "optimal" to a Split.
func ParseSplit(s string) (Split, error) {
	switch s {
	case "even":
		return SplitEven, nil
	case "optimal":
		return SplitOptimal, nil
	}
	return 0, fmt.Errorf("solver: --split %q: want even or optimal", s)
}

// String returns "even" or "optimal".
func (s Split) String() string {
	if s == SplitOptimal {
		return "optimal"
	}
	return "even"
}

// LayerBalance is the certified balance of one layer: the busiest GPU's
// load (tokens divided by speed), the mean, and a lower bound on the
// busiest load of any plan with the same slots.
type LayerBalance struct {
	Busiest, Mean, Bound float64
	// Under local dispatch: Traffic is the layer's token-expert pairs that
	// cross a NIC (per phase, sources uniform), Σ_e P_e·(N − nodes with
	// e)/N, and TrafficBound a lower bound on it for any plan whose
	// busiest GPU is at most Busiest. 0 otherwise.
	Traffic, TrafficBound float64
}

// Gap is Busiest/Bound − 1.
func (b LayerBalance) Gap() float64 {
	if b.Bound <= 0 {
		return 0
	}
	return b.Busiest/b.Bound - 1
}

// BalanceReport certifies a replicated plan's load balance layer by layer.
type BalanceReport struct {
	Layers []LayerBalance
	// MaxGap and MeanGap summarise Layers' Gap.
	MaxGap, MeanGap float64
	// TrafficGap, under local dispatch with count-only statistics (where
	// Traffic is exactly what crosses the NICs), is Σ Traffic /
	// Σ TrafficBound − 1 over the layers: how far the cross-node traffic
	// is from the least any plan at most as unbalanced (layer by layer)
	// could have. 0 otherwise.
	TrafficGap float64
	// Workload[s] is the mean over layers of busiest/mean for workload s
	// (Problem.Workloads), nil without workloads.
	Workload []float64
}

func publicBalance(b *replica.BalanceReport) *BalanceReport {
	out := &BalanceReport{MaxGap: b.MaxGap, MeanGap: b.MeanGap, TrafficGap: b.TrafficGap, Workload: b.Workload}
	for _, lb := range b.Layers {
		out.Layers = append(out.Layers, LayerBalance{Busiest: lb.Busiest, Mean: lb.Mean, Bound: lb.Bound, Traffic: lb.Traffic, TrafficBound: lb.TrafficBound})
	}
	return out
}

// MarshalText encodes s by name (String).
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText decodes a name that String returns.
func (s *Status) UnmarshalText(b []byte) error {
	for st := StatusOptimal; st <= StatusStopped; st++ {
		if st.String() == string(b) {
			*s = st
			return nil
		}
	}
	return fmt.Errorf("solver: unknown status %q", b)
}

// jsonFloat encodes NaN and ±Inf as null, which JSON has no numbers for.
type jsonFloat float64

func (f jsonFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(v)
}

// MarshalJSON encodes r with its unset quantities (NaN: no ILP, no bound)
// as null, so that a service can log or ship a Result.
func (r Result) MarshalJSON() ([]byte, error) {
	type plain Result // without this method
	return json.Marshal(struct {
		plain
		Objective, ModelObjective, Bound, Gap jsonFloat
		Stage1Objective, Stage2Objective      jsonFloat
		BaselineObjective, CostBound, CostGap jsonFloat
		RemoteBound, RemoteBoundCap           jsonFloat
	}{plain(r), jsonFloat(r.Objective), jsonFloat(r.ModelObjective), jsonFloat(r.Bound), jsonFloat(r.Gap),
		jsonFloat(r.Stage1Objective), jsonFloat(r.Stage2Objective),
		jsonFloat(r.BaselineObjective), jsonFloat(r.CostBound), jsonFloat(r.CostGap),
		jsonFloat(r.RemoteBound), jsonFloat(r.RemoteBoundCap)})
}
