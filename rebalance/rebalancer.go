package rebalance

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver"
)

// Phase says which kind of forward pass a step was.
type Phase int

const (
	// PhaseAny: the input does not say (in a Step), or every observed
	// step whatever its phase (in a Budget).
	PhaseAny Phase = iota
	// PhasePrefill: a prefill (extend) pass, thousands of tokens.
	PhasePrefill
	// PhaseDecode: a decode pass, a few tokens per GPU; its cost follows
	// the experts its tokens activate (costmodel.StepCompute).
	PhaseDecode
)

// String returns "any", "prefill" or "decode".
func (p Phase) String() string {
	switch p {
	case PhasePrefill:
		return "prefill"
	case PhaseDecode:
		return "decode"
	}
	return "any"
}

// Step is one forward pass's routing: Load[l][e] tokens routed to expert e
// at MoE layer l (SGLang's per-pass logical_count, a TensorRT-LLM
// iteration, a routing.Stats.StepLoad entry), and its Phase when known.
// Per-token expert sets are not needed to balance: an expert is activated
// in a step exactly when its count is positive.
//
// Tokens, when set, is the step's per-token routing, what affinity needs
// (the remote-node copies a token's experts cost depend on which of them
// share a node with each other and with the token): a routing.Trace of
// the step's tokens with every token's top-k experts at every MoE layer
// (Layers = Model.Layers, TopK = Model.TopK, Experts = Model.Experts) and,
// in Source, the rank (GPU of the cluster) the token lives on, -1 or nil
// where unknown; Weights and Step are not read. Load may then be nil: it
// is the tokens' counts, and a Load given with Tokens must equal them.
type Step struct {
	Load   [][]float64
	Phase  Phase
	Tokens *routing.Trace
}

// DefaultWindow is Config.Window's default, vLLM's EPLB window_size.
const DefaultWindow = 1000

// DefaultTime is Budget.Time's default. Incremental re-placement of
// DeepSeek-V3 (58 layers, 288 slots) takes milliseconds, so the limit
// never binds at the default sizes and proposals are reproducible.
const DefaultTime = 30 * time.Second

// Config sets up a Rebalancer. Cluster and Model are required; every other
// field's zero value works.
type Config struct {
	// Cluster is the hardware (GPU count, links for migration, compute
	// coefficients).
	Cluster costmodel.Cluster
	// Model is the MoE model; Layers, Experts and TopK fix the shape of
	// every Step, ExpertBytes() the bytes one slot change moves.
	Model costmodel.Model
	// RedundantSlots are the slots per layer beyond one per expert of the
	// default initial plan (DefaultPlan); ignored with Initial.
	RedundantSlots int
	// Initial is the placement running when the rebalancer starts (nil:
	// DefaultPlan, what the serving stacks start with). Every proposal
	// keeps its slots per GPU.
	Initial *placement.Plan
	// Window is how many of the latest steps each phase keeps (default
	// DefaultWindow; negative: no limit, for a pure exponential decay).
	Window int
	// Decay is the weight of a step relative to the next one, in (0, 1],
	// as TensorRT-LLM's online balancer decays its statistics: the step
	// of age a (0 for the newest) weighs Decay^a. 0 means 1, no decay. A
	// negative Window needs Decay < 1.
	Decay float64
	// Solver tunes the re-placement solves (Strategy is always joint;
	// MaxMoves and TimeLimit come from the Budget).
	Solver solver.Options
	// Dispatch is how the serving stack picks among an expert's copies
	// (placement.DispatchEven by default; SGLang's static table is
	// placement.DispatchSGLangStatic): every proposal is planned and
	// scored under it (from counts alone, each rank sends an equal share
	// of an expert's tokens).
	Dispatch placement.Dispatch
}

