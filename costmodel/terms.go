package costmodel

import (
	"math"

	"github.com/moetuner/moetuner/placement"
)

// Terms are a scenario's cost coefficients and the one place where the
// formulas that turn them into seconds are written: the compute rule, the
// layer-time rule and the balance measure. Evaluate and every search's
// specialised counters call these methods instead of restating them, so a
// change to a rule changes every search at once.
type Terms struct {
	// PerTokenSec and PerExpertSec are Cluster.Coefficients(Model): the
	// time per routed token per expert and per expert held, at speed 1.
	PerTokenSec, PerExpertSec float64
	// Speed is every GPU's relative speed (Cluster.SpeedOf).
	Speed []float64
	// Sigma is the compute slowdown under overlap (Cluster.SigmaValue).
	Sigma float64
	// Chunks is the number of pipeline chunks of the overlapped mode (≥ 1).
	Chunks float64
	// Mode picks LayerSec's rule.
	Mode Mode
}

// NewTerms returns the terms of cluster c and model m in mode with chunks
// pipeline chunks (0: DefaultChunks).
func NewTerms(c Cluster, m Model, mode Mode, chunks int) Terms {
	if chunks <= 0 {
		chunks = DefaultChunks
	}
	t := Terms{Sigma: c.SigmaValue(), Chunks: float64(chunks), Mode: mode, Speed: make([]float64, c.GPUs())}
	t.PerTokenSec, t.PerExpertSec = c.Coefficients(m)
	for g := range t.Speed {
		t.Speed[g] = c.SpeedOf(g)
	}
	return t
}

// Terms returns s's terms (its Mode and Chunks).
func (s Scenario) Terms() Terms { return NewTerms(s.Cluster, s.Model, s.Mode, s.Chunks) }

// ComputeAt is the expert compute time, in seconds, of a GPU of relative
// speed speed that holds slots experts and computes tokens routed tokens:
// (tokens·PerTokenSec + slots·PerExpertSec)/speed. With speed the sum of a
// group's speeds and the group's sums it is the group's mean GPU.
func (t *Terms) ComputeAt(tokens, slots, speed float64) float64 {
	return (tokens*t.PerTokenSec + slots*t.PerExpertSec) / speed
}

// Compute is ComputeAt for GPU g at its own speed.
func (t *Terms) Compute(g int, tokens, slots float64) float64 {
	return t.ComputeAt(tokens, slots, t.Speed[g])
}

// Times returns a layer's sequential, ideal and overlapped times from its
// compute tail and the seconds of its dispatch and combine phases:
//
//	Sequential = disp + tail + comb
//	Ideal      = max(tail, disp+comb)
//	Overlapped = max(tail·(1+Sigma), disp+comb) + (disp+comb)/Chunks
//
// A caller that knows only the phases' sum passes it as disp and 0 as comb.
func (t *Terms) Times(tail, disp, comb float64) (seq, ideal, over float64) {
	comm := disp + comb
	seq = disp + tail + comb
	ideal = max(tail, comm)
	over = max(tail*(1+t.Sigma), comm) + comm/t.Chunks
	return seq, ideal, over
}

// LayerSec is the layer time of t.Mode (Times' sequential or overlapped).
func (t *Terms) LayerSec(tail, disp, comb float64) float64 {
	if t.Mode == Overlapped {
		comm := disp + comb
		return max(tail*(1+t.Sigma), comm) + comm/t.Chunks
	}
	return disp + tail + comb
}

// Balance is moetuner's one balance measure: the busiest GPU's routed
// tokens per unit of speed over the mean per unit of speed,
//
//	max_g tokens[g]/speed[g]  ÷  Σ tokens / Σ speed,
//
// so that a mixed-speed cluster loaded in proportion to its speeds reads 1.
// A nil speed means every GPU has speed 1 (busiest/mean). It is 1 when
// there are no tokens. Problem.MaxImbalance caps it, LayerReport.Balance
// reports it.
func Balance(tokens, speed []float64) float64 {
	b, _ := BalanceAt(tokens, speed)
	return b
}

// BalanceAt is Balance and the busiest GPU (the first of equals).
func BalanceAt(tokens, speed []float64) (balance float64, busiest int) {
	var sum, ssum, peak float64
	for g, x := range tokens {
		sp := speedAt(speed, g)
		sum += x
		ssum += sp
		if v := x / sp; v > peak {
			peak, busiest = v, g
		}
	}
	if sum <= 0 {
		return 1, busiest
	}
	return peak / (sum / ssum), busiest
}

func speedAt(speed []float64, g int) float64 {
	if speed == nil {
		return 1
	}
	return speed[g]
}

// CapTol is the relative slack within which a balance counts as meeting a
// cap: the rounding of the token sums.
const CapTol = 1e-9

// Cap is the balance cap every search keeps to: no layer's Balance above
// Max (0: no cap).
type Cap struct {
	Max float64
}

