package affinity

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// SolveChain improves p.Start for the chain flow: the layers are coupled
// through their transitions, so one annealing of the cross-layer proxy
// places every layer's copies on GPUs (on nodes for the receivers, on GPUs
// for the senders and the balance), stopping now and then to relabel the
// nodes so that every layer lines up with the one before (relabel); where
// the statistics have no paths, each node's copies are then balanced over
// its GPUs.
func SolveChain(ctx context.Context, p Problem, opts Options) (*Result, error) {
	st, c := p.Stats, p.Cluster
	if p.Flow != costmodel.FlowChain {
		return nil, errors.New("affinity: SolveChain is for the chain flow")
	}
	G := c.GPUs()
	if len(p.Slots) != G {
		return nil, fmt.Errorf("affinity: %d slot counts for %d GPUs", len(p.Slots), G)
	}
	L := st.Layers
	if p.Start == nil || len(p.Start.Layers) != L {
		return nil, errors.New("affinity: no start plan for every layer")
	}
	copies := make([][][]int32, L)
	for l := range copies {
		copies[l] = make([][]int32, st.Experts)
		for e, gs := range p.Start.ExpertGPUs(l) {
			for _, g := range gs {
				copies[l][e] = append(copies[l][e], int32(g))
			}
		}
	}
	res := &Result{Copies: make([][][]placement.GPU, L)}
	if !opts.Limit.ByWork() && !time.Now().Before(opts.Limit.Deadline) || ctx.Err() != nil {
		// No time left: the start, without building the proxy (a pass
		// over every token path) to search for nothing.
		for l := range res.Copies {
			res.Copies[l] = p.Start.ExpertGPUs(l)
		}
		return res, nil
	}
	rep, evalTime := p.StartReport, p.EvalTime
	if rep == nil {
		t0 := time.Now()
		var err error
		if rep, err = p.Evaluate(p.Start); err != nil {
			return nil, err
		}
		evalTime = time.Since(t0)
	}
	// The proxy needs a pass over every token path to build and many
	// sweeps to anneal; under a short limit the alignment and the
	// gain-cached refinement, whose quality arrives in the first
	// seconds, take its place.
	useProxy := !p.budgeted() && c.Nodes > 1 && (opts.Limit.ByWork() || time.Until(opts.Limit.Deadline) >= chainProxyEvals*evalTime)
	if !useProxy && !opts.Limit.ByWork() {
		res.Tries += fastChain(ctx, p, opts, copies, rep, evalTime)
	}
	keep := make([]bool, L) // layers that keep their start
	var cp *chainProxy
	var spare int64 // work the proxy cannot use, for the exact polish
	if p.budgeted() {
		// Under a move budget the proxy (which relabels whole nodes) and
		// the balancing within nodes do not run: the exact annealing and
		// the polish, which count every slot they change, get the work
		// (the polish's tenth on top of it, as always).
		spare = opts.Limit.Work - opts.Limit.Work/10
	} else if useProxy {
		w, err := transitionWeights(st)
		if err != nil {
			return nil, err
		}
		cp = newChainProxy(p, copies, w)
		startPeak := make([]float64, L)
		for l := range startPeak {
			startPeak[l] = cp.peak(l)
		}
		if cut := cp.cost(); cut > 0 {
			var tries int64
			spare, tries = proxyChain(ctx, p, opts, cp, rep, cut, startPeak, keep)
			res.Tries += tries
		}
	}
	speed := make([]float64, G)
	for g := range speed {
		speed[g] = c.SpeedOf(g)
	}
	for l := 0; l < L; l++ {
		from := copies[l]
		if cp != nil && !keep[l] {
			from = cp.copies(l)
		}
		// With the tokens' paths the annealing has arranged each node's
		// GPUs for their senders as well as for balance (capPeak bounds
		// the busiest); without, only balance tells them apart.
		bal := from
		if !p.budgeted() && (cp != nil && cp.cgOf(l) == nil || cp == nil && !senderPairs(p, l)) {
			bal = balanceNodes(from, st.Load[l], p.Slots, speed, c.GPUsPerNode)
		}
		res.Copies[l] = make([][]placement.GPU, st.Experts)
		for e, gs := range bal {
			for _, g := range gs {
				res.Copies[l][e] = append(res.Copies[l][e], placement.GPU(g))
			}
		}
	}
	spare = exactChain(ctx, p, opts, spare, res, rep, evalTime)
	polishChain(ctx, p, opts, spare, res, rep, evalTime)
	return res, nil
}

