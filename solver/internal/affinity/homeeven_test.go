package affinity

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nodeBalance is the busiest node's tokens per unit of speed over the
// mean's.
func nodeBalance(s *state) float64 {
	sh := s.ly.sh
	nl, sp := make([]float64, sh.N), make([]float64, sh.N)
	tot, spd := 0.0, 0.0
	for g, x := range s.tok {
		nl[g/sh.P] += x
		sp[g/sh.P] += sh.speed[g]
		tot += x
		spd += sh.speed[g]
	}
	mx := 0.0
	for b := range nl {
		mx = max(mx, nl[b]/sp[b])
	}
	return mx / (tot / spd)
}

// TestEvenNodesEvensTheNodes: on random layers (2-4 nodes of 2-4 GPUs),
// evened out within their nodes first, evenNodes leaves a state whose
// recount (a fresh state of its copies) costs no more than it was given
// and holds the model's counters, keeps every GPU's slots and every
// expert's copy count, and lowers the busiest node on most layers whose
// nodes are uneven. A step that does nothing fails the last; one that
// keeps swaps without pricing them, or keeps a worse state, fails the
// recount.
func TestEvenNodesEvensTheNodes(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 7))
	lowered, uneven := 0, 0
	for it := range 24 {
		N, P := 2+rng.IntN(3), 2+rng.IntN(3)
		E, K := 12+rng.IntN(16), 1+rng.IntN(3)
		red := fillSlots(E, N*P, rng.IntN(2)*N*P)
		d := fastDispatches[it%len(fastDispatches)]
		t.Run(fmt.Sprintf("%d-%s-N%dP%dE%dK%dR%d", it, d, N, P, E, K, red), func(t *testing.T) {
			sc, plan, slots := randomInstance(t, rng, N, P, E, K, 1, 100+rng.IntN(200), red, d, it%5 == 2)
			ly := firstLayer(t, sc, plan, slots)
			s := newStateKappa(ly, int32Copies(plan.ExpertGPUs(0)), 0)
			evenOut(context.Background(), s)
			s = newStateKappa(ly, s.copies(), 0)
			before, nb := s.costNow(levelGPU), nodeBalance(s)
			counts := make([]int, E)
			for e := range s.cs {
				counts[e] = len(s.cs[e].gpus)
			}
			s, _ = evenNodes(context.Background(), s)
			fresh := newStateKappa(ly, s.copies(), 0)
			if it%5 != 2 {
				// Without sources the sample spreads its tokens over
				// the GPUs, the model its shares: only the traced
				// sources' counters are the model's.
				checkAgainstModel(t, sc, s, 0)
			}
			require.LessOrEqual(t, fresh.costNow(levelGPU), before*(1+1e-12))
			for g, es := range s.held {
				assert.Len(t, es, slots[g])
			}
			for e := range s.cs {
				assert.Len(t, s.cs[e].gpus, counts[e], "expert %d", e)
				assert.False(t, hasDup(s.cs[e].gpus), "expert %d's copies share a GPU", e)
			}
			if nb > 1.02 {
				uneven++
				if nodeBalance(fresh) < nb*(1-1e-9) {
					lowered++
				}
			}
		})
	}
	t.Logf("busiest node lowered on %d of %d uneven layers", lowered, uneven)
	assert.Positive(t, uneven)
	assert.GreaterOrEqual(t, 2*lowered, uneven, "the busiest node lowered on most uneven layers")
}