// Budget bounds one proposal.
type Budget struct {
	// MaxMoves is the most slots per layer the proposal may change
	// (ChangedSlots); 0 means no bound. The search swaps two slots at a
	// time, so an odd budget leaves one slot unused unless a copy-count
	// change fits.
	MaxMoves int
	// Horizon > 0 keeps only moves that pay for their migration within
	// Horizon steps (the steps until the next rebalance): the solve
	// charges every changed slot the time its weights take over the
	// slowest link (NIC across nodes, else NVLink) in units of modeled
	// layer time, and a layer changes only if its modeled gain per step ×
	// Horizon exceeds its MigrationTime. 0: no such rule.
	Horizon int
	// Phase picks the window to plan for (PhaseAny: all of them).
	Phase Phase
	// Fresh plans from scratch instead of from the current plan (every
	// slot may change; MaxMoves does not apply): EPLB's plan of the window
	// improved by the joint strategy's swap search until no move gains
	// 1e-6 busiest/mean, which is reproducible (with GPUs of different
	// slot counts, where EPLB does not apply, the joint strategy's
	// replicated solve, which runs to its time limit and is not).
	Fresh bool
	// Time bounds the solve (default DefaultTime); on per-token paths the
	// whole proposal, its evaluations of the cost model included, as far
	// as the solve's start and evaluations, which no deadline cuts, allow.
	Time time.Duration
}

// Proposal is a proposed placement with what installing it costs and
// gains, both modeled on the window the proposal was made for.
type Proposal struct {
	// Plan is the proposed placement, its slots aligned with the current
	// plan's (Align; a fresh plan's GPUs relabelled first, Relabel): only
	// Moved slots differ.
	Plan *placement.Plan
	// Moved[l] is the slots of layer l that change (ChangedSlots),
	// MovedSlots their sum and BytesMoved = MovedSlots × ExpertBytes.
	Moved      []int
	MovedSlots int
	BytesMoved int64
	// MigrationSec is MigrationTime from the current plan.
	MigrationSec float64
	// CurrentStepSec and StepSec are the modeled expert compute time per
	// step (the layers' compute tails, costmodel.StepTails under
	// Config.Dispatch, averaged over the window's steps by weight) of the
	// current and proposed plans, each plan dealt as a whole; GainSec is
	// their difference.
	CurrentStepSec, StepSec, GainSec float64
	// CurrentPAR and PAR are busiest/mean GPU load on the window's load,
	// averaged over layers, with every expert split evenly over its copies
	// whatever the dispatch (LayerPAR, the harness's measure).
	CurrentPAR, PAR float64
	// Steps is the number of steps in the window.
	Steps int
	// Kept counts the layers left as they are because the solve found no
	// gain there, the change would not pay within Budget.Horizon, or (a
	// safeguard that has never fired in tests) it exceeded MaxMoves.
	Kept int
	// Paths says the proposal was planned on the window's per-token
	// paths (Step.Tokens): PathSteps of the window's steps carried them,
	// PathTokens is their tokens (weighted as their steps). CurrentRemote
	// and Remote are then the remote-node copies per token and layer of
	// the current and proposed plans on those tokens, and CurrentLayerSec
	// and LayerSec the cost model's modeled time of all layers for them
	// (costmodel.Report.TimeSec: compute and all-to-all, home flow, under
	// Config.Dispatch); all four are NaN without paths.
	Paths                                            bool
	PathSteps                                        int
	PathTokens                                       float64
	CurrentRemote, Remote, CurrentLayerSec, LayerSec float64
	// Status is the solve's; TimedOut reports that Budget.Time stopped it,
	// in which case the same inputs may give another plan.
	Status    solver.Status
	TimedOut  bool
	SolveTime time.Duration
}

// Rebalancer keeps a running placement and the recent per-step loads of
// every phase, and proposes re-placements that change few slots. It is
// safe for concurrent use; a proposal is solved outside the lock, so
// steps may be observed meanwhile.
//
// Proposals are deterministic: the same Config, the same sequence of
// Observe and Install calls and the same Budget give the same plan, byte
// for byte, on any GOMAXPROCS, as long as the time budget does not stop
// the solve (Proposal.TimedOut); the solve's layers are independent, its
// moves are chosen in a fixed order, and nothing iterates over a map.
// Proposals on per-token paths (Step.Tokens) search until Budget.Time and
// are reproducible only under a work budget (Config.Solver.Effort).
type Rebalancer struct {
	cfg     Config
	mu      sync.Mutex
	current *placement.Plan
	windows [3]*window     // by Phase
	paths   [3]*pathWindow // by Phase
	seen    int
}