// proxyChain runs the cross-layer proxy's annealing on cp (cut its
// cost, rep the start's report), within opts.Chain's proxy share of the time left or
// the work that saturates it, then brings every layer's busiest GPU back
// to its start's (startPeak), marking in keep the layers the time left
// could not. It returns the work the proxy could not use and the moves
// tried.
func proxyChain(ctx context.Context, p Problem, opts Options, cp *chainProxy, rep *costmodel.Report, cut float64, startPeak []float64, keep []bool) (spare, tries int64) {
	c := p.Cluster
	G, L := c.GPUs(), p.Stats.Layers
	tb := p.Model.TokenBytes()
	exact := 0.0
	for _, lr := range rep.Layers {
		exact += lr.CrossNodeBytes / tb
	}
	perTok, _ := c.Coefficients(p.Model)
	lim := opts.Limit
	if !lim.ByWork() {
		lim.Deadline = time.Now().Add(time.Duration(opts.Chain.proxy() * float64(time.Until(lim.Deadline))))
	} else {
		// Past annealSweeps sweeps of its neighbourhood (every copy to
		// every GPU in every layer) the proxy's annealing has seen
		// all it can; exact moves are worth more than more of it.
		V := 0
		for l := range cp.exp {
			V += len(cp.exp[l])
		}
		need := (int64(annealSweeps)*int64(V)*int64(G) + chainProxyPerUnit - 1) / chainProxyPerUnit
		if lim.Work > need {
			spare, lim.Work = lim.Work-need, need
		}
	}
	cp.pricePorts(rep, tb/c.NICBytesPerSec())
	// Blocks of six layers or more: four searched a round.
	scs := blockSchedules(ctx, lim, opts.Parallel, L, 6, chainProxyPerUnit)
	kind := nodeKinds(p.Slots, cp.speed, c.Nodes, c.GPUsPerNode)
	// Relabels during the annealing, relabelsMax by work; by time as
	// many as fit in a tenth of its share, at what the start's took
	// (the start is the balancer's plan: its relabel moves little).
	relabels := relabelsMax
	if !lim.ByWork() {
		t0 := time.Now()
		cp.relabel(kind)
		if took := time.Since(t0); took > 0 {
			relabels = min(relabelsMax, int(time.Until(lim.Deadline)/(10*took)))
		}
	}
	moves := cp.anneal(uint64(L), scs, opts.Parallel, exact/cut, perTok, tb/c.NICBytesPerSec()/float64(G), kind, relabels)
	cp.relabel(kind)
	tries = moves / chainProxyPerUnit
	// No layer ends less balanced than it started (the start is the
	// balancer's plan): the proxy prices the cut as an average over
	// the NIC ports, which the busiest port exceeds, so its trades of
	// balance for transitions are dearer on the exact cost than it
	// sees. A layer whose busiest GPU the time left did not bring
	// back keeps its start; one where no swap lowers it further keeps
	// what the swaps reached (reverting it would give back all of its
	// gain for the little its balance lacks).
	var dl time.Time
	if !opts.Limit.ByWork() {
		dl = opts.Limit.Deadline
	}
	for l := 0; l < L; l++ {
		n, ok := cp.capPeak(l, startPeak[l], exact/cut, tb/c.NICBytesPerSec()/float64(G), dl)
		tries += int64(n)
		if !ok && !dl.IsZero() && !time.Now().Before(dl) {
			keep[l] = true
		}
	}
	return spare, tries
}

// senderPairs reports whether the chain proxy of p prices layer l's
// senders (chainProxy.cgOf is not nil): per-token paths, a layer below
// the last, and pairs within a layer that weigh (two experts a token or
// more, two nodes or more).
func senderPairs(p Problem, l int) bool {
	st, c := p.Stats, p.Cluster
	K, N := st.TopK, c.Nodes
	return st.Patterns != nil && l+1 < st.Layers && intraWeight(K, N) > 0 && sendWeight(K, c.GPUs(), N) > 0
}

// chainProxyPerUnit is how many chain proxy moves one work unit (one
// exact move) buys. Unlike the home flow's proxy (proxyPerUnit), a chain
// proxy move walks the layer's GPUs for its balance and ports, and an
// accepted one the vertices of three layers. Timed inside 20 s solves on
// the 32k-token DeepSeek-V3-shaped trace (TestExperimentChain): a proxy
// move took 1.41 µs on 4 × 8 GPUs and 3.32 µs on 8 × 8, one core; an
// exact move, as its annealing counts them (those a layer's cap rejects
// before its tokens are walked included), 44 µs and 109 µs of CPU. The
// smaller ratio, so that a work budget's proxy ends sooner than its units
// suggest, never later. At 128, `--effort 1` ran the proxy for about four
// minutes there; at 10 (its timings of an older proxy, 7.7 µs against
// 78 µs) the proxy took every unit of `--effort 2` and the exact
// annealing got none.
const chainProxyPerUnit = 31

