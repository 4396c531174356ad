package affinity

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// capWeight is the charge, per GPU of the cluster, for each second of
// compute the busiest GPU holds above the cap: G seconds a second, as if
// every GPU waited for the excess, well above the 1 + sigma a second of
// the busiest GPU's compute costs the layer at most, so that hardly any
// saving of NIC copies pays for it. Its exact value does not matter: 4
// instead of 1 gave the same plans within a run's spread (32k DeepSeek-V3
// trace, 8 × 8, 64 slots, cap 1.01: 4.3455 remote copies against 4.3487;
// TestSolveMeetsMaxImbalance: 29 layers within the cap against 28).
const capWeight = 1.0

// newShape prepares the sample and coefficients of p.
func newShape(p Problem) (*shape, error) {
	st, c := p.Stats, p.Cluster
	if st == nil || st.Patterns == nil {
		return nil, errors.New("affinity: the statistics have no per-token paths")
	}
	if p.Flow != costmodel.FlowHome {
		return nil, errors.New("affinity: the home flow only")
	}
	G := c.GPUs()
	if len(p.Slots) != G {
		return nil, fmt.Errorf("affinity: %d slot counts for %d GPUs", len(p.Slots), G)
	}
	sh := &shape{
		N: c.Nodes, P: c.GPUsPerNode, G: G, E: st.Experts, K: st.TopK,
		slots: p.Slots, perSource: p.PerSource(),
		copySec: p.Model.TokenBytes() / c.NICBytesPerSec(),
		nicLat:  c.NICLatency.Seconds(),
		terms:   p.Scenario.Terms(),
	}
	sh.perTok, sh.speed = sh.terms.PerTokenSec, sh.terms.Speed
	// The dispatch as the cost model counts it (vLLM's hash token by
	// token where the statistics hold their token order), so that the
	// search's loads are the ones Evaluate scores.
	split, err := p.Splitter(p.Start)
	sh.keepCounts = err == nil && p.Dispatch.Dealt()
	if err != nil {
		// No start to deal for (or one SGLang could not number): plan
		// with the closed form; the result is scored exactly all the same.
		if split, err = costmodel.NewSplitter(p.Dispatch.Closed(), nil, G, c.GPUsPerNode, placement.Layout{}); err != nil {
			return nil, err
		}
	}
	sh.split = split
	sh.ones = make([]int32, G)
	for i := range sh.ones {
		sh.ones[i] = 1
	}
	if p.MaxImbalance > 0 {
		sh.cap, sh.capW = costmodel.Cap{Max: p.MaxImbalance}, capWeight*float64(G)
	}
	if bw := c.NVLinkBytesPerSec(); bw > 0 && c.GPUsPerNode > 1 {
		sh.nvSec = p.Model.TokenBytes() / bw
		rep := p.StartReport
		if rep == nil && p.Start != nil {
			var err error
			if rep, err = p.Evaluate(p.Start); err != nil {
				return nil, err
			}
		}
		if rep != nil {
			sh.nvRatio = nvlinkRatios(rep, c)
			for _, r := range sh.nvRatio {
				sh.nv = sh.nv || r >= nvlinkShare
			}
		}
	}
	sh.T = len(st.Patterns)
	sh.src = make([]int32, sh.T)
	sh.w = make([]float64, sh.T)
	next := int32(0)
	for i, pt := range st.Patterns {
		sh.w[i] = pt.Count
		if pt.Source >= 0 && int(pt.Source) < G {
			sh.src[i] = pt.Source
			continue
		}
		sh.src[i] = next
		next = (next + 1) % int32(G)
	}
	return sh, nil
}