// New returns a Rebalancer for cfg, or an error naming the Config field
// that is wrong.
func New(cfg Config) (*Rebalancer, error) {
	if err := cfg.Cluster.Validate(); err != nil {
		return nil, fmt.Errorf("rebalance: Config.Cluster: %w", err)
	}
	m := cfg.Model
	if m.Layers < 1 || m.Experts < 1 || m.TopK < 1 {
		return nil, fmt.Errorf("rebalance: Config.Model has %d layers, %d experts, top-k %d: set a model (costmodel.ModelPreset) whose shape is the steps'", m.Layers, m.Experts, m.TopK)
	}
	if cfg.Decay == 0 {
		cfg.Decay = 1
	}
	if !(cfg.Decay > 0 && cfg.Decay <= 1) {
		return nil, fmt.Errorf("rebalance: Config.Decay %v: want a weight in (0, 1] (0 means 1)", cfg.Decay)
	}
	size := cfg.Window
	switch {
	case size == 0:
		size = DefaultWindow
	case size < 0 && cfg.Decay == 1:
		return nil, errors.New("rebalance: Config.Window is negative (no limit) without a Decay below 1: the statistics would never forget; set a Window or a Decay")
	case size < 0:
		size = 0
	}
	r := &Rebalancer{cfg: cfg}
	for p := range r.windows {
		r.windows[p] = newWindow(m.Layers, m.Experts, size, cfg.Decay)
		r.paths[p] = newPathWindow(m.Layers, m.Experts, m.TopK, size, cfg.Decay)
	}
	if !cfg.Dispatch.Valid() {
		return nil, fmt.Errorf("rebalance: Config.Dispatch %d is not a dispatch; use a placement.Dispatch constant (placement.ParseDispatch parses the names)", cfg.Dispatch)
	}
	init := cfg.Initial
	if init == nil {
		var err error
		if init, err = DefaultPlan(m.Layers, m.Experts, cfg.RedundantSlots, cfg.Cluster.GPUs()); err != nil {
			return nil, err
		}
	}
	if err := r.check(init, "Config.Initial"); err != nil {
		return nil, err
	}
	r.current = init.Clone()
	return r, nil
}

// check validates plan against the configured shape.
func (r *Rebalancer) check(plan *placement.Plan, what string) error {
	if plan == nil {
		return fmt.Errorf("rebalance: %s is nil", what)
	}
	m := r.cfg.Model
	if plan.GPUs != r.cfg.Cluster.GPUs() {
		return fmt.Errorf("rebalance: %s is for %d GPUs, the cluster has %d", what, plan.GPUs, r.cfg.Cluster.GPUs())
	}
	if err := plan.Validate(placement.ValidateOptions{Experts: m.Experts, Layers: m.Layers}); err != nil {
		return fmt.Errorf("rebalance: %s: %w", what, err)
	}
	per := plan.SlotsPerGPU(0)
	for l := range plan.Layers {
		if !slices.Equal(plan.SlotsPerGPU(l), per) {
			return fmt.Errorf("rebalance: %s: layer %d holds %v slots per GPU but layer 0 holds %v; every layer needs the same slots per GPU", what, l, plan.SlotsPerGPU(l), per)
		}
	}
	return nil
}

