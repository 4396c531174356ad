package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver"
)

// common are the flags shared by plan, eval and compare.
type common struct {
	traces      multiFlag
	format      string
	transitions string
	topK        int
	cluster     string
	model       string
	nodes       int
	gpusPerNode int
	flow        string
	mode        string
	sigma       float64
	timeLimit   time.Duration
	gap         float64
	threads     int
	seed        int
	jsonOut     string
	equalSizes  bool
	redundant   int
	groups      int
	across      string
	from        string
	maxMoves    int
	split       string
	dispatch    string
	moveCost    float64
	slotsPerGPU string
}

func (c *common) register(fs *flag.FlagSet, solve bool) {
	fs.Var(&c.traces, "trace", "routing trace file or directory (repeatable; stats are added up)")
	choiceVar(fs, &c.format, "trace-format", "", traceFormats, "force the trace format: jsonl, npy, flame-csv, olmoe-json, fiddler-json, logical-count, sglang-pt, sglang-routed-experts, trtllm-expert-statistic, megatron-router-trace, vllm-eplb-load-stats, moetuner-stats (default: detect)")
	choiceVar(fs, &c.transitions, "transitions", "all-pairs", []string{"all-pairs", "top1"}, "transition counting for per-token traces: all-pairs (k×k) or top1")
	fs.IntVar(&c.topK, "top-k", 0, "top-k for count formats that do not state it (default: the model's)")
	fs.StringVar(&c.cluster, "cluster", "h100x8", "cluster preset ("+strings.Join(costmodel.ClusterNames(), ", ")+", or <n>x<preset>) or YAML file")
	fs.StringVar(&c.model, "model", "", "model preset ("+strings.Join(costmodel.ModelNames(), ", ")+") or YAML file (default: the preset matching the trace's shape)")
	fs.IntVar(&c.nodes, "nodes", 0, "override the number of nodes")
	fs.IntVar(&c.gpusPerNode, "gpus-per-node", 0, "override GPUs (EP ranks) per node (default: the cluster's; for models with fewer than 16 experts, E/2 so each GPU holds two experts, MoETuner's EP4 for Mixtral)")
	choiceVar(fs, &c.flow, "flow", "home", []string{"home", "chain"}, "token flow: home (standard EP dispatch/combine) or chain (MoETuner Eq. 9 / ExFlow)")
	choiceVar(fs, &c.mode, "mode", "sequential", []string{"sequential", "overlapped"}, "layer time: sequential or overlapped (compute slowed by sigma)")
	fs.Float64Var(&c.sigma, "sigma", -1, "compute slowdown under overlap (default: the cluster's, 0.189)")
	fs.StringVar(&c.jsonOut, "json", "", "also write the results as JSON to this file")
	choiceVar(fs, &c.dispatch, "dispatch", "even", []string{"even", "local"}, "how tokens pick among an expert's copies: even (every source splits evenly: vLLM, SGLang random/static dispatch, EPLB's model) or local (own GPU's copy, else own node's, else fairly: node-local replicas as in SGLang PR #19772; home flow only)")
	if solve {
		fs.DurationVar(&c.timeLimit, "time-limit", 60*time.Second, "time limit per ILP strategy (HiGHS limit plus wall-clock watchdog)")
		fs.Float64Var(&c.gap, "gap", 0, "relative MIP gap (default 1e-4)")
		fs.IntVar(&c.threads, "threads", 1, "HiGHS threads (1 is deterministic)")
		fs.IntVar(&c.seed, "seed", 0, "HiGHS random seed")
		fs.IntVar(&c.redundant, "redundant-slots", 0, "redundant physical slots per layer (EPLB's num_replicas − experts); joint then replicates hot experts")
		fs.IntVar(&c.groups, "expert-groups", 0, "keep each of N expert groups (and its copies) on one node, as DeepSeek's group-limited routing (0: off)")
		choiceVar(fs, &c.across, "across", "", []string{"mean", "worst"}, "with several --trace files: plan for all of them at once, minimising the mean or worst busiest/mean load (mean|worst); default: add the traces up")
		fs.StringVar(&c.from, "from", "", "current placement file: re-place incrementally from it (see --max-moves)")
		choiceVar(fs, &c.split, "split", "even", []string{"even", "optimal"}, "how an expert's tokens divide among its copies: even (vLLM, SGLang static dispatch) or optimal (SGLang's dispatch LP; the plan then carries per-slot shares)")
		fs.Float64Var(&c.moveCost, "move-cost", 0, "with --from: cost of one changed slot in units of busiest/mean load; a move is made only if it gains more")
		fs.StringVar(&c.slotsPerGPU, "slots-per-gpu", "", "comma-separated expert slots per GPU per layer, for heterogeneous clusters (overrides --redundant-slots)")
		fs.IntVar(&c.maxMoves, "max-moves", 0, "with --from: at most this many slots per layer change (0: no bound)")
		fs.BoolVar(&c.equalSizes, "moetuner-equal-sizes", false, "moetuner strategy: E/G experts per cluster in ILP 1 (not the paper's design; always meets Eq. 13)")
	}
}

