package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
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
	ppOffsets    string // --pp-layer-offset
	traces       multiFlag
	format       string
	transitions  string
	topK         int
	cluster      string
	model        string
	nodes        int
	gpusPerNode  int
	flow         string
	mode         string
	sigma        float64
	timeLimit    time.Duration
	gap          float64
	threads      int
	seed         int
	jsonOut      string
	equalSizes   bool
	effort       int
	timeLimitSet bool
	fs           *flag.FlagSet // the flags, to tell which were given
	started      time.Time     // when the command began: --time-limit counts from here
	redundant    int
	groups       int
	across       string
	from         string
	maxMoves     int
	maxImbalance float64
	split        string
	dispatch     string
	moveCost     float64
	slotsPerGPU  string

	pathError float64
	quiet     bool
	// holdout is --holdout's fraction; held what setup kept back for it.
	holdout float64
	held    *heldOut
	shrink  bool

	// needTrace keeps the per-token traces (replay measures them); other
	// commands read only their statistics, in bounded memory.
	needTrace bool
	// passTokens is --pass-tokens; orderErr says why vLLM's dispatch has
	// no token order to count the hash by (nil when it has one or was not
	// asked for).
	passTokens int
	orderErr   error
	// stderr receives the notes on what the statistics left out.
	stderr io.Writer
	// progress shows the reading (nil: nothing).
	progress *progress

	// layout, set by setup, says where the trace's MoE layers sit in the
	// model, for placement files that do not record it.
	layout placement.Layout
	// modelName is the model setup chose, for error messages.
	modelName string
	// decoderFromTrace says the layout's decoder-layer count is the
	// trace's (else the model's), for error messages.
	decoderFromTrace bool
	// serving is the placement that was serving while the traces were
	// recorded (plan's --from, eval's --plan), for TensorRT-LLM's
	// load-balancer statistics, which count its slots.
	serving servingPlan
	// solving says the command solves (plan, compare): the slots of its
	// plans come from the flags, which must fill the GPUs. The others
	// read the slots from their --plan files.
	solving bool
}

