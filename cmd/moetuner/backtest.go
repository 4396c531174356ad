package main

import (
	"context"
	"fmt"
	"io"

	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/rebalance"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver"
)

const backtestSynopsis = "backtest --trace T... [flags]"

// backtestFlags are backtest's flags.
type backtestFlags struct {
	traces              multiFlag
	format              string
	topK                int
	cluster, model      string
	nodes, gpusPerNode  int
	redundant           int
	dispatch            string
	tokensPerStep       int
	stepsPerWindow      int
	every               string
	window, firstWindow int
	maxMoves            int
	pay                 bool
	decay               float64
	eplb                string
	policies            string
	harnessBytes        int64
	harnessCallSec      float64
	timeLimit           time.Duration
	jsonOut, plansDir   string
	quiet               bool
	layout              placement.Layout
}

func cmdBacktest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("backtest", backtestSynopsis, stderr)
	var f backtestFlags
	fs.Var(&f.traces, "trace", "per-step loads, in time order (repeatable): logical_count JSON [steps][layers][experts] (an SGLang stat dump's passes), several dumps one after the other (an [layers][experts] dump is one step), or a per-token trace with step ids or cut by --tokens-per-step")
	choiceVar(fs, &f.format, "trace-format", "", traceFormats, "force the trace format (default: detect)")
	fs.IntVar(&f.topK, "top-k", 0, "top-k for count formats that do not state it (default: the model's)")
	fs.StringVar(&f.cluster, "cluster", "h100x8", "cluster preset ("+strings.Join(costmodel.ClusterNames(), ", ")+", or <n>x<preset>) or YAML file")
	fs.StringVar(&f.model, "model", "", "model preset ("+strings.Join(costmodel.ModelNames(), ", ")+") or YAML file (default: the preset matching the trace's shape)")
	fs.IntVar(&f.nodes, "nodes", 0, "override the number of nodes")
	fs.IntVar(&f.gpusPerNode, "gpus-per-node", 0, "override GPUs (EP ranks) per node")
	fs.IntVar(&f.redundant, "redundant-slots", 0, "redundant physical slots per layer (EPLB's num_replicas − experts)")
	choiceVar(fs, &f.dispatch, "dispatch", "even", dispatchChoices(), "the stack's dispatch every step is scored under (see plan -h; the steps carry no source ranks, so every rank sends an equal share)")
	fs.IntVar(&f.tokensPerStep, "tokens-per-step", 0, "cut per-token traces without step ids into steps of this many tokens")
	fs.IntVar(&f.stepsPerWindow, "steps-per-window", 1, "add up every M consecutive recorded steps into one backtest step (a coarser series)")
	fs.StringVar(&f.every, "every", "100", "re-plan every N steps; a comma-separated list tries each cadence")
	fs.IntVar(&f.window, "window", 0, "steps each re-plan sees (default: its cadence N)")
	fs.IntVar(&f.firstWindow, "first-window", 0, "steps before the first plan, which every policy makes from them; only later steps are scored (default: --window, else the largest cadence)")
	fs.IntVar(&f.maxMoves, "max-moves", 16, "the rebalancer's budget: at most this many slots per layer change at a rebalance (0: no bound)")
	fs.BoolVar(&f.pay, "pay", false, "the rebalancer keeps only moves whose modeled gain until the next rebalance pays for moving the weights over the link")
	fs.Float64Var(&f.decay, "decay", 1, "the rebalancer weighs a step decay^age in its window (TensorRT-LLM's online balancer decays its statistics); 1: no decay")
	choiceVar(fs, &f.eplb, "eplb", "auto", []string{"auto", "global", "hierarchical"}, "EPLB's policy: auto (hierarchical when the model's expert groups divide over the nodes, as SGLang and vLLM choose), global or hierarchical")
	fs.StringVar(&f.policies, "policies", "static,eplb,moetuner,rebalance", "comma-separated policies: static (one moetuner plan from the first window), eplb and moetuner (re-planned every N steps on the last W), rebalance (moetuner's rebalancer with --max-moves)")
	fs.Int64Var(&f.harnessBytes, "harness-bytes-per-expert", rebalance.DefaultHarnessBytes, "bytes one changed slot moves in the harness score (the public harness: 88,080,384, DeepSeek-V3's expert in bf16)")
	fs.Float64Var(&f.harnessCallSec, "harness-call-sec", rebalance.DefaultHarnessCallSec, "planner time the harness score charges per call, in seconds (the public harness: 0.08)")
	fs.DurationVar(&f.timeLimit, "time-limit", rebalance.DefaultTime, "time limit of each moetuner planner call (it does not bind at DeepSeek-V3's size: the search stops on its own)")
	fs.StringVar(&f.jsonOut, "json", "", "also write the results (per-step PAR of every policy, every rebalance) as JSON to this file")
	fs.StringVar(&f.plansDir, "plans-dir", "", "write every placement each policy installs to DIR/POLICY/step-NNNNNN.sglang.json (SGLang's --init-expert-location JSON), named by the first step it is in force")
	fs.BoolVar(&f.quiet, "quiet", false, "print only errors (no progress)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("backtest takes no positional arguments (got %q); use --trace", fs.Args())
	}
	if len(f.traces) == 0 {
		return usagef("no --trace given")
	}
	if f.stepsPerWindow < 1 || f.tokensPerStep < 0 || f.maxMoves < 0 || f.window < 0 || f.firstWindow < 0 || f.redundant < 0 {
		return usagef("--steps-per-window must be ≥ 1; --tokens-per-step, --max-moves, --window, --first-window and --redundant-slots ≥ 0")
	}
	if !(f.decay > 0 && f.decay <= 1) {
		return usagef("--decay %v: want a weight in (0, 1]", f.decay)
	}
	disp, err := placement.ParseDispatch(f.dispatch)
	if err != nil {
		return err
	}
	cfg := rebalance.BacktestConfig{Dispatch: disp, Window: f.window, FirstWindow: f.firstWindow, MaxMoves: f.maxMoves, Pay: f.pay, Decay: f.decay,
		RedundantSlots: f.redundant, Time: f.timeLimit,
		Harness: rebalance.Harness{BytesPerExpert: f.harnessBytes, CallSec: f.harnessCallSec}}
	if f.harnessCallSec == 0 {
		cfg.Harness.CallSec = -1 // 0 means the default in the library
	}
	for _, s := range strings.Split(f.every, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return usagef("--every %q: want comma-separated step counts ≥ 1", f.every)
		}
		cfg.Every = append(cfg.Every, n)
	}
	for _, s := range strings.Split(f.policies, ",") {
		p, err := rebalance.ParsePolicy(strings.TrimSpace(s))
		if err != nil {
			return usagef("--policies: %v", strings.TrimPrefix(err.Error(), "rebalance: "))
		}
		cfg.Policies = append(cfg.Policies, p)
	}
	pr, stdout, stderr := startProgress(stdout, stderr, f.quiet)
	defer pr.close()
	steps, stats, err := f.load(pr, stderr)
	if err != nil {
		return err
	}
	if cfg.Model, err = (&common{model: f.model}).loadModel(stats); err != nil {
		return err
	}
	if cfg.Cluster, err = f.loadCluster(stats.Experts); err != nil {
		return err
	}
	if (stats.Experts+f.redundant)%cfg.Cluster.GPUs() != 0 {
		return fmt.Errorf("%d experts + %d redundant slots per layer do not divide evenly over %d GPUs (%d nodes × %d); choose --nodes/--gpus-per-node or --redundant-slots so the GPU count divides the slots", stats.Experts, f.redundant, cfg.Cluster.GPUs(), cfg.Cluster.Nodes, cfg.Cluster.GPUsPerNode)
	}
	switch groups := cfg.Model.ExpertGroups; f.eplb {
	case "auto":
		if groups > 0 && cfg.Cluster.Nodes > 1 && groups%cfg.Cluster.Nodes == 0 {
			cfg.EPLBGroups = groups
		}
	case "hierarchical":
		if groups == 0 || groups%cfg.Cluster.Nodes != 0 {
			return fmt.Errorf("--eplb hierarchical needs expert groups that divide over the %d nodes; model %q has %d", cfg.Cluster.Nodes, cfg.Model.Name, groups)
		}
		cfg.EPLBGroups = groups
	}
	f.layout = solver.Problem{Stats: stats, Cluster: cfg.Cluster, Model: cfg.Model}.Layout()
	if f.plansDir != "" {
		if err := placement.CheckLayout(placement.FormatSGLang, f.layout); err != nil {
			c := common{layout: f.layout, modelName: cfg.Model.Name}
			return c.layoutError(err, f.plansDir, cfg.Cluster)
		}
	}
	if !f.quiet {
		fmt.Fprintf(stderr, "moetuner: backtest: %d steps, %d MoE layers × %d experts, %d GPUs (%d × %d), %d slots per layer\n", len(steps), stats.Layers, stats.Experts, cfg.Cluster.GPUs(), cfg.Cluster.Nodes, cfg.Cluster.GPUsPerNode, stats.Experts+f.redundant)
	}
	bp := pr.backtesting()
	res, err := rebalance.Backtest(ctx, steps, bp.options(cfg))
	bp.end()
	if err != nil {
		return err
	}
	printBacktest(stdout, res, cfg)
	if f.plansDir != "" {
		n, err := writePlans(f.plansDir, res, f.layout)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %d placements under %s\n", n, f.plansDir)
	}
	return writeJSON(f.jsonOut, res)
}