// alignSweepsMax is the most sweeps of the alignment (chainAligner): on
// the 32k-token DeepSeek-V3-shaped trace (4 × 8 GPUs, from EPLB's plan)
// the sweeps took the cross-node transitions per token-layer from 19.73
// to 19.03, 18.65, 18.52 and 18.47, each sweep swapping about half as
// many experts as the one before; past eight the sweeps swap a few
// hundred experts each, which the searches after them do as well.
const alignSweepsMax = 8

// fastChain is the chain search under a short limit (no proxy, by
// time): the alignment's sweeps (alignSweeps), the balancing within
// nodes, the gathering of every token's experts onto fewer GPUs of their
// nodes (gatherSenders), then the gain-cached refinement for fmShare of
// what they leave less one evaluation, on copies in place, every layer's
// compute tail held to the start's (rep) and its time to where the
// alignment left it. The refinement runs only when its share holds an
// evaluation: building its counters and a layer's gains for every layer
// is a pass over every token's experts in every layer, as an evaluation
// is. It returns the swaps scored.
func fastChain(ctx context.Context, p Problem, opts Options, copies [][][]int32, rep *costmodel.Report, evalTime time.Duration) int64 {
	n, ag := alignSweeps(ctx, p, opts, copies, evalTime)
	if n > 0 {
		// The alignment holds every GPU to the layer's busiest; within
		// each node its experts can then be balanced (the nodes' tokens
		// and transitions stay, the senders move little). On the 32k
		// trace this took the mean busiest/mean from 1.0670 to 1.0599
		// and the time 0.4405 s to 0.4370 s, the transitions 18.466 to
		// 18.479, in a tenth of a second.
		speed := make([]float64, p.Cluster.GPUs())
		for g := range speed {
			speed[g] = p.Cluster.SpeedOf(g)
		}
		for l := range copies {
			copies[l] = balanceNodes(copies[l], p.Stats.Load[l], p.Slots, speed, p.Cluster.GPUsPerNode)
		}
		// ag holds copies (the same outer slice) and the nodes, which
		// the balancing kept.
		n += ag.gatherSenders(ctx, opts.Limit.Deadline, gatherPassesMax)
	}
	startTail := make([]float64, len(copies))
	for l := range startTail {
		startTail[l] = rep.Layers[l].ComputeTail.Seconds()
	}
	share := time.Duration(fmShare * float64(time.Until(opts.Limit.Deadline)-evalTime))
	if share < evalTime {
		return n
	}
	return n + fmChain(ctx, p, opts, copies, startTail, task.Limit{Deadline: time.Now().Add(share)})
}

// alignSweeps runs the alignment's sweeps on copies (in place) while they
// swap something, within alignSweepsMax, and while opts's deadline
// leaves another sweep as long as the last (the caller's scoring is
// outside the deadline): they gain more a second than the searches after
// them. Once a sweep swaps under a quarter of what the first swapped
// (gatherFrom), the deadline must also leave a pass of the gathering
// (gatherSweeps sweeps). The first sweep runs when half an evaluation
// (evalTime) is left: a sweep, a pass over every token's experts in
// three layers for each layer, took 0.33 s of CPU where an evaluation
// took 0.7 s (32k-token DeepSeek-V3-shaped trace, 4 × 8 GPUs). Under a
// move budget it does nothing: its sweeps move most experts of a layer.
// It returns the swaps made and the aligner, which holds copies (nil
// where it does not apply).
func alignSweeps(ctx context.Context, p Problem, opts Options, copies [][][]int32, evalTime time.Duration) (int64, *chainAligner) {
	if p.budgeted() || time.Until(opts.Limit.Deadline) < evalTime/2 {
		return 0, nil
	}
	ag := newChainAligner(p, copies, opts.Parallel)
	if ag == nil {
		return 0, nil
	}
	var swaps int64
	first := 0
	for sw := range alignSweepsMax {
		if ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		n := ag.sweep(sw)
		swaps += int64(n)
		if sw == 0 {
			first = n
		}
		need := time.Since(t0)
		if float64(n) < gatherFrom*float64(first) {
			need = time.Duration((1 + gatherSweeps) * float64(need))
		}
		if n == 0 || time.Until(opts.Limit.Deadline) < need {
			break
		}
	}
	return swaps, ag
}