func (c *common) register(fs *flag.FlagSet, solve bool) {
	c.fs = fs
	c.started = time.Now()
	c.solving = solve
	fs.Var(&c.traces, "trace", "routing trace file or directory (repeatable; stats are added up)")
	choiceVar(fs, &c.format, "trace-format", "", traceFormats, "force the trace format: jsonl, npy, flame-csv, olmoe-json, fiddler-json, logical-count, sglang-pt, sglang-routed-experts, trtllm-expert-statistic, megatron-router-trace, vllm-eplb-load-stats, moetuner-stats (default: detect)")
	choiceVar(fs, &c.transitions, "transitions", "all-pairs", []string{"all-pairs", "top1"}, "transition counting for per-token traces: all-pairs (k×k) or top1")
	fs.IntVar(&c.topK, "top-k", 0, "top-k for count formats that do not state it (default: the model's)")
	fs.StringVar(&c.ppOffsets, "pp-layer-offset", "", ppOffsetUsage)
	fs.StringVar(&c.cluster, "cluster", "h100x8", "cluster preset ("+strings.Join(costmodel.ClusterNames(), ", ")+", or <n>x<preset>) or YAML file")
	fs.StringVar(&c.model, "model", "", "model preset ("+strings.Join(costmodel.ModelNames(), ", ")+") or YAML file (default: the preset matching the trace's shape)")
	fs.IntVar(&c.nodes, "nodes", 0, "override the number of nodes")
	fs.IntVar(&c.gpusPerNode, "gpus-per-node", 0, "override GPUs (EP ranks) per node (default: the cluster's; for models with fewer than 16 experts, E/2 so each GPU holds two experts, MoETuner's EP4 for Mixtral)")
	choiceVar(fs, &c.flow, "flow", "home", []string{"home", "chain"}, "token flow: home (standard EP dispatch/combine) or chain (MoETuner Eq. 9 / ExFlow)")
	choiceVar(fs, &c.mode, "mode", "sequential", []string{"sequential", "overlapped"}, "layer time: sequential or overlapped (compute slowed by sigma)")
	fs.Float64Var(&c.sigma, "sigma", -1, "compute slowdown under overlap (default: the cluster's, 0.189)")
	fs.StringVar(&c.jsonOut, "json", "", "also write the results as JSON to this file")
	fs.Float64Var(&c.pathError, "path-error", routing.DefaultPathError, "per-token traces: target relative standard error of the per-token means estimated from the sample of token paths kept for long traces (0: keep every path)")
	fs.BoolVar(&c.quiet, "quiet", false, "print only errors (no notes on what the statistics left out, no progress)")
	c.stderr = fs.Output()
	if solve {
		fs.BoolVar(&c.shrink, "shrink-sources", false, "plan with the trace's per-rank mix shrunk by its split-half reliability (per-source dispatches): for traffic the trace has not seen; plans are still scored on the trace as recorded")
		fs.Float64Var(&c.holdout, "holdout", 0, "plan on the first part of one per-token trace and also score every plan on its last fraction F (whole steps when the trace records them): what a plan does on traffic it has not seen (compare prints both; 0: off)")
	}
	choiceVar(fs, &c.dispatch, "dispatch", "even", dispatchChoices(), "how a rank's tokens pick among an expert's copies, as the serving stack does it: "+
		"sglang-static (SGLang's --ep-dispatch-algorithm static table, dealt exactly as SGLang deals it with random.Random(42): a rank's own-GPU copy, else one copy dealt to it; trees before the same-node rule; 'static' is this), "+
		"sglang-static-node (the trees that prefer the first same-node copy), sglang-static-node-narrow (the newest tree: a same-node copy only when the node holds some but not all copies), sglang-static-gpu-only (the newest tree under elastic EP scale-up), "+
		"sglang-dynamic (SGLang's dynamic dispatch: nearest copy, else a random copy per token), vllm (vLLM's hashed replica per token: counted token by token from each token's row in its rank's batch when one per-token trace with source ranks is given, see --pass-tokens, else by its expectation), trtllm (TensorRT-LLM's round robin per block of routed tokens, by its expectation), "+
		"even (every rank splits evenly: EPLB's own model), local (own GPU, else own node, else water-filled: node-local replicas as in SGLang PR #19772) or static-mean (the expectation of SGLang's table over its deal, which no GPU sees); every one but even, vllm and trtllm is home flow only")
	fs.IntVar(&c.passTokens, "pass-tokens", 0, "vllm dispatch: the tokens each rank runs per forward pass (a token's row in it picks its copy; 4096-token prefills on 32 ranks: 128); 0: a step of the trace is one pass, or all of a rank's tokens when the trace has no steps")
	if solve {
		c.timeLimit = 60 * time.Second
		fs.Var(setDuration{&c.timeLimit, &c.timeLimitSet}, "time-limit", "time limit of the whole command, reading the traces included: the solves get what reading left (compare shares it among the strategies that search), and the command ends within it plus 10%; with --effort only a safety limit, off unless given")
		fs.IntVar(&c.effort, "effort", 0, "work budget instead of the clock: N million scored moves (a branch-and-bound node counts 1000); the same inputs then give the same plan bytes on any machine (0: time-limited)")
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
		fs.Float64Var(&c.maxImbalance, "max-imbalance", 0, "joint: cap every layer's busiest/mean GPU load (tokens per unit of speed, as dispatched), e.g. 1.02; the home flow's affinity search keeps to it, layers still above it are repaired, and a cap no plan is found under is an error (0: no cap)")
		fs.BoolVar(&c.equalSizes, "moetuner-equal-sizes", false, "moetuner strategy: E/G experts per cluster in ILP 1 (not the paper's design; always meets Eq. 13)")
	}
}

