package affinity

import (
	"context"
	"slices"

	"github.com/moetuner/moetuner/solver/internal/task"
)

// evenNodesSweeps bounds evenNodes by work: that many of balanceSwap's
// full candidate lists (a node's slots each) per node. It is a guard,
// not a limit the step reaches: balanceSwap makes a swap only when it
// lowers the node-level cost, and on the 32k DeepSeek-V3 trace each
// layer stops on its own, when no candidate lowers the cost.
const evenNodesSweeps = 4

// evenNodes evens the nodes out after the phases: while balanceSwap
// finds a swap between the busiest node and another that lowers the
// node-level cost (the copies' loads against the remote copies their
// move changes, estimated for the single-copy experts from the
// counters, priced exactly), it is made; the GPUs are then evened out
// within the nodes (evenOut). It returns s or, when the GPU-level cost
// did not fall, a state of the copies it was given, and the moves
// priced. Bounded by work, not by the clock.
//
// The phases before it leave the nodes where their own moves stop: the
// annealing's random pairs rarely draw the swap that moves a few tokens
// off the busiest node, and under a short limit the node phase gets
// little time. On the 32k DeepSeek-V3 trace (4 × 8 GPUs, 32 slots,
// SGLang's table) a 5 s plan went from busiest/mean 1.006 (worst layer
// 1.013–1.016) with 2.5864–2.5869 remote copies to 1.001 (1.002) with
// 2.5753–2.5838, and a 60 s plan to 1.001 (1.002) with 2.5592.
func evenNodes(ctx context.Context, s *state) (*state, int64) {
	sh := s.ly.sh
	if sh.N < 2 || sh.P < 2 || sh.nv {
		// Without a second GPU per node evenOut cannot follow; where
		// NVLink is modeled it prices nothing from loads.
		return s, 0
	}
	before := s.costNow(levelGPU)
	start := s.copies()
	S := slices.Max(sh.slots)
	se := &searcher{s: s, m: task.ByWork(ctx, int64(evenNodesSweeps*S*sh.P*sh.N)), nodeLevel: levelNode}
	gains := se.gains(false)
	for !se.m.Done() && se.balanceSwap(gains) {
	}
	if se.applied == 0 {
		return s, se.tries
	}
	n := se.tries + evenOut(ctx, s)
	if !(s.costNow(levelGPU) < before) {
		return newStateKappa(s.ly, start, s.kappa), n
	}
	return s, n
}
