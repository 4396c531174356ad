package affinity

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// fmInstance is a random chain-flow instance with one copy of every
// expert (tokens with and without homes) and its exact counters, every
// layer's tail cap at its start's.
func fmInstance(t *testing.T, rng *rand.Rand, it int) (Problem, *chainExact) {
	t.Helper()
	N, P := 2+rng.IntN(2), 1+rng.IntN(3)
	E, K, L := N*P*(2+rng.IntN(3)), 1+rng.IntN(3), 2+rng.IntN(3)
	sc, plan, slots := randomInstance(t, rng, N, P, E, K, L, 60+rng.IntN(80), 0, placement.DispatchEven, it%3 == 0)
	p, copies := chainExactProblem(sc, plan, slots)
	tcap := make([]float64, L)
	cx := newChainExact(p, copies, tcap)
	require.NotNil(t, cx)
	for l := range tcap {
		tcap[l] = cx.tail(l, -1, -1, 0) * (1 + 1e-12)
	}
	return p, cx
}

// TestChainFMGainsMatchRecount: on random instances, the node-move gains kept
// up to date through random swaps (fmApply) equal the gains counted
// afresh after every swap; and the swaps change the fresh gains, so a
// refinement that did not update them would fail the comparison.
func TestChainFMGainsMatchRecount(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 7))
	stale := 0
	for it := range 12 {
		t.Run(fmt.Sprint(it), func(t *testing.T) {
			_, cx := fmInstance(t, rng, it)
			for l := range cx.tcap {
				cx.tcap[l] = math.Inf(1)
			}
			s := cx.newScratch()
			l := rng.IntN(cx.L)
			gain := make([]float64, cx.E*cx.N)
			cx.fmNodeGains(l, gain)
			first := slices.Clone(gain)
			fresh := make([]float64, len(gain))
			for range 30 {
				e, f := rng.IntN(cx.E), rng.IntN(cx.E)
				if cx.gpu[l][e] == cx.gpu[l][f] {
					continue
				}
				_, tl, tn, ok := cx.trial(s, l, e, f)
				require.True(t, ok)
				cx.fmApply(s, l, e, f, tl, tn, gain)
				cx.fmNodeGains(l, fresh)
				for i := range gain {
					require.InDelta(t, fresh[i], gain[i], 1e-9*(1+math.Abs(fresh[i])), "expert %d node %d", i/cx.N, i%cx.N)
				}
			}
			if !slices.EqualFunc(first, fresh, func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }) {
				stale++
			}
		})
	}
	require.Greater(t, stale, 6, "the swaps must change the gains, or the comparison proves nothing")
}

// TestChainFMGainsPriceSwaps: a gain is what its move saves. For every swap of
// e (node A) and f (node B) where no token uses both and neither lands on
// a GPU holding another expert of its tokens, the exact change of NIC
// copies (trial's) is −(gain[e][B] + gain[f][A]). Gains counted on the
// wrong phase, sender or home fail it.
func TestChainFMGainsPriceSwaps(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 3))
	checked := 0
	for it := range 16 {
		_, cx := fmInstance(t, rng, it)
		for l := range cx.tcap {
			cx.tcap[l] = math.Inf(1)
		}
		s := cx.newScratch()
		gain := make([]float64, cx.E*cx.N)
		for l := range cx.L {
			cx.fmNodeGains(l, gain)
			for e := range cx.E {
				for f := range cx.E {
					a, b := int(cx.gpu[l][e]), int(cx.gpu[l][f])
					if a/cx.P == b/cx.P || !fmIsolated(cx, l, e, f, b) || !fmIsolated(cx, l, f, e, a) {
						continue
					}
					_, _, _, ok := cx.trial(s, l, e, f)
					require.True(t, ok)
					want := -(gain[e*cx.N+b/cx.P] + gain[f*cx.N+a/cx.P])
					require.InDelta(t, want, s.dCut[0]+s.dCut[1], 1e-9*(1+math.Abs(want)), "instance %d layer %d swap %d,%d", it, l, e, f)
					checked++
				}
			}
		}
	}
	require.Greater(t, checked, 50)
}