// setup loads statistics, cluster and model and builds the problem.
func (c *common) setup(defaultTrace bool) (solver.Problem, []*routing.Source, error) {
	var p solver.Problem
	stats, sources, err := c.loadTraces(defaultTrace)
	if err != nil {
		return p, nil, err
	}
	model, err := c.loadModel(stats)
	if err != nil {
		return p, nil, err
	}
	// Count formats such as logical_count do not say their top-k; the
	// model does.
	stats.AssumeTopK(model.TopK)
	if c.held != nil {
		c.held.stats.AssumeTopK(model.TopK)
	}
	cluster, err := c.setupCluster(stats, sources)
	if err != nil {
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
	if c.redundant < 0 {
		return p, nil, usagef("--redundant-slots %d: want 0 or more (copies beyond one per expert, per layer)", c.redundant)
	}
	if c.solving && (stats.Experts+c.redundant)%cluster.GPUs() != 0 && c.from == "" && c.slotsPerGPU == "" {
		return p, nil, fmt.Errorf("%d experts + %d redundant slots per layer do not divide evenly over %d GPUs (%d nodes × %d); choose --nodes/--gpus-per-node or --redundant-slots so the GPU count divides the slots", stats.Experts, c.redundant, cluster.GPUs(), cluster.Nodes, cluster.GPUsPerNode)
	}
	p = solver.Problem{Stats: stats, Cluster: cluster, Model: model, Flow: flow, Mode: mode,
		RedundantSlots: c.redundant, ExpertGroups: c.groups, ShrinkSources: c.shrink}
	if err := c.problemFlags(&p, sources); err != nil {
		return p, nil, err
	}
	if p.Dispatch, err = placement.ParseDispatch(c.dispatch); err != nil {
		return p, nil, err
	}
	var notes []string
	if !c.given("dispatch") && flow == costmodel.FlowHome && fromSGLang(sources) {
		p.Dispatch = placement.DispatchSGLangStaticNarrow
		notes = append(notes, fmt.Sprintf("dispatch %s: SGLang's static table of its newest tree, the default for an SGLang trace (--ep-dispatch-algorithm static); --dispatch names another", p.Dispatch))
	}
	notes = append(notes, c.dispatchNotes(p.Dispatch, stats, cluster.GPUs(), flow)...)
	if !c.quiet {
		printNotes(c.stderr, notes)
	}
	c.layout, c.modelName = planLayout(stats, model, cluster), model.Name
	c.decoderFromTrace = stats.ModelLayers != 0
	if c.from != "" {
		if p.Current, err = c.readPlan(c.from, cluster); err != nil {
			return p, nil, err
		}
		if err := c.runningSlots(&p); err != nil {
			return p, nil, err
		}
	}
	return p, sources, nil
}

// loadTraces reads the --trace files (the bundled trace when none is
// given and defaultTrace is set) with the flags' load options, prints the
// loaders' notes unless --quiet, and holds out and orders what it read
// (cutAndOrder).
func (c *common) loadTraces(defaultTrace bool) (*routing.Stats, []*routing.Source, error) {
	traces := []string(c.traces)
	if len(traces) == 0 {
		if !defaultTrace {
			return nil, nil, usagef("no --trace given")
		}
		if _, err := os.Stat(DefaultTrace); err != nil {
			return nil, nil, fmt.Errorf("no --trace given and the bundled data %s is not here (run from the repository root or pass --trace)", DefaultTrace)
		}
		traces = []string{DefaultTrace}
	}
	if c.pathError < 0 {
		return nil, nil, usagef("--path-error %v: want 0 (every path) or a positive relative error such as 0.01", c.pathError)
	}
	if !(c.holdout >= 0 && c.holdout < 1) {
		return nil, nil, usagef("--holdout %v: want a fraction of the trace's tokens in [0, 1), such as 0.5", c.holdout)
	}
	lo := routing.LoadOptions{Format: routing.Format(c.format), TopK: c.topK, StatsOnly: !c.keepTrace(), PathError: libPathError(c.pathError)}
	offsets, err := parsePPOffsets(c.ppOffsets)
	if err != nil {
		return nil, nil, err
	}
	lo.MegatronLayerOffsets = offsets
	switch c.transitions {
	case "all-pairs":
	case "top1":
		lo.Transitions = routing.TransitionTop1
	default:
		return nil, nil, fmt.Errorf("--transitions %q: want all-pairs or top1", c.transitions)
	}
	if err := c.modelLoadOptions(&lo); err != nil {
		return nil, nil, err
	}
	if c.serving.path == "" && c.from != "" {
		c.serving = servingPlan{path: c.from, flag: "--from"}
	}
	var servingErr error
	lo.SlotExperts, servingErr = c.serving.slotExperts(c.flagGPUs(), lo.Experts)
	rd := c.progress.reading(traces)
	stats, sources, err := routing.LoadAll(traces, rd.options(lo))
	rd.end(stats, err)
	if err != nil {
		if servingErr != nil && strings.Contains(err.Error(), "load balancer") {
			return nil, nil, fmt.Errorf("%w (%s %s could not be read as the placement that was serving: %v)", routingError(err), c.serving.flag, c.serving.path, servingErr)
		}
		return nil, nil, routingError(err)
	}
	if !c.quiet {
		printNotes(c.stderr, stats.Notes)
		printSlotNotes(c.stderr, sources, c.serving, stats.Experts)
	}
	if stats, err = c.cutAndOrder(sources, stats, lo); err != nil {
		return nil, nil, err
	}
	return stats, sources, nil
}

// setupCluster is the cluster of the flags (--cluster, --nodes,
// --gpus-per-node, --sigma), or of the deployment a trace records, checked
// to hold every source rank of the traces.
func (c *common) setupCluster(stats *routing.Stats, sources []*routing.Source) (costmodel.Cluster, error) {
	cluster, err := costmodel.LoadCluster(c.cluster)
	if err != nil {
		return costmodel.Cluster{}, err
	}
	if c.nodes > 0 {
		cluster = cluster.WithNodes(c.nodes)
	}
	dep, err := deploymentOf(sources)
	if err != nil {
		return costmodel.Cluster{}, err
	}
	switch {
	case dep != nil:
		if err := c.applyDeployment(&cluster, dep); err != nil {
			return costmodel.Cluster{}, err
		}
		if !c.quiet && c.stderr != nil {
			fmt.Fprintf(c.stderr, "moetuner: note: --trace %s records its deployment (vLLM's eplb_load_meta): %d ranks on %d nodes, %d expert groups, %d redundant experts; planned for it\n", dep.File, dep.Ranks, dep.Nodes, dep.Groups, dep.RedundantExperts)
		}
	case c.gpusPerNode > 0:
		cluster = cluster.WithGPUsPerNode(c.gpusPerNode)
	default:
		cluster = cluster.FitExperts(stats.Experts)
	}
	if c.sigma >= 0 {
		s := c.sigma
		cluster.Sigma = &s
	}
	if err := cluster.Validate(); err != nil {
		return costmodel.Cluster{}, err
	}
	// A token's source rank is the GPU it lives on (its home): a trace
	// recorded on more ranks than the cluster has has homes the cluster
	// cannot hold.
	for _, src := range sources {
		if _, top := src.Stats.MaxSource(); top >= cluster.GPUs() {
			return costmodel.Cluster{}, fmt.Errorf("--trace %s: its tokens come from source ranks up to %d (each token's home GPU in the deployment it was recorded on), but the cluster has %d GPUs (--nodes %d × --gpus-per-node %d); plan for the deployment it was recorded on, at least %d GPUs", src.Path, top, cluster.GPUs(), cluster.Nodes, cluster.GPUsPerNode, top+1)
		}
	}
	return cluster, nil
}

// problemFlags sets p's workloads (--across), move limits (--move-cost,
// --max-moves), imbalance cap, slots per GPU and split from the flags.
func (c *common) problemFlags(p *solver.Problem, sources []*routing.Source) error {
	var err error
	if c.across != "" {
		if p.Across, err = solver.ParseAcross(c.across); err != nil {
			return err
		}
		switch {
		case len(sources) >= 2:
			for _, src := range sources {
				p.Workloads = append(p.Workloads, src.Stats)
			}
		case len(p.Stats.StepLoad) >= 2:
			// One file with per-step loads ([steps][L][E] logical_count):
			// every step is a workload, as SGLang's deepseek_vec does.
			for _, load := range p.Stats.StepLoad {
				p.Workloads = append(p.Workloads, routing.StatsFromLoad(load, p.Stats.TopK))
			}
		default:
			return fmt.Errorf("--across needs at least two --trace workloads, or one trace with per-step loads")
		}
	}
	if !(c.moveCost >= 0) || math.IsInf(c.moveCost, 0) {
		return usagef("--move-cost %v: want 0 (free moves) or more, in units of busiest/mean load per changed slot, such as 0.001", c.moveCost)
	}
	if c.maxMoves < 0 {
		return usagef("--max-moves %d: want 0 (no bound) or more slots per layer", c.maxMoves)
	}
	if c.from == "" && (c.maxMoves != 0 || c.moveCost != 0) {
		flag := "--max-moves"
		if c.maxMoves == 0 {
			flag = "--move-cost"
		}
		return usagef("%s counts the moves from a running plan: give that plan with --from", flag)
	}
	p.MoveCost = c.moveCost
	if c.maxImbalance != 0 && !(c.maxImbalance >= 1 && !math.IsInf(c.maxImbalance, 0)) {
		return usagef("--max-imbalance %v: want 0 (no cap) or a busiest/mean ratio of at least 1, such as 1.02", c.maxImbalance)
	}
	p.MaxImbalance = c.maxImbalance
	if c.slotsPerGPU != "" {
		for _, f := range strings.Split(c.slotsPerGPU, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				return fmt.Errorf("--slots-per-gpu %q: want comma-separated non-negative integers", c.slotsPerGPU)
			}
			p.SlotsPerGPU = append(p.SlotsPerGPU, n)
		}
		if len(p.SlotsPerGPU) != p.Cluster.GPUs() {
			return fmt.Errorf("--slots-per-gpu has %d entries for %d GPUs; give one per GPU", len(p.SlotsPerGPU), p.Cluster.GPUs())
		}
	}
	if c.split != "" {
		if p.Split, err = solver.ParseSplit(c.split); err != nil {
			return err
		}
	}
	return nil
}

