package routing

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// orderTrace is a random trace of T tokens with sources (some unknown)
// and, when steps, step ids in runs.
func orderTrace(rng *rand.Rand, T, L, K, E, R int, steps bool) *Trace {
	tr := &Trace{Tokens: T, Layers: L, TopK: K, Experts: E, Source: make([]int32, T)}
	for tok := range T {
		tr.Source[tok] = int32(rng.IntN(R+1)) - 1
		for range L {
			for _, e := range rng.Perm(E)[:K] {
				tr.IDs = append(tr.IDs, int16(e))
			}
		}
	}
	if steps {
		tr.Step = make([]int32, T)
		for tok := 1; tok < T; tok++ {
			tr.Step[tok] = tr.Step[tok-1] + int32(rng.IntN(5)/4)
		}
	}
	return tr
}

// TestTokenOrderRows: every (layer, expert, rank) lists exactly the rows a
// direct count gives: a token's index among its rank's tokens of its step
// (of the trace without steps), modulo the pass size.
func TestTokenOrderRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for it := range 12 {
		T, L, K, E, R := 20+rng.IntN(80), 1+it%3, 1+it%2, 4+it%3, 1+it%4
		tr := orderTrace(rng, T, L, K, E, R, it%2 == 1)
		require.NoError(t, tr.Validate())
		B := []int{0, 3, 7}[it%3]
		o, err := tr.TokenOrder(B)
		require.NoError(t, err)
		require.NoError(t, o.Validate(L, E))
		want := map[[3]int][]int32{}
		for tok, r := range tr.Source {
			if r < 0 {
				continue
			}
			row := 0
			for u := range tok {
				if tr.Source[u] == r && (tr.Step == nil || tr.Step[u] == tr.Step[tok]) {
					row++
				}
			}
			if B > 0 {
				row %= B
			}
			for l := range L {
				for j := range K {
					k := [3]int{l, int(tr.At(tok, l, j)), int(r)}
					want[k] = append(want[k], int32(row))
				}
			}
		}
		for l := range L {
			for e := range E {
				for r := range o.Ranks {
					got := o.Of(l, e, r)
					assert.True(t, slices.Equal(want[[3]int{l, e, r}], got), "it %d layer %d expert %d rank %d: rows %v, want %v", it, l, e, r, got, want[[3]int{l, e, r}])
					assert.Equal(t, len(got), o.Count(l, e, r))
				}
			}
		}
		assert.Nil(t, o.Of(0, 0, o.Ranks), "a rank outside the order has no rows")
	}
}

// TestTokenOrderErrors: a trace without sources or a negative pass size
// has no order, and the errors say which field.
func TestTokenOrderErrors(t *testing.T) {
	tr := &Trace{Tokens: 1, Layers: 1, TopK: 1, Experts: 2, IDs: []int16{1}}
	_, err := tr.TokenOrder(0)
	require.ErrorContains(t, err, "Source")
	tr.Source = []int32{0}
	_, err = tr.TokenOrder(-1)
	require.ErrorContains(t, err, "pass tokens")
	o, err := tr.TokenOrder(0)
	require.NoError(t, err)
	s := tr.Stats(StatsOptions{})
	s.Order = o
	require.NoError(t, s.Validate())
	s.Order = &TokenOrder{Layers: 2, Experts: 2}
	require.ErrorContains(t, s.Validate(), "Order")
	s.Order = o
	s.Scale(2)
	assert.Nil(t, s.Order, "scaled counts are no batch's rows")
}