// buildLayer gathers layer l of the sample and its source shares.
func buildLayer(p Problem, sh *shape, l int) *layer {
	st := p.Stats
	K, G := sh.K, sh.G
	ex := make([]int16, sh.T*K)
	for i, pt := range st.Patterns {
		copy(ex[i*K:(i+1)*K], pt.Experts[l*K:(l+1)*K])
	}
	var share []float64
	if sh.perSource {
		// As the cost model: the share of each expert's sampled tokens
		// from each source, tokens without a source spread evenly.
		share = costmodel.LayerSourceShares(st, G, l)
	}
	ly := newLayer(sh, l, ex, st.Load[l], share)
	ly.bud = newBudget(p, l)
	return ly
}

// nvlinkShare is how large a share of the NIC ports' time the busiest
// NVLink port's must reach in some layer of the start before the search
// counts the NVLink ports (a counter per token and GPU). Measured on the
// 32k-token DeepSeek-V3 trace, static dispatch, 20 s, with EPLB's plan as
// the start. Where the ratio stays below it, counting the ports anyway
// only cost time and made the plan slower:
//   - 4 × 8 H100, ratio 0.26–0.29: 0.4 % slower, 100 MB more;
//   - 4 × 8 H200, ratio 0.52–0.57: 0.4 % slower;
//   - 8 × 8 PCIe-linked nodes, ratio 0.60–0.66: 1.0 % slower.
//
// On 4 × 8 PCIe-linked nodes (ratio 1.8–2.0) counting them made the plan
// 2.5 % faster. A search without the counters raised the ratio by at most
// a fifth: 0.26–0.29 became 0.28–0.31, 0.52–0.57 became 0.55–0.63, and
// 0.60–0.66 became 0.65–0.78. Below 0.8 the NVLink ports therefore stay
// short of the NICs'.
const nvlinkShare = 0.8

// nvlinkRatios returns, per layer of rep, the busiest NVLink port's time
// in the dispatch over the busiest NIC port's (+Inf with NVLink bytes and
// no NIC bytes, 0 without NVLink bytes or a dispatch matrix).
func nvlinkRatios(rep *costmodel.Report, c costmodel.Cluster) []float64 {
	G, P := c.GPUs(), c.GPUsPerNode
	nvBW, nicBW := c.NVLinkBytesPerSec(), c.NICBytesPerSec()
	ports := make([]float64, 4*G)
	out := make([]float64, len(rep.Layers))
	for l, lr := range rep.Layers {
		if len(lr.Dispatch) != G {
			continue
		}
		clear(ports)
		for s, row := range lr.Dispatch {
			for d, b := range row {
				k := 0
				if s/P != d/P {
					k = 2
				}
				ports[k*G+s] += b
				ports[(k+1)*G+d] += b
			}
		}
		nv, nic := 0.0, 0.0
		for g := 0; g < G; g++ {
			nv = max(nv, ports[g], ports[G+g])
			nic = max(nic, ports[2*G+g], ports[3*G+g])
		}
		switch {
		case nv == 0:
		case nic == 0:
			out[l] = math.Inf(1)
		default:
			out[l] = (nv / nvBW) / (nic / nicBW)
		}
	}
	return out
}