// fromSGLang reports whether every trace was recorded by SGLang (its
// expert-distribution recorder or its routed-experts responses).
func fromSGLang(sources []*routing.Source) bool {
	for _, src := range sources {
		if src.Format != routing.FormatSGLangPT && src.Format != routing.FormatSGLangRoutedExperts {
			return false
		}
	}
	return len(sources) > 0
}

// given reports whether the flag name was on the command line.
func (c *common) given(name string) bool {
	found := false
	if c.fs != nil {
		c.fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	}
	return found
}

// runningSlots gives p the running plan's slots (--from): a service
// re-placed keeps its slot layout, so every strategy, the baselines
// included, is planned for it. A --redundant-slots or --slots-per-gpu
// that disagrees with the file, or a file whose layers differ, is an
// error.
func (c *common) runningSlots(p *solver.Problem) error {
	cur := p.Current
	var per []int
	for l := range cur.Layers {
		s := cur.SlotsPerGPU(l)
		if per == nil {
			per = s
			continue
		}
		if !slices.Equal(s, per) {
			return fmt.Errorf("--from %s: layer %d has %v slots per GPU but layer 0 has %v; moetuner re-places a plan with the same slots in every layer", c.from, l, s, per)
		}
	}
	total, uniform := 0, true
	for _, v := range per {
		total += v
		uniform = uniform && v == per[0]
	}
	red := total - p.Stats.Experts
	switch {
	case p.SlotsPerGPU != nil:
		if !slices.Equal(p.SlotsPerGPU, per) {
			return fmt.Errorf("--from %s has %v slots per GPU but --slots-per-gpu gives %v; drop --slots-per-gpu to keep the running plan's slots", c.from, per, p.SlotsPerGPU)
		}
	case c.given("redundant-slots"):
		if !uniform || red != c.redundant {
			return fmt.Errorf("--from %s has %d redundant slots per layer (%d slots on %d GPUs) but --redundant-slots is %d; drop --redundant-slots to keep the running plan's slots", c.from, red, total, len(per), c.redundant)
		}
	case uniform:
		p.RedundantSlots = red
	default:
		p.SlotsPerGPU = per
	}
	return nil
}

