package solver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"time"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/onenode"
	"github.com/moetuner/moetuner/solver/internal/replica"
)

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
	// The contiguous, round-robin and greedy baselines leave the extra
	// slots out: they place one copy per expert.
	RedundantSlots int
	// SlotsPerGPU, when set, gives every GPU its own slot count per layer
	// (heterogeneous clusters); it overrides RedundantSlots.
	SlotsPerGPU []int
	// ExpertGroups > 0 keeps each group of E/ExpertGroups consecutive
	// experts, and all its copies, on one node (DeepSeek's group-limited
	// routing).
	ExpertGroups int
	// Workloads, when set, are several workloads (same shape as Stats) the
	// plan must serve at once, combined by Across; Stats should be their
	// sum and is used for scoring.
	Workloads []*routing.Stats
	Across    Across
	// Split is how an expert's tokens divide among its copies: SplitEven
	// (default, what the serving stacks do statically) or SplitOptimal
	// (SGLang's dispatch-time LP; plans then carry per-slot shares).
	Split Split
	// Dispatch is how the serving stack picks among an expert's copies
	// (placement.DispatchEven by default; docs/dispatch.md lists the
	// stacks' rules). Every plan is scored under it, and the joint searches
	// plan on it: under SGLang's tables on the deal itself. Under
	// DispatchLocal the joint strategy also spreads copies of an expert
	// over nodes, so that each node's tokens reach a copy without crossing
	// a NIC. Every per-source dispatch is home flow only.
	Dispatch placement.Dispatch
	// ShrinkSources, under a per-source dispatch, has the joint searches
	// plan with the trace's per-rank mix shrunk by its split-half
	// reliability (routing.SourceReliability), for traffic the trace has
	// not seen; plans are still scored on the trace as recorded. Measured
	// (compare --holdout 0.5, SGLang's table): on small planted traces
	// (4,000 planning tokens, 8 ranks) the held-out busiest/mean fell from
	// 1.048 to 1.034 on average, in-sample it rose from 1.003 to 1.014; on
	// the 32k DeepSeek-V3 trace (4 × 8) held out it stayed at 1.049 and
	// in-sample rose from 1.009 to 1.016. Default false.
	ShrinkSources bool
	// Current is the running plan for incremental re-placement: the joint
	// strategy starts from it and changes at most Options.MaxMoves slots
	// per layer. With free moves (no MaxMoves, no MoveCost), when it has
	// the problem's slots on every GPU, it is only a plan to beat: the
	// layers are planned afresh and Current kept if faster.
	Current *placement.Plan
	// MaxImbalance, when positive, caps every layer's busiest/mean load
	// in the joint strategy's plan: the busiest GPU's routed tokens per
	// unit of speed (Cluster.Speed; tokens on equal GPUs) over the layer's
	// tokens per unit of speed, as the plan is dispatched (Dispatch). A
	// value of 1.02 allows the busiest GPU 2 % above the mean. In the home
	// flow the affinity search (several nodes, per-token traces) keeps to
	// it as it searches; the plan is then repaired where a layer is still
	// above it, and a cap no plan is found
	// under is an *InfeasibleError that names the layer and what would
	// fix it (before the search when a bound rules out every plan). With
	// Workloads it applies to Stats, their sum. The other strategies
	// ignore it (compare shows their balance). 0: no cap.
	MaxImbalance float64
	// MoveCost, with Current, is what one changed slot costs in units of
	// busiest/mean load: a swap (two slots) is made only if it lowers the
	// per-layer busiest/mean by more than 2·MoveCost. 0: free moves.
	MoveCost float64
}

// Scenario returns what p's plans are scored against.
func (p Problem) Scenario() costmodel.Scenario {
	return costmodel.Scenario{Stats: p.Stats, Cluster: p.Cluster, Model: p.Model, Flow: p.Flow, Mode: p.Mode, Dispatch: p.Dispatch}
}

