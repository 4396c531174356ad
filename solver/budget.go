package solver

import (
	"time"

	"github.com/moetuner/moetuner/solver/internal/affinity"
	"github.com/moetuner/moetuner/solver/internal/onenode"
	"github.com/moetuner/moetuner/solver/internal/replica"
)

// budget is every split of a solve's time, in one place. Shares are of the
// solve's limit (the smaller of Options.TimeLimit and the context's
// deadline), measured from its start. Each entry says why it is what it is
// and on which instances it was chosen; the instances are those of
// BENCHMARKS.md: Mixtral-8x7B counts on 4 GPUs, FLAME-MoE-290M per-token
// on 8 GPUs (one node) and on 2 nodes × 4, SGLang's DeepSeek-V3 prefill
// counts on 4 nodes × 8 with 32 redundant slots.
type budget struct {
	// JointILP is the joint ILP's share in the home flow; the exact-cost
	// swap polish gets the rest. The polish converges in well under the
	// remaining fifth on FLAME (2 nodes) and Mixtral, while HiGHS's
	// incumbent still improves late in the ILP's share.
	JointILP float64
	// ChainILP is the monolithic chain-flow ILP's share; the layer-by-layer
	// descent (exact small ILPs) runs to ChainDescentEnd, the polish to the
	// end. The descent finds the transitions the monolithic ILP's pair
	// budget leaves out (FLAME, 2 nodes × 4, chain flow).
	ChainILP, ChainDescentEnd float64
	// DescentStep is one descent step's share of the limit per layer (the
	// limit over DescentSteps·L), at least DescentStepMin; a step starts
	// only with DescentMinLeft left.
	DescentSteps                   int
	DescentStepMin, DescentMinLeft time.Duration

	// One node, home flow, per-token patterns: the layer cost depends only
	// on the busiest GPU's routed and distinct tokens, which annealing
	// optimises directly and column generation bounds, so the ILP (a weak
	// pairwise proxy there) gets OneNodeILP, the polish runs to
	// OneNodePolishEnd, the annealing to OneNodeAnnealEnd and the bound the
	// rest. Chosen on FLAME (8 GPUs): annealing to 20 % or 35 % was within
	// noise of 25 %; the certified gap was 0.65–0.76 % at 10 s.
	OneNodeILP, OneNodePolishEnd, OneNodeAnnealEnd float64
	// ReAnnealLeft: when the bound converges with more than this share of
	// the limit left, the rest goes to another annealing.
	ReAnnealLeft float64
	// AnnealMovesPerExpert caps each annealing restart at this many moves
	// per expert (a work cap, so short limits do not stop early and long
	// ones do not anneal forever); with 20000 a 60 s FLAME run stopped its
	// annealing early, without a cap the bound's brute-force test took 40×
	// longer.
	AnnealMovesPerExpert int
	// AnnealRestarts are the first annealing's restarts (the plan's own
	// partition, then random balanced ones); a re-annealing has one.
	AnnealRestarts int
	// Bound holds the one-node bound's own rules.
	Bound onenode.Budget

	// PaperStage1 is the paper's ILP 1 share (its layers in parallel); ILP
	// 2 gets the rest (its warm start when too little is left to load it).
	PaperStage1 float64

	// ReplicaLayers is the replicated path's share for its layers when an
	// exact-cost polish follows (per-token statistics); the polish gets
	// the rest. The layers' packing and swaps converge in milliseconds on
	// DeepSeek-V3 (58 layers, 288 slots) and in seconds with expert groups.
	ReplicaLayers float64
	// ReplicaPairProbe is one probe of the exact pair method's share of a
	// work budget (each probe being a HiGHS solve).
	ReplicaPairProbe float64
	// Replica holds the replicated path's other rules (node spreading
	// grace, the exact pair method's probes).
	Replica replica.Options

	// AffinityStart is the share of the limit for the balanced plan the
	// affinity search starts from (the replicated path's packing, which
	// converges in milliseconds on DeepSeek-V3's 58 layers × 288 slots).
	AffinityStart float64
	// AffinityBound is the share for the lower bound on remote-node
	// copies that the affinity search reports: 58 DeepSeek-V3 layers take
	// about 1.5 s of CPU without the spectral shift steps, a tenth of a
	// minute's solve with room for a loaded machine; a solve whose share
	// is too short bounds fewer layers. When every layer is bounded with
	// twice that pass's time left in the share, a second pass with the
	// shift steps (a third more work) tightens each layer's bound: 2.7 %
	// on 4 × 8 home, 8.8 % on the 4 × 8 chain at a 60 s limit.
	AffinityBound float64
	// AffinityCappedPasses: with a cap (home flow) the bound's pass over
	// the plans that meet it runs alone when the bound's share holds this
	// many first passes (it takes about three times a first pass, with
	// the shift steps about six: 29, 91 and 165 ms a layer on the 32k
	// trace, 4 × 8, 32 slots, static dispatch, one core); else it runs
	// after the steps pass, in what is left.
	AffinityCappedPasses float64
	// AffinityStepRounds: without the capped pass alone, the pass with
	// the spectral shift steps (a third more work than the first) runs
	// when the share left holds this many rounds of layers at the first
	// pass's time.
	AffinityStepRounds float64
	// Affinity splits each layer's share among the search's phases: the
	// node-level proxy annealing, the exact node-level swaps, balancing
	// within nodes, and the exact annealing (the rest). Chosen on the
	// DeepSeek-V3-shaped per-token trace (32,768 tokens, 4 nodes × 8,
	// 32 redundant slots, static dispatch, 60 s): the proxy converges in
	// about a third of a second per layer; balancing within nodes from the
	// largest-first packing needs about a tenth of a second.
	Affinity affinity.Shares

	// NodeWork is what one branch-and-bound node counts under a work
	// budget (Options.Effort), in scored moves: on FLAME and Mixtral a
	// node of the joint ILP takes about as long as 1000 exact swap deltas.
	NodeWork int64
	// BoundTimeFactor: under a work budget the one-node bound (which does
	// not change the plan) runs for this many times what the work before
	// it took, the ratio of its time share to theirs.
	BoundTimeFactor float64
	// DescentRounds caps the chain descent's rounds under a work budget.
	DescentRounds int
	// EffortMaxCols: under a work budget, ILPs with more columns are not
	// solved (the phase keeps its warm start): HiGHS's node limit does not
	// bound the root node, which on FLAME's per-layer joint ILP (2,600
	// columns) ran for minutes with 3 nodes and 1000 simplex iterations
	// allowed, while Mixtral's (40 columns) and the chain descent's steps
	// (520) finish in milliseconds.
	EffortMaxCols int

	// MinLayer is the least time any one layer's sub-problem gets, so a
	// layer started near the deadline still runs its cheap first steps.
	MinLayer time.Duration
	// Watchdog is how far past the limit the backstop context of a solve
	// ends (as a share of the limit, plus WatchdogFixed): HiGHS does not
	// always honour its own time limit. Half of the 10 % a command may
	// run past its limit, so that scoring and writing fit in the rest.
	Watchdog      float64
	WatchdogFixed time.Duration
}