// Solve improves p.Start layer by layer (the home flow's layers are
// independent), in parallel, within opts.Limit.
func Solve(ctx context.Context, p Problem, opts Options) (*Result, error) {
	sh, err := newShape(p)
	if err != nil {
		return nil, err
	}
	L := p.Stats.Layers
	if p.Start == nil || len(p.Start.Layers) != L {
		return nil, errors.New("affinity: no start plan for every layer")
	}
	res := &Result{Copies: make([][][]placement.GPU, L), Remote: make([]float64, L), StartRemote: make([]float64, L)}
	tries := make([]int64, L)
	deadline := opts.Limit.Deadline
	// Under a cap and no move budget, SGLang's per-rank trees are repaired
	// layer after layer (repairSequential; under a budget a reroll would
	// move slots the budget does not count, and the parallel repairDealt
	// makes the same moves).
	perRank := sh.keepCounts && costmodel.DealtPerRank(p.Dispatch, p.Start)
	sequential := perRank && sh.cap.On() && !p.budgeted()
	switch {
	case opts.Limit.ByWork():
		deadline = time.Now().Add(24 * time.Hour)
	case sequential:
		// The sequential repair (repairSequential) runs on one core.
		deadline = deadline.Add(-seqRepairEvals * p.EvalTime)
	case perRank:
		// The repair (repairDealt) builds every layer's counters once
		// more, a pass over every token's experts as an evaluation is,
		// and descends on the plan's own table until the deadline.
		deadline = deadline.Add(-dealtRepairEvals * p.EvalTime)
	}
	task.Layers(L, opts.Parallel, deadline, opts.MinLayer, func(l int, limit time.Duration) {
		t0 := time.Now()
		start := p.Start.ExpertGPUs(l)
		if ctx.Err() != nil || (!opts.Limit.ByWork() && !time.Now().Before(deadline)) {
			// No time left: keep the start rather than build the layer's
			// counters (a pass over its tokens) to search for nothing.
			// Under a cap the counters are built, and a start over it gets
			// the descent bounded by work (capDescent): a plan over the
			// cap is no plan.
			res.Copies[l] = start
			res.StartRemote[l], res.Remote[l] = math.NaN(), math.NaN()
			if ctx.Err() == nil && sh.cap.On() {
				s := newStateKappa(buildLayer(p, sh, l), int32Copies(start), 0)
				if s.overCap() > 0 {
					res.StartRemote[l] = s.remote()
					tries[l] = capDescent(ctx, s, false)
					res.Copies[l], res.Remote[l] = gpuCopiesOf(s.copies()), s.remote()
				}
			}
			return
		}
		ly := buildLayer(p, sh, l)
		s := newState(ly, int32Copies(start))
		res.StartRemote[l] = s.remote()
		// The layer's time counts its counters' build, and the steps
		// after the phases are bounded by work, not by the clock: the
		// phases leave them what they took on the layers before, so that
		// the last layers are not left without time.
		lim := task.Limit{Deadline: t0.Add(limit - sh.spill()), Work: opts.Limit.Work}.Share(L)
		shares := opts.Shares
		if sh.nv && l < len(sh.nvRatio) && sh.nvRatio[l] >= 1 {
			// NVLink sets this layer's all-to-all: the phases that trade
			// only NIC copies (the proxy, the node-level swaps) give
			// their time to the ones that see the NVLink ports (on
			// PCIe-linked nodes, 32k trace, 32 slots, 20 s: 418.4 ms
			// instead of 422.6 ms).
			shares = Shares{GPUs: shares.GPUs}
		}
		s, tries[l] = improve(ctx, s, lim, shares, uint64(l), opts.Logf)
		res.Remote[l] = s.remote()
		res.Copies[l] = gpuCopiesOf(s.copies())
	})
	if sh.keepCounts && sh.inexact.Load() {
		n, ok := int64(0), false
		if sequential {
			n, ok = repairSequential(ctx, p, res, opts)
		}
		if !ok {
			n = repairDealt(ctx, p, res, opts)
		}
		res.Tries += n
	}
	for _, t := range tries {
		res.Tries += t
	}
	for l := range res.Copies {
		if res.Copies[l] == nil {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return nil, errors.New("affinity: a layer was left without a plan")
		}
	}
	return res, nil
}

// annealSweeps is how many times a hot exact annealing must be able to try
// each move of its neighbourhood: its schedule cools over four decades, and
// at each temperature the state needs about a sweep to settle.
const annealSweeps = 64

// proxyPerUnit is how many proxy moves one work unit (one exact move)
// buys: a proxy move is scored in O(1), an exact one walks the tokens of
// two experts, about a hundred times more work on production layers.
const proxyPerUnit = 128

