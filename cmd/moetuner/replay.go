package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/replay"
	"github.com/moetuner/moetuner/solver"
)

func cmdReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("replay", "replay --trace T... --plan A.json [--plan B.json] [--backend sim|cpu|gpu] [flags]", stderr)
	var c common
	c.register(fs, false)
	var plans multiFlag
	fs.Var(&plans, "plan", "placement file to replay, in any format moetuner writes (repeatable; the first is the reference for % differences)")
	var backend string
	choiceVar(fs, &backend, "backend", "sim", []string{"sim", "cpu", "gpu"}, "sim (event simulation on the cost model), cpu (runs the expert FFNs with gonum) or gpu (CUDA via purego)")
	batch := fs.Int("batch-tokens", 0, "tokens per iteration (default: a per-token trace in one batch; 4096 for count-only stats)")
	iters := fs.Int("iterations", 0, "iterations: batches sampled from count-only stats (default 4), or the most batches cut from a trace (default all)")
	seed := fs.Uint64("seed", 0, "seed of the batch sampler for count-only stats (default 0x6d6f65)")
	hidden := fs.Int("hidden", 0, fmt.Sprintf("expert hidden size the cpu/gpu backend runs (default: cpu %d, gpu the model's)", replay.DefaultCPUHidden))
	ffn := fs.Int("ffn", 0, fmt.Sprintf("expert FFN size the cpu/gpu backend runs (default: cpu %d, gpu the model's)", replay.DefaultCPUFFN))
	tokenScale := fs.Float64("token-scale", 0, fmt.Sprintf("cpu: multiply every expert's token count by this (default %g; 1 runs the true counts)", replay.DefaultCPUTokenScale))
	repeats := fs.Int("repeats", 0, "cpu/gpu: timed repeats per GPU and layer, median kept (default 3)")
	rounds := fs.Int("rounds", 0, "at most this many interleaved rounds (every plan once per round, cpu: GPU share by GPU share); replay stops earlier once every difference is resolved (default: cpu/gpu 30, sim 1: it is deterministic)")
	minRounds := fs.Int("min-rounds", 0, "cpu/gpu: at least this many rounds before stopping on resolved differences (default 5)")
	budget := fs.Duration("budget", 0, "cpu/gpu: start no round that would end after this wall-clock time (default: none; at least one round runs)")
	confidence := fs.Float64("confidence", replay.DefaultLevel, "confidence level of the bootstrap intervals of the differences")
	resolution := fs.Float64("resolution", 100*replay.DefaultResolution, "a difference whose interval lies within ± this many percent counts as resolved (equal to within it)")
	chunks := fs.Int("chunks", 0, "overlapped mode: pipeline chunks per layer (default 4)")
	devices := fs.String("devices", "", "gpu: comma-separated CUDA device ordinals; virtual GPU g runs on device g mod n (default 0)")
	calibrate := fs.String("calibrate", "", "cpu/gpu: fit the cost model's per-token and per-expert compute costs to the measurement and write the cluster YAML here")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("replay takes no positional arguments (got %q); use --trace and --plan", fs.Args())
	}
	if len(plans) == 0 {
		return usagef("replay needs --plan FILE (up to several)")
	}
	c.needTrace = true
	pr, stdout, _ := c.startProgress(stdout, stderr)
	defer pr.close()
	p, sources, err := c.setup(false)
	if err != nil {
		return err
	}
	model := p.Model // the size the backend runs, for calibration
	var b replay.Backend
	var scale float64
	switch backend {
	case "sim":
		b = replay.Sim{}
		if *calibrate != "" {
			return usagef("--calibrate needs a measuring backend: cpu or gpu")
		}
	case "cpu":
		cb := replay.CPU{Hidden: *hidden, FFN: *ffn, TokenScale: *tokenScale}
		b = cb
		model.Hidden, model.FFN, scale = cb.Sizes()
		model.BytesPerExpert = 0
	case "gpu":
		gb := replay.GPU{Hidden: *hidden, FFN: *ffn}
		if *devices != "" {
			for _, s := range strings.Split(*devices, ",") {
				d, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil || d < 0 {
					return usagef("--devices %q: want comma-separated device ordinals", *devices)
				}
				gb.Devices = append(gb.Devices, d)
			}
		}
		b = gb
		model.Hidden, model.FFN, model.BytesPerExpert = cmpOr(*hidden, model.Hidden), cmpOr(*ffn, model.FFN), 0
	default:
		return fmt.Errorf("--backend %q: want sim, cpu or gpu", backend)
	}
	in := replay.Input{Stats: p.Stats}
	if len(sources) == 1 && sources[0].Trace != nil {
		in = replay.Input{Trace: sources[0].Trace}
	}
	wopts := replay.WorkloadOptions{BatchTokens: *batch, Iterations: *iters, Seed: *seed, TopK: p.Model.TopK, Dispatch: p.Dispatch, GPUsPerNode: p.Cluster.GPUsPerNode, Layout: p.Layout(),
		PassTokens: c.passTokens, Flow: p.Flow}
	ws, err := c.replayWorkloads(plans, p, in, wopts)
	if err != nil {
		return err
	}
	if !c.quiet {
		printNotes(c.stderr, c.replayHashNotes(p, ws[0]))
	}
	ropts := replay.RunOptions{Cluster: p.Cluster, Model: p.Model, Flow: p.Flow, Mode: p.Mode, Chunks: *chunks, Repeats: *repeats, Dispatch: p.Dispatch}
	if *confidence <= 0 || *confidence >= 1 {
		return usagef("--confidence %g: want a level between 0 and 1, such as 0.95", *confidence)
	}
	if *resolution < 0 || *rounds < 0 || *minRounds < 0 || *budget < 0 {
		return usagef("--rounds, --min-rounds, --budget and --resolution must not be negative")
	}
	co := replay.CompareOptions{MinRounds: *minRounds, MaxRounds: *rounds, Budget: *budget, Level: *confidence, Resolution: *resolution / 100}
	if backend == "sim" && co.MaxRounds == 0 {
		co.MaxRounds = 1
	}
	rp := pr.replaying(backend, len(ws), cmpOr(co.MaxRounds, replay.DefaultMaxRounds))
	cmp, err := replay.Compare(ctx, b, ws, ropts, rp.options(co))
	rp.end(cmp, err)
	if err != nil {
		return err
	}
	ms := cmp.Measurements
	printReplay(stdout, plans, ws, ms, p.Cluster, p.Model)
	printDiffs(stdout, backend, cmp)

	out := jsonReplay{Backend: b.Name(), Mode: p.Mode.String(), Flow: p.Flow.String(), Cluster: p.Cluster.Name, GPUs: p.Cluster.GPUs(), Model: p.Model.Name, Comparison: cmp}
	for j, m := range ms {
		out.Plans = append(out.Plans, jsonReplayPlan{File: plans[j], Measurement: m})
	}
	if *calibrate != "" {
		rc := replayCalibration{path: *calibrate, backend: b, model: model, scale: scale}
		if out.Calibration, err = rc.run(stdout, p.Cluster, plans, ws, ms); err != nil {
			return err
		}
	}
	return writeJSON(c.jsonOut, out)
}

