package affinity

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// proxyDispatches are the dispatches the proxy tests draw from.
var proxyDispatches = []placement.Dispatch{placement.DispatchEven, placement.DispatchStaticMean, placement.DispatchLocal, placement.DispatchSGLangStatic}

// proxyObjective is o's objective of px's placement recomputed from
// nothing but the pair and terminal weights (no cached pins): the cut
// scaled to seconds plus the busiest node's compute and the cap's charge.
func proxyObjective(px *proxy, o *proxyObj) float64 {
	V, N := len(px.exp), px.N
	cut := 0.0
	nl := make([]float64, N)
	for x := 0; x < V; x++ {
		nl[px.node[x]] += px.load[x]
		for b := 0; b < N; b++ {
			if b != px.node[x] {
				cut += px.tw(x, b)
			}
		}
		for y := x + 1; y < V; y++ {
			if px.node[x] != px.node[y] {
				cut += px.pw(x, y)
			}
		}
	}
	v := cut*o.scale*2*o.copySec + maxNode(nl)*o.perNodeTok
	if o.capOn {
		v += px.capExcess(nl)
	}
	return v
}

// TestProxyDescendReachesLocalOptimum checks the proxy's best-swap
// descent on random layers: the objective it reports never rises, and
// when it stops no allowed swap of two copies on different nodes lowers
// the objective (recomputed from the weights) by more than its
// tolerance; and the starts it is given are not already such optima, so
// a descent that did nothing would fail.
func TestProxyDescendReachesLocalOptimum(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	moved := 0
	for it := range 12 {
		N, P := 2+rng.IntN(3), 1+rng.IntN(3)
		E, K := 8+rng.IntN(12), 2+rng.IntN(3)
		red := fillSlots(E, N*P, (it%2)*N*P)
		d := proxyDispatches[it%len(proxyDispatches)]
		sc, plan, slots := randomInstance(t, rng, N, P, E, K, 1, 80+rng.IntN(120), red, d, it%3 == 0)
		t.Run(fmt.Sprintf("%d-%s-N%dP%dE%dK%d", it, d, N, P, E, K), func(t *testing.T) {
			p := Problem{Scenario: sc, Slots: slots, Start: plan}
			if it%2 == 1 {
				p.MaxImbalance = 1.05
			}
			sh, err := newShape(p)
			require.NoError(t, err)
			s := newState(buildLayer(p, sh, 0), int32Copies(plan.ExpertGPUs(0)))
			px := newProxy(s)
			if px.cut == 0 {
				t.Skip("no cut to lower")
			}
			o := &proxyObj{scale: s.remote() / px.cut, perNodeTok: sh.perTok / float64(P), copySec: sh.copySec / float64(N*P), capOn: px.cap.On(), nl: make([]float64, N)}
			before := proxyObjective(px, o)
			tol := 1e-9 * math.Abs(before)
			n := px.descend(o, tol, func() bool { return false })
			moved += n
			after := proxyObjective(px, o)
			assert.LessOrEqual(t, after, before+tol)
			require.InDelta(t, px.cost(), px.cut, 1e-9*math.Max(1, px.cut), "the cached cut")
			V := len(px.exp)
			for x := 0; x < V; x++ {
				for y := x + 1; y < V; y++ {
					if px.node[x] == px.node[y] || !px.allowed(x, y) {
						continue
					}
					px.swap(x, y)
					v := proxyObjective(px, o)
					px.swap(x, y)
					require.GreaterOrEqual(t, v, after-2*tol, "swap %d,%d lowers the objective after the descent", x, y)
				}
			}
		})
	}
	require.Positive(t, moved, "the descents never moved a copy: the starts were all optima or descend does nothing")
}

// TestProxyAnnealShortSchedule checks that a proxy annealing given a
// small share of a full schedule (a work budget) ends no worse than its
// start and at a local optimum of the swaps, as its closing descent
// promises.
func TestProxyAnnealShortSchedule(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for it := range 6 {
		N, P := 2+rng.IntN(3), 2
		E, K := 16+rng.IntN(16), 4
		sc, plan, slots := randomInstance(t, rng, N, P, E, K, 1, 300, fillSlots(E, N*P, 0), proxyDispatches[it%len(proxyDispatches)], false)
		p := Problem{Scenario: sc, Slots: slots, Start: plan}
		sh, err := newShape(p)
		require.NoError(t, err)
		s := newState(buildLayer(p, sh, 0), int32Copies(plan.ExpertGPUs(0)))
		px := newProxy(s)
		if px.cut == 0 {
			continue
		}
		o := &proxyObj{scale: s.remote() / px.cut, perNodeTok: sh.perTok / float64(P), copySec: sh.copySec / float64(N*P), nl: make([]float64, N)}
		before := proxyObjective(px, o)
		// One move per copy: far below a full schedule's share.
		lim := task.Limit{Work: int64(len(px.exp))}
		px.anneal(rand.New(rand.NewPCG(1, 2)), newSchedule(context.Background(), lim, 1), o.scale, o.perNodeTok, o.copySec)
		after := proxyObjective(px, o)
		assert.LessOrEqual(t, after, before*(1+1e-9), "instance %d", it)
		require.Zero(t, px.descend(o, 1e-9*math.Abs(after), func() bool { return false }), "instance %d: a swap still lowers the objective", it)
	}
}

