package trafficbound

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/testkit"
)

// TestChainLayersBelowCostModelOptimum: on small chain-flow instances the
// sum of ChainLayers' bounds never exceeds the least dispatch copies
// across nodes that the cost model counts (Report.RemoteCopies) over every
// single-copy plan of every layer, enumerated. It ties the pieces (the
// homes' dispatch for layer 0, the transitions after it) to what the cost
// model counts: a bound on another quantity, or one summed over the wrong
// layers, fails it, and so does a vacuous one.
func TestChainLayersBelowCostModelOptimum(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 5))
	shapes := []struct{ E, N, P, slots, k int }{{4, 2, 2, 1, 2}, {4, 2, 1, 2, 2}, {6, 3, 1, 2, 2}, {4, 2, 1, 2, 1}}
	ratio := 0.0
	for i := range 8 {
		s := shapes[i%len(shapes)]
		layers := 3
		if s.E > 4 {
			layers = 2 // 90 placements a layer
		}
		in := randomInstance(r, s.E, s.N, s.P, s.slots, s.k, 4+r.IntN(5), layers, true)
		st := in.stats
		bs, err := ChainLayers(context.Background(), st, in.shape, Options{Parallel: 2})
		require.NoError(t, err)
		require.Len(t, bs, st.Layers)
		bound := 0.0
		for l, b := range bs {
			bound += b.Value
			if l > 0 { // the shared pair budgets change nothing
				one, err := ChainCrossNode(context.Background(), st, l, in.shape, Options{})
				require.NoError(t, err)
				assert.Equal(t, one.Value, b.Value, "%s layer %d", in.name, l)
			}
		}
		sc := costmodel.Scenario{Stats: st, Cluster: testkit.SmallCluster(s.N, s.P), Model: testkit.FakeModel(s.E, s.k), Flow: costmodel.FlowChain}
		G := s.N * s.P
		layer := singleCopyPlacements(s.E, G, s.slots)
		best := math.Inf(1)
		idx := make([]int, st.Layers)
		for {
			copies := make([][][]placement.GPU, st.Layers)
			for l := range copies {
				copies[l] = layer[idx[l]]
			}
			rep, err := sc.Evaluate(placement.FromReplicas(G, copies, "brute"))
			require.NoError(t, err)
			best = min(best, rep.RemoteCopies)
			l := 0
			for ; l < len(idx); l++ {
				if idx[l]++; idx[l] < len(layer) {
					break
				}
				idx[l] = 0
			}
			if l == len(idx) {
				break
			}
		}
		assert.LessOrEqual(t, bound, best*(1+1e-9)+1e-9, "%s: bound %v above the cost model's optimum %v", in.name, bound, best)
		ratio += bound / max(best, 1e-12)
	}
	// Not vacuous (a bound of 0 passes the check above): 0.74 measured.
	assert.Greater(t, ratio/8, 0.5, "mean bound/optimum")
}

// singleCopyPlacements lists every placement of E experts, one copy each,
// on G GPUs of slots slots.
func singleCopyPlacements(E, G, slots int) [][][]placement.GPU {
	var out [][][]placement.GPU
	gpu := make([]int, E)
	used := make([]int, G)
	var rec func(e int)
	rec = func(e int) {
		if e == E {
			p := make([][]placement.GPU, E)
			for x, g := range gpu {
				p[x] = []placement.GPU{placement.GPU(g)}
			}
			out = append(out, p)
			return
		}
		for g := range G {
			if used[g] < slots {
				used[g]++
				gpu[e] = g
				rec(e + 1)
				used[g]--
			}
		}
	}
	rec(0)
	return out
}

// TestEachLayerKeepsWhatFinished: when the context ends part-way, the
// layers bounded before are returned with the context's error, the one
// it stopped is marked unbounded (empty Method), and every layer holds its
// own bound or none, never a made-up value; without an end every layer is
// returned.
func TestEachLayerKeepsWhatFinished(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bs, err := eachLayer(ctx, 10, 1, func(l int) (Bound, error) {
		if l == 4 {
			cancel()
			return Bound{}, ctx.Err()
		}
		return Bound{Value: float64(l + 1), Method: MethodMoments}, nil
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Len(t, bs, 10)
	for l, b := range bs {
		if l < 4 {
			assert.Equal(t, float64(l+1), b.Value, "layer %d", l)
			assert.Equal(t, MethodMoments, b.Method, "layer %d", l)
			continue
		}
		if l == 4 || b.Method == "" {
			// The layer the end stopped, or one not started: unbounded.
			assert.Empty(t, b.Method, "layer %d", l)
			assert.Zero(t, b.Value, "layer %d", l)
			continue
		}
		// A layer already handed to a worker may finish after the end.
		assert.Equal(t, float64(l+1), b.Value, "layer %d", l)
	}
	bs, err = eachLayer(context.Background(), 5, 2, func(l int) (Bound, error) {
		return Bound{Value: 1, Method: MethodMoments}, nil
	})
	require.NoError(t, err)
	for _, b := range bs {
		assert.Equal(t, MethodMoments, b.Method)
	}
}
