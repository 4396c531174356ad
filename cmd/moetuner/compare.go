package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver"
)

func cmdCompare(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("compare", "compare --trace T... [flags]", stderr)
	var c common
	c.register(fs, true)
	reportOut := fs.String("report", "", "also write the comparison with its plots as one self-contained HTML page to this file")
	strategies := fs.String("strategies", "", "comma-separated strategies to compare (default: contiguous, round-robin, greedy, eplb, eplb-hierarchical when the model has expert groups, deepseek-vec, flashlb, moetuner when it fits, joint; also deepseek-vec-hierarchical)")
	var planFiles multiFlag
	fs.Var(&planFiles, "plan", "placement file to add as a row, scored like the strategies: the placement you run today, in any format moetuner writes (repeatable)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("compare takes no positional arguments (got %q); use --trace and --plan", fs.Args())
	}
	pr, stdout, stderr := c.startProgress(stdout, stderr)
	defer pr.close()
	p, sources, err := c.setup(true)
	if err != nil {
		return err
	}
	// Read the files first: a bad one should not wait for the solves. The
	// running plan (--from) is one: the plans are measured against it.
	files, err := c.readComparePlans(p, planFiles)
	if err != nil {
		return err
	}
	list := *strategies
	if list == "" {
		list = c.defaultCompareList(p, stderr)
	}
	var results []*solver.Result
	var names []solver.Strategy
	stack := stackRunner(p)
	for _, name := range strings.Split(list, ",") {
		st, err := parseStrategy(strings.TrimSpace(name))
		if err != nil {
			return err
		}
		names = append(names, st)
	}
	if note := stepsNote(p, names); note != "" && !c.quiet {
		fmt.Fprintln(stderr, "moetuner: compare: "+note)
	}
	// The strategies that search share what is left of --time-limit, each
	// getting an even share of what the ones before it left; the scoring
	// after the last keeps the longest baseline's time (one
	// evaluation of the cost model).
	var evalTime time.Duration
	for i, st := range names {
		searching := 0
		for _, later := range names[i:] {
			if searches(later) {
				searching++
			}
		}
		opts := c.optionsShare(searching, evalTime)
		opts.MoETunerEqualSizes = c.equalSizes
		opts.Strategy = st
		t0 := time.Now()
		sp := pr.solving(st)
		var res *solver.Result
		var err error
		if isPeer(st) {
			res, err = stack(solvePeer(p, st))
		} else {
			res, err = stack(solved(solver.Solve(ctx, p, sp.options(opts))))
		}
		sp.end(res, err)
		if err != nil && isPeer(st) && *strategies == "" {
			// Shown by default, so a shape the stack's algorithm cannot
			// place (its own asserts, or copies no swap can separate)
			// drops the row, not the comparison.
			if !c.quiet {
				fmt.Fprintf(stderr, "moetuner: compare: skipping the %s strategy: %v\n", st, err)
			}
			continue
		}
		if !searches(st) {
			evalTime = max(evalTime, time.Since(t0))
		}
		if err != nil && (errors.Is(err, solver.ErrInfeasible) || errors.Is(err, solver.ErrNoSolution)) && st == solver.StrategyMoETuner && !opts.MoETunerEqualSizes {
			// The paper's unequal clusters cannot meet Eq. 13 here; show the
			// equal-size variant instead and say so.
			fmt.Fprintf(stderr, "moetuner: strategy moetuner: %v\nmoetuner: retrying the moetuner strategy with E/G experts per cluster\n", err)
			opts.MoETunerEqualSizes = true
			sp := pr.solving(st)
			res, err = solver.Solve(ctx, p, sp.options(opts))
			sp.end(res, err)
		}
		if err != nil {
			if errors.Is(err, solver.ErrInfeasible) {
				fmt.Fprintf(stderr, "moetuner: strategy %s: %v\n", st, err)
				continue
			}
			if errors.Is(err, solver.ErrNoILPBackend) && *strategies == "" {
				// A build without cgo compares what it can.
				fmt.Fprintf(stderr, "moetuner: compare: skipping the %s strategy: %v\n", st, err)
				continue
			}
			return fmt.Errorf("strategy %s: %w", st, err)
		}
		results = append(results, res)
	}
	results = append(results, files...)
	fmt.Fprintf(stdout, "%d layers × %d experts (top-%d), %.0f tokens; %s: %d nodes × %d GPUs; model %s; flow %s, mode %s\n",
		p.Stats.Layers, p.Stats.Experts, p.Stats.TopK, p.Stats.Tokens, p.Cluster.Name, p.Cluster.Nodes, p.Cluster.GPUsPerNode, p.Model.Name, p.Flow, p.Mode)
	printCompare(stdout, p, results)
	if c.held != nil {
		if err := printHeldOut(stdout, p, c.held.stats, c.held.cut, c.held.tokens, results); err != nil {
			return err
		}
	}
	if *reportOut != "" {
		if err := compareReport(*reportOut, p, sources, results); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", *reportOut)
	}
	return writeJSON(c.jsonOut, jsonResults(p, results))
}