// Observe records one step: its load in its phase's window and, with
// Tokens, its tokens' paths in the phase's path window. It returns an
// error naming the field, and records nothing, when the load is not
// [Model.Layers][Model.Experts] finite non-negative counts, the phase is
// unknown, or Tokens does not have the model's layers, top-k and experts,
// holds an expert id out of range or twice in one top-k, a source rank
// outside [0, GPUs) (or -1), or other counts than Load.
func (r *Rebalancer) Observe(step Step) error {
	m := r.cfg.Model
	r.mu.Lock()
	n := r.seen
	r.mu.Unlock()
	if step.Phase < PhaseAny || step.Phase > PhaseDecode {
		return fmt.Errorf("rebalance: step %d: unknown phase %d", n, step.Phase)
	}
	// The tokens are checked, counted and grouped by path outside the
	// lock: a proposal's snapshot need not wait for them.
	load := step.Load
	var counted [][]float64
	var batch *pathBatch
	if step.Tokens != nil {
		if err := checkTokens(step.Tokens, m.Layers, m.Experts, m.TopK, r.cfg.Cluster.GPUs(), n); err != nil {
			return err
		}
		counted = tokenLoad(step.Tokens)
		if load == nil {
			load = counted
		}
		batch = newPathBatch(step.Tokens)
	}
	if len(load) != m.Layers {
		return fmt.Errorf("rebalance: step %d: load has %d layers, the model %d", n, len(load), m.Layers)
	}
	for l, row := range load {
		if len(row) != m.Experts {
			return fmt.Errorf("rebalance: step %d: load[%d] has %d experts, the model %d", n, l, len(row), m.Experts)
		}
		for e, v := range row {
			if !(v >= 0) || math.IsInf(v, 1) {
				return fmt.Errorf("rebalance: step %d: load[%d][%d] = %v: counts must be finite and non-negative", n, l, e, v)
			}
		}
	}
	if counted != nil && step.Load != nil {
		if err := sameLoad(step.Load, counted, n); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.windows[step.Phase].add(load)
	r.paths[step.Phase].add(batch)
	r.seen++
	return nil
}

// Current returns a copy of the plan in force.
func (r *Rebalancer) Current() *placement.Plan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.current.Clone()
}

// Install makes plan (copied) the plan in force, once the serving stack
// runs it; it fails when plan does not fit the cluster and model or holds
// other slots per GPU than the current plan.
func (r *Rebalancer) Install(plan *placement.Plan) error {
	if err := r.check(plan, "the installed plan"); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Equal(plan.SlotsPerGPU(0), r.current.SlotsPerGPU(0)) {
		return fmt.Errorf("rebalance: the installed plan holds %v slots per GPU, the current plan %v; a serving stack cannot change its slot layout by rebalancing", plan.SlotsPerGPU(0), r.current.SlotsPerGPU(0))
	}
	r.current = plan.Clone()
	return nil
}

// snapshot is what one proposal works on, copied under the lock.
type snapshot struct {
	current *placement.Plan
	steps   [][][]float64 // nil with an unlimited window
	weights []float64
	decode  []bool // per step
	load    [][]float64
	weight  float64
	n       int
	// paths are the per-token statistics of the window's steps that
	// carried tokens (nil when none did), pathWeight those steps' summed
	// weight and pathSteps their number.
	paths      *routing.Stats
	pathWeight float64
	pathSteps  int
}

func (r *Rebalancer) snapshot(phase Phase) (snapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := snapshot{current: r.current.Clone(), load: matrix(r.cfg.Model.Layers, r.cfg.Model.Experts)}
	for p, w := range r.windows {
		if (phase != PhaseAny && Phase(p) != phase) || w.count == 0 {
			continue
		}
		ld, wt := w.load()
		for l, row := range ld {
			for e, v := range row {
				s.load[l][e] += v
			}
		}
		s.weight += wt
		steps, wts := w.steps()
		if steps == nil {
			// An unlimited decayed window keeps no steps: its mean step
			// stands for them.
			for l := range ld {
				for e := range ld[l] {
					ld[l][e] /= wt
				}
			}
			steps, wts = [][][]float64{ld}, []float64{wt}
		}
		s.steps = append(s.steps, steps...)
		s.weights = append(s.weights, wts...)
		for range steps {
			s.decode = append(s.decode, Phase(p) == PhaseDecode)
		}
		s.n += w.covered()
	}
	if s.weight == 0 {
		return s, fmt.Errorf("rebalance: no %s steps observed yet; Observe some before Propose", phaseWords(phase))
	}
	var pws []*pathWindow
	for p, w := range r.paths {
		if phase == PhaseAny || Phase(p) == phase {
			pws = append(pws, w)
			s.pathSteps += w.steps()
		}
	}
	s.paths, s.pathWeight = pathStats(pws)
	return s, nil
}

func phaseWords(p Phase) string {
	if p == PhaseAny {
		return "load"
	}
	return p.String()
}

