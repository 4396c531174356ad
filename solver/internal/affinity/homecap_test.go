package affinity

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
)

// TestCapDescentBringsLayersUnderTheCap: on random layers under a cap
// half-way between the start's busiest/mean and 1, capDescent leaves a
// state whose recount (a fresh state of its copies) costs no more than
// the start, keeps every GPU's slots and every expert's copy count, and
// never raises the busiest GPU; it brings most layers under the cap.
// Without a cap it makes no move. A descent that does nothing fails; one
// that takes swaps without pricing them fails the recount.
func TestCapDescentBringsLayersUnderTheCap(t *testing.T) {
	rng := rand.New(rand.NewPCG(97, 9))
	lowered, runs, capped, held := 0, 0, 0, 0
	for it := range 24 {
		N, P := 1+rng.IntN(3), 1+rng.IntN(4)
		if N*P < 2 {
			P = 2
		}
		E, K := 10+rng.IntN(14), 1+rng.IntN(3)
		red := fillSlots(E, N*P, rng.IntN(2)*N*P)
		d := fastDispatches[it%len(fastDispatches)]
		withCap := it%2 == 1
		t.Run(fmt.Sprintf("%d-%s-N%dP%dE%dK%dR%d-cap%v", it, d, N, P, E, K, red, withCap), func(t *testing.T) {
			sc, plan, slots := randomInstance(t, rng, N, P, E, K, 1, 100+rng.IntN(150), red, d, it%5 == 2)
			p := Problem{Scenario: sc, Slots: slots, Start: plan}
			if withCap {
				sh, err := newShape(p)
				require.NoError(t, err)
				s0 := newStateKappa(buildLayer(p, sh, 0), int32Copies(plan.ExpertGPUs(0)), 0)
				b := costmodel.Balance(s0.tok, sh.speed)
				if b < 1.01 {
					t.Skip("the start is balanced")
				}
				p.MaxImbalance = 1 + (b-1)/2
			}
			sh, err := newShape(p)
			require.NoError(t, err)
			ly := buildLayer(p, sh, 0)
			s := newStateKappa(ly, int32Copies(plan.ExpertGPUs(0)), 0)
			before := s.costNow(levelGPU)
			peak := costmodel.Balance(s.tok, sh.speed)
			counts := make([]int, sh.E)
			for e := range s.cs {
				counts[e] = len(s.cs[e].gpus)
			}
			n := capDescent(context.Background(), s, it%4 == 3)
			if !withCap {
				assert.Zero(t, n)
				assert.Equal(t, int32Copies(plan.ExpertGPUs(0)), s.copies())
				return
			}
			runs++
			fresh := newStateKappa(ly, s.copies(), 0)
			assert.LessOrEqual(t, fresh.costNow(levelGPU), before*(1+1e-12))
			after := costmodel.Balance(fresh.tok, sh.speed)
			assert.LessOrEqual(t, after, peak*(1+1e-12))
			for g, es := range s.held {
				assert.Len(t, es, slots[g])
			}
			for e := range s.cs {
				assert.Len(t, s.cs[e].gpus, counts[e], "expert %d", e)
				assert.False(t, hasDup(s.cs[e].gpus), "expert %d's copies share a GPU", e)
			}
			capped++
			if sh.cap.Holds(fresh.tok, sh.speed) {
				held++
			}
			if after < peak*(1-1e-9) {
				lowered++
			}
		})
	}
	assert.GreaterOrEqual(t, lowered, runs/2, "the busiest GPU lowered")
	assert.GreaterOrEqual(t, held, capped/2, "layers brought under the cap")
	assert.Positive(t, capped)
}

// hasDup reports whether gs holds a GPU twice.
func hasDup(gs []int32) bool {
	c := slices.Clone(gs)
	slices.Sort(c)
	return len(slices.Compact(c)) != len(gs)
}