// readComparePlans reads and scores compare's --plan files, the running
// plan (--from) first: read before the solves, so that a bad one does not
// wait for them.
func (c *common) readComparePlans(p solver.Problem, planFiles multiFlag) ([]*solver.Result, error) {
	var files []*solver.Result
	paths := []string(planFiles)
	if c.from != "" && !slices.Contains(paths, c.from) {
		paths = append([]string{c.from}, paths...)
	}
	for _, path := range paths {
		var r *solver.Result
		var err error
		if path == c.from {
			// Read once already, by setup.
			r, err = scorePlan(p, p.Current, path)
		} else {
			r, err = c.scoreFile(p, path)
		}
		if err != nil {
			return nil, err
		}
		files = append(files, r)
	}
	return files, nil
}

// defaultCompareList is compare's default --strategies for p, saying on
// stderr (unless --quiet) which it leaves out and why.
func (c *common) defaultCompareList(p solver.Problem, stderr io.Writer) string {
	list := "contiguous,round-robin,greedy,eplb"
	if g := p.Cluster.GPUs(); p.Stats.Experts%g != 0 {
		list = "round-robin,greedy,eplb"
		if !c.quiet {
			fmt.Fprintf(stderr, "moetuner: compare: skipping the contiguous strategy: %d experts do not divide over %d GPUs\n", p.Stats.Experts, g)
		}
	}
	if p.ExpertGroups > 0 || (p.Model.ExpertGroups > 0 && p.Model.ExpertGroups%p.Cluster.Nodes == 0) {
		list += ",eplb-hierarchical"
	}
	// The other algorithms the stacks ship, with the same slots.
	list += "," + string(stratDeepSeekVec) + "," + string(stratFlashLB)
	switch {
	case p.RedundantSlots > 0 || len(p.Workloads) > 0 || p.Current != nil:
		if !c.quiet {
			fmt.Fprintln(stderr, "moetuner: compare: skipping the moetuner strategy: it places one copy per expert for one workload")
		}
	case p.Stats.Experts*p.Cluster.GPUs() > 4096:
		if !c.quiet {
			fmt.Fprintln(stderr, "moetuner: compare: skipping the moetuner strategy: its ILP 2 has G⁴ variables per layer pair; pass --strategies to force it")
		}
	default:
		list += ",moetuner"
	}
	list += ",joint"
	return list
}

// filePrefix marks the results of compare --plan files: their Strategy is
// filePrefix + the path.
const filePrefix = "file:"

// scoreFile reads the placement file at path and scores it on p as Solve
// scores a strategy's plan.
func (c *common) scoreFile(p solver.Problem, path string) (*solver.Result, error) {
	plan, err := c.readPlan(path, p.Cluster)
	if err != nil {
		return nil, err
	}
	return scorePlan(p, plan, path)
}