// improve runs the phases on s within lim and returns the better of s's
// start and its result by the surrogate, with the moves tried; logf, when
// set, receives a line on what the phases did.
func improve(ctx context.Context, s *state, lim task.Limit, sh Shares, seed uint64, logf func(format string, args ...any)) (*state, int64) {
	ly := s.ly
	start := s.copies()
	// The start's cost with no NIC allowance, what the result must beat
	// (s is that start until the phases move it).
	kappa := s.kappa
	s.kappa = 0
	startCost, startOver, startRemote := s.costNow(levelGPU), s.overCap(), s.remote()
	s.kappa = kappa
	t0 := time.Now()
	phase := func(from, to float64) task.Limit {
		if lim.ByWork() {
			return task.Limit{Work: max(1, int64((to-from)*float64(lim.Work)))}
		}
		d := lim.Deadline.Sub(t0)
		return task.Limit{Deadline: t0.Add(time.Duration(to * float64(d)))}
	}
	rng := rand.New(rand.NewPCG(seed, 0x6d6f65))
	var tries int64
	// 1. Nodes on the proxy.
	a := sh.Proxy
	short := false
	if a > 0 {
		var n int64
		s, short, n = proxyPhase(ctx, s, phase(0, a), rng)
		tries += n
	}
	r0 := s.remote()
	// 2. Exact node-level swaps, unless an earlier layer's pass did not
	// fit in this phase's share of the same deadline: then the balance
	// within the nodes, which the plan needs, gets that share.
	b := a + sh.Nodes
	skip := !lim.ByWork() && ly.sh.nodesCut.Load()
	if skip {
		b = a
	}
	se := &searcher{s: s, m: phase(a, b).Meter(ctx), nodeLevel: levelNode}
	switch {
	case skip:
	case sh.refineNodes:
		refineNodes(se)
	default:
		se.nodePhase()
	}
	r1 := s.remote()
	i1 := s.imbalance(levelGPU)
	// 3. Balance within nodes.
	c := a + sh.Nodes + sh.GPUs
	if ly.bud == nil {
		se.s = repack(s)
		s = se.s
	}
	se.m = phase(b, c).Meter(ctx)
	se.gpuPhase()
	r2, i2 := s.remote(), s.imbalance(levelGPU)
	// 4. The full surrogate (the cost model's NIC time is the busiest
	// port's: no allowance left). An annealing pays off only when it can
	// try every move of the neighbourhood (a slot to any GPU) many times
	// over; below that it starts cold, refining what the phases before
	// found instead of undoing it.
	s.kappa = 0
	c2 := s.costNow(levelGPU)
	// Under a short limit the annealing leaves a third of the GPU phase's
	// share for a last balance within the nodes (5.).
	end := 1.0
	if short {
		end = 1 - sh.GPUs/3
	}
	last := phase(c, end)
	expect := float64(last.Work)
	if !lim.ByWork() {
		el := time.Since(t0)
		expect = float64(se.tries) / el.Seconds() * time.Until(last.Deadline).Seconds()
	}
	slots := 0
	for _, v := range ly.sh.slots {
		slots += v
	}
	hot := coolTo
	if expect >= annealSweeps*float64(slots*ly.sh.G) {
		hot = 1
	}
	// A cold refinement walks the plateaus of the busiest port, where
	// the other ports' copies decide where it drifts: they break its
	// ties (on the 32k trace, 4×8, 32 slots: 5.55 % fewer remote copies
	// than EPLB instead of 4.90 %, at the same layer time). A hot one
	// explores on its own and anneals the exact surrogate.
	s.tie = hot < 1
	se.anneal(rng, newSchedule(ctx, last, 1), levelGPU, hot)
	s.tie = false
	s.resync()
	// 5. Under a short limit, balance within the nodes again: where the
	// NICs set the layer's time the annealing trades the busiest GPU for
	// NIC copies freely, and a swap within a node that does not raise the
	// cost evens the GPUs out for nothing.
	if short {
		se.m = phase(end, 1).Meter(ctx)
		se.gpuPhase()
	}
	tries += se.tries
	// 6. and 7. (settle) and 8. are bounded by work, not by the clock:
	// the phases of the layers after leave them the time they take
	// (spill).
	s, n := settle(ctx, s)
	tries += n
	if logf != nil {
		logf("layer %d: %v: remote start %.0f proxy %.0f nodes %.0f (imb %.4f) gpus %.0f (imb %.4f) end %.0f (imb %.4f); cost %.4g → %.4g (after gpus %.4g, port imb %.4f)", ly.l, time.Since(t0), startRemote, r0, r1, i1, r2, i2, s.remote(), s.imbalance(levelGPU), startCost, s.costNow(levelGPU), c2, s.portImbalance())
	}
	if s.costNow(levelGPU) > startCost || startOver == 0 && s.overCap() > 0 {
		// A layer that starts within the cap stays within it.
		s = newStateKappa(ly, start, 0)
	}
	// 8. Whatever the clock left, the swaps within nodes that cost
	// nothing to price.
	tries += evenOut(ctx, s)
	if !lim.ByWork() {
		ly.sh.spilled(time.Since(lim.Deadline))
	}
	return s, tries
}

