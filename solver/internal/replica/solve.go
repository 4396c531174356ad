package replica

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver/internal/search"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// Across says how a plan made for several workloads (Problem.Scenarios)
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

// LayerBalance is the certified balance of one layer: the busiest GPU's
// load (tokens divided by speed), the mean, and a lower bound on the
// busiest load of any plan with the same slots.
type LayerBalance struct {
	Busiest, Mean, Bound float64
	// Under local dispatch: Traffic is the layer's token-expert pairs that
	// cross a NIC (per phase, sources uniform), Σ_e P_e·(N − nodes with
	// e)/N, and TrafficBound a lower bound on it for any plan whose
	// busiest GPU is at most Busiest (see trafficBound). 0 otherwise.
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

// replicaLayout is the per-problem slot layout for replicated plans.
type replicaLayout struct {
	slots []int // per GPU per layer
	total int
	// groups > 0: expert groups kept on nodes of perNode GPUs, which
	// groupBound's certificate accounts for.
	groups, perNode int
	// src, under static dispatch with per-token sources, is every layer's
	// source shares (costmodel.SourceShares): the loads are then the
	// static split's (staticLoads), not the even split's.
	src [][]float64
}

// srcOf returns layer l's source shares, or nil.
func (lay replicaLayout) srcOf(l int) []float64 {
	if lay.src == nil {
		return nil
	}
	return lay.src[l]
}

func (p Problem) layout() (replicaLayout, error) {
	G := p.Cluster.GPUs()
	E := p.Stats.Experts
	var lay replicaLayout
	if p.SlotsPerGPU != nil {
		if len(p.SlotsPerGPU) != G {
			return lay, fmt.Errorf("solver: SlotsPerGPU has %d entries for %d GPUs", len(p.SlotsPerGPU), G)
		}
		lay.slots = append([]int(nil), p.SlotsPerGPU...)
	} else {
		R := E + p.RedundantSlots
		if R%G != 0 {
			return lay, &task.Infeasible{Constraint: "slots", Detail: fmt.Sprintf("%d experts + %d redundant slots = %d slots per layer do not divide over %d GPUs; use %d or %d redundant slots", E, p.RedundantSlots, R, G, p.RedundantSlots-R%G, p.RedundantSlots+G-R%G)}
		}
		lay.slots = make([]int, G)
		for g := range lay.slots {
			lay.slots[g] = R / G
		}
	}
	for _, s := range lay.slots {
		lay.total += s
	}
	lay.groups, lay.perNode = p.ExpertGroups, p.Cluster.GPUsPerNode
	if lay.total < E {
		return lay, &task.Infeasible{Constraint: "slots", Detail: fmt.Sprintf("%d slots per layer cannot hold %d experts", lay.total, E)}
	}
	if eb := p.Model.ExpertBytes(); eb > 0 {
		for g, s := range lay.slots {
			have := p.Cluster.MemOf(g)
			need := int64(s) * eb * int64(p.Stats.Layers)
			if have > 0 && need > have {
				return lay, &task.Infeasible{Constraint: "memory", Detail: fmt.Sprintf("GPU %d needs %.2f GiB for %d expert slots × %d layers × %.1f MiB but has %.2f GiB: %.2f GiB missing; use fewer redundant slots, fewer slots on this GPU or more GPUs", g, gib(need), s, p.Stats.Layers, float64(eb)/(1<<20), gib(have), gib(need-have))}
			}
		}
	}
	return lay, nil
}

func gib(b int64) float64 { return float64(b) / (1 << 30) }

// workloadLoads returns per layer the [S][E] loads the packer balances.
func (p Problem) workloadLoads(l int) [][]float64 {
	if len(p.Workloads) == 0 {
		return [][]float64{p.Stats.Load[l]}
	}
	out := make([][]float64, len(p.Workloads))
	for s, st := range p.Workloads {
		out[s] = st.Load[l]
	}
	return out
}

// Problem is a placement with replicas: the scenario, the slots, and what
// constrains them.
type Problem struct {
	costmodel.Scenario
	// RedundantSlots adds slots per layer beyond one per expert; SlotsPerGPU,
	// when set, gives every GPU its own slot count (it wins).
	RedundantSlots int
	SlotsPerGPU    []int
	// ExpertGroups > 0 keeps each group of E/ExpertGroups consecutive
	// experts, and all its copies, on one node.
	ExpertGroups int
	// Workloads, when set, are several loads the plan must serve at once,
	// combined by Across.
	Workloads []*routing.Stats
	Across    Across
	// Current, when set, is the running plan: start from it, change at
	// most MaxMoves slots per layer (0: no bound), or only moves worth
	// MoveCost each (in units of busiest/mean).
	Current  *placement.Plan
	MaxMoves int
	MoveCost float64
}

// Options bound a solve; the solver facade fills them from its budget
// table.
type Options struct {
	// Deadline ends the solve; the layers get LayerShare of the time until
	// it when a polish on the exact cost model follows (1 otherwise).
	Start      time.Time
	Deadline   time.Time
	LayerShare float64
	Parallel   int
	MinLayer   time.Duration
	// SpreadGrace is how far past its share a layer's node spreading under
	// local dispatch may run (it is cheap and saves NIC traffic).
	SpreadGrace time.Duration
	// PairProbeMin and PairProbeShare bound one feasibility probe of the
	// exact pair method (the larger of the two, the share being of the
	// time left); PairProofShare of the layer's time goes to proving the
	// bound, the rest to finding plans.
	PairProbeMin   time.Duration
	PairProbeShare float64
	PairProofShare float64
	NoPolish       bool
	// AfterEvals is how many evaluations' worth of time the caller needs
	// once Solve returns (it scores the plan again, after changing its
	// dispatch splits for instance); 0 means 1.
	AfterEvals float64
	// Work > 0 replaces the clock by a work budget of that many scored
	// moves in all (the layers' share LayerShare, split evenly among
	// them; the polish the rest), so that the same inputs give the same
	// plan on any machine. PairProbeNodes then bounds each of the exact
	// pair method's HiGHS probes.
	Work           int64
	PairProbeNodes int
}

// Result is the plan with its certified balance; TimedOut when the
// deadline passed.
type Result struct {
	Plan     *placement.Plan
	Balance  *BalanceReport
	Optimal  bool
	TimedOut bool
	// Report is the cost model's report of Plan when the solve evaluated
	// it (the polished path), else nil.
	Report *costmodel.Report
}

// Solve places every layer with replication: replica counts by
// apportionment (which minimises the largest replica), copies packed
// largest first, then improved by swaps; every layer's busiest load is
// certified against the bound max(mean, largest replica under the best
// apportionment). Layers run in parallel. With per-token statistics, or
// under SGLang's plain table, the plan is then polished on the exact cost
// model.
func Solve(ctx context.Context, p Problem, backend mip.Backend, opts Options) (*Result, error) {
	if p.MaxMoves < 0 {
		return nil, fmt.Errorf("replica: Problem.MaxMoves %d: want 0 (no bound) or more slots per layer", p.MaxMoves)
	}
	lay, err := p.layout()
	if err != nil {
		return nil, err
	}
	s := p.Stats
	G, E, L := p.Cluster.GPUs(), s.Experts, s.Layers
	speed := make([]float64, G)
	for g := range speed {
		speed[g] = p.Cluster.SpeedOf(g)
	}
	groups := p.ExpertGroups
	if groups > 0 && (E%groups != 0 || groups%p.Cluster.Nodes != 0) {
		return nil, &task.Infeasible{Constraint: "expert groups", Detail: fmt.Sprintf("%d groups must divide %d experts and be a multiple of %d nodes", groups, E, p.Cluster.Nodes)}
	}
	// On one node local dispatch splits as static does (a source's own
	// GPU, else its node's copies evenly: all of them).
	if (p.Dispatch.Closed() == placement.DispatchStaticMean || (p.Dispatch.Closed() == placement.DispatchLocal && p.Cluster.Nodes == 1)) && len(p.Workloads) == 0 {
		lay.src = costmodel.SourceShares(s, G)
	}
	deadline := opts.Deadline
	// The layers are placed on the dispatch's closed form: with per-token
	// statistics, and under SGLang's plain table (whose deal no closed
	// form sees: on DeepSeek-V3's published counts, 4 × 8 GPUs, 32
	// redundant slots, 20 s, 74.289 s modeled before the polish, 73.967 s
	// after, EPLB 74.047 s), the polish prices what the cost model does.
	// The trees that deal per rank would price most swaps by dealing the
	// whole plan again.
	dealt := p.Dispatch.Dealt() && !costmodel.DealtPerRank(p.Dispatch, nil)
	polishable := !opts.NoPolish && p.Current == nil && len(p.Workloads) == 0 && (s.Patterns != nil || (p.Flow == costmodel.FlowChain && s.Transitions != nil) || dealt)
	layersDone := deadline
	if polishable {
		layersDone = opts.Start.Add(time.Duration(opts.LayerShare * float64(deadline.Sub(opts.Start))))
	}
	layerWork, polishWork := int64(0), int64(0)
	if opts.Work > 0 {
		layerWork = opts.Work
		if polishable {
			layerWork = int64(opts.LayerShare * float64(opts.Work))
			polishWork = opts.Work - layerWork
		}
		layersDone = time.Now().Add(24 * time.Hour) // only the work bounds it
	}
	copies := make([][][]placement.GPU, L)
	bal := make([]LayerBalance, L)
	errs := make([]error, L)
	task.Layers(L, opts.Parallel, layersDone, opts.MinLayer, func(l int, limit time.Duration) {
		if ctx.Err() != nil {
			errs[l] = ctx.Err()
			return
		}
		lim := task.Limit{Deadline: time.Now().Add(limit), Work: layerWork}.Share(L)
		copies[l], bal[l], errs[l] = placeLayer(ctx, p, backend, l, lay, speed, groups, lim, opts)
	})
	for _, e := range errs {
		if e != nil {
			return nil, e
		}
	}
	plan := placement.FromReplicas(G, copies, "joint")
	// With per-token statistics the cost model sees which tokens share
	// GPUs and nodes: trade balance against communication by polishing on
	// the exact cost model (not for incremental re-placement, whose move
	// budget a polish would break).
	var report *costmodel.Report
	if polishable {
		t0 := time.Now()
		before, err := p.Evaluate(plan)
		if err != nil {
			return nil, err
		}
		// The polished plan is scored once more here, then by the
		// caller (Options.AfterEvals): the polish stops that much before
		// the deadline (at production scale one evaluation walks every
		// token path).
		report = before
		eval := time.Since(t0)
		callerEvals := opts.AfterEvals
		if callerEvals <= 0 {
			callerEvals = 1
		}
		polishEnd := deadline.Add(-time.Duration((1 + callerEvals) * float64(eval)))
		// Building the polish's evaluator costs one to two evaluations
		// (32k tokens, 4 × 8 GPUs, 32 redundant slots: 0.71 s against
		// 0.36 s in the home flow, 1.17 s against 0.81 s in the chain
		// flow): with less than two left the polish could not make a
		// move, so it is skipped. Under Work the work budget, not the
		// clock, bounds it.
		if opts.Work > 0 || time.Until(polishEnd) > 2*eval {
			polished, err := search.Polish(ctx, p.Scenario, plan, task.Limit{Deadline: polishEnd, Work: polishWork}, opts.Parallel)
			if err != nil {
				return nil, err
			}
			if after, err := p.Evaluate(polished); err == nil && after.TimeSec < before.TimeSec {
				plan, report = polished, after
				copies, bal = certifyLayers(p, plan, lay, speed)
			}
		}
	}
	res := &Result{Plan: plan, Report: report}
	br := balanceReport(p, bal, copies, speed)
	res.Optimal = br.MaxGap <= 1e-9
	res.TimedOut = opts.Work == 0 && time.Now().After(deadline)
	res.Balance = br
	return res, nil
}

// balanceReport sums the layers' certified balance bal of copies into
// Result.Balance: the gaps, each workload's balance, and under local
// dispatch without per-token paths the traffic gap.
func balanceReport(p Problem, bal []LayerBalance, copies [][][]placement.GPU, speed []float64) *BalanceReport {
	L := len(bal)
	br := &BalanceReport{Layers: bal}
	for _, b := range bal {
		br.MaxGap = math.Max(br.MaxGap, b.Gap())
		br.MeanGap += b.Gap() / float64(L)
	}
	if len(p.Workloads) > 0 {
		br.Workload = make([]float64, len(p.Workloads))
		for si, st := range p.Workloads {
			for l := range L {
				br.Workload[si] += busiestOverMean(st.Load[l], copies[l], speed, p.localP(), nil) / float64(L)
			}
		}
	}
	if p.Dispatch.Closed() == placement.DispatchLocal && p.Stats.Patterns == nil {
		t, tb := 0.0, 0.0
		for _, b := range bal {
			t += b.Traffic
			tb += b.TrafficBound
		}
		if tb > 0 {
			br.TrafficGap = t/tb - 1
		}
	}
	return br
}

// Certify is Result.Balance for plan, a plan with p's slots that Solve
// did not make (or that was changed after it): every layer's busiest load
// against its bound, counted as Solve counts it.
func Certify(p Problem, plan *placement.Plan) (*BalanceReport, error) {
	lay, err := p.layout()
	if err != nil {
		return nil, err
	}
	speed := make([]float64, p.Cluster.GPUs())
	for g := range speed {
		speed[g] = p.Cluster.SpeedOf(g)
	}
	copies, bal := certifyLayers(p, plan, lay, speed)
	return balanceReport(p, bal, copies, speed), nil
}

// certifyLayers is every layer's copies in plan and their balance
// against the basic bound (layerBalance).
func certifyLayers(p Problem, plan *placement.Plan, lay replicaLayout, speed []float64) ([][][]placement.GPU, []LayerBalance) {
	L, G := len(plan.Layers), p.Cluster.GPUs()
	copies := make([][][]placement.GPU, L)
	bal := make([]LayerBalance, L)
	for l := range L {
		copies[l] = plan.ExpertGPUs(l)
		bal[l] = layerBalance(p.Stats.Load[l], copies[l], speed, lay, G, p.localP(), lay.srcOf(l))
	}
	return copies, bal
}

// busiestOverMean scores one layer of copies under a load vector (even
// split, local dispatch with P GPUs per node when P > 0, or static
// dispatch with source shares src when src is not nil).
func busiestOverMean(load []float64, copies [][]placement.GPU, speed []float64, P int, src []float64) float64 {
	var gl []float64
	if src != nil {
		gl = staticLoads(load, copies, speed, src)
	} else {
		gl = gpuLoads(load, copies, speed, P)
	}
	total, sp := 0.0, 0.0
	for e := range copies {
		total += load[e]
	}
	for _, v := range speed {
		sp += v
	}
	m := 0.0
	for _, v := range gl {
		m = math.Max(m, v)
	}
	if total == 0 {
		return 1
	}
	return m / (total / sp)
}

// Slots returns the expert slots of every GPU in p's layout.
func Slots(p Problem) ([]int, error) {
	lay, err := p.layout()
	return lay.slots, err
}

// Bounds returns, per layer, the mean load per unit of speed and a lower
// bound on the busiest GPU's load of any plan with p's slots: max(mean,
// largest replica under the apportionment that minimises it over the
// fastest GPU), the bound Solve certifies its own plans against.
func Bounds(p Problem) (mean, bound []float64, err error) {
	lay, err := p.layout()
	if err != nil {
		return nil, nil, err
	}
	G := p.Cluster.GPUs()
	speed := make([]float64, G)
	sp, maxSp := 0.0, 0.0
	for g := range speed {
		speed[g] = p.Cluster.SpeedOf(g)
		sp += speed[g]
		maxSp = math.Max(maxSp, speed[g])
	}
	E := p.Stats.Experts
	experts := make([]int, E)
	for e := range experts {
		experts[e] = e
	}
	for _, load := range p.Stats.Load {
		total := 0.0
		for _, v := range load {
			total += v
		}
		m := total / sp
		b := m
		if cnt, err := apportion(load, experts, lay.total, G); err == nil {
			b = math.Max(m, maxReplica(load, cnt)/maxSp)
		}
		b = math.Max(b, groupBound(load, speed, lay.slots, lay.groups, lay.perNode))
		mean, bound = append(mean, m), append(bound, b)
	}
	return mean, bound, nil
}

// budget is layer l's move budget against p.Current: at most MaxMoves
// changed slots, each charged MoveCost (busiest/mean, the packer's
// objective).
func (p Problem) budget(l int) *costmodel.MoveBudget {
	return costmodel.NewMoveBudget(p.Current.Layers[l], p.Cluster.GPUs(), p.Stats.Experts, p.MaxMoves, p.MoveCost)
}
