package affinity

import (
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// Problem is one placement to improve: the scenario (its Stats must hold
// per-token paths), the slots per GPU and the balanced plan to start from.
type Problem struct {
	costmodel.Scenario
	// Slots is every GPU's slot count per layer.
	Slots []int
	// Start is the plan the search starts from (one layer per MoE layer,
	// Slots[g] slots on GPU g, copies of an expert on distinct GPUs).
	Start *placement.Plan
	// StartReport, when set, is the cost model's report of Start, which
	// the chain flow's search then need not evaluate again.
	StartReport *costmodel.Report
	// EvalTime is how long one evaluation of the cost model takes on this
	// scenario (0: unknown, the chain flow then times its own evaluation
	// of Start, or skips its exact polish when it has none to time).
	EvalTime time.Duration
	// Current, when set with MaxMoves or MoveCost, is the running plan
	// (same layers and slots): the search then changes at most MaxMoves
	// slots per layer against it (0: no bound, as placement.ChangedSlots
	// counts them) and charges MoveCost per changed slot, in units of the
	// layer's busiest/mean load (one changed slot costs MoveCost times
	// the mean GPU's compute). Start must already be within MaxMoves.
	// The phases that move copies freely (the proxies, the packing and
	// balancing within nodes) do not run then.
	Current  *placement.Plan
	MaxMoves int
	MoveCost float64
	// MaxImbalance, when positive, caps every layer's busiest/mean (tokens
	// per unit of GPU speed over the mean) in the home flow: the search
	// treats it as a constraint, charging any excess far above what a
	// second of compute is worth (capWeight).
	MaxImbalance float64
}

// budgeted reports whether p bounds or prices the moves.
func (p Problem) budgeted() bool {
	return p.Current != nil && (p.MaxMoves > 0 || p.MoveCost > 0)
}

// Options bound a solve.
type Options struct {
	// Limit bounds the whole solve (shared among the layers).
	Limit    task.Limit
	Parallel int
	// MinLayer is the least time a layer gets while time is left.
	MinLayer time.Duration
	// Shares split each layer's limit among the phases.
	Shares Shares
	// Chain splits a timed SolveChain's limit among its phases; the zero
	// value means the defaults (see ChainShares).
	Chain ChainShares
	// Logf, when set, receives a line per layer of Solve on what each
	// phase did (the experiments harness prints it); nil means none.
	Logf func(format string, args ...any)
}

// Result is the improved plan's copies per layer and what the search did.
type Result struct {
	Copies [][][]placement.GPU
	// Remote and StartRemote are the sample's expected remote-node copies
	// per layer after and before the search; NaN for a layer kept at its
	// start because no time was left to search it.
	Remote, StartRemote []float64
	Tries               int64
}

// Shares split a layer's limit among the phases, in order: the proxy
// annealing (Proxy), the node-level swaps (Nodes: priced on the full
// surrogate, or the gain-cached refinement of the node cut, fm.go, with
// refineNodes), balancing within nodes (GPUs) and the exact annealing on
// the full surrogate (the rest).
type Shares struct {
	Proxy, Nodes, GPUs float64
	// refineNodes runs the gain-cached refinement of the node cut (fm.go)
	// in place of the node-level swaps priced afresh each pass. Not the
	// default yet: on the 32k DeepSeek-V3 trace (4 × 8, 32 slots, SGLang's
	// table, 60 s) it sent 2.5475 remote copies per token-layer against
	// 2.5725 at the same balance (1.011), but on TestJointBalancesAsDealt's
	// planted instance, under a work budget, it left the dealt busiest/mean
	// at 1.0224 against 1.0100: it prices the node cut alone, and the
	// balance within the nodes that follows cannot repair what it costs.
	refineNodes bool
}

// budget is one layer's move budget against the running plan, the cost
// model's.
type budget = costmodel.MoveBudget

// newBudget is layer l's budget in p against p.Current (nil when p bounds
// and prices no moves).
func newBudget(p Problem, l int) *budget {
	if !p.budgeted() {
		return nil
	}
	G, E := p.Cluster.GPUs(), p.Stats.Experts
	return costmodel.NewMoveBudget(p.Current.Layers[l], G, E, p.MaxMoves, SlotCharge(p.Scenario, p.MoveCost, l))
}

// SlotCharge is what one changed slot of layer l costs under moveCost (in
// units of the layer's busiest/mean load), in seconds: moveCost times the
// mean GPU's compute, the layer's routed tokens over the GPUs' speeds.
func SlotCharge(sc costmodel.Scenario, moveCost float64, l int) float64 {
	t := sc.Terms()
	return t.SlotSec(moveCost, sc.Stats.Load[l])
}