// startProgress makes the command's progress (see startProgress) and
// sends the reading and the notes through it.
func (c *common) startProgress(stdout, stderr io.Writer) (*progress, io.Writer, io.Writer) {
	pr, stdout, stderr := startProgress(stdout, stderr, c.quiet)
	c.progress, c.stderr = pr, stderr
	return pr, stdout, stderr
}

// modelLoadOptions sets what a --model says about the trace in lo: its
// experts per layer (the readers then check every id against them) and
// its decoder layers.
func (c *common) modelLoadOptions(lo *routing.LoadOptions) error {
	if c.model == "" {
		return nil
	}
	m, err := costmodel.LoadModel(c.model)
	if err != nil {
		return err
	}
	lo.Experts, lo.ModelLayers = m.Experts, m.DecoderLayers
	return nil
}

func (c *common) loadModel(stats *routing.Stats) (costmodel.Model, error) {
	if c.model != "" {
		m, err := costmodel.LoadModel(c.model)
		if err != nil {
			return m, err
		}
		if m.Experts != stats.Experts {
			return m, fmt.Errorf("model %q has %d experts per layer but the trace (%s) has %d; pick the matching --model", m.Name, m.Experts, c.traceNames(), stats.Experts)
		}
		// A trace may record fewer choices than the model makes (only the
		// first, as ExFlow's top-1 traces do), never more.
		if stats.TopK > m.TopK {
			return m, fmt.Errorf("model %q routes each token to %d experts per layer (top_k) but the trace (%s) routes each to %d; pick the matching --model, or a model YAML file with top_k: %d", m.Name, m.TopK, c.traceNames(), stats.TopK, stats.TopK)
		}
		return m, nil
	}
	m, err := costmodel.InferModel(stats)
	if err != nil {
		return m, fmt.Errorf("%w (--model PRESET or FILE.yaml)", err)
	}
	return m, nil
}