// load reads the traces in order and returns their steps (all-zero
// steps, such as the unfilled tail of an SGLang stat buffer, dropped) and
// their merged statistics (for the model and the layout).
func (f *backtestFlags) load(pr *progress, stderr io.Writer) ([][][]float64, *routing.Stats, error) {
	rd := pr.reading(f.traces)
	lo := routing.LoadOptions{Format: routing.Format(f.format), TopK: f.topK, NoPatterns: true}
	if err := (&common{model: f.model}).modelLoadOptions(&lo); err != nil {
		return nil, nil, err
	}
	lo = rd.options(lo)
	var steps [][][]float64
	merged := &routing.Stats{}
	for _, path := range f.traces {
		src, err := routing.Load(path, lo)
		if err != nil {
			rd.end(nil, err)
			return nil, nil, routingError(err)
		}
		st := src.Stats
		var got [][][]float64
		switch {
		case st.StepLoad != nil && st.StepsUnordered:
			return nil, nil, fmt.Errorf("%s: the time order of its steps is unknown (an SGLang stat dump whose circular buffer is full): a backtest replays steps in order; record with --expert-distribution-recorder-buffer-size -1 (unbounded) or a buffer larger than the passes recorded, or dump before it fills", path)
		case st.StepLoad != nil:
			got = st.StepLoad
		case src.Trace != nil && f.tokensPerStep > 0:
			got = cutTrace(src.Trace, f.tokensPerStep)
		case src.Trace != nil:
			return nil, nil, fmt.Errorf("%s: a per-token trace without step ids; pass --tokens-per-step N to cut it into steps of N tokens", path)
		default:
			got = [][][]float64{st.Load} // one dump, one step
		}
		if len(steps) > 0 && (len(got[0]) != len(steps[0]) || len(got[0][0]) != len(steps[0][0])) {
			return nil, nil, fmt.Errorf("%s: steps of %d layers × %d experts, the traces before it %d × %d", path, len(got[0]), len(got[0][0]), len(steps[0]), len(steps[0][0]))
		}
		shape := *st
		shape.StepLoad, shape.Transitions, shape.CoActivation, shape.Patterns = nil, nil, nil, nil
		if err := merged.Merge(&shape); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		steps = append(steps, got...)
	}
	rd.end(merged, nil)
	kept := steps[:0]
	dropped := 0
	for _, st := range steps {
		if total(st) > 0 {
			kept = append(kept, st)
		} else {
			dropped++
		}
	}
	if dropped > 0 && !f.quiet {
		fmt.Fprintf(stderr, "moetuner: backtest: dropped %d steps without any load (an unfilled recorder buffer)\n", dropped)
	}
	steps = kept
	if f.stepsPerWindow > 1 {
		var coarse [][][]float64
		for i := 0; i < len(steps); i += f.stepsPerWindow {
			m := cloneSteps(steps[i])
			for _, st := range steps[i+1 : min(i+f.stepsPerWindow, len(steps))] {
				for l, row := range st {
					for e, v := range row {
						m[l][e] += v
					}
				}
			}
			coarse = append(coarse, m)
		}
		steps = coarse
	}
	if len(steps) == 0 {
		return nil, nil, fmt.Errorf("the traces hold no step with any load")
	}
	return steps, merged, nil
}