// TestCapDescentExactOnTheTable: on SGLang's tables (the plain tree and the
// newest, whose closed form the search prices some copies on), the exact
// descent repairDealt runs, with a cap and without one, leaves a state
// whose tokens, ports and remote copies are the plan's as the table
// really deals it (checkAgainstModel: a fresh evaluation of its copies),
// costs no more, and lowers the busiest GPU on some instances. A descent that took a move priced on the closed form would
// leave counters the deal does not give.
func TestCapDescentExactOnTheTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(98, 10))
	lowered, runs := 0, 0
	for it := range 16 {
		N, P := 2+rng.IntN(2), 2+rng.IntN(3)
		E := 8 + rng.IntN(10)
		red := fillSlots(E, N*P, N*P)
		d := []placement.Dispatch{placement.DispatchSGLangStaticNarrow, placement.DispatchSGLangStatic}[it%2]
		t.Run(fmt.Sprintf("%d-%s-N%dP%dE%dR%d", it, d, N, P, E, red), func(t *testing.T) {
			sc, plan, slots := randomInstance(t, rng, N, P, E, 2, 1, 150+rng.IntN(150), red, d, false)
			p := Problem{Scenario: sc, Slots: slots, Start: plan}
			sh, err := newShape(p)
			require.NoError(t, err)
			s0 := newStateKappa(buildLayer(p, sh, 0), int32Copies(plan.ExpertGPUs(0)), 0)
			b := costmodel.Balance(s0.tok, sh.speed)
			if b < 1.01 {
				t.Skip("the start is balanced")
			}
			if it%4 < 2 {
				p.MaxImbalance = 1 + (b-1)/2
			}
			sh, err = newShape(p)
			require.NoError(t, err)
			s := newStateKappa(buildLayer(p, sh, 0), int32Copies(plan.ExpertGPUs(0)), 0)
			before := s.costNow(levelGPU)
			capDescent(context.Background(), s, true)
			runs++
			checkAgainstModel(t, sc, s, 0)
			assert.LessOrEqual(t, s.costNow(levelGPU), before*(1+1e-12))
			if costmodel.Balance(s.tok, sh.speed) < b*(1-1e-9) {
				lowered++
			}
		})
	}
	assert.GreaterOrEqual(t, lowered, runs/3, "the busiest GPU lowered")
	t.Logf("%d of %d lowered", lowered, runs)
}

// TestCapDescentEndsWhereNoSwapHelps: under SGLang's plain table, on
// random layers with replicated experts and a cap a third of the way from
// the start's busiest/mean to 1, a layer capDescent leaves over the cap
// is one where no swap it may make lowers the cost: none of the busiest
// GPU's copies with a copy elsewhere that would carry less, and none of
// the busiest GPU's experts' other copies with any copy, each priced on a
// fresh state of the result. The descent's state also recounts to no
// more than the start's cost. A descent that does nothing, or stops at
// its first refusals while cheaper swaps are left, fails.
func TestCapDescentEndsWhereNoSwapHelps(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 3))
	over, runs := 0, 0
	for range 30 {
		N, P := 2+rng.IntN(2), 2+rng.IntN(3)
		E := 8 + rng.IntN(12)
		red := fillSlots(E, N*P, N*P)
		sc, plan, slots := randomInstance(t, rng, N, P, E, 2, 1, 150+rng.IntN(200), red, placement.DispatchSGLangStatic, false)
		p := Problem{Scenario: sc, Slots: slots, Start: plan}
		sh, err := newShape(p)
		require.NoError(t, err)
		s0 := newStateKappa(buildLayer(p, sh, 0), int32Copies(plan.ExpertGPUs(0)), 0)
		b := costmodel.Balance(s0.tok, sh.speed)
		if b < 1.01 {
			continue
		}
		p.MaxImbalance = 1 + (b-1)/3
		sh, err = newShape(p)
		require.NoError(t, err)
		ly := buildLayer(p, sh, 0)
		s := newStateKappa(ly, int32Copies(plan.ExpertGPUs(0)), 0)
		before := s.costNow(levelGPU)
		capDescent(context.Background(), s, false)
		runs++
		fresh := newStateKappa(ly, s.copies(), 0)
		checkAgainstModel(t, sc, s, 0)
		require.LessOrEqual(t, fresh.costNow(levelGPU), before*(1+1e-12))
		top := fresh.busiestOverCap()
		if top < 0 {
			continue
		}
		over++
		now := fresh.costNow(levelGPU)
		cur := fresh.tok[top] / sh.speed[top]
		var moves []move
		for ia, e := range fresh.held[top] {
			for g := range sh.G {
				for ib, f := range fresh.held[g] {
					dl := fresh.cs[e].loadOn(top) - fresh.cs[f].loadOn(g)
					if g != top && dl > 0 && math.Max((fresh.tok[top]-dl)/sh.speed[top], (fresh.tok[g]+dl)/sh.speed[g]) < cur*(1-1e-12) {
						moves = append(moves, move{kind: moveSwap, a: top, ia: ia, b: g, ib: ib})
					}
				}
			}
			for _, h := range fresh.cs[e].gpus {
				if int(h) == top {
					continue
				}
				ia := slices.Index(fresh.held[h], e)
				for g := range sh.G {
					for ib := range fresh.held[g] {
						moves = append(moves, move{kind: moveSwap, a: int(h), ia: ia, b: g, ib: ib})
					}
				}
			}
		}
		for _, mv := range moves {
			if !fresh.valid(mv) || mv.b == top {
				continue
			}
			d := fresh.try(mv, levelGPU)
			assert.GreaterOrEqual(t, d, -1e-12*math.Abs(now), "layer left over the cap with a cheaper swap %+v", mv)
		}
	}
	t.Logf("%d layers, %d left over the cap", runs, over)
	assert.Positive(t, over)
}