// Propose solves for a placement within b and reports it; it does not
// install it. With Budget.Fresh it plans from scratch, otherwise from the
// current plan (solver.Problem.Current with Options.MaxMoves, and the
// migration charge of Budget.Horizon as Problem.MoveCost). Every layer of
// the result is then scored on the window's steps with
// costmodel.StepTails under Config.Dispatch and kept only if its modeled
// time drops (and the drop pays for its migration within Budget.Horizon,
// and its changed slots are within MaxMoves); under SGLang's tables the
// plan that results is dealt and decided again (settleDealt). Decode steps enter the solve with one extra token's
// worth of load per activated expert (perExpert/perToken tokens), so that
// the solve spreads activated experts as well as tokens.
func (r *Rebalancer) Propose(ctx context.Context, b Budget) (*Proposal, error) {
	if b.MaxMoves < 0 || b.Horizon < 0 || b.Time < 0 {
		return nil, fmt.Errorf("rebalance: Budget{MaxMoves: %d, Horizon: %d, Time: %v}: none may be negative", b.MaxMoves, b.Horizon, b.Time)
	}
	if b.Phase < PhaseAny || b.Phase > PhaseDecode {
		return nil, fmt.Errorf("rebalance: Budget.Phase %d is not a phase", b.Phase)
	}
	t0 := time.Now()
	s, err := r.snapshot(b.Phase)
	if err != nil {
		return nil, err
	}
	if s.paths != nil && !b.Fresh {
		return r.proposePaths(ctx, b, s, t0)
	}
	c, m := r.cfg.Cluster, r.cfg.Model
	perTok, perExp := c.Coefficients(m)
	solveLoad := s.load
	if slices.Contains(s.decode, true) && perTok > 0 {
		solveLoad = cloneMatrix(s.load)
		for i, st := range s.steps {
			if !s.decode[i] {
				continue
			}
			for l, row := range st {
				for e, v := range row {
					if v > 0 {
						solveLoad[l][e] += s.weights[i] * perExp / perTok
					}
				}
			}
		}
	}
	var res *solver.Result
	if b.Fresh {
		res, err = freshPlan(ctx, solveLoad, c, m, r.cfg.Dispatch, s.current.SlotsPerGPU(0), r.cfg.Solver, b.Time)
	} else {
		p := solver.Problem{
			Stats:       routing.StatsFromLoad(solveLoad, m.TopK),
			Cluster:     c,
			Model:       m,
			Dispatch:    r.cfg.Dispatch,
			SlotsPerGPU: s.current.SlotsPerGPU(0),
			Current:     s.current,
		}
		if b.Horizon > 0 {
			if perTok <= 0 {
				return nil, errors.New("rebalance: Budget.Horizon needs the cluster's compute speed (TFLOPS or TokenCost) to price a move against its gain")
			}
			p.MoveCost = moveCost(s.load, s.weight, c, m, perTok, b.Horizon)
		}
		opts := solveOptions(r.cfg.Solver, b.Time)
		opts.MaxMoves = b.MaxMoves
		res, err = solver.Solve(ctx, p, opts)
	}
	if err != nil {
		return nil, err
	}
	align := Align
	if b.Fresh {
		align = func(prev, next *placement.Plan) (*placement.Plan, error) { return Relabel(prev, next, c) }
	}
	next, err := align(s.current, res.Plan)
	if err != nil {
		return nil, err
	}
	next.Strategy, next.Meta = "rebalance", nil
	prop := &Proposal{Steps: s.n, Status: res.Status, SolveTime: res.SolveTime,
		TimedOut: res.Status == solver.StatusTimeLimit || res.Status == solver.StatusStopped}
	curCost, err := r.windowCost(s, s.current)
	if err != nil {
		return nil, err
	}
	newCost, err := r.windowCost(s, next)
	if err != nil {
		return nil, err
	}
	mig, err := migrationPerLayer(s.current, next, c, m)
	if err != nil {
		return nil, err
	}
	if newCost, err = r.decideLayers(s, b, next, mig, curCost, newCost, prop); err != nil {
		return nil, err
	}
	prop.CurrentRemote, prop.Remote, prop.CurrentLayerSec, prop.LayerSec = math.NaN(), math.NaN(), math.NaN(), math.NaN()
	return prop, r.summarize(prop, s, next, mig, curCost, newCost)
}