// fmIsolated reports whether no token of expert e in layer l uses f, and
// none has another expert on GPU to.
func fmIsolated(cx *chainExact, l, e, f, to int) bool {
	K := cx.K
	for _, t := range cx.toks[l][cx.off[l][e]:cx.off[l][e+1]] {
		for _, x := range cx.ex[l][int(t)*K : (int(t)+1)*K] {
			if int(x) == f || int(x) != e && int(cx.gpu[l][x]) == to {
				return false
			}
		}
	}
	return true
}

// TestChainFMKeepsCapsAndBudget: the refinement never takes a layer's
// compute tail above its cap, a layer's time above its cap (unless the
// exact cost fell), or a layer past its move budget; its plan is valid,
// its counters match the cost model, and without a budget it lowers the
// NIC copies on most instances (so the caps are not kept by doing
// nothing). The budget counts the slots changed against the running plan.
func TestChainFMKeepsCapsAndBudget(t *testing.T) {
	rng := rand.New(rand.NewPCG(47, 1))
	lowered := 0
	for it := range 14 {
		t.Run(fmt.Sprint(it), func(t *testing.T) {
			p, cx := fmInstance(t, rng, it)
			start := cloneGPU(cx.gpu)
			cut0, cost0 := slices.Clone(cx.cut), cx.cost()
			budgeted := it%2 == 1
			k := 1 + rng.IntN(2)
			if budgeted {
				p.Current = placement.FromReplicas(cx.G, gpuCopies(start), "run")
				p.MaxMoves = k
				cx.bud = newChainBudgets(p, gpuCopies(start))
			} else {
				cx.lcap = make([]float64, cx.L)
				for l := range cx.lcap {
					cx.lcap[l] = cx.ltime[l] * (1 + 1e-12)
				}
			}
			cx.refine(context.Background(), task.Limit{Work: 400}, 2)
			checkPlan(t, gpuCopies(cx.gpu), cx.E, p.Slots)
			requireChainExactMatches(t, p.Scenario, cx, "refined")
			for l := range cx.L {
				assert.LessOrEqual(t, cx.tail(l, -1, -1, 0), cx.tcap[l], "layer %d tail", l)
				if cx.lcap != nil {
					assert.LessOrEqual(t, cx.ltime[l], cx.lcap[l], "layer %d time", l)
				}
				if budgeted {
					run := placement.FromReplicas(cx.G, gpuCopies(start), "run")
					assert.LessOrEqual(t, layerChanged(run, l, cx.G, gpuCopies(cx.gpu)[l]), k, "layer %d moves", l)
				}
			}
			if budgeted {
				assert.LessOrEqual(t, cx.cost(), cost0*(1+1e-12))
			} else if sumF(cx.cut) < sumF(cut0)*(1-1e-9) {
				lowered++
			}
		})
	}
	require.Greater(t, lowered, 3, "the refinement must lower the NIC copies somewhere")
}

func sumF(x []float64) float64 {
	s := 0.0
	for _, v := range x {
		s += v
	}
	return s
}

// TestChainFMReachesBruteForceCut: on tiny instances (2 nodes of one GPU
// with 2 slots, 4 experts, 2 or 3 layers, where the refinement's ranked
// partners are every partner) and only the NIC copies count (no tail or
// time cap, the copies priced far above the time), the refinement from
// the start plan reaches the least NIC copies over every plan one swap
// away, enumerated: no swap of two experts in any layer sends fewer. It
// does not promise the optimum over whole plans: on 3 of these 12 a
// layer's relabelling (its two nodes exchanged, two swaps each adding
// copies) sends fewer, which a search of single swaps does not reach.
func TestChainFMReachesBruteForceCut(t *testing.T) {
	rng := rand.New(rand.NewPCG(53, 9))
	const N, P, E = 2, 1, 4
	for it := range 12 {
		L := 2 + it%2
		t.Run(fmt.Sprint(it), func(t *testing.T) {
			sc, plan, slots := randomInstance(t, rng, N, P, E, 2, L, 30+rng.IntN(30), 0, placement.DispatchEven, it%3 == 0)
			p, copies := chainExactProblem(sc, plan, slots)
			tcap := make([]float64, L)
			for l := range tcap {
				tcap[l] = math.Inf(1)
			}
			cx := newChainExact(p, copies, tcap)
			cx.tie = 1e9 // the copies alone
			cut0 := sumF(cx.cut)
			cx.refine(context.Background(), task.Limit{Work: 1000}, 1)
			got := sumF(cx.cut)
			require.LessOrEqual(t, got, cut0)
			for l := range L {
				for e := range E {
					for f := range E {
						cp := gpuCopies(cx.gpu)
						if cp[l][e][0] == cp[l][f][0] {
							continue
						}
						cp[l][e], cp[l][f] = cp[l][f], cp[l][e]
						other := newChainExact(p, cp, make([]float64, L))
						require.GreaterOrEqual(t, sumF(other.cut), got*(1-1e-12), "layer %d: swapping %d and %d sends fewer copies", l, e, f)
					}
				}
			}
		})
	}
}