// scorePlan scores plan, read from the file at path, on p as Solve scores
// a strategy's plan.
func scorePlan(p solver.Problem, plan *placement.Plan, path string) (*solver.Result, error) {
	res, err := scoreAs(p, plan, solver.Strategy(filePrefix+path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return res, nil
}

// scoreAs scores plan on p's scenario, the evaluation solver.Solve ends
// every strategy with, as a heuristic result named st.
func scoreAs(p solver.Problem, plan *placement.Plan, st solver.Strategy) (*solver.Result, error) {
	rep, err := p.Scenario().Evaluate(plan)
	if err != nil {
		return nil, err
	}
	obj := rep.TimeSec
	nan := math.NaN()
	return &solver.Result{Strategy: st, Plan: plan, Status: solver.StatusHeuristic,
		Objective: obj, Report: rep, ModelObjective: nan, Bound: nan, Gap: nan, Stage1Objective: nan, Stage2Objective: nan,
		CostBound: nan, CostGap: nan, RemoteBound: nan}, nil
}

// The serving stacks' own placement algorithms beyond DeepSeek's EPLB,
// ported in baseline. The solver does not know them: plan and compare
// build their plans here and score them as Solve scores a baseline's.
const (
	// stratDeepSeekVec is SGLang's --eplb-algorithm deepseek_vec.
	stratDeepSeekVec solver.Strategy = "deepseek-vec"
	// stratDeepSeekVecHier is SGLang's deepseek_vec_hierarchical.
	stratDeepSeekVecHier solver.Strategy = "deepseek-vec-hierarchical"
	// stratFlashLB is vllm-ascend's FlashLB policy.
	stratFlashLB solver.Strategy = "flashlb"
)

var peerStrategies = []solver.Strategy{stratDeepSeekVec, stratDeepSeekVecHier, stratFlashLB}

// isPeer reports whether st is one of the stacks' algorithms built here.
func isPeer(st solver.Strategy) bool { return slices.Contains(peerStrategies, st) }

// parseStrategy is solver.ParseStrategy with the stacks' algorithms
// built here.
func parseStrategy(name string) (solver.Strategy, error) {
	if st := solver.Strategy(name); isPeer(st) {
		return st, nil
	}
	st, err := solver.ParseStrategy(name)
	if err != nil {
		return "", usagef("unknown strategy %q (want joint, moetuner, greedy, eplb, eplb-hierarchical, deepseek-vec, deepseek-vec-hierarchical, flashlb, contiguous or round-robin)", name)
	}
	return st, nil
}

// peerGroups is the expert-group count the hierarchical policies use:
// --expert-groups, else the model's (as for eplb-hierarchical).
func peerGroups(p solver.Problem) int {
	if p.ExpertGroups > 0 {
		return p.ExpertGroups
	}
	return p.Model.ExpertGroups
}

// peerPlan builds st's plan for p with --redundant-slots redundant slots.
func peerPlan(p solver.Problem, st solver.Strategy) (*placement.Plan, error) {
	if p.SlotsPerGPU != nil {
		return nil, fmt.Errorf("%s gives every GPU the same slots; drop --slots-per-gpu", st)
	}
	gpus := p.Cluster.GPUs()
	switch st {
	case stratDeepSeekVec:
		return baseline.DeepSeekVec(p.Stats, gpus, baseline.DeepSeekVecOptions{RedundantSlots: p.RedundantSlots, FixDuplicates: true})
	case stratDeepSeekVecHier:
		g := peerGroups(p)
		if g == 0 || g%p.Cluster.Nodes != 0 {
			return nil, fmt.Errorf("%s needs expert groups that are a multiple of the %d nodes (model %q has %d); pass --expert-groups", st, p.Cluster.Nodes, p.Model.Name, g)
		}
		return baseline.DeepSeekVec(p.Stats, gpus, baseline.DeepSeekVecOptions{RedundantSlots: p.RedundantSlots, Hierarchical: true, Groups: g, Nodes: p.Cluster.Nodes, FixDuplicates: true})
	case stratFlashLB:
		return baseline.FlashLB(p.Stats, gpus, baseline.FlashLBOptions{RedundantSlots: p.RedundantSlots})
	}
	return nil, fmt.Errorf("%q is not one of the stacks' algorithms", st)
}

// solvePeer builds st's plan and scores it as Solve scores EPLB's: the
// plan validated, then one evaluation on p's scenario.
func solvePeer(p solver.Problem, st solver.Strategy) (*solver.Result, error) {
	t0 := time.Now()
	plan, err := peerPlan(p, st)
	if err != nil {
		return nil, err
	}
	plan.Strategy = string(st)
	if err := plan.Validate(placement.ValidateOptions{Experts: p.Stats.Experts, Layers: p.Stats.Layers}); err != nil {
		return nil, fmt.Errorf("%s produced an invalid plan: %w", st, err)
	}
	res, err := scoreAs(p, plan, st)
	if err != nil {
		return nil, err
	}
	res.SolveTime = time.Since(t0)
	return res, nil
}

// stepsNote says what the step-aware algorithms among names
// (deepseek-vec, flashlb) see of the trace: its steps, their sum as
// FlashLB's one stage, or the total when it records no steps; "" when
// names has none of them.
func stepsNote(p solver.Problem, names []solver.Strategy) string {
	var peers []string
	for _, st := range names {
		if isPeer(st) && !slices.Contains(peers, string(st)) {
			peers = append(peers, string(st))
		}
	}
	if len(peers) == 0 {
		return ""
	}
	n := len(p.Stats.StepLoad)
	if n == 0 {
		verb := "see"
		if len(peers) == 1 {
			verb = "sees"
		}
		return fmt.Sprintf("%s %s the trace's total load as one step: the trace records no steps", strings.Join(peers, ", "), verb)
	}
	var parts []string
	if vec := slices.DeleteFunc(slices.Clone(peers), func(s string) bool { return s == string(stratFlashLB) }); len(vec) > 0 {
		verb := "see"
		if len(vec) == 1 {
			verb = "sees"
		}
		parts = append(parts, fmt.Sprintf("%s %s the trace's %d steps", strings.Join(vec, ", "), verb, n))
	}
	if slices.Contains(peers, string(stratFlashLB)) {
		parts = append(parts, fmt.Sprintf("flashlb sees the sum of the trace's %d steps as one stage, as vllm-ascend's FlashLB does by default (max_stage_window 1)", n))
	}
	return strings.Join(parts, "; ")
}

// stackDefault is the EPLB strategy SGLang and vLLM run by default for
// p's model: the hierarchical policy when the model has expert groups and
// they are a multiple of the nodes, else the global one. SGLang's
// --eplb-algorithm auto picks deepseek_hierarchical exactly then
// (compute_algorithm, python/sglang/srt/eplb/eplb_algorithms/__init__.py
// at sgl-project/sglang@046f88cb); vLLM passes the model's
// num_expert_groups and node count to DeepSeek's rebalance_experts
// (vllm/distributed/eplb/eplb_state.py at vllm-project/vllm@50feac95),
// which is hierarchical on the same condition.
func stackDefault(p solver.Problem) solver.Strategy {
	if g := p.Model.ExpertGroups; g > 0 && g%p.Cluster.Nodes == 0 {
		return solver.StrategyEPLBHierarchical
	}
	return solver.StrategyEPLB
}

// fromFile reports whether r is a compare --plan file's row.
func fromFile(r *solver.Result) bool { return strings.HasPrefix(string(r.Strategy), filePrefix) }

// slotsNote says when a plan with fewer slots than joint's (no redundant
// slots: contiguous, round-robin, greedy) is modeled faster than joint's:
// every expert a GPU holds costs a weight read a layer, which the balance
// redundant slots buy may not repay at the trace's loads. "" otherwise.
func slotsNote(p solver.Problem, results []*solver.Result) string {
	total := func(r *solver.Result) int {
		n := 0
		for l := range r.Plan.Layers {
			n += r.Plan.Slots(l)
		}
		return n
	}
	var joint, best *solver.Result
	for _, r := range results {
		if r.Strategy == solver.StrategyJoint && r.Plan != nil {
			joint = r
		}
	}
	if joint == nil || len(joint.Plan.Layers) == 0 {
		return ""
	}
	for _, r := range results {
		if r.Plan != nil && len(r.Plan.Layers) == len(joint.Plan.Layers) && total(r) < total(joint) && r.Objective < joint.Objective && (best == nil || r.Objective < best.Objective) {
			best = r
		}
	}
	if best == nil {
		return ""
	}
	L := len(joint.Plan.Layers)
	per := func(r *solver.Result) string {
		n := float64(total(r)) / float64(L)
		if n == math.Round(n) {
			return fmt.Sprintf("%.0f", n)
		}
		return fmt.Sprintf("%.1f", n)
	}
	_, perExpert := p.Cluster.Coefficients(p.Model)
	return fmt.Sprintf("%s (%s slots a layer) is modeled %.1f%% faster than joint (%s): every expert a GPU holds costs a weight read of %s a layer, "+
		"which the balance the extra slots buy does not repay at these loads; fewer --redundant-slots may be faster",
		best.Strategy, per(best), 100*(joint.Objective-best.Objective)/joint.Objective, per(joint), dur(time.Duration(perExpert*1e9)))
}

// singleCopyEven reports whether plan has one copy of every expert and
// the same number of experts on every GPU in every layer: the plans the
// exact-cost lower bound holds for.
func singleCopyEven(plan *placement.Plan) bool {
	for l := range plan.Layers {
		if plan.Slots(l) != plan.Experts {
			return false
		}
		for _, n := range plan.SlotsPerGPU(l) {
			if n*plan.GPUs != plan.Experts {
				return false
			}
		}
	}
	return true
}

// printCompare prints one row per result; percentages are against the
// contiguous result when present.
func printCompare(w io.Writer, p solver.Problem, results []*solver.Result) {
	var ref *solver.Result
	// A bound on the exact cost model holds for every plan of the problem,
	// so the best one any strategy certified prices them all alike.
	bound := math.NaN()
	for _, r := range results {
		if r.Strategy == solver.StrategyContiguous {
			ref = r
		}
		if !math.IsNaN(r.CostBound) && !(r.CostBound <= bound) {
			bound = r.CostBound
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	multi := p.Cluster.Nodes > 1
	remoteCols := ""
	if multi {
		remoteCols = "remote/token\tbusiest NIC\t"
	}
	fmt.Fprintln(tw, "strategy\ttoken tail\tmax/mean\tworst\tall-to-all tail\tcross-node\t"+remoteCols+"layer time\tvs contiguous\tstatus\tgap\tsolve\t")
	for _, r := range results {
		rep := r.Report
		vs := "-"
		if ref != nil && ref.Objective > 0 {
			vs = fmt.Sprintf("%+.1f%%", 100*(ref.Objective-r.Objective)/ref.Objective)
		}
		gap, status, solve := "-", r.Status.String(), r.SolveTime.Round(time.Millisecond).String()
		if fromFile(r) {
			status, solve = "file", "-"
		}
		switch {
		case fromFile(r) && !singleCopyEven(r.Plan):
			// The bound holds for single-copy plans with E/G experts per
			// GPU; it says nothing about this one.
		case !math.IsNaN(bound) && bound > 0:
			// The certificate on the exact cost model is the stronger
			// statement (the ILP's model is a proxy of it); as CostGap,
			// how far the plan lies above the bound.
			gap = fmt.Sprintf("%.2f%% exact", 100*math.Max(0, r.Objective/bound-1))
		case !math.IsNaN(r.Gap):
			gap = fmt.Sprintf("%.2f%%", 100*r.Gap)
		}
		name := rowLabel(p, r)
		if r.Note != "" {
			name += "*"
		}
		remote := ""
		if multi {
			rt, bn := remotePer(p, rep)
			remote = fmt.Sprintf("%.4f\t%.4f\t", rt, bn)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.3f\t%.3f\t%s\t%s\t%s%s\t%s\t%s\t%s\t%s\t\n", name, rep.MaxTokensSum, rep.MeanBalance, rep.MaxBalance, dur(rep.CommTime), bytesStr(rep.CrossNodeBytes), remote, dur(rep.Time), vs, status, gap, solve)
	}
	tw.Flush()
	for _, r := range results {
		printResultNotes(w, p, r)
	}
	if note := slotsNote(p, results); note != "" {
		fmt.Fprintln(w, note)
	}
	if p.Current != nil {
		printChangedSlots(w, p, results)
	}
	fmt.Fprintln(w, "token tail: Σ over layers of the busiest GPU's routed tokens; max/mean: the busiest GPU's load over the mean, averaged over layers; worst: its largest layer; all-to-all tail: Σ of dispatch+combine bottleneck times; layer time: Σ modeled layer times;")
	fmt.Fprintln(w, "vs contiguous: how much lower the layer time is than Megatron's contiguous placement; gap: joint's proven gap to HiGHS's bound on its ILP model,")
	fmt.Fprintln(w, "or, with replication, the largest per-layer gap between the busiest GPU's load and its lower bound max(mean, largest replica)")
	fmt.Fprintln(w, "(with --expert-groups, also the best split of the groups over the nodes);")
	if multi {
		fmt.Fprintln(w, "remote/token: token copies sent to other nodes per token and layer in the dispatch (home flow: remote nodes reached; chain flow: cross-node transitions);")
		fmt.Fprintln(w, "busiest NIC: the copies through the busiest NIC port, per token of one GPU's share and layer (1 would be one copy for every token the GPU hosts);")
	}
	stackFooter(w, p, results)
	fmt.Fprintln(w, "\"exact\": the gap to the best lower bound on the exact cost model itself that any strategy certified (one node, home flow, per-token traces).")
	for _, r := range results {
		if fromFile(r) {
			what := "a --plan file"
			if p.Current != nil {
				what = "a --plan file or the running plan (--from)"
			}
			fmt.Fprintf(w, "file: %s, scored as it is (no solve).\n", what)
			break
		}
	}
}

// printResultNotes prints the notes under compare's table for result r:
// its footnote, and how far it lies above the lower bounds it carries.
func printResultNotes(w io.Writer, p solver.Problem, r *solver.Result) {
	if r.Note != "" {
		fmt.Fprintf(w, "%s*: %s\n", r.Strategy, r.Note)
	}
	if r.Strategy == solver.StrategyJoint && !math.IsNaN(r.CostGap) {
		fmt.Fprintf(w, "%s: modeled time %.2f%% above a lower bound on the exact cost model for every plan (%s)\n", r.Strategy, 100*r.CostGap, dur(time.Duration(r.CostBound*1e9)))
	}
	if !math.IsNaN(r.RemoteBound) && r.RemoteBound >= 0 {
		rt, _ := remotePer(p, r.Report)
		above := "-"
		if r.RemoteBound > 0 {
			above = fmt.Sprintf("%.1f%%", 100*(rt/r.RemoteBound-1))
		}
		what := "remote-node copies"
		plans := "any plan with these slots"
		if p.Flow == costmodel.FlowChain {
			what, plans = "cross-node transitions", "any plan with one copy of every expert"
		} else if r.RemoteBoundCap > 0 {
			plans = fmt.Sprintf("any plan with these slots and every layer's busiest/mean at most %g (--max-imbalance)", r.RemoteBoundCap)
		}
		part := ""
		if n := r.RemoteBoundLayers; n > 0 && n < p.Stats.Layers {
			part = fmt.Sprintf(" (%d of %d layers bounded in the time, the others counted as 0)", n, p.Stats.Layers)
		}
		fmt.Fprintf(w, "%s: %.4f %s per token-layer, %s above a certified lower bound of %.4f for %s%s\n", r.Strategy, rt, what, above, r.RemoteBound, plans, part)
	}
	if p.Dispatch == placement.DispatchLocal && r.Balance != nil && p.Stats.Patterns == nil {
		fmt.Fprintf(w, "%s: cross-node traffic %.2f%% above its lower bound for plans at least as balanced in every layer (local dispatch)\n", r.Strategy, 100*r.Balance.TrafficGap)
	}
}

// printChangedSlots prints how many slots of the running plan (--from)
// each solved plan changes.
func printChangedSlots(w io.Writer, p solver.Problem, results []*solver.Result) {
	for _, r := range results {
		if r.Plan == nil || fromFile(r) || len(r.Plan.Layers) != len(p.Current.Layers) {
			continue
		}
		total, most := 0, 0
		for l := range r.Plan.Layers {
			n := placement.ChangedSlots(p.Current.Layers[l], r.Plan.Layers[l])
			total, most = total+n, max(most, n)
		}
		fmt.Fprintf(w, "%s: changes %d slots of the running plan (--from), at most %d in a layer\n", r.Strategy, total, most)
	}
}

// remotePer returns rep's remote-node copies per token and layer and the
// busiest NIC port's copies per token of one GPU's share and layer.
func remotePer(p solver.Problem, rep *costmodel.Report) (remote, busiest float64) {
	n := rep.Tokens * float64(len(rep.Layers))
	if n <= 0 {
		return 0, 0
	}
	return rep.RemoteCopies / n, rep.BusiestNIC / (n / float64(p.Cluster.GPUs()))
}

type jsonResult struct {
	Strategy       string   `json:"strategy"`
	StackDefault   bool     `json:"stack_default,omitempty"`
	SGLangInit     string   `json:"sglang_init,omitempty"`
	Status         string   `json:"status"`
	TimeSec        float64  `json:"layer_time_sec"`
	MaxTokensSum   float64  `json:"token_tail"`
	MeanBalance    float64  `json:"mean_balance"`
	MaxBalance     float64  `json:"max_balance"`
	CommSec        float64  `json:"all_to_all_sec"`
	CrossNodeBytes float64  `json:"cross_node_bytes"`
	RemotePerToken float64  `json:"remote_per_token_layer"`
	BusiestNIC     float64  `json:"busiest_nic_per_token_layer"`
	RemoteBound    nullable `json:"remote_bound_per_token_layer"`
	RemoteBoundOf  int      `json:"remote_bound_layers,omitempty"`
	RemoteBoundCap float64  `json:"remote_bound_max_imbalance,omitempty"`
	// The solver's quantities that a strategy may leave unset (NaN) are
	// null then, as solver.Result's own JSON writes them; 0 is a value.
	ModelObjective  nullable `json:"model_objective_sec"`
	Bound           nullable `json:"bound_sec"`
	Gap             nullable `json:"gap"`
	TrafficGap      *float64 `json:"traffic_gap,omitempty"`
	CostBound       nullable `json:"cost_bound_sec"`
	CostGap         nullable `json:"cost_gap"`
	Stage1Objective nullable `json:"stage1_objective"`
	SolveSec        float64  `json:"solve_sec"`
	Cols            int      `json:"cols,omitempty"`
	Rows            int      `json:"rows,omitempty"`
}

// nullable is a float64 that encodes NaN and ±Inf as null (JSON has no
// number for them), the convention of solver.Result.MarshalJSON.
type nullable float64

// MarshalJSON writes null for NaN and ±Inf, else the number.
func (f nullable) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(v)
}

func jsonResults(p solver.Problem, results []*solver.Result) any {
	var out []jsonResult
	for _, r := range results {
		var tg *float64
		if p.Dispatch == placement.DispatchLocal && r.Balance != nil && p.Stats.Patterns == nil {
			tg = &r.Balance.TrafficGap
		}
		status := r.Status.String()
		if fromFile(r) {
			status = "file"
		}
		rt, bn := remotePer(p, r.Report)
		out = append(out, jsonResult{
			RemotePerToken: rt, BusiestNIC: bn, RemoteBound: nullable(r.RemoteBound), RemoteBoundOf: r.RemoteBoundLayers, RemoteBoundCap: r.RemoteBoundCap,
			TrafficGap: tg, CostBound: nullable(r.CostBound), CostGap: nullable(r.CostGap),
			Strategy: string(r.Strategy), StackDefault: r.Strategy == stackDefault(p), SGLangInit: sglangInit(p, r), Status: status, TimeSec: r.Objective,
			MaxTokensSum: r.Report.MaxTokensSum, MeanBalance: r.Report.MeanBalance, MaxBalance: r.Report.MaxBalance,
			CommSec: r.Report.CommTime.Seconds(), CrossNodeBytes: r.Report.CrossNodeBytes,
			ModelObjective: nullable(r.ModelObjective), Bound: nullable(r.Bound), Gap: nullable(r.Gap),
			Stage1Objective: nullable(r.Stage1Objective), SolveSec: r.SolveTime.Seconds(), Cols: r.Cols, Rows: r.Rows,
		})
	}
	return map[string]any{"flow": p.Flow.String(), "mode": p.Mode.String(), "dispatch": p.Dispatch.String(), "gpus": p.Cluster.GPUs(), "nodes": p.Cluster.Nodes, "results": out}
}

// searches reports whether strategy st searches until its time limit
// rather than building its plan in one pass.
func searches(st solver.Strategy) bool {
	return st == solver.StrategyJoint || st == solver.StrategyMoETuner
}