// options returns the solver options for a solve that gets all the time
// the command has left (see solveLimit).
func (c *common) options() solver.Options {
	return c.optionsShare(1, 0)
}

// optionsShare returns the solver options for one of shares solves that
// split the time the command has left, keeping reserve for the work after
// them.
func (c *common) optionsShare(shares int, reserve time.Duration) solver.Options {
	limit := c.solveLimit(shares, reserve)
	if c.effort > 0 && !c.timeLimitSet {
		limit = 0 // the work bounds it
	}
	return solver.Options{TimeLimit: limit, Effort: c.effort, RelGap: c.gap, Threads: c.threads, Seed: c.seed, MoETunerEqualSizes: c.equalSizes, MaxMoves: c.maxMoves}
}

// minSolve is the least time limit a solve gets when reading took all of
// --time-limit: the solvers then return their first plan at once.
const minSolve = time.Millisecond

// solveLimit returns the time limit of one of shares solves: what is left
// of --time-limit since the command began, less reserve (the scoring and
// writing after the solves), split evenly.
func (c *common) solveLimit(shares int, reserve time.Duration) time.Duration {
	if c.timeLimit <= 0 {
		return 0 // the solver's own default
	}
	left := c.timeLimit - time.Since(c.started) - reserve
	return max(left/time.Duration(max(shares, 1)), minSolve)
}