// summarize sets prop's plan, moves, migration, modeled step times and
// balance from next and its per-layer migration and step costs.
func (r *Rebalancer) summarize(prop *Proposal, s snapshot, next *placement.Plan, mig, curCost, newCost []float64) error {
	prop.Plan = next
	var err error
	if prop.Moved, err = ChangedSlots(s.current, next); err != nil {
		return err
	}
	for l, n := range prop.Moved {
		prop.MovedSlots += n
		prop.MigrationSec += mig[l]
		prop.CurrentStepSec += curCost[l]
		prop.StepSec += newCost[l]
		prop.CurrentPAR += LayerPAR(s.current.Layers[l], next.GPUs, s.load[l]) / float64(len(next.Layers))
		prop.PAR += LayerPAR(next.Layers[l], next.GPUs, s.load[l]) / float64(len(next.Layers))
	}
	prop.GainSec = prop.CurrentStepSec - prop.StepSec
	prop.BytesMoved = int64(prop.MovedSlots) * r.cfg.Model.ExpertBytes()
	return nil
}

// freshEpsilon is the least gain in busiest/mean per changed slot that a
// fresh plan's local search accepts: with any positive charge the search
// makes only strict improvements and stops on its own (work-bounded),
// where with none it would also make balance-neutral moves until the time
// limit.
const freshEpsilon = 1e-6

// freshPlan places from scratch on load with the slots per GPU given:
// EPLB's plan of load (global policy) improved by the joint strategy's
// swap and copy-count search (solver.Problem.Current) until no move gains
// freshEpsilon, which ends on its own and is reproducible. Where EPLB does
// not fit (GPUs with different slot counts) it is the joint strategy's own
// replicated solve, bounded by the time limit only.
func freshPlan(ctx context.Context, load [][]float64, c costmodel.Cluster, m costmodel.Model, d placement.Dispatch, slots []int, so solver.Options, limit time.Duration) (*solver.Result, error) {
	st := routing.StatsFromLoad(load, m.TopK)
	p := solver.Problem{Stats: st, Cluster: c, Model: m, Dispatch: d, SlotsPerGPU: slots}
	opts := solveOptions(so, limit)
	total := 0
	for _, n := range slots {
		total += n
	}
	if !slices.ContainsFunc(slots, func(n int) bool { return n != slots[0] }) && total >= m.Experts {
		start, err := baseline.EPLB(st, c.GPUs(), baseline.EPLBOptions{RedundantSlots: total - m.Experts, FixDuplicates: true})
		if err == nil {
			p.Current, p.MoveCost = start, freshEpsilon
		}
	}
	return solver.Solve(ctx, p, opts)
}

// solveOptions are so for the joint strategy with the time limit of a
// budget (DefaultTime when 0).
func solveOptions(so solver.Options, limit time.Duration) solver.Options {
	so.Strategy = solver.StrategyJoint
	so.TimeLimit = limit
	if limit == 0 {
		so.TimeLimit = DefaultTime
	}
	so.MaxMoves = 0
	return so
}

func cloneLayer(lp placement.LayerPlan) placement.LayerPlan {
	return placement.LayerPlan{SlotExpert: slices.Clone(lp.SlotExpert), SlotGPU: slices.Clone(lp.SlotGPU), SlotShare: slices.Clone(lp.SlotShare)}
}

// moveCost is what one changed slot costs in units of a layer's
// busiest/mean load (solver.Problem.MoveCost): its weights' time over the
// slowest link, over the compute time that one unit of busiest/mean is
// worth per step (the mean GPU's tokens × perTok) times the horizon.
func moveCost(load [][]float64, weight float64, c costmodel.Cluster, m costmodel.Model, perTok float64, horizon int) float64 {
	link := c.NVLinkBytesPerSec()
	if c.Nodes > 1 && c.NICBytesPerSec() > 0 {
		link = c.NICBytesPerSec()
	}
	slotSec := float64(m.ExpertBytes()) / link
	mean := 0.0
	for _, row := range load {
		for _, v := range row {
			mean += v
		}
	}
	mean /= weight * float64(len(load)) * float64(c.GPUs())
	if mean <= 0 {
		return math.Inf(1)
	}
	return slotSec / (mean * perTok * float64(horizon))
}