// setup loads statistics, cluster and model and builds the problem.
func (c *common) setup(defaultTrace bool) (solver.Problem, []*routing.Source, error) {
	var p solver.Problem
	traces := []string(c.traces)
	if len(traces) == 0 {
		if !defaultTrace {
			return p, nil, usagef("no --trace given")
		}
		if _, err := os.Stat(DefaultTrace); err != nil {
			return p, nil, fmt.Errorf("no --trace given and the bundled data %s is not here (run from the repository root or pass --trace)", DefaultTrace)
		}
		traces = []string{DefaultTrace}
	}
	lo := routing.LoadOptions{Format: routing.Format(c.format), TopK: c.topK}
	switch c.transitions {
	case "all-pairs":
	case "top1":
		lo.Transitions = routing.TransitionTop1
	default:
		return p, nil, fmt.Errorf("--transitions %q: want all-pairs or top1", c.transitions)
	}
	stats, sources, err := routing.LoadAll(traces, lo)
	if err != nil {
		return p, nil, err
	}
	model, err := c.loadModel(stats)
	if err != nil {
		return p, nil, err
	}
	if stats.TopK == 0 && model.TopK > 0 {
		// Count formats such as logical_count do not say; the model does.
		stats.TopK = model.TopK
		if len(stats.Load) > 0 {
			stats.Tokens = stats.LayerTotal(0) / float64(model.TopK)
		}
	}
	cluster, err := costmodel.LoadCluster(c.cluster)
	if err != nil {
		return p, nil, err
	}
	if c.nodes > 0 {
		cluster = cluster.WithNodes(c.nodes)
	}
	switch {
	case c.gpusPerNode > 0:
		cluster.GPUsPerNode = c.gpusPerNode
		cluster.Speed = nil
	case stats.Experts < 16 && cluster.GPUsPerNode > stats.Experts/2 && stats.Experts >= 2:
		cluster.GPUsPerNode = stats.Experts / 2
		cluster.Speed = nil
	}
	if c.sigma >= 0 {
		s := c.sigma
		cluster.Sigma = &s
	}
	if err := cluster.Validate(); err != nil {
		return p, nil, err
	}
	flow, err := costmodel.ParseFlow(c.flow)
	if err != nil {
		return p, nil, err
	}
	mode, err := costmodel.ParseMode(c.mode)
	if err != nil {
		return p, nil, err
	}
	if (stats.Experts+c.redundant)%cluster.GPUs() != 0 && c.from == "" && c.slotsPerGPU == "" {
		return p, nil, fmt.Errorf("%d experts + %d redundant slots per layer do not divide evenly over %d GPUs (%d nodes × %d); choose --nodes/--gpus-per-node or --redundant-slots so the GPU count divides the slots", stats.Experts, c.redundant, cluster.GPUs(), cluster.Nodes, cluster.GPUsPerNode)
	}
	p = solver.Problem{Stats: stats, Cluster: cluster, Model: model, Flow: flow, Mode: mode,
		RedundantSlots: c.redundant, ExpertGroups: c.groups}
	if c.across != "" {
		if p.Across, err = solver.ParseAcross(c.across); err != nil {
			return p, nil, err
		}
		switch {
		case len(sources) >= 2:
			for _, src := range sources {
				p.Scenarios = append(p.Scenarios, src.Stats)
			}
		case len(stats.StepLoad) >= 2:
			// One file with per-step loads ([steps][L][E] logical_count):
			// every step is a workload, as SGLang's deepseek_vec does.
			for _, load := range stats.StepLoad {
				p.Scenarios = append(p.Scenarios, routing.StatsFromLoad(load, stats.TopK))
			}
		default:
			return p, nil, fmt.Errorf("--across needs at least two --trace workloads, or one trace with per-step loads")
		}
	}
	p.MoveCost = c.moveCost
	if c.slotsPerGPU != "" {
		for _, f := range strings.Split(c.slotsPerGPU, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				return p, nil, fmt.Errorf("--slots-per-gpu %q: want comma-separated non-negative integers", c.slotsPerGPU)
			}
			p.SlotsPerGPU = append(p.SlotsPerGPU, n)
		}
		if len(p.SlotsPerGPU) != cluster.GPUs() {
			return p, nil, fmt.Errorf("--slots-per-gpu has %d entries for %d GPUs; give one per GPU", len(p.SlotsPerGPU), cluster.GPUs())
		}
	}
	if c.split != "" {
		if p.Split, err = solver.ParseSplit(c.split); err != nil {
			return p, nil, err
		}
	}
	if p.Dispatch, err = placement.ParseDispatch(c.dispatch); err != nil {
		return p, nil, err
	}
	if c.from != "" {
		if p.Current, err = readPlan(c.from, cluster.GPUs()); err != nil {
			return p, nil, err
		}
	}
	return p, sources, nil
}

