package costmodel

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
)

// TestParallelLayersSameReport: costing the layers on several goroutines
// gives the report one goroutine gives, bit for bit, in both flows, every
// dispatch, both modes, with replicas and tokens with and without a
// source. A worker that shared another's scratch, or a layer that read
// the layer before's result instead of its shares, differs (and fails
// under -race).
func TestParallelLayersSameReport(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 1))
	c, err := ClusterPreset("2xh100x8")
	require.NoError(t, err)
	c.GPUsPerNode = 2
	G := c.GPUs()
	const L, E, K = 6, 12, 3
	var pats []pat
	for i := 0; i < 300; i++ {
		pats = append(pats, pat{src: int32(rng.IntN(G+1)) - 1, count: float64(1 + rng.IntN(3)), sets: randomSets(rng, L, E, K)})
	}
	st := patternStats(L, E, K, pats)
	m, err := ModelPreset("flame-moe-290m")
	require.NoError(t, err)
	m.Experts = E
	copies := make([][][]placement.GPU, L)
	for l := range copies {
		copies[l] = make([][]placement.GPU, E)
		for e := range copies[l] {
			copies[l][e] = []placement.GPU{placement.GPU((e + l) % G)}
		}
		for _, e := range rng.Perm(E)[:G] {
			g := placement.GPU((int(copies[l][e][0]) + 1 + rng.IntN(G-1)) % G)
			copies[l][e] = append(copies[l][e], g)
		}
	}
	plan := placement.FromReplicas(G, copies, "test")
	for _, flow := range []Flow{FlowHome, FlowChain} {
		for _, d := range []placement.Dispatch{placement.DispatchEven, placement.DispatchStaticMean, placement.DispatchLocal} {
			if flow == FlowChain && d != placement.DispatchEven {
				continue
			}
			for _, mode := range []Mode{Sequential, Overlapped} {
				t.Run(fmt.Sprintf("%s-%s-%s", flow, d, mode), func(t *testing.T) {
					ev, err := newEngine(st, c, m, Options{Flow: flow, Dispatch: d, Mode: mode})
					require.NoError(t, err)
					sh, err := ev.planShares(plan)
					require.NoError(t, err)
					one := make([]LayerReport, L)
					t1 := ev.layerReports(sh, one, 1)
					for _, w := range []int{2, 3, L + 2} {
						many := make([]LayerReport, L)
						tw := ev.layerReports(sh, many, w)
						require.Equal(t, t1, tw, "%d workers: layer times", w)
						require.Equal(t, one, many, "%d workers: layer reports", w)
					}
				})
			}
		}
	}
}