func total(m [][]float64) float64 {
	t := 0.0
	for _, row := range m {
		for _, v := range row {
			t += v
		}
	}
	return t
}

func cloneSteps(m [][]float64) [][]float64 {
	out := make([][]float64, len(m))
	for i, row := range m {
		out[i] = append([]float64(nil), row...)
	}
	return out
}

// cutTrace returns t's loads in steps of n consecutive tokens.
func cutTrace(t *routing.Trace, n int) [][][]float64 {
	var out [][][]float64
	for from := 0; from < t.Tokens; from += n {
		s := t.Slice(from, from+n)
		s.Step = nil
		out = append(out, s.Stats(routing.StatsOptions{NoPatterns: true}).Load)
	}
	return out
}

func (f *backtestFlags) loadCluster(experts int) (costmodel.Cluster, error) {
	c, err := costmodel.LoadCluster(f.cluster)
	if err != nil {
		return c, err
	}
	if f.nodes > 0 {
		c = c.WithNodes(f.nodes)
	}
	if f.gpusPerNode > 0 {
		c = c.WithGPUsPerNode(f.gpusPerNode)
	} else {
		c = c.FitExperts(experts)
	}
	return c, c.Validate()
}

func printBacktest(w io.Writer, res *rebalance.BacktestResult, cfg rebalance.BacktestConfig) {
	h := res.Harness
	fmt.Fprintf(w, "steps %d, scored %d..%d (the first plan of every policy is made from steps 0..%d)\n", res.Steps, res.FirstStep, res.Steps-1, res.FirstStep-1)
	fmt.Fprintf(w, "harness score = 60 s × mean PAR + transit × %d B / 900 GB/s + %.2f s per planner call\n", h.BytesPerExpert, h.CallSec)
	if slices.Contains(cfg.Policies, rebalance.PolicyRebalance) {
		pay := ""
		if cfg.Pay {
			pay = ", only moves that pay for their migration before the next rebalance"
		}
		fmt.Fprintf(w, "rebalance: at most %s slots per layer per rebalance%s\n", movesWords(cfg.MaxMoves), pay)
	}
	// The harness's PAR splits every expert evenly over its copies; under
	// another dispatch the table also shows the balance as it deals them.
	dealt := cfg.Dispatch != placement.DispatchEven
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "policy\tevery\twindow\tmean PAR\tmax PAR\t"
	if dealt {
		head += "mean as dealt\tmax as dealt\t"
	}
	fmt.Fprintln(tw, head+"rebalances\tslots moved\tper rebalance\tbytes moved\tharness s\t(PAR\ttransit\tplanner)\tmodeled s\t(steps\tmigration)\tplanner wall\t")
	stackRun := false
	for _, p := range res.Policies {
		per := "-"
		if p.Rebalances > 0 {
			per = fmt.Sprintf("%.1f", float64(p.MovedSlots)/float64(p.Rebalances))
		}
		name := p.Name
		if p.Policy == rebalance.PolicyEPLB && cfg.Dispatch.Dealt() {
			name += " [init_by_eplb]"
			stackRun = true
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.4f\t%.4f\t", name, dash(p.Every), dash(p.Window), p.MeanPAR, p.MaxPAR)
		if dealt {
			fmt.Fprintf(tw, "%.4f\t%.4f\t", p.MeanBalance, p.MaxBalance)
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%.3f\t%.3f\t%.3f\t%.3f\t%.4f\t%.4f\t%.4f\t%s\t\n",
			p.Rebalances, p.MovedSlots, per, bytesStr(float64(p.BytesMoved)),
			p.Harness.TotalSec, p.Harness.PARSec, p.Harness.TransitSec, p.Harness.PlannerSec,
			p.ModeledSec, p.StepSec, p.MigrationSec, fmtSec(p.PlannerSec))
	}
	tw.Flush()
	if dealt {
		fmt.Fprintf(w, "as dealt: busiest/mean GPU load of every step under --dispatch %s (PAR and the harness split every expert evenly over its copies)\n", cfg.Dispatch)
	}
	if stackRun {
		fmt.Fprintln(w, "[init_by_eplb]: "+stackRunNote+"; every other row is dealt as a map loaded from a file (init_by_mapping)")
	}
	ratios := ""
	for _, p := range res.Policies {
		if p.Policy != rebalance.PolicyRebalance {
			continue
		}
		for _, q := range res.Policies {
			if q.Policy == rebalance.PolicyEPLB && q.Every == p.Every && q.Window == p.Window {
				ratios += fmt.Sprintf("  %s / %s: harness %.3f, mean PAR %.3f, slots moved %s\n", p.Name, q.Name,
					p.Harness.TotalSec/q.Harness.TotalSec, p.MeanPAR/q.MeanPAR, ratio(float64(p.MovedSlots), float64(q.MovedSlots)))
			}
		}
	}
	if ratios != "" {
		fmt.Fprint(w, "against EPLB on the same cadence:\n"+ratios)
	}
	fmt.Fprintf(w, "recommendation: %s\n", res.Recommendation.Text)
	if r := res.Recommendation; r.BestModeled != "" && r.BestModeled != r.Best {
		fmt.Fprintf(w, "by moetuner's modeled time (steps + migration over the cluster's links) %s is best\n", r.BestModeled)
	}
}

func movesWords(k int) string {
	if k == 0 {
		return "any number of"
	}
	return strconv.Itoa(k)
}

func dash(n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

func ratio(a, b float64) string {
	if b == 0 {
		if a == 0 {
			return "1"
		}
		return "inf"
	}
	return fmt.Sprintf("%.3f", a/b)
}

// writePlans writes every installed placement as SGLang JSON to
// dir/POLICY/step-NNNNNN.sglang.json and returns how many it wrote.
func writePlans(dir string, res *rebalance.BacktestResult, l placement.Layout) (int, error) {
	n := 0
	for _, p := range res.Policies {
		sub := filepath.Join(dir, strings.ReplaceAll(p.Name, "/", "-"))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return n, err
		}
		for _, ev := range p.Events {
			path := filepath.Join(sub, fmt.Sprintf("step-%06d.sglang.json", ev.Step))
			if err := placement.WriteFileWith(path, ev.Plan, placement.FormatSGLang, l); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}