func (c *common) loadModel(stats *routing.Stats) (costmodel.Model, error) {
	if c.model != "" {
		m, err := costmodel.LoadModel(c.model)
		if err != nil {
			return m, err
		}
		if m.Experts != stats.Experts {
			return m, fmt.Errorf("model %q has %d experts per layer but the trace has %d; pick the matching --model", m.Name, m.Experts, stats.Experts)
		}
		return m, nil
	}
	for _, name := range costmodel.ModelNames() {
		m, _ := costmodel.ModelPreset(name)
		if m.Experts == stats.Experts && m.Layers == stats.Layers && (stats.TopK == 0 || m.TopK == stats.TopK) {
			return m, nil
		}
	}
	for _, name := range costmodel.ModelNames() {
		m, _ := costmodel.ModelPreset(name)
		if m.Experts == stats.Experts && (stats.TopK == 0 || m.TopK == stats.TopK) {
			return m, nil
		}
	}
	return costmodel.Model{}, fmt.Errorf("no model preset has %d experts and top-%d like the trace; pass --model PRESET or a YAML file", stats.Experts, stats.TopK)
}

func (c *common) options() solver.Options {
	return solver.Options{TimeLimit: c.timeLimit, RelGap: c.gap, Threads: c.threads, Seed: c.seed, MoETunerEqualSizes: c.equalSizes, MaxMoves: c.maxMoves}
}

func readPlan(path string, gpus int) (*placement.Plan, error) {
	f, err := placement.FormatFromPath(path)
	if err == nil && f == placement.FormatSGLang {
		r, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		return placement.ReadSGLang(r, gpus)
	}
	return placement.ReadFile(path)
}

// traceFormats are the values of --trace-format ("" detects the format).
var traceFormats = []string{"", "jsonl", "npy", "flame-csv", "olmoe-json", "fiddler-json", "logical-count",
	"sglang-pt", "sglang-routed-experts", "trtllm-expert-statistic", "megatron-router-trace", "vllm-eplb-load-stats", "moetuner-stats"}
