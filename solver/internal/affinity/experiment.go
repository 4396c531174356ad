package affinity

import (
	"context"
	"errors"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// This file holds the entry points of the experiments harness
// (solver/internal/experiments) into the package's internals. The
// solver does not call them.

// NICPorts returns the NIC out and in bytes per GPU of one phase's
// dispatch D (bytes [src][dst], nodes of gpusPerNode GPUs) and the mean
// port's bytes, as the chain search counts the ports.
func NICPorts(D [][]float64, gpusPerNode int) (out, in []float64, mean float64) {
	return nicPorts(D, gpusPerNode)
}

// ChainCeiling anneals p.Start (one copy per expert) on the exact chain
// counters for the cross-node transitions alone (the time's weight made
// negligible), every layer's compute tail held to the start's, or, with
// tailRatio > 0, to tailRatio times the mean GPU's tokens where that is
// above the start's tail. It returns the best plan's copies and the swaps
// scored, or an error where the exact counters do not apply (replicas,
// more than 64 GPUs, fewer than two layers or nodes, no per-token
// paths). It asks how far the transitions could fall at a balance: a
// heuristic, not a bound.
func ChainCeiling(ctx context.Context, p Problem, tailRatio float64, lim task.Limit) ([][][]placement.GPU, int64, error) {
	L := p.Stats.Layers
	if p.Start == nil || len(p.Start.Layers) != L {
		return nil, 0, errors.New("affinity: no start plan for every layer")
	}
	copies := make([][][]placement.GPU, L)
	tcap := make([]float64, L)
	for l := range copies {
		copies[l] = p.Start.ExpertGPUs(l)
	}
	cx := newChainExact(p, copies, tcap)
	if cx == nil {
		return nil, 0, errors.New("affinity: the exact chain counters do not apply: they need one copy per expert, at most 64 GPUs, two layers and two nodes or more, and per-token paths")
	}
	for l := range tcap {
		tcap[l] = cx.tail(l, -1, -1, 0) * (1 + 1e-12)
		if tailRatio > 0 {
			sum, sl := 0.0, 0.0
			for g, x := range cx.gtok[l] {
				sum += x
				sl += cx.slots[g]
			}
			G := float64(len(cx.gtok[l]))
			tcap[l] = max(tcap[l], (tailRatio*sum/G*cx.terms.PerTokenSec+sl/G*cx.terms.PerExpertSec)/cx.speed[0])
		}
	}
	cx.tie = 1e6 // the copies alone
	scs := []*schedule{newSchedule(ctx, lim, 1), newSchedule(ctx, lim, 1)}
	gpu, n := cx.anneal(1, scs, len(scs), func(float64) bool { return true })
	return gpuCopies(gpu), n, nil
}