// On reports whether c caps anything.
func (c Cap) On() bool { return c.Max > 0 }

// Holds reports whether a layer with these tokens per GPU meets the cap
// (always without one).
func (c Cap) Holds(tokens, speed []float64) bool {
	return !c.On() || Balance(tokens, speed) <= c.Max*(1+CapTol)
}

// Excess is the cap's penalty: how many tokens per unit of speed the
// busiest GPU holds above Max times the mean per unit of speed, 0 within
// the cap (or without one). With group > 1 the GPUs are taken in groups of
// group consecutive GPUs (a node) and a group's tokens over its speeds
// stand for its GPUs: a relaxation for searches that place on nodes first.
func (c Cap) Excess(tokens, speed []float64, group int) float64 {
	if !c.On() {
		return 0
	}
	var sum, ssum, peak float64
	for g, x := range tokens {
		sum += x
		ssum += speedAt(speed, g)
	}
	if group > 1 {
		for b := 0; b+group <= len(tokens); b += group {
			var x, sp float64
			for g := b; g < b+group; g++ {
				x += tokens[g]
				sp += speedAt(speed, g)
			}
			peak = math.Max(peak, x/sp)
		}
	} else {
		for g, x := range tokens {
			peak = math.Max(peak, x/speedAt(speed, g))
		}
	}
	if ssum <= 0 {
		return 0
	}
	return math.Max(0, peak-c.Max*(1+CapTol)*sum/ssum)
}

// MoveBudget is the move budget every search of a re-plan keeps to, for
// one layer: against the running plan's layer, at most Max changed slots
// (0: no bound), each charged SlotSec in the units of the search's
// objective (seconds for the affinity search, busiest/mean for the replica
// packer). A plan changes a slot for every copy it puts on a GPU where the
// running plan has no copy of that expert (as placement.ChangedSlots
// counts). The zero value has no bound and charges nothing (and no
// running plan: Off and Changed need NewMoveBudget's).
type MoveBudget struct {
	Max     int
	SlotSec float64
	run     []bool // run[g·E+e]: the running plan has e on g
	experts int
}

// NewMoveBudget is the budget of one layer against running (that layer of
// the running plan, G GPUs, E experts), with at most maxMoves changed
// slots (0: no bound), each charged slotSec.
func NewMoveBudget(running placement.LayerPlan, G, E, maxMoves int, slotSec float64) *MoveBudget {
	b := &MoveBudget{Max: maxMoves, SlotSec: slotSec, run: make([]bool, G*E), experts: E}
	for i, e := range running.SlotExpert {
		if i < len(running.SlotGPU) {
			if g := int(running.SlotGPU[i]); g >= 0 && g < G && e >= 0 && int(e) < E {
				b.run[g*E+int(e)] = true
			}
		}
	}
	return b
}

// Off is 1 when the running plan has no copy of expert e on GPU g, else 0:
// what putting a copy of e on g adds to the changed slots.
func (b *MoveBudget) Off(g, e int) int {
	if b.run[g*b.experts+e] {
		return 0
	}
	return 1
}

// SwapChanged is how many more slots differ from the running plan after
// expert e (on GPU a) and expert f (on GPU c) trade GPUs.
func (b *MoveBudget) SwapChanged(a, e, c, f int) int {
	return b.Off(c, e) + b.Off(a, f) - b.Off(a, e) - b.Off(c, f)
}

// Allows reports whether changed slots are within the budget.
func (b *MoveBudget) Allows(changed int) bool { return b.Max <= 0 || changed <= b.Max }

// Left is how many more slots may change once changed have: −1 when the
// budget has no bound, else max(Max − changed, 0).
func (b *MoveBudget) Left(changed int) int {
	if b.Max <= 0 {
		return -1
	}
	return max(b.Max-changed, 0)
}

// Changed counts the slots of a layer whose copies are copies (copies[e]:
// the GPU of every slot of expert e) that differ from the running plan:
// Σ Off over the slots.
func (b *MoveBudget) Changed(copies [][]placement.GPU) int {
	n := 0
	for e, gs := range copies {
		for _, g := range gs {
			n += b.Off(int(g), e)
		}
	}
	return n
}

// Charge is what changed slots cost, in seconds.
func (b *MoveBudget) Charge(changed int) float64 { return b.SlotSec * float64(changed) }

// SlotSec is what one changed slot of a layer with these expert loads
// costs under moveCost (in units of the layer's mean GPU compute), in
// seconds: moveCost × Σ load × PerTokenSec / Σ speed.
func (t *Terms) SlotSec(moveCost float64, load []float64) float64 {
	tok, sp := 0.0, 0.0
	for _, v := range load {
		tok += v
	}
	for _, s := range t.Speed {
		sp += s
	}
	if sp <= 0 {
		return 0
	}
	return moveCost * tok * t.PerTokenSec / sp
}