// TestAlignerKeepsSlotsAndCompute: the alignment keeps every GPU's slots
// and every layer's busiest compute within its start's, and lowers the
// NIC copies on most random instances with affinity.
func TestAlignerKeepsSlotsAndCompute(t *testing.T) {
	rng := rand.New(rand.NewPCG(59, 4))
	lowered := 0
	for it := range 12 {
		t.Run(fmt.Sprint(it), func(t *testing.T) {
			p, cx := fmInstance(t, rng, it)
			L := cx.L
			copies := make([][][]int32, L)
			for l := range copies {
				copies[l] = make([][]int32, cx.E)
				for e, g := range cx.gpu[l] {
					copies[l][e] = []int32{int32(g)}
				}
			}
			ag := newChainAligner(p, copies, 2)
			require.NotNil(t, ag)
			for sw := range 3 {
				ag.sweep(sw)
			}
			gc := make([][][]placement.GPU, L)
			for l := range gc {
				gc[l] = make([][]placement.GPU, cx.E)
				for e, gs := range copies[l] {
					gc[l][e] = []placement.GPU{placement.GPU(gs[0])}
				}
			}
			checkPlan(t, gc, cx.E, p.Slots)
			after := newChainExact(p, gc, make([]float64, L))
			for l := range L {
				assert.LessOrEqual(t, after.tail(l, -1, -1, 0), cx.tcap[l], "layer %d tail", l)
			}
			if sumF(after.cut) < sumF(cx.cut)*(1-1e-9) {
				lowered++
			}
		})
	}
	require.Greater(t, lowered, 5)
}

// TestAlignerNotForReplicas: the alignment declines plans with replicas
// and statistics without per-token paths.
func TestAlignerNotForReplicas(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 2))
	p, cx := fmInstance(t, rng, 1)
	copies := make([][][]int32, cx.L)
	for l := range copies {
		copies[l] = make([][]int32, cx.E)
		for e, g := range cx.gpu[l] {
			copies[l][e] = []int32{int32(g)}
		}
	}
	copies[0][0] = append(copies[0][0], copies[0][1][0])
	require.Nil(t, newChainAligner(p, copies, 1))
	copies[0][0] = copies[0][0][:1]
	require.NotNil(t, newChainAligner(p, copies, 1))
	q := p
	st := *p.Stats
	st.Patterns = nil
	q.Stats = &st
	require.Nil(t, newChainAligner(q, copies, 1))
	_ = costmodel.FlowChain
}

// TestSolveChainShortLimitKeepsBalance: by time with fewer evaluations
// left than the proxy needs (the start's evaluation said to take a
// tenth of the limit), SolveChain takes the short path (alignment,
// refinement, exact annealing, polish) and returns a valid plan whose
// every layer's compute tail is within its start's, and whose exact
// cost (time and copies) is no higher than the start's. It asserts what
// holds whatever the clock reached, not what it reached.
func TestSolveChainShortLimitKeepsBalance(t *testing.T) {
	rng := rand.New(rand.NewPCG(67, 5))
	for it := range 6 {
		t.Run(fmt.Sprint(it), func(t *testing.T) {
			p, cx := fmInstance(t, rng, it)
			rep, err := p.Evaluate(p.Start)
			require.NoError(t, err)
			limit := 300 * time.Millisecond
			p.StartReport, p.EvalTime = rep, limit/10
			res, err := SolveChain(context.Background(), p, Options{Limit: task.Limit{Deadline: time.Now().Add(limit)}, Parallel: 2})
			require.NoError(t, err)
			checkPlan(t, res.Copies, cx.E, p.Slots)
			after := newChainExact(p, res.Copies, make([]float64, cx.L))
			for l := range cx.L {
				assert.LessOrEqual(t, after.tail(l, -1, -1, 0), cx.tcap[l]*(1+1e-9), "layer %d tail", l)
			}
		})
	}
}
