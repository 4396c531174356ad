package affinity

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// fastNVLink makes NVLink free, so that the cost model's layer time is
// what the exact chain counters model (the NIC and compute).
func fastNVLink(sc *costmodel.Scenario) {
	sc.Cluster.NVLinkGBps = 1e12
	sc.Cluster.NVLinkLatency = 0
}

// chainExactProblem is the chain-flow problem of sc (NVLink made free)
// starting at plan, with plan's copies per layer.
func chainExactProblem(sc costmodel.Scenario, plan *placement.Plan, slots []int) (Problem, [][][]placement.GPU) {
	sc.Flow = costmodel.FlowChain
	fastNVLink(&sc)
	copies := make([][][]placement.GPU, len(plan.Layers))
	for l := range copies {
		copies[l] = plan.ExpertGPUs(l)
	}
	return Problem{Scenario: sc, Slots: slots, Start: plan}, copies
}

// requireChainExactMatches checks every counter of cx against the cost
// model's report of cx's plan: each layer's NIC copies (dispatch and, in
// the last layer, combine), its dispatch's busiest NIC port, its compute
// tail and its time.
func requireChainExactMatches(t *testing.T, sc costmodel.Scenario, cx *chainExact, what string) {
	t.Helper()
	rep, err := sc.Evaluate(placement.FromReplicas(cx.G, gpuCopies(cx.gpu), "exact"))
	require.NoError(t, err)
	tb := sc.Model.TokenBytes()
	for l, lr := range rep.Layers {
		cut := cx.cut[l]
		if l == cx.L-1 {
			cut += cx.cut[cx.L]
		}
		tol := 1e-9 * max(1, cut)
		require.InDelta(t, lr.CrossNodeBytes/tb, cut, tol, "%s layer %d NIC copies", what, l)
		require.InDelta(t, lr.RemoteCopies, cx.cut[l], tol, "%s layer %d dispatch copies", what, l)
		busiest := 0.0
		if s := cx.portSec(l, nil, -1); s > 0 {
			busiest = (s - cx.lat) / cx.copySec
		}
		require.InDelta(t, lr.BusiestNIC, busiest, 1e-9*max(1, busiest), "%s layer %d busiest port", what, l)
		require.InDelta(t, lr.ComputeTail.Seconds(), cx.tail(l, -1, -1, 0), 2e-9, "%s layer %d tail", what, l)
		require.InDelta(t, lr.TimeSec, cx.ltime[l], 1e-9+1e-9*lr.TimeSec, "%s layer %d time", what, l)
	}
}