// gatherFrom and gatherSweeps set when the alignment's sweeps leave time
// for a pass of the gathering (gatherSenders): from the first sweep that
// swaps under gatherFrom of what the first swapped, and gatherSweeps
// sweeps' time. On the 32k-token DeepSeek-V3-shaped trace (4 × 8 GPUs,
// 5 s) a sweep took 0.2–0.33 s and a pass 0.9–1.1 s; the sweeps swapped
// 12215, 6828, 3585, 2142, 1430 and 1151 experts, and their fifth to
// seventh took the cross-node transitions per token-layer from 18.40 to
// 18.39, where a pass after two sweeps took them to 18.34, after three
// to 18.21, after four to 18.15 and after five to 18.14. On 8 × 8 GPUs
// (sweeps 0.28–0.4 s swapping 16123, 9410, 4811 and 3161, a pass 1.1 s)
// a pass after two sweeps sent 29.64 copies at 497.2 ms modeled, after
// four 29.35–29.48 at 493.4–493.6 ms, five sweeps and no pass 29.57 at
// 493.1 ms: sweeps that still swap many are worth more than the pass.
const (
	gatherFrom   = 0.25
	gatherSweeps = 3
)

// gatherPassesMax is the most passes of the gathering.
const gatherPassesMax = 4

// fmShare is the gain-cached refinement's share of what the alignment
// leaves of the limit, less an evaluation; the exact annealing and the
// polish get the rest. After the alignment it finds little: on the
// 32k-token DeepSeek-V3-shaped trace (4 × 8 GPUs) it took the aligned
// plan's cross-node transitions per token-layer from 18.756 to 18.751 in
// 3.3 s, and from EPLB's plan alone from 19.73 to 19.58 in 5 s: the
// single swaps it ranks are mostly refused by the compute tail's cap.
const fmShare = 0.1

// chainProxyEvals is the least time left, in evaluations of the start,
// for which the proxy is built and annealed (by time; by work it always
// is): building it is a pass over every token path and the E² pairs of
// every layer, which took about one evaluation (2.5 s against 2.5 s on
// the 32k-token DeepSeek-V3-shaped trace, 4 × 8 GPUs, a loaded 2-core
// machine, an evaluation there 1.4 s); its annealing then took the
// cross-node bytes 0.07 % lower at a 3 s limit, 4.7 % at 10 s, 6.6 % at
// 20 s and 7.0 % at 45 s, where the alignment that takes its place under a
// shorter limit reaches 6.4 % at 5 s and stays there (6.4 % at 30 s on
// half the machine). The two cross at about 15 s there, a dozen
// evaluations.
const chainProxyEvals = 12

// relabelsMax is how many times the chain's annealing stops to relabel
// the nodes (chainProxy.relabel), at even steps of its progress. On a
// trace with blocks of experts that persist over the layers (4 × 8 GPUs,
// 256 experts, 30 s) the plan's transitions were 4.28, 4.22 and 4.19 per
// token-layer with 0, 4 and 16 (5.29 with no relabel at all); on the
// DeepSeek-V3-shaped synthetic trace, where it finds little to relabel,
// within the noise of none.
const relabelsMax = 16

// exactChain anneals res on the exact chain counters (chainExact) where
// they apply, no layer's compute tail above the start's (or, where the
// search could not bring it back, above where it is now). By time it
// gets Chain.Exact/(1 − Chain.Proxy) of what is left less one evaluation
// (the polish after it gets the rest); by work, half of spare, and it
// returns the rest. The best plan it visits replaces res.
func exactChain(ctx context.Context, p Problem, opts Options, spare int64, res *Result, start *costmodel.Report, evalTime time.Duration) int64 {
	lim := task.Limit{Work: spare / 2}
	if !opts.Limit.ByWork() {
		left := time.Until(opts.Limit.Deadline) - evalTime
		share := opts.Chain.exact() / (1 - opts.Chain.proxy())
		if left <= 0 || time.Duration(share*float64(left)) < evalTime/2 {
			// Building the counters is a pass over every token's
			// experts in every layer, about half an evaluation: a share
			// shorter than that would end past its deadline.
			return spare
		}
		lim = task.Limit{Deadline: time.Now().Add(time.Duration(share * float64(left)))}
	} else if lim.Work == 0 {
		return spare
	}
	L := len(res.Copies)
	tcap := make([]float64, L)
	cx := newChainExact(p, res.Copies, tcap)
	if cx == nil {
		return spare
	}
	cx.bud = newChainBudgets(p, res.Copies)
	for l := range tcap {
		tcap[l] = max(start.Layers[l].ComputeTail.Seconds()+1e-9, cx.tail(l, -1, -1, 0)) * (1 + 1e-12)
	}
	// One schedule per block of layers (at most one per three layers, as
	// anneal runs them).
	scs := blockSchedules(ctx, lim, opts.Parallel, L, 3, 1)
	neigh := annealSweeps * float64(L*cx.E*cx.G)
	gpu, n := cx.anneal(uint64(L)<<32|0x657861, scs, opts.Parallel, func(rate float64) bool {
		if lim.ByWork() {
			return float64(lim.Work) >= neigh
		}
		return rate*time.Until(lim.Deadline).Seconds() >= neigh
	})
	res.Tries += n
	res.Copies = gpuCopies(gpu)
	return spare - lim.Work
}
