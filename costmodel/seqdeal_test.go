package costmodel

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
)

// layerCopies is a plan's layer l as SequentialDeal takes it: per expert,
// the GPU of each of its slots.
func layerCopies(p *placement.Plan, l int) [][]int32 {
	lp := p.Layers[l]
	out := make([][]int32, p.Experts)
	for s, e := range lp.SlotExpert {
		out[e] = append(out[e], int32(lp.SlotGPU[s]))
	}
	return out
}

// TestSequentialDealFollowsTheStreams: a plan changed in one layer by a
// move that shifts ranks' streams, dealt layer by layer from the original
// plan's SequentialDeal (each layer bound to the changed plan's copies, then
// committed), gives every layer the table of the changed plan itself: its
// splits equal a Splitter bound to the changed plan, which deals it whole. The changed plan's later layers are dealt
// otherwise than the original's (so a deal that kept the original streams
// would fail).
func TestSequentialDealFollowsTheStreams(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, d := range []placement.Dispatch{placement.DispatchSGLangStaticNode, placement.DispatchSGLangStaticNarrow, placement.DispatchSGLangStaticGPUOnly} {
		const nodes, gpn, S, L, E = 2, 4, 3, 6, 16
		G := nodes * gpn
		shifted := 0
		for trial := range 6 {
			plan, _, _, _ := dealInstance(rng, nodes, gpn, S, L, E, 2, 1)
			changed := plan.Clone()
			// Swap, in layer 1, a slot of a replicated expert with a slot
			// of another expert on the other node.
			lp := changed.Layers[1]
			cnt := make([]int, E)
			for _, e := range lp.SlotExpert {
				cnt[e]++
			}
			for {
				a, b := rng.IntN(len(lp.SlotExpert)), rng.IntN(len(lp.SlotExpert))
				ea, eb := lp.SlotExpert[a], lp.SlotExpert[b]
				if cnt[ea] < 2 || ea == eb || int(lp.SlotGPU[a])/gpn == int(lp.SlotGPU[b])/gpn {
					continue
				}
				lp.SlotExpert[a], lp.SlotExpert[b] = eb, ea
				break
			}
			q, err := NewSequentialDeal(d, plan, G, gpn, placement.Layout{})
			require.NoError(t, err)
			whole, err := NewSplitter(d, changed, G, gpn, placement.Layout{})
			require.NoError(t, err)
			orig, err := NewSplitter(d, plan, G, gpn, placement.Layout{})
			require.NoError(t, err)
			for l := range L {
				cp := layerCopies(changed, l)
				require.NoError(t, q.Bind(l, cp))
				for e, gs := range cp {
					gpus, slots := distinct(gs)
					n := len(gpus)
					got, want, old := make([]float64, G*n), make([]float64, G*n), make([]float64, G*n)
					require.True(t, q.Splitter().Split(l, e, gpus, slots, got), "%v trial %d layer %d expert %d: bound split not exact", d, trial, l, e)
					require.True(t, whole.Split(l, e, gpus, slots, want))
					require.Equal(t, want, got, "%v trial %d layer %d expert %d", d, trial, l, e)
					if l > 1 && (!orig.Split(l, e, gpus, slots, old) || !slices.Equal(old, want)) {
						shifted++
					}
				}
				require.NoError(t, q.Commit(l))
			}
			require.Error(t, q.Bind(0, layerCopies(changed, 0)), "a committed layer must be refused")
		}
		require.Positive(t, shifted, "%v: no later layer dealt otherwise: the instance does not test the streams", d)
	}
}

// distinct is gs (one GPU per slot) as distinct GPUs and their slot counts.
func distinct(gs []int32) ([]int32, []int32) {
	var gpus, slots []int32
	for _, g := range gs {
		if i := slices.Index(gpus, g); i >= 0 {
			slots[i]++
			continue
		}
		gpus, slots = append(gpus, g), append(slots, 1)
	}
	return gpus, slots
}