var defaultBudget = budget{
	JointILP:        0.8,
	ChainILP:        0.5,
	ChainDescentEnd: 0.8,
	DescentSteps:    4,
	DescentStepMin:  200 * time.Millisecond,
	DescentMinLeft:  100 * time.Millisecond,

	OneNodeILP:           0.02,
	OneNodePolishEnd:     0.03,
	OneNodeAnnealEnd:     0.25,
	ReAnnealLeft:         0.05,
	AnnealMovesPerExpert: 100000,
	AnnealRestarts:       2,
	Bound: onenode.Budget{
		MinLayer: 50 * time.Millisecond,
		// The proofs at the end of a layer's search take about a sixth
		// of its time on FLAME.
		Reserve: 0.15,
		// Under 4 s a layer cannot afford the probes nearest the LP bound
		// (each costs an exhaustive search); stopping within 0.5 % of the
		// plan gave the best 10 s certificates on FLAME.
		Short:    4 * time.Second,
		ShortTol: 0.005,
		// A load-capped second pass needs a tenth of the layer's time to
		// reach its own convergence on FLAME.
		CapShare: 0.1,
	},

	PaperStage1: 0.5,

	ReplicaLayers:    0.8,
	ReplicaPairProbe: 0.001,
	Replica: replica.Options{
		// Node spreading under local dispatch permutes whole GPUs; it
		// needs well under a second on DeepSeek-V3 and may finish after
		// its layer's share.
		SpreadGrace: time.Second,
		// A HiGHS feasibility probe of the pair method needs about half a
		// second to prove infeasibility on 32-GPU layers.
		PairProbeMin:   500 * time.Millisecond,
		PairProbeShare: 0.25,
		PairProofShare: 0.5,
	},

	AffinityStart:        0.05,
	AffinityBound:        0.1,
	AffinityCappedPasses: 6,
	AffinityStepRounds:   2,
	Affinity:             affinity.Shares{Proxy: 0.4, Nodes: 0.25, GPUs: 0.15},

	NodeWork:        1000,
	BoundTimeFactor: 3,
	DescentRounds:   4,
	EffortMaxCols:   1000,

	MinLayer:      50 * time.Millisecond,
	Watchdog:      0.05,
	WatchdogFixed: 50 * time.Millisecond,
}

