package affinity

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
)

// BenchmarkChainSwap32k scores swaps of two experts of one layer on the
// shared 32k-token trace, 4 nodes × 8 GPUs, chain flow, EPLB's plan: with
// the cost model's incremental evaluator (evaluator) and with the exact
// chain counters (exact), which stay in one layer for a run of E swaps as
// their annealing does. It skips when the trace is absent.
func BenchmarkChainSwap32k(b *testing.B) {
	st, c, m, plan := shared32k(b, 0)
	sc := costmodel.Scenario{Stats: st, Cluster: c, Model: m, Flow: costmodel.FlowChain}
	L, E := st.Layers, st.Experts
	b.Run("evaluator", func(b *testing.B) {
		ev, err := sc.NewEvaluator(plan)
		require.NoError(b, err)
		rng := rand.New(rand.NewPCG(1, 2))
		for b.Loop() {
			l := rng.IntN(L)
			lp := ev.Layer(l)
			x, y := rng.IntN(len(lp.SlotGPU)), rng.IntN(len(lp.SlotGPU))
			if lp.SlotGPU[x] == lp.SlotGPU[y] {
				continue
			}
			_, err := ev.Delta(costmodel.Move{Kind: costmodel.MoveSwap, Layer: l, Slot: x, Other: y})
			require.NoError(b, err)
		}
	})
	b.Run("exact", func(b *testing.B) {
		copies := make([][][]placement.GPU, L)
		tcap := make([]float64, L)
		for l := range copies {
			copies[l] = plan.ExpertGPUs(l)
			tcap[l] = math.Inf(1)
		}
		cx := newChainExact(Problem{Scenario: sc}, copies, tcap)
		require.NotNil(b, cx)
		s := cx.newScratch()
		rng := rand.New(rand.NewPCG(1, 2))
		i, l := 0, 0
		for b.Loop() {
			if i%E == 0 {
				l = rng.IntN(L)
			}
			i++
			e, f := rng.IntN(E), rng.IntN(E)
			if cx.gpu[l][e] == cx.gpu[l][f] {
				continue
			}
			cx.trial(s, l, e, f)
		}
	})
}
