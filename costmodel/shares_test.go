package costmodel

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/routing"
)

// SourceShares: per layer and expert, the shares over the GPUs sum to 1,
// a GPU's share is its tokens' count (plus 1/G of the unsourced ones) over
// the expert's, LayerSourceShares gives the same layer, and stats without
// sources or with a source past the GPUs give nil.
func TestSourceShares(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 8))
	const G, E, L, k = 4, 6, 3, 2
	tr := &routing.Trace{Tokens: 200, Layers: L, TopK: k, Experts: E, Source: make([]int32, 200)}
	for tok := range tr.Tokens {
		tr.Source[tok] = int32(rng.IntN(G+1)) - 1 // -1: unknown
		for range L {
			a := rng.IntN(E)
			tr.IDs = append(tr.IDs, int16(a), int16((a+1+rng.IntN(E-1))%E))
		}
	}
	require.NoError(t, tr.Validate())
	st := tr.Stats(routing.StatsOptions{})
	sh := SourceShares(st, G)
	require.Len(t, sh, L)
	for l := range L {
		want := make([]float64, G*E)
		tot := make([]float64, E)
		for tok := range tr.Tokens {
			for _, e := range tr.IDs[(tok*L+l)*k : (tok*L+l+1)*k] {
				tot[e]++
				if h := tr.Source[tok]; h >= 0 {
					want[int(h)*E+int(e)]++
				} else {
					for g := range G {
						want[g*E+int(e)] += 1.0 / G
					}
				}
			}
		}
		for e := range E {
			sum := 0.0
			for h := range G {
				assert.InDelta(t, want[h*E+e]/tot[e], sh[l][h*E+e], 1e-12, "layer %d expert %d GPU %d", l, e, h)
				sum += sh[l][h*E+e]
			}
			assert.InDelta(t, 1, sum, 1e-12)
		}
		assert.Equal(t, sh[l], LayerSourceShares(st, G, l))
	}
	assert.Nil(t, LayerSourceShares(st, G, L), "layer out of range")
	assert.Nil(t, SourceShares(st, G-1), "a source past the GPUs")
	counts := *st
	counts.Patterns = nil
	assert.Equal(t, sh, SourceShares(&counts, G), "the exact per-source loads alone give the same shares")
	paths := *st
	paths.SourceLoad = nil
	assert.InDeltaSlice(t, sh[0], SourceShares(&paths, G)[0], 1e-12, "the paths alone (every token kept) give the same shares")
	none := counts
	none.SourceLoad = nil
	assert.Nil(t, SourceShares(&none, G), "neither patterns nor per-source loads")
}
