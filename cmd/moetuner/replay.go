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
	hidden := fs.Int("hidden", 0, "expert hidden size the cpu/gpu backend runs (default: cpu 256, gpu the model's)")
	ffn := fs.Int("ffn", 0, "expert FFN size the cpu/gpu backend runs (default: cpu 896, gpu the model's)")
	tokenScale := fs.Float64("token-scale", 0, "cpu: multiply every expert's token count by this (default 1)")
	repeats := fs.Int("repeats", 0, "cpu/gpu: timed repeats per GPU and layer, median kept (default 3)")
	rounds := fs.Int("rounds", 1, "cpu/gpu: run the plans interleaved this many times and keep the median, so machine noise hits every plan alike")
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
		b, scale = cb, *tokenScale
		model.Hidden, model.FFN, model.BytesPerExpert = cmpOr(*hidden, replay.DefaultCPUHidden), cmpOr(*ffn, replay.DefaultCPUFFN), 0
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
	wopts := replay.WorkloadOptions{BatchTokens: *batch, Iterations: *iters, Seed: *seed, TopK: p.Model.TopK, Dispatch: p.Dispatch, GPUsPerNode: p.Cluster.GPUsPerNode}
	var ws []*replay.Workload
	for _, path := range plans {
		plan, err := c.readPlan(path, p.Cluster)
		if err != nil {
			return err
		}
		if plan.GPUs != p.Cluster.GPUs() {
			return fmt.Errorf("%s: plan has %d GPUs but the cluster %d (%d nodes × %d); set --nodes/--gpus-per-node", path, plan.GPUs, p.Cluster.GPUs(), p.Cluster.Nodes, p.Cluster.GPUsPerNode)
		}
		w, err := replay.NewWorkload(plan, in, wopts)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		ws = append(ws, w)
	}
	ropts := replay.RunOptions{Cluster: p.Cluster, Model: p.Model, Flow: p.Flow, Mode: p.Mode, Chunks: *chunks, Repeats: *repeats, Dispatch: p.Dispatch}
	ms, err := replay.RunInterleaved(ctx, b, ws, *rounds, ropts)
	if err != nil {
		return err
	}
	printReplay(stdout, plans, ws, ms, p.Cluster, p.Model)

	out := jsonReplay{Backend: b.Name(), Mode: p.Mode.String(), Flow: p.Flow.String(), Cluster: p.Cluster.Name, GPUs: p.Cluster.GPUs(), Model: p.Model.Name}
	for j, m := range ms {
		out.Plans = append(out.Plans, jsonReplayPlan{File: plans[j], Measurement: m})
	}
	if *calibrate != "" {
		var obs []replay.Observation
		tokens := func(n int) int { return n }
		if cb, ok := b.(replay.CPU); ok {
			tokens = cb.ScaledTokens
		}
		for j, m := range ms {
			obs = append(obs, replay.Observations(ws[j], m, tokens)...)
		}
		fit, err := replay.Calibrate(obs)
		if err != nil {
			return err
		}
		cl := fit.Apply(p.Cluster)
		if err := replay.WriteCluster(*calibrate, cl); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\ncalibrated on %d GPU-layer shares at hidden %d, FFN %d: token_cost %v (%.4g s), expert_cost %v (%.4g s); wrote %s\n",
			fit.N, model.Hidden, model.FFN, cl.TokenCost, fit.PerTokenSec, cl.ExpertCost, fit.PerExpertSec, *calibrate)
		out.Calibration = &jsonCalibration{File: *calibrate, PerTokenSec: fit.PerTokenSec, PerExpertSec: fit.PerExpertSec, Hidden: model.Hidden, FFN: model.FFN, Fit: fit.Accuracy}
		for j, m := range ms {
			acc, err := replay.CheckModel(ws[j], m, cl, model, scale)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "cost model vs measurement, %s: per GPU-layer mean |error| %.2f%% (max %.2f%%), per-layer tail mean %.2f%% (max %.2f%%)\n",
				plans[j], acc.MeanAbsPct, acc.MaxAbsPct, acc.TailMeanAbsPct, acc.TailMaxAbsPct)
			out.Calibration.Model = append(out.Calibration.Model, acc)
		}
	}
	return writeJSON(c.jsonOut, out)
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

type jsonReplay struct {
	Backend     string           `json:"backend"`
	Mode        string           `json:"mode"`
	Flow        string           `json:"flow"`
	Cluster     string           `json:"cluster"`
	GPUs        int              `json:"gpus"`
	Model       string           `json:"model"`
	Plans       []jsonReplayPlan `json:"plans"`
	Calibration *jsonCalibration `json:"calibration,omitempty"`
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