// withDefaults fills in what p leaves out the way the command line does:
// the model preset matching the statistics' shape when Model is zero
// (costmodel.InferModel), and the model's top-k for count-only statistics
// that do not record theirs (routing.Stats.AssumeTopK, on a copy).
func (p Problem) withDefaults() (Problem, error) {
	if p.Stats == nil {
		return p, errors.New("solver: problem has no statistics")
	}
	if p.Model.Experts == 0 && p.Model.Name == "" {
		m, err := costmodel.InferModel(p.Stats)
		if err != nil {
			return p, fmt.Errorf("%w (Problem.Model)", err)
		}
		p.Model = m
	}
	if p.Stats.TopK == 0 && p.Model.TopK > 0 {
		s := *p.Stats
		s.AssumeTopK(p.Model.TopK)
		p.Stats = &s
	}
	return p, nil
}

// Layout says where p's plans sit in the model, for the file formats
// that index by decoder layer (SGLang, TensorRT-LLM) and for reading files
// that do not record the GPU count: the cluster's GPUs, the statistics'
// experts and MoE layers, and the layer ids and decoder-layer count of the
// statistics (routing.Stats.LayerNames, ModelLayers), which win over the
// model's (DecoderLayers, MoELayerIDs). A zero Model is inferred from the
// statistics as Solve infers it (costmodel.InferModel), so the layout is
// the one Solve's plan has (Result.Layout). What neither knows stays zero,
// and the formats that need it then fail with placement.ErrNeedLayers;
// without statistics only GPUs is set. The command line uses the same.
func (p Problem) Layout() placement.Layout {
	if p.Stats == nil {
		return placement.Layout{GPUs: p.Cluster.GPUs()}
	}
	if q, err := p.withDefaults(); err == nil {
		p = q
	}
	return p.Scenario().Layout()
}

// replicated reports whether p needs the replicated (slot-based) solver.
func (p Problem) replicated() bool {
	return p.RedundantSlots > 0 || p.SlotsPerGPU != nil || p.ExpertGroups > 0 || len(p.Workloads) > 0 || p.Current != nil
}

// Options tune a solve. The zero value works: the joint strategy with
// HiGHS (in a build with cgo), 60 s at most, as many parallel
// sub-problems as the host has cores.
type Options struct {
	// Strategy is the placement method (default StrategyJoint).
	Strategy Strategy
	// Backend solves the ILPs. Nil means HiGHS (mip/highs, linked
	// statically) in a build with cgo. A build without cgo
	// (CGO_ENABLED=0) has no HiGHS, and nil then means no backend: the
	// strategies that need an ILP, moetuner and joint on a single-copy
	// problem (no redundant slots, expert groups, workloads or running
	// plan), return a *BackendError (errors.Is ErrNoILPBackend) before
	// they search; the baselines and joint's other paths (the replicated
	// packing, the affinity search) run without one, leaving out the
	// exact pair method's probes, which need it.
	Backend mip.Backend
	// TimeLimit bounds the whole solve (default 60 s). The budget every
	// time split is a share of is the smaller of TimeLimit and the time
	// left before the context's deadline. It is passed to HiGHS and
	// enforced by a wall-clock watchdog as well.
	TimeLimit time.Duration
	// Effort, when positive, replaces the clock by a work budget of Effort
	// million work units, a unit being one scored move (an annealing
	// proposal, a swap delta, a packing swap) and a branch-and-bound node
	// a thousand (the budget table's NodeWork, budget.go). The units are
	// split among the phases in the same shares as the time, with these
	// exceptions:
	//   - ILPs with more than 1000 columns (EffortMaxCols) are not solved:
	//     the phase keeps its warm start, since HiGHS's node limit does not
	//     bound the root node.
	//   - The affinity search's proxies count cheaper moves: 128 home-flow
	//     proxy moves a unit (proxyPerUnit in solver/internal/affinity),
	//     31 chain-flow proxy moves a unit (chainProxyPerUnit).
	//   - In the chain flow the affinity search gives its cross-layer
	//     proxy all the work up to what saturates it, 64 sweeps
	//     (annealSweeps) of its neighbourhood (every copy to every GPU in
	//     every layer), then half of the rest to the exact annealing and
	//     the rest, with a tenth of the budget on top, to the polish on
	//     the full cost model, whose moves count 24 units each
	//     (polishMoveUnits: an evaluation of two layers' all-to-alls).
	// The same inputs then give the same plan, byte for byte, on any
	// machine and however loaded. TimeLimit, when also set, stays a
	// safety limit that, if it stops the solve first, makes the result
	// depend on the clock again (Status says so); unset, it is 24 h. What
	// a work budget leaves to the clock is the one-node bound
	// (Result.CostBound), which runs three times as long as the work
	// before it took (BoundTimeFactor) and does not change the plan.
	Effort int
	// RelGap is the relative MIP gap at which HiGHS stops (default 1e-4
	// for joint, 0.025 for moetuner as in the paper; set a negative value
	// for 0).
	RelGap float64
	// Threads for HiGHS (default 1, deterministic). Independent layer
	// problems are also solved Parallel at a time.
	Threads int
	// Parallel is how many independent sub-problems run at once (default
	// runtime.GOMAXPROCS(0)).
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
	// Progress, when set, is told as each stage of the strategy ends
	// (a handful of reports per solve, none for the baselines), from the
	// goroutine that called Solve; it should return quickly.
	Progress func(Progress)

	// noDefaultBackend leaves Backend nil when it is unset, as in a build
	// without cgo (tests of that path set it in a build with cgo).
	noDefaultBackend bool
}