// settle runs the steps after the phases: 6. the swaps between nodes that
// even them out (evenNodes), 7. over the cap, the swaps off the busiest
// GPU that lower the cost (capDescent). It returns the state and the
// moves priced.
func settle(ctx context.Context, s *state) (*state, int64) {
	s, n := evenNodes(ctx, s)
	return s, n + capDescent(ctx, s, false)
}

// proxyPhase runs the node-level proxy on s within lim and returns the
// state of its copies, whether the limit was short (the proxy's schedule
// share under shortSchedule: the later phases then favour their
// cheapest moves) and the work it was given. Under a move budget only
// its descent runs, each swap bounded and charged by the budget (an
// annealing would spend the budget on moves it later undoes); under a
// deadline the descent's pace is timed to size the schedule's share.
func proxyPhase(ctx context.Context, s *state, lim task.Limit, rng *rand.Rand) (*state, bool, int64) {
	ly := s.ly
	if ly.sh.N < 2 {
		return s, false, 0
	}
	px := newProxy(s)
	if px.cut <= 0 {
		return s, false, 0
	}
	scale := s.remote() / px.cut
	perNodeTok, copySec := ly.sh.perTok/float64(ly.sh.P), ly.sh.copySec/float64(ly.sh.G)
	sc := newSchedule(ctx, lim, proxyPerUnit)
	short := false
	if ly.bud != nil {
		px.bud, px.changed = ly.bud, s.changed
		o := &proxyObj{scale: scale, perNodeTok: perNodeTok, copySec: copySec, capOn: px.cap.On(), nl: make([]float64, ly.sh.N)}
		var pace time.Duration
		if !lim.ByWork() {
			pace = px.pace(o)
		}
		short = px.scheduleShare(sc, pace) < shortSchedule
		px.descend(o, 1e-9*s.costNow(levelGPU), func() bool { return sc.progress() >= 1 || ctx.Err() != nil })
	} else {
		short = px.anneal(rng, sc, scale, perNodeTok, copySec)
	}
	return newStateKappa(ly, px.copies(), s.kappa), short, lim.Work
}

// repairDealt balances every layer of res as the table dealt for res's
// own plan splits it, when the search priced some copies on the table's
// closed form (shape.inexact: SGLang's node trees deal a loaded map on
// one stream per rank, and a copy moved into or out of a rank's node
// moves that rank's stream for every later deal). The layers, side by
// side, each get descendDealt: only moves that leave the table as it is,
// so each is priced exactly and none raises the layer's surrogate cost;
// the cheap swaps within nodes get repairSweeps tries of every pair of a
// node's slots whatever the clock, the exact descent after them runs
// until opts' deadline (by work alone over the cap). It returns the
// moves priced.
func repairDealt(ctx context.Context, p Problem, res *Result, opts Options) int64 {
	q := p
	q.Start = placement.FromReplicas(p.Cluster.GPUs(), res.Copies, "joint")
	sh, err := newShape(q)
	if err != nil {
		return 0
	}
	L := len(res.Copies)
	tries := make([]int64, L)
	S := slices.Max(p.Slots)
	work := int64(repairSweeps * sh.G * S * S)
	dctx := ctx
	if !opts.Limit.ByWork() {
		var cancel context.CancelFunc
		dctx, cancel = context.WithDeadline(ctx, opts.Limit.Deadline)
		defer cancel()
	}
	task.Layers(L, opts.Parallel, time.Now().Add(24*time.Hour), 0, func(l int, _ time.Duration) {
		if ctx.Err() != nil {
			return
		}
		s := newStateKappa(buildLayer(q, sh, l), int32Copies(res.Copies[l]), 0)
		before := s.costNow(levelGPU)
		s, tries[l] = descendDealt(ctx, dctx, s, work)
		if s.costNow(levelGPU) > before {
			return
		}
		res.Copies[l] = gpuCopiesOf(s.copies())
		res.Remote[l] = s.remote()
	})
	n := int64(0)
	for _, t := range tries {
		n += t
	}
	return n
}