// planLayout says where the trace's MoE layers sit among the model's
// decoder layers, for placement files indexed by decoder layer: the
// trace's layer ids (routing.Stats.LayerNames) and decoder-layer count
// (ModelLayers) win over the model's (decoder_layers, moe_layer_ids); what
// neither knows stays zero, and the formats that need it then fail with
// placement.ErrNeedLayers. GPUs, Experts and Layers are the cluster's and
// the trace's.
func planLayout(s *routing.Stats, m costmodel.Model, cluster costmodel.Cluster) placement.Layout {
	return solver.Problem{Stats: s, Model: m, Cluster: cluster}.Layout()
}

// traceFormats are the values of --trace-format ("" detects the format).
var traceFormats = []string{"", "jsonl", "npy", "flame-csv", "olmoe-json", "fiddler-json", "logical-count",
	"sglang-pt", "sglang-routed-experts", "trtllm-expert-statistic", "megatron-router-trace", "vllm-eplb-load-stats", "moetuner-stats"}

// setDuration is a duration flag that records whether it was given.
type setDuration struct {
	d   *time.Duration
	set *bool
}

func (f setDuration) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f setDuration) Set(v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return err
	}
	*f.d, *f.set = d, true
	return nil
}

// libPathError maps --path-error (0: every path) to
// routing.LoadOptions.PathError (negative: every path).
func libPathError(v float64) float64 {
	if v == 0 {
		return -1
	}
	return v
}

// printNotes prints each of the statistics' notes once, as
// "moetuner: note: ..." lines.
func printNotes(w io.Writer, notes []string) {
	if w == nil {
		return
	}
	seen := map[string]bool{}
	for _, n := range notes {
		if !seen[n] {
			seen[n] = true
			fmt.Fprintln(w, "moetuner: note:", n)
		}
	}
}

// ppOffsetUsage documents --pp-layer-offset.
const ppOffsetUsage = "Megatron router traces recorded with pipeline parallelism: the number of decoder layers before each rank's stage, as RANK=OFFSET,... (e.g. 0=0,1=0,2=16,3=16), or one OFFSET for every file; files of different offsets are joined into whole-model tokens (in training a record's layer is the index within its stage). Under Megatron's default rank order the stage of rank r is r ÷ (world size ÷ PP)"

// parsePPOffsets parses --pp-layer-offset: "" (nil), "N" (every rank) or
// "RANK=OFFSET,...".
func parsePPOffsets(s string) (map[int]int, error) {
	if s == "" {
		return nil, nil
	}
	bad := func(part string) error {
		return usagef("--pp-layer-offset %q: %q is not RANK=OFFSET or OFFSET with non-negative integers; give e.g. 0=0,1=0,2=16,3=16", s, part)
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 {
			return nil, bad(s)
		}
		return map[int]int{-1: n}, nil
	}
	out := map[int]int{}
	for _, part := range strings.Split(s, ",") {
		r, o, ok := strings.Cut(strings.TrimSpace(part), "=")
		rank, err1 := strconv.Atoi(r)
		off, err2 := strconv.Atoi(o)
		if !ok || err1 != nil || err2 != nil || rank < 0 || off < 0 {
			return nil, bad(part)
		}
		if _, dup := out[rank]; dup {
			return nil, usagef("--pp-layer-offset %q: rank %d given twice", s, rank)
		}
		out[rank] = off
	}
	return out, nil
}