// work returns the share of a work budget of w units (0: none, time mode).
func work(w int64, share float64) int64 {
	if w <= 0 {
		return 0
	}
	return max(1, int64(share*float64(w)))
}

// nodes returns the branch-and-bound nodes of share of a work budget of w
// units (0: none, time mode).
func (b budget) nodes(w int64, share float64) int {
	if w <= 0 {
		return 0
	}
	return int(max(1, work(w, share)/b.NodeWork))
}

// at returns the instant share·limit after start.
func at(start time.Time, limit time.Duration, share float64) time.Time {
	return start.Add(time.Duration(share * float64(limit)))
}

// of returns share·limit.
func of(limit time.Duration, share float64) time.Duration {
	return time.Duration(share * float64(limit))
}

// imbalanceEvals is how many evaluations of the plan the repair behind
// Problem.MaxImbalance is given at the end of a solve (0 without a cap):
// building its evaluator (up to two), scoring the repaired plan (one),
// and one step on a quarter of the layers, a step pricing one swap
// towards each node at about a layer's part of an evaluation each
// (Nodes/4 evaluations in all). On the 32k DeepSeek-V3 trace, 4 × 8 GPUs,
// the search left 13 of 58 layers above a cap of 1.004 (home flow, 32
// redundant slots, static dispatch) and 4 above 1.2 (chain flow). Layers
// the time does not reach take the balance-first baseline's layer
// (capfix.Cap), which costs a layer's part of an evaluation.
func imbalanceEvals(p Problem) float64 {
	if p.MaxImbalance <= 0 {
		return 0
	}
	return 3 + float64(p.Cluster.Nodes)/4
}

// affinityAfter is, in evaluations of the plan, what follows the affinity
// search within the limit: evaluating its plan (the facade reuses that
// report); the layers' last steps that no deadline cuts (building a
// layer's counters, a few passes over its tokens, where one evaluation
// passes once over every layer's: about 8/L of an evaluation for L
// layers on two cores); the repair to Problem.MaxImbalance when there is
// a cap; and under an optimal split the optimal splits' flows (about one
// evaluation) and the plan's evaluation after them.
func (b budget) affinityAfter(p Problem) float64 {
	after := 1 + 8/float64(max(p.Stats.Layers, 1)) + imbalanceEvals(p)
	if p.Split == SplitOptimal {
		after += 2
	}
	return after
}