// TestWithinNodePricesAsTry checks that the GPU phase's token-free price
// of a swap within a node (withinNode) gives the tokens and the cost
// change the exact try gives, on random layers of every dispatch, with
// and without a move budget, and that it declines every other swap.
func TestWithinNodePricesAsTry(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 4))
	priced, declined := 0, 0
	for it := range 12 {
		N, P := 2+rng.IntN(3), 2+rng.IntN(3)
		E, K := 10+rng.IntN(12), 2+rng.IntN(3)
		red := fillSlots(E, N*P, (it%2)*N*P)
		sc, plan, slots := randomInstance(t, rng, N, P, E, K, 1, 100+rng.IntN(100), red, proxyDispatches[it%len(proxyDispatches)], it%3 == 0)
		p := Problem{Scenario: sc, Slots: slots, Start: plan}
		if it%4 == 3 {
			p.Current, p.MaxMoves = plan, 4
		}
		sh, err := newShape(p)
		require.NoError(t, err)
		s := newState(buildLayer(p, sh, 0), int32Copies(plan.ExpertGPUs(0)))
		scratch := make([]float64, sh.G)
		for range 200 {
			mv, ok := randomMove(rng, s)
			if !ok || !s.valid(mv) {
				continue
			}
			t2, d := s.withinNode(mv, scratch, s.baseCost())
			if t2 == nil {
				declined++
				continue
			}
			priced++
			want := s.try(mv, levelGPU)
			require.Equal(t, want, d, "instance %d: the cost change of %+v", it, mv)
			require.Equal(t, s.tr.t2, t2, "instance %d: the GPUs' tokens after %+v", it, mv)
			if rng.IntN(4) == 0 {
				s.apply(mv)
			}
		}
	}
	require.Positive(t, priced, "no swap within a node was priced")
	require.Positive(t, declined, "no swap was declined")
}

// TestProxyDescendKeepsMoveBudget checks the proxy's descent under a move
// budget on random layers: the slots it changes from the running plan,
// recounted from its copies, never exceed the budget and equal its own
// count; and without the budget the same descents change more slots in
// some instance, so the bound is not vacuous.
func TestProxyDescendKeepsMoveBudget(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 8))
	bound := 0
	for it := range 10 {
		N, P := 2+rng.IntN(3), 1+rng.IntN(3)
		E, K := 10+rng.IntN(12), 2+rng.IntN(3)
		red := fillSlots(E, N*P, (it%2)*N*P)
		sc, plan, slots := randomInstance(t, rng, N, P, E, K, 1, 150, red, proxyDispatches[it%len(proxyDispatches)], false)
		maxMoves := 2 + rng.IntN(4)
		p := Problem{Scenario: sc, Slots: slots, Start: plan, Current: plan, MaxMoves: maxMoves}
		sh, err := newShape(p)
		require.NoError(t, err)
		ly := buildLayer(p, sh, 0)
		require.NotNil(t, ly.bud)
		moved := func(budgeted bool) int {
			s := newState(ly, int32Copies(plan.ExpertGPUs(0)))
			px := newProxy(s)
			if px.cut == 0 {
				return 0
			}
			if budgeted {
				px.bud, px.changed = ly.bud, s.changed
			}
			o := &proxyObj{scale: s.remote() / px.cut, perNodeTok: sh.perTok / float64(P), copySec: sh.copySec / float64(N*P), nl: make([]float64, N)}
			px.descend(o, 0, func() bool { return false })
			got := newState(ly, px.copies()).changed
			if budgeted {
				require.Equal(t, px.changed, got, "instance %d: the descent's count of changed slots", it)
				require.LessOrEqual(t, got, maxMoves, "instance %d", it)
			}
			return got
		}
		if moved(false) > maxMoves {
			bound++
		}
		moved(true)
	}
	require.Positive(t, bound, "no free descent changed more slots than the budget")
}