// DefaultTimeLimit is Options.TimeLimit's default.
const DefaultTimeLimit = 60 * time.Second

func (o Options) withDefaults() Options {
	if o.Strategy == "" {
		o.Strategy = StrategyJoint
	}
	if o.Backend == nil && !o.noDefaultBackend {
		o.Backend = defaultBackend()
	}
	st := o.Strategy
	if o.TimeLimit <= 0 {
		o.TimeLimit = DefaultTimeLimit
		if o.Effort > 0 {
			o.TimeLimit = 24 * time.Hour // the work bounds it
		}
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
		o.Parallel = runtime.GOMAXPROCS(0)
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
	if i, src := s.MaxSource(); src >= g {
		return fmt.Errorf("solver: Problem.Stats.Patterns[%d] comes from source rank %d, but Problem.Cluster has %d GPUs (ranks 0 to %d); plan for the cluster the trace was recorded on (at least %d GPUs), or set the patterns' Source to -1 (homes spread evenly)", i, src, g, g-1, src+1)
	}
	if p.MaxImbalance != 0 && !(p.MaxImbalance >= 1) || math.IsInf(p.MaxImbalance, 0) {
		return fmt.Errorf("solver: Problem.MaxImbalance %v: want 0 (no cap) or a busiest/mean ratio of at least 1, such as 1.02", p.MaxImbalance)
	}
	if !(p.MoveCost >= 0) || math.IsInf(p.MoveCost, 0) {
		return fmt.Errorf("solver: Problem.MoveCost %v: want 0 (free moves) or a finite cost per changed slot in units of busiest/mean load", p.MoveCost)
	}
	if c := p.Current; c != nil {
		if c.GPUs != g {
			return fmt.Errorf("solver: Problem.Current is a plan for %d GPUs but Problem.Cluster has %d; give the running plan of this cluster", c.GPUs, g)
		}
		if err := c.Validate(placement.ValidateOptions{Experts: s.Experts, Layers: s.Layers}); err != nil {
			return fmt.Errorf("solver: Problem.Current: %w", err)
		}
	}
	if !p.Dispatch.Valid() {
		return fmt.Errorf("solver: unknown dispatch %v", p.Dispatch)
	}
	// The split depends on the source under the per-source dispatches and
	// under vLLM's hash counted token by token (home flow only).
	if p.Scenario().PerSource() {
		if p.Flow != costmodel.FlowHome {
			return fmt.Errorf("solver: %s dispatch is modeled for the home flow only; use flow home or dispatch even", p.Dispatch)
		}
		if p.Split == SplitOptimal {
			return fmt.Errorf("solver: split optimal (SGLang's dispatch LP) and %s dispatch are two different dispatch policies; choose one", p.Dispatch)
		}
	}
	return nil
}

// Solve places experts with opts.Strategy. Every returned plan has been
// validated and its cost recomputed in Go; solver objectives are never
// trusted.
//
// The budget is the smaller of opts.TimeLimit and the time left before
// ctx's deadline. Once any valid plan exists (the baselines take
// milliseconds), a deadline or cancel returns the best validated plan
// found so far with Status StatusStopped, not an error; an error is
// returned only when the context ends before any plan exists.
func Solve(ctx context.Context, p Problem, opts Options) (*Result, error) {
	if opts.MaxMoves < 0 {
		return nil, fmt.Errorf("solver: Options.MaxMoves %d: want 0 (no bound) or more slots per layer", opts.MaxMoves)
	}
	p, err := p.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := p.check(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	st := opts.Strategy
	if p.MaxImbalance > 0 && st == StrategyJoint {
		// A cap no plan with these slots can meet is refused before the
		// search spends its time.
		if err := refuseBeforeSolve(p); err != nil {
			return nil, public(err)
		}
	}
	start := time.Now()
	// byContext: the context's deadline, not TimeLimit, is the budget, so
	// a strategy that runs out of it without a plan was cut short by the
	// deadline.
	byContext := false
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		byContext = left < opts.TimeLimit
		opts.TimeLimit = max(min(opts.TimeLimit, left), 0)
	}
	b := defaultBudget
	ctx, cancel := context.WithTimeout(ctx, opts.TimeLimit+of(opts.TimeLimit, b.Watchdog)+b.WatchdogFixed)
	defer cancel()
	res, err := runStrategy(ctx, p, opts, b, start)
	if err != nil && res == nil && (ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		(byContext && errors.Is(err, ErrNoSolution))) {
		// Cut short before the strategy had a plan: the best baseline is
		// the best plan found so far.
		res, err = stoppedBaseline(p, opts, err)
	}
	if err == nil {
		err = p.fillSlots(res, st)
	}
	if err != nil {
		return nil, public(err)
	}
	res.Strategy = st
	res.Model, res.Layout = p.Model, p.Layout()
	if !res.remoteBound {
		res.RemoteBound = math.NaN()
	}
	if ctx.Err() != nil && res.Status != StatusHeuristic {
		res.Status = StatusStopped
	}
	if err := finish(ctx, p, opts, res); err != nil {
		return nil, err
	}
	res.SolveTime = time.Since(start)
	return res, nil
}

// solveJointPath runs joint on the path p takes: the affinity search,
// the replicated path or the joint ILP.
func solveJointPath(ctx context.Context, p Problem, opts Options, b budget, start time.Time) (*Result, error) {
	if useAffinity(p, opts, b) {
		return solveAffinity(ctx, p, opts.Backend, opts, b, start)
	}
	if p.replicated() {
		return solveReplicated(ctx, p, opts.Backend, opts, b, start)
	}
	if opts.Backend == nil {
		return nil, &BackendError{Strategy: StrategyJoint, Needs: "the joint ILP of a single-copy problem (with Problem.RedundantSlots joint needs none)"}
	}
	return solveJoint(ctx, p, opts.Backend, opts, b, start)
}

// solveFresh is joint from a running plan with free moves: the problem
// without p.Current, whose evaluation is then compared with the plan's.
func solveFresh(ctx context.Context, p Problem, opts Options, b budget, start time.Time) (*Result, error) {
	// The running plan is scored first, so the solve's time limit (from
	// start) already counts it.
	sc := p.Scenario()
	run, err := sc.Evaluate(p.Current)
	if err != nil {
		return nil, err
	}
	q := p
	q.Current = nil
	res, err := solveJointPath(ctx, q, opts, b, start)
	if err != nil || res == nil || res.Plan == nil {
		return res, err
	}
	planRep := res.report
	if planRep == nil {
		if planRep, err = sc.Evaluate(res.Plan); err != nil {
			return nil, err
		}
		res.report = planRep
	}
	if run.TimeSec < planRep.TimeSec {
		return &Result{Plan: p.Current.Clone(), Status: StatusHeuristic, report: run, CurrentReport: run,
			ModelObjective: math.NaN(), Bound: math.NaN(), Gap: math.NaN(),
			Note: "the running plan (Problem.Current) kept: planning afresh found nothing faster"}, nil
	}
	res.CurrentReport = run
	return res, nil
}

// stoppedBaseline is the result of a solve cut short before its strategy
// had a plan: the running plan when it bounds or prices the moves and fits
// (Problem.Current with Options.MaxMoves or Problem.MoveCost: the one plan
// known to keep the budget), else EPLB with replicas, else the first
// baseline that builds (greedy), taken without an evaluation, which at
// production scale would outlast the context. cause is the strategy's
// error, kept when no baseline works either.
func stoppedBaseline(p Problem, opts Options, cause error) (*Result, error) {
	if movesBudgeted(p, opts) && currentFits(p) {
		return &Result{Plan: p.Current.Clone(), Status: StatusStopped,
			ModelObjective: math.NaN(), Bound: math.NaN(), Gap: math.NaN(),
			Note: "stopped before the strategy had a plan; this is the running plan (Problem.Current), the one plan known within the move budget"}, nil
	}
	var st Strategy
	var plan *placement.Plan
	var err error
	if p.replicated() {
		st = StrategyEPLB
		plan, err = Baseline(p, st)
	} else {
		var b baselinePick
		b, err = bestBaseline(p, time.Now())
		st, plan = b.st, b.plan
	}
	if err != nil {
		return nil, cause
	}
	return &Result{Plan: plan, Status: StatusStopped, Baseline: st,
		ModelObjective: math.NaN(), Bound: math.NaN(), Gap: math.NaN(),
		Note: fmt.Sprintf("stopped before the strategy had a plan; this is the %s baseline", st)}, nil
}

// costLowerBound is the one-node bound on the exact cost model (with the
// certified corners where joint found them), for single-copy problems.
func costLowerBound(p Problem, corners [][]onenode.Corner) (float64, bool) {
	if p.replicated() {
		return 0, false
	}
	return onenode.LowerBound(p.Scenario(), corners)
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
		if g > 0 && s.Experts%g != 0 {
			return nil, &InfeasibleError{Constraint: "contiguous", Detail: fmt.Sprintf("Megatron's contiguous layout gives every GPU E/G experts, and %d experts do not divide over %d GPUs; use round-robin, or a GPU count that divides %d", s.Experts, g, s.Experts)}
		}
		return baseline.Contiguous(s.Layers, s.Experts, g)
	case StrategyRoundRobin:
		return baseline.RoundRobin(s.Layers, s.Experts, g)
	case StrategyGreedy:
		opts := baseline.GreedyOptions{Speed: p.Cluster.Speed}
		if g > 0 && s.Experts%g != 0 {
			// The experts fill the GPUs as evenly as counts allow: the first
			// E mod G GPUs take one more.
			opts.SlotsPerGPU = make([]int, g)
			for i := range opts.SlotsPerGPU {
				opts.SlotsPerGPU[i] = s.Experts / g
				if i < s.Experts%g {
					opts.SlotsPerGPU[i]++
				}
			}
		}
		return baseline.Greedy(s, g, opts)
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

// fillSlots gives a one-copy-per-expert plan (contiguous, round-robin,
// greedy, moetuner) the slots RedundantSlots or SlotsPerGPU ask for, with
// copies of the hottest experts (baseline.AddCopies): SGLang and vLLM
// refuse a map whose slot count is not E + redundant experts. Plans that
// already have the slots are kept.
func (p Problem) fillSlots(res *Result, st Strategy) error {
	if res == nil || res.Plan == nil || (p.RedundantSlots == 0 && p.SlotsPerGPU == nil) {
		return nil
	}
	G := p.Cluster.GPUs()
	if p.SlotsPerGPU == nil && (p.Stats.Experts+p.RedundantSlots)%G != 0 {
		return fmt.Errorf("solver: %d experts + %d redundant slots (Problem.RedundantSlots) do not divide evenly over %d GPUs; choose a redundant-slot count that makes the slots a multiple of %d", p.Stats.Experts, p.RedundantSlots, G, G)
	}
	want := p.slotCounts()
	total := 0
	for _, c := range want {
		total += c
	}
	short := false
	for l := range res.Plan.Layers {
		short = short || res.Plan.Slots(l) < total
	}
	if !short {
		return nil
	}
	plan, err := baseline.AddCopies(res.Plan, p.Stats, want, baseline.AddCopiesOptions{Speed: p.Cluster.Speed})
	if err != nil {
		return fmt.Errorf("solver: %s places one copy per expert and the redundant slots could not be filled: %w; use strategy eplb or joint, which place the copies themselves", st, err)
	}
	res.Plan, res.report = plan, nil
	return nil
}

// baselinePick is the baseline bestBaseline chose, with its report (nil
// when it was taken without an evaluation) and how long one evaluation
// took (zero if none ran).
type baselinePick struct {
	st   Strategy
	plan *placement.Plan
	obj  float64
	rep  *costmodel.Report
	eval time.Duration
}

// bestBaseline returns the baseline with the lowest modeled time among
// greedy, EPLB, contiguous and round-robin, in that order. With a
// deadline it evaluates the next candidate only while the time one
// evaluation took still fits before it, and once the deadline has passed
// with none evaluated it takes the first that builds unevaluated (obj
// NaN): at production scale an evaluation walks every token path, and
// four of them can outlast a short limit.
func bestBaseline(p Problem, deadline time.Time) (baselinePick, error) {
	best := baselinePick{obj: math.Inf(1)}
	var firstErr error
	sc := p.Scenario()
	for _, st := range []Strategy{StrategyGreedy, StrategyEPLB, StrategyContiguous, StrategyRoundRobin} {
		if !deadline.IsZero() && best.plan != nil && time.Now().Add(best.eval).After(deadline) {
			break
		}
		plan, err := Baseline(p, st)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if !deadline.IsZero() && best.plan == nil && !time.Now().Before(deadline) {
			return baselinePick{st: st, plan: plan, obj: math.NaN()}, nil
		}
		t0 := time.Now()
		rep, err := sc.Evaluate(plan)
		if err != nil {
			return baselinePick{}, err
		}
		best.eval = max(best.eval, time.Since(t0))
		if rep.TimeSec < best.obj {
			best.st, best.plan, best.obj, best.rep = st, plan, rep.TimeSec, rep
		}
	}
	if best.plan == nil {
		return baselinePick{}, firstErr
	}
	return best, nil
}

// applyOptimalSplit keeps every copy where it is and splits each expert's
// tokens over its copies to minimise the busiest GPU, as SGLang's
// dispatch-time LP would (any strategy, so comparisons stay fair). Layers
// with one copy per expert are left alone.
func applyOptimalSplit(p Problem, res *Result) {
	// The exact pair method's and the exhaustive search's bounds hold for
	// even splits only; max(mean, largest replica) holds for any split.
	var anySplit []float64
	if res.Balance != nil {
		if _, bound, err := replica.Bounds(replicaProblem(p, Options{})); err == nil && len(bound) == len(res.Balance.Layers) {
			anySplit = bound
		}
	}
	speed := make([]float64, res.Plan.GPUs)
	for g := range speed {
		speed[g] = p.Cluster.SpeedOf(g)
	}
	for l := range res.Plan.Layers {
		lp := &res.Plan.Layers[l]
		if len(lp.SlotExpert) == res.Plan.Experts {
			continue
		}
		shares, busiest := replica.OptimalShares(p.Stats.Load[l], *lp, speed)
		lp.SlotShare = shares
		if b := res.Balance; b != nil {
			b.Layers[l].Busiest = math.Min(b.Layers[l].Busiest, busiest)
			if anySplit != nil {
				b.Layers[l].Bound = math.Min(b.Layers[l].Bound, anySplit[l])
			}
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