// descendDealt is what repairDealt and repairSequential do to a layer
// on the plan's own table: the single-copy experts packed around the
// replicated ones, the cheap swaps within nodes (a work bound, whatever
// the clock), then capDescent's exact mode until dctx ends, or bounded by
// its work alone while the layer is over the cap (a plan over the cap is
// no plan). It returns the layer's state and the moves priced.
func descendDealt(ctx, dctx context.Context, s *state, work int64) (*state, int64) {
	sh := s.ly.sh
	if !sh.nv && s.ly.bud == nil {
		// Where no NVLink port is modeled, a copy's GPU within its node
		// changes only the GPUs' tokens: pack the single-copy experts
		// around the replicated ones first (not under a move budget,
		// which the packing does not count; the swaps after it do).
		if r := repackNodes(s, true); r.costNow(levelGPU) <= s.costNow(levelGPU) {
			s = r
		}
	}
	se := &searcher{s: s, m: task.ByWork(ctx, work), nodeLevel: levelNode, cheapOnly: true}
	se.gpuPhase()
	if s.overCap() > 0 {
		dctx = ctx
	}
	// The moves the plan's own table prices exactly, off the busiest GPU,
	// across nodes too.
	return s, se.tries + capDescent(dctx, s, true)
}

// dealtRepairEvals is, in evaluations of the plan, the time the layers
// leave repairDealt under SGLang's node trees: one to build every layer's
// counters again, two for the descent on the plan's own table (on 8 × 8
// GPUs, 64 slots, 32k DeepSeek-V3 trace, 60 s, the descent of every layer
// took about three evaluations' time; it stops at the deadline).
const dealtRepairEvals = 3

// seqRepairEvals is dealtRepairEvals for repairSequential, which runs on
// one core, layer after layer, and rerolls the layers the descent leaves
// over the cap. On 8 × 8 GPUs (64 slots, cap 1.02, 60 s; one evaluation
// 0.41 s) the layers' descents alone took 1.5-1.8 s; with 6 evaluations'
// time the 32k DeepSeek-V3 trace's plan ended 17 layers over the cap,
// with 12 the grouped trace's ended 2-7 over in two of three runs (the
// rerolls ran out of time), with 20 both traces' plans held it (and the
// 32k plan at 20 s).
const seqRepairEvals = 20

// repairSweeps is how many times repairDealt may try each pair of a
// node's slots per GPU of the layer.
const repairSweeps = 1

// int32Copies is a layer's copies (per expert, its GPUs) as the search
// holds them.
func int32Copies(cp [][]placement.GPU) [][]int32 {
	out := make([][]int32, len(cp))
	for e, gs := range cp {
		for _, g := range gs {
			out[e] = append(out[e], int32(g))
		}
	}
	return out
}

// gpuCopiesOf is int32Copies the other way round.
func gpuCopiesOf(cp [][]int32) [][]placement.GPU {
	out := make([][]placement.GPU, len(cp))
	for e, gs := range cp {
		for _, g := range gs {
			out[e] = append(out[e], placement.GPU(g))
		}
	}
	return out
}