// TestChainExactMatchesCostModel: on random chain-flow instances (one copy
// per expert, tokens with and without homes, both modes) the exact
// counters equal the cost model's report of the start, and after every
// applied swap still equal both the cost model's report and counters
// built afresh (also on GPUs of different speeds); a swap is refused exactly when it would take its layer's
// compute tail above the cap, and a refused swap changes nothing. A
// delta that drops a phase (the next layer's senders, the last layer's
// combine, the homeless tokens' ports) fails it.
func TestChainExactMatchesCostModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 7))
	applied, refused, lastLayer := 0, 0, 0
	for it := range 12 {
		N, P := 2+rng.IntN(3), 1+rng.IntN(3)
		E := N * P * (1 + rng.IntN(4)) // one copy per expert
		K := 1 + rng.IntN(min(3, E))
		L := 2 + rng.IntN(3)
		sc, plan, slots := randomInstance(t, rng, N, P, E, K, L, 40+rng.IntN(80), 0, placement.DispatchEven, it%3 == 0)
		if it%2 == 1 {
			// Heterogeneous GPUs: the tails are tokens over speed.
			sc.Cluster.Speed = make([]float64, N*P)
			for g := range sc.Cluster.Speed {
				sc.Cluster.Speed[g] = 0.5 + rng.Float64()
			}
		}
		p, copies := chainExactProblem(sc, plan, slots)
		tcap := make([]float64, L)
		for l := range tcap {
			tcap[l] = math.Inf(1)
		}
		cx := newChainExact(p, copies, tcap)
		require.NotNil(t, cx, "instance %d", it)
		what := fmt.Sprintf("instance %d (N%d P%d E%d K%d L%d)", it, N, P, E, K, L)
		requireChainExactMatches(t, p.Scenario, cx, what)
		// Caps a little above the start's tails: some swaps are refused.
		for l := range tcap {
			tcap[l] = cx.tail(l, -1, -1, 0) * (1 + rng.Float64()/50)
		}
		cost := cx.cost()
		scr := cx.newScratch()
		for range 60 {
			l, e, f := rng.IntN(L), rng.IntN(E), rng.IntN(E)
			if cx.gpu[l][e] == cx.gpu[l][f] {
				continue
			}
			before := cloneGPU(cx.gpu)
			d, tl, tn, ok := cx.trial(scr, l, e, f)
			// The tail the swap would give, recounted.
			after := cloneGPU(cx.gpu)
			after[l][e], after[l][f] = after[l][f], after[l][e]
			fresh := newChainExact(p, gpuCopies(after), tcap)
			require.Equal(t, fresh.tail(l, -1, -1, 0) <= tcap[l], ok, "%s: swap refused or allowed wrongly", what)
			if !ok {
				refused++
				require.Equal(t, before, cx.gpu)
				continue
			}
			cx.apply(scr, l, e, f, tl, tn)
			applied++
			if l == L-1 {
				lastLayer++
			}
			cost += d
			require.InDelta(t, fresh.cost(), cost, 1e-9*max(1, cost), "%s: predicted cost", what)
			require.InDelta(t, fresh.cost(), cx.cost(), 1e-9*max(1, cost), "%s: kept cost", what)
			for ph := range cx.out {
				require.InDeltaSlice(t, fresh.out[ph], cx.out[ph], 1e-9, "%s phase %d out ports", what, ph)
				require.InDeltaSlice(t, fresh.in[ph], cx.in[ph], 1e-9, "%s phase %d in ports", what, ph)
				require.InDeltaSlice(t, fresh.un[ph], cx.un[ph], 1e-9, "%s phase %d homeless", what, ph)
			}
			for ll := range cx.mask {
				require.True(t, slices.Equal(fresh.mask[ll], cx.mask[ll]), "%s layer %d masks", what, ll)
			}
		}
		requireChainExactMatches(t, p.Scenario, cx, what+" after swaps")
	}
	require.Positive(t, applied)
	require.Positive(t, refused, "no swap hit a cap")
	require.Positive(t, lastLayer, "no swap in the last layer")
}

// TestChainExactNotForReplicas: the exact counters decline plans with
// replicas, one node, or more GPUs than a mask holds.
func TestChainExactNotForReplicas(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	sc, plan, slots := randomInstance(t, rng, 2, 2, 6, 2, 2, 30, fillSlots(6, 4, 2), placement.DispatchEven, false)
	sc.Flow = costmodel.FlowChain
	copies := [][][]placement.GPU{plan.ExpertGPUs(0), plan.ExpertGPUs(1)}
	require.Nil(t, newChainExact(Problem{Scenario: sc, Slots: slots, Start: plan}, copies, []float64{1, 1}))
}

// randomChainExact draws a chain-flow problem for the exact annealing: 2
// or 3 nodes of 1 or 2 GPUs, 2 to 4 experts a GPU (one copy each), top-2,
// 6 to 9 layers (two or three blocks of layers), 60 to 119 tokens, with
// homes on even it and without on odd.
func randomChainExact(t *testing.T, rng *rand.Rand, it int) (Problem, [][][]placement.GPU, []int) {
	N, P := 2+rng.IntN(2), 1+rng.IntN(2)
	E := N * P * (2 + rng.IntN(3))
	L := 6 + rng.IntN(4)
	sc, plan, slots := randomInstance(t, rng, N, P, E, 2, L, 60+rng.IntN(60), 0, placement.DispatchEven, it%2 == 0)
	p, copies := chainExactProblem(sc, plan, slots)
	return p, copies, slots
}

