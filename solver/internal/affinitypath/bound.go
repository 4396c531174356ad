package affinitypath

import (
	"context"
	"errors"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/solver/internal/trafficbound"
)

// remoteBound bounds the remote-node copies, within its share, into res:
// the home flow's for any plan with these slots, the chain flow's for any
// plan with one copy of every expert (its bound knows no copies).
func remoteBound(ctx context.Context, p Problem, opts Options, res *Result) {
	bctx, cancel := ctx, func() {}
	if opts.Work == 0 {
		// Its share from now: the start's packing and checks before it
		// take what they take, and a deadline fixed from the solve's
		// start would leave the bound what they left.
		dl := time.Now().Add(of(opts.Limit, opts.BoundShare))
		if end := opts.Start.Add(opts.Limit - opts.Reserve); dl.After(end) {
			dl = end
		}
		bctx, cancel = context.WithDeadline(ctx, dl)
	}
	sh := trafficbound.Shape{Nodes: p.Cluster.Nodes, GPUsPerNode: p.Cluster.GPUsPerNode, SlotsPerGPU: p.Slots}
	bo := trafficbound.Options{Parallel: opts.Parallel, ShiftSteps: -1}
	bound := func(o trafficbound.Options) ([]trafficbound.Bound, error) {
		if p.Flow == costmodel.FlowHome {
			return trafficbound.HomeRemoteLayers(bctx, p.Stats, sh, p.Dispatch, o)
		}
		return trafficbound.ChainLayers(bctx, p.Stats, sh, o)
	}
	t0 := time.Now()
	bs, err := bound(bo)
	pass := time.Since(t0)
	// A layer's time in that pass: its wall time over the rounds of
	// Parallel layers it ran.
	layerTime := pass * time.Duration(max(opts.Parallel, 1)) / time.Duration(max(p.Stats.Layers, 1))
	// again bounds the layers once more with o while the share lasts
	// (a pass takes them in order); each layer keeps the larger of
	// its bounds (all hold).
	again := func(o trafficbound.Options) {
		bs2, err2 := bound(o)
		if err2 != nil && !errors.Is(err2, context.DeadlineExceeded) {
			return
		}
		for i := range min(len(bs), len(bs2)) {
			if bs2[i].Method != "" && bs2[i].Value > bs[i].Value {
				bs[i] = bs2[i]
			}
		}
	}
	// With a cap (home flow), a pass over the plans that meet it, as
	// the joint plan will: every layer's busiest GPU at most
	// MaxImbalance times the mean per unit of speed, so a node serves
	// at most its share of the speed times that. It runs with the
	// shift steps and includes the bound over every plan with them,
	// so each layer it reaches is at least what the steps pass gives;
	// but it is dearer. Measured on the 32k trace (4 × 8, 32 slots,
	// static, one core, layers 0, 20, 40): 29 ms a layer for the
	// first pass (0.92 remote nodes per token), 91 ms with the cap
	// (1.15), 165 ms with the cap and the steps (1.27). So when the
	// share holds BoundCappedPasses (six) first passes it runs alone;
	// else the steps pass
	// over every plan comes first, as without a cap, and the capped
	// pass takes what is left (a layer it does not reach keeps the
	// larger of the others), so a cap never leaves the bound below
	// the one without it.
	capOn := p.Flow == costmodel.FlowHome && p.BoundCap > 0
	dl, timed := bctx.Deadline()
	cappedFits := capOn && (opts.Work > 0 || timed && time.Until(dl) > times(opts.BoundCappedPasses, pass))
	if timed && err == nil && opts.Work == 0 && !cappedFits && time.Until(dl) > times(opts.BoundStepRounds, layerTime) {
		// Every layer is bounded, and the share holds a round of
		// layers with the spectral shift steps (a third more work),
		// BoundStepRounds (twice) over: the steps tighten each layer's
		// bound.
		bo.ShiftSteps = 0
		again(bo)
	}
	if capOn && err == nil && bctx.Err() == nil {
		bo.MaxNodeLoad = p.BoundCap * nodeSpeedPeak(p.Cluster)
		bo.ShiftSteps = 0
		again(bo)
	}
	cancel()
	// Out of its share (not cancelled): the layers bounded by then
	// still bound the plan, the others counting 0.
	if (err == nil || ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded)) && p.Stats.Tokens > 0 {
		v, n, capped := 0.0, 0, false
		for _, bd := range bs {
			if bd.Method != "" {
				v, n, capped = v+bd.Value, n+1, capped || bd.Capped
			}
		}
		if n > 0 {
			res.RemoteBound, res.Bounded = v/(p.Stats.Tokens*float64(p.Stats.Layers)), true
			res.RemoteBoundLayers = n
			if capped {
				res.RemoteBoundCap = p.BoundCap
			}
		}
	}
}

// nodeSpeedPeak is the largest node's share of the cluster's speed times
// the node count (1 on equal GPUs).
func nodeSpeedPeak(c costmodel.Cluster) float64 {
	total, peak := 0.0, 0.0
	for B := range c.Nodes {
		s := 0.0
		for i := range c.GPUsPerNode {
			s += c.SpeedOf(B*c.GPUsPerNode + i)
		}
		total += s
		peak = max(peak, s)
	}
	if total <= 0 {
		return 1
	}
	return max(1, peak*float64(c.Nodes)/total)
}

// times is f·d.
func times(f float64, d time.Duration) time.Duration {
	return time.Duration(f * float64(d))
}