// replayHashNotes says how replay's batches count vLLM's hash where
// that differs from the note on the whole trace (dispatchNotes): each
// batch is every rank's forward pass, so the rows restart at every batch,
// and a batch that cannot be counted takes the expectation.
func (c *common) replayHashNotes(p solver.Problem, w *replay.Workload) []string {
	switch {
	case p.Dispatch != placement.DispatchVLLM:
		return nil
	case w.CountsHash && w.Iterations() > 1:
		return []string{fmt.Sprintf("vllm dispatch: replay's %d batches of %d tokens are each every rank's forward pass: a token's row restarts at every batch", w.Iterations(), w.Tokens[0])}
	case w.HashErr != nil && c.orderErr == nil && p.Flow == costmodel.FlowHome && costmodel.HashOrder(p.Stats, p.Cluster.GPUs()) == nil:
		return []string{fmt.Sprintf("vllm dispatch: replay's batches take each copy's even share, the hash's expectation, not the hash token by token: %v", w.HashErr)}
	}
	return nil
}

// replayWorkloads reads the --plan files and cuts each one's workload
// from in.
func (c *common) replayWorkloads(plans []string, p solver.Problem, in replay.Input, wopts replay.WorkloadOptions) ([]*replay.Workload, error) {
	var ws []*replay.Workload
	for _, path := range plans {
		plan, err := c.readPlan(path, p.Cluster)
		if err != nil {
			return nil, err
		}
		if plan.GPUs != p.Cluster.GPUs() {
			return nil, fmt.Errorf("%s: plan has %d GPUs but the cluster %d (%d nodes × %d); set --nodes/--gpus-per-node", path, plan.GPUs, p.Cluster.GPUs(), p.Cluster.Nodes, p.Cluster.GPUsPerNode)
		}
		w, err := replay.NewWorkload(plan, in, wopts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		ws = append(ws, w)
	}
	return ws, nil
}

// replayCalibration is replay --calibrate: the cluster YAML to write, and
// the backend and expert sizes the measurement ran.
type replayCalibration struct {
	path    string
	backend replay.Backend
	model   costmodel.Model
	scale   float64
}

// run fits the cost model's compute costs to the measurements ms of the
// workloads ws, writes the calibrated cluster to rc.path, and prints the
// fit and how well the calibrated model predicts each plan.
func (rc replayCalibration) run(stdout io.Writer, cluster costmodel.Cluster, plans []string, ws []*replay.Workload, ms []*replay.Measurement) (*jsonCalibration, error) {
	var obs []replay.Observation
	tokens := func(n int) int { return n }
	if cb, ok := rc.backend.(replay.CPU); ok {
		tokens = cb.ScaledTokens
	}
	for j, m := range ms {
		obs = append(obs, replay.Observations(ws[j], m, tokens)...)
	}
	fit, err := replay.Calibrate(obs)
	if err != nil {
		return nil, err
	}
	cl := fit.Apply(cluster)
	if err := replay.WriteCluster(rc.path, cl); err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "\ncalibrated on %d GPU-layer shares at hidden %d, FFN %d: token_cost %v (%.4g s), expert_cost %v (%.4g s); wrote %s\n",
		fit.N, rc.model.Hidden, rc.model.FFN, cl.TokenCost, fit.PerTokenSec, cl.ExpertCost, fit.PerExpertSec, rc.path)
	cal := &jsonCalibration{File: rc.path, PerTokenSec: fit.PerTokenSec, PerExpertSec: fit.PerExpertSec, Hidden: rc.model.Hidden, FFN: rc.model.FFN, Fit: fit.Accuracy}
	for j, m := range ms {
		acc, err := replay.CheckModel(ws[j], m, cl, rc.model, rc.scale)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(stdout, "cost model vs measurement, %s: per GPU-layer mean |error| %.2f%% (max %.2f%%), per-layer tail mean %.2f%% (max %.2f%%)\n",
			plans[j], acc.MeanAbsPct, acc.MaxAbsPct, acc.TailMeanAbsPct, acc.TailMaxAbsPct)
		cal.Model = append(cal.Model, acc)
	}
	return cal, nil
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

type jsonReplay struct {
	Backend     string             `json:"backend"`
	Mode        string             `json:"mode"`
	Flow        string             `json:"flow"`
	Cluster     string             `json:"cluster"`
	GPUs        int                `json:"gpus"`
	Model       string             `json:"model"`
	Plans       []jsonReplayPlan   `json:"plans"`
	Comparison  *replay.Comparison `json:"comparison"`
	Calibration *jsonCalibration   `json:"calibration,omitempty"`
}

// printDiffs prints every plan's differences against the first with their
// confidence intervals, and how the rounds ended.
func printDiffs(w io.Writer, backend string, c *replay.Comparison) {
	if len(c.Diffs) == 0 {
		return
	}
	if backend == "sim" {
		for j, d := range c.Diffs {
			fmt.Fprintf(w, "%c vs A (sim is deterministic, no interval needed): tail %+.1f%%, mean %+.1f%%, layer %+.1f%%\n", 'B'+j, 100*d.Tail.Estimate, 100*d.Mean.Estimate, 100*d.Time.Estimate)
		}
		return
	}
	level := 100 * c.Options.Level
	fmt.Fprintf(w, "differences with %.0f%% confidence intervals (percentile bootstrap over %d interleaved rounds, rounds resampled jointly for all plans; %s):\n", level, c.Rounds, stopNote(c))
	for j, d := range c.Diffs {
		fmt.Fprintf(w, "  %c vs A: tail %s, mean %s, layer %s\n", 'B'+j, d.Tail, d.Mean, d.Time)
	}
	fmt.Fprintf(w, "\"within noise\": the interval contains 0, the measurement cannot tell the plans apart; a difference is resolved when its interval excludes 0 or lies within ±%.1f%%.\n", 100*c.Options.Resolution)
}

func stopNote(c *replay.Comparison) string {
	switch c.Stop {
	case replay.StopResolved:
		return fmt.Sprintf("stopped after %.1fs: every difference resolved", c.Elapsed.Seconds())
	case replay.StopBudget:
		return fmt.Sprintf("stopped after %.1fs: --budget %gs spent", c.Elapsed.Seconds(), c.Options.BudgetSec)
	case replay.StopInterrupted:
		return fmt.Sprintf("interrupted after %.1fs", c.Elapsed.Seconds())
	}
	return fmt.Sprintf("stopped after %.1fs: --rounds %d reached", c.Elapsed.Seconds(), c.Options.MaxRounds)
}

type jsonReplayPlan struct {
	File        string              `json:"file"`
	Measurement *replay.Measurement `json:"measurement"`
}

type jsonCalibration struct {
	File         string            `json:"cluster_file"`
	PerTokenSec  float64           `json:"per_token_sec"`
	PerExpertSec float64           `json:"per_expert_sec"`
	Hidden       int               `json:"hidden"`
	FFN          int               `json:"ffn"`
	Fit          replay.Accuracy   `json:"fit"`
	Model        []replay.Accuracy `json:"cost_model_vs_measurement"`
}

func pctDiff(b, a time.Duration) string {
	if a == 0 {
		return "-"
	}
	return fmt.Sprintf("%+.1f%%", 100*(b.Seconds()-a.Seconds())/a.Seconds())
}

// printReplay prints one row per layer and a total: every plan's tail and
// mean compute time and layer time, and the % difference of the last plan
// against the first.
func printReplay(w io.Writer, paths []string, ws []*replay.Workload, ms []*replay.Measurement, cl costmodel.Cluster, m costmodel.Model) {
	m0 := ms[0]
	fmt.Fprintf(w, "replay: backend %s, mode %s, %d iteration(s) of %d tokens, %d layers, %d GPUs (%s), model %s\n",
		m0.Backend, m0.Mode, ws[0].Iterations(), ws[0].Tokens[0], ws[0].Layers(), ws[0].GPUs(), cl.Name, m.Name)
	fmt.Fprintf(w, "compute: %s — %s\ncommunication: %s — %s\n", m0.Compute, m0.ComputeNote, m0.Communication, m0.CommunicationNote)
	for j, p := range paths {
		fmt.Fprintf(w, "plan %c: %s (%s)\n", 'A'+j, p, strategyOf(ws[j].Plan))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "layer\t"
	for j := range ms {
		head += fmt.Sprintf("%c tail\t%c mean\t%c layer\t", 'A'+j, 'A'+j, 'A'+j)
	}
	last := ms[len(ms)-1]
	diff := len(ms) > 1
	if diff {
		x := 'A' + rune(len(ms)-1)
		head += fmt.Sprintf("%c vs A tail\t%c vs A mean\t%c vs A layer\t", x, x, x)
	}
	fmt.Fprintln(tw, head)
	for l := range m0.Layers {
		row := fmt.Sprintf("%d\t", l)
		for _, m := range ms {
			r := m.Layers[l]
			row += fmt.Sprintf("%s\t%s\t%s\t", dur(r.Tail), dur(r.Mean), dur(r.Time))
		}
		if diff {
			a, b := m0.Layers[l], last.Layers[l]
			row += fmt.Sprintf("%s\t%s\t%s\t", pctDiff(b.Tail, a.Tail), pctDiff(b.Mean, a.Mean), pctDiff(b.Time, a.Time))
		}
		fmt.Fprintln(tw, row)
	}
	row := "total\t"
	for _, m := range ms {
		row += fmt.Sprintf("%s\t%s\t%s\t", dur(m.Tail), dur(m.Mean), dur(m.E2E))
	}
	if diff {
		row += fmt.Sprintf("%s\t%s\t%s\t", pctDiff(last.Tail, m0.Tail), pctDiff(last.Mean, m0.Mean), pctDiff(last.E2E, m0.E2E))
	}
	fmt.Fprintln(tw, row)
	tw.Flush()
	fmt.Fprintf(w, "tail: slowest GPU's expert compute (%s), mean: average over GPUs (%s), both averaged over iterations as in the MoETuner paper;\n", m0.Compute, m0.Compute)
	fmt.Fprintf(w, "layer: dispatch + compute + combine (%s mode; communication %s); total layer = E2E, Σ over layers averaged over iterations.\n", m0.Mode, m0.Communication)
}

func strategyOf(p *placement.Plan) string {
	if p.Strategy == "" {
		return "unnamed"
	}
	return p.Strategy
}