// TestChainExactAnnealParallel: the exact annealing with a goroutine per
// block of layers keeps every layer's GPUs (the same slots, one copy of
// every expert), no layer's compute tail above its cap, and ends no worse
// than it started (better on some: one that does nothing fails); the same
// seed gives the same plan, the same blocks on one goroutine give it too
// (what --effort promises on any machine), and the counters after it
// equal counters built afresh for the plan (a block that wrote into
// another's would break them, and go test -race reports it).
func TestChainExactAnnealParallel(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 1))
	improved := 0
	for it := range 4 {
		p, copies, _ := randomChainExact(t, rng, it)
		L, E := len(copies), len(copies[0])
		blocks := max(1, L/3)
		run := func(procs int) ([][]int16, *chainExact, []float64) {
			tcap := make([]float64, L)
			cx := newChainExact(p, copies, tcap)
			for l := range tcap {
				tcap[l] = cx.tail(l, -1, -1, 0) * (1 + 1e-12)
			}
			scs := make([]*schedule, blocks)
			for w := range scs {
				scs[w] = newSchedule(t.Context(), task.Limit{Work: 3000}, 1)
			}
			gpu, n := cx.anneal(7, scs, procs, func(float64) bool { return false })
			require.Positive(t, n)
			return gpu, cx, tcap
		}
		start := newChainExact(p, copies, make([]float64, L)).cost()
		gpu, cx, tcap := run(blocks)
		again, _, _ := run(blocks)
		require.Equal(t, gpu, again, "instance %d: not deterministic", it)
		// The blocks, not the goroutines that run them, decide the plan.
		one, _, _ := run(1)
		require.Equal(t, gpu, one, "instance %d: %d blocks on one goroutine and on %d differ", it, blocks, blocks)
		fresh := newChainExact(p, gpuCopies(gpu), tcap)
		require.LessOrEqual(t, fresh.cost(), start*(1+1e-12), "instance %d", it)
		if fresh.cost() < start*(1-1e-9) {
			improved++
		}
		for l := range gpu {
			a, b := slices.Clone(gpu[l]), make([]int16, E)
			for e, gs := range copies[l] {
				b[e] = int16(gs[0])
			}
			slices.Sort(a)
			slices.Sort(b)
			require.Equal(t, b, a, "instance %d layer %d: slots changed", it, l)
			require.LessOrEqual(t, fresh.tail(l, -1, -1, 0), tcap[l], "instance %d layer %d over its cap", it, l)
		}
		// The walk's own counters, for the plan it ended in.
		end := newChainExact(p, gpuCopies(cx.gpu), tcap)
		require.InDelta(t, end.cost(), cx.cost(), 1e-9*end.cost(), "instance %d: counters drifted", it)
		require.True(t, fresh.cost() <= end.cost()*(1+1e-12), "instance %d: not the best plan", it)
	}
	require.Positive(t, improved, "the annealing improved no instance")
}

// TestSolveChainByWorkAnyParallel: under a work budget the chain search
// gives the same plan whatever Options.Parallel is (the number of cores it
// defaults to), as --effort promises: the exact annealing's blocks of
// layers, their random streams and their shares of the work follow the
// instance, not the workers. Each instance must reach the exact annealing
// (single copies, several layers to a block) for the check to mean
// something.
func TestSolveChainByWorkAnyParallel(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 5))
	for it := range 4 {
		p, copies, slots := randomChainExact(t, rng, it)
		L, E := len(copies), len(copies[0])
		require.NotNil(t, newChainExact(p, copies, make([]float64, L)), "instance %d: the exact counters must apply", it)
		var plans [][][][]placement.GPU
		for _, par := range []int{1, 2, 3} {
			res, err := SolveChain(t.Context(), p, Options{Limit: task.Limit{Work: 20000}, Parallel: par})
			require.NoError(t, err)
			checkPlan(t, res.Copies, E, slots)
			plans = append(plans, res.Copies)
		}
		require.Equal(t, plans[0], plans[1], "instance %d: Parallel 1 and 2 differ", it)
		require.Equal(t, plans[0], plans[2], "instance %d: Parallel 1 and 3 differ", it)
	}
}
