package placement

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/routing"
)

func TestParseDispatch(t *testing.T) {
	for d := Dispatch(0); d.Valid(); d++ {
		got, err := ParseDispatch(d.String())
		require.NoError(t, err)
		assert.Equal(t, d, got)
	}
	got, err := ParseDispatch("static")
	require.NoError(t, err)
	assert.Equal(t, DispatchSGLangStatic, got, "static is SGLang's table, not its expectation")
	_, err = ParseDispatch("nearest")
	assert.ErrorContains(t, err, "want even, local, static-mean, sglang-static")
	assert.False(t, Dispatch(-1).Valid())
}

// StaticSplit: own copy wins, every other source splits evenly. The
// mutation "prefer a copy on the own node" (LocalSplit's rule) fails the
// row of GPU 1, which shares node 0 with the copy on GPU 0.
func TestStaticSplit(t *testing.T) {
	gpus := []int32{0, 3}
	frac := make([]float64, 4*2)
	StaticSplit(gpus, 4, frac)
	assert.Equal(t, []float64{1, 0, 0.5, 0.5, 0.5, 0.5, 0, 1}, frac)
	local := make([]float64, 4*2)
	LocalSplit(gpus, 4, 2, local)
	assert.NotEqual(t, frac, local, "static dispatch has no node preference")
}

// 4 nodes × 2 GPUs; copies on GPU 0 (node 0) and GPUs 2, 3 (node 1).
// Node 0's two sources go to GPU 0, GPUs 2 and 3 keep their own tokens,
// so the copies start at a = (2, 1, 1) sources; the four sources of nodes
// 2 and 3 are water-filled to the common level 8/3.
func TestLocalSplitWaterFill(t *testing.T) {
	gpus := []int32{0, 2, 3}
	frac := make([]float64, 8*3)
	LocalSplit(gpus, 8, 2, frac)
	row := func(h int) []float64 { return frac[h*3 : h*3+3] }
	assert.Equal(t, []float64{1, 0, 0}, row(0))
	assert.Equal(t, []float64{1, 0, 0}, row(1))
	assert.Equal(t, []float64{0, 1, 0}, row(2))
	assert.Equal(t, []float64{0, 0, 1}, row(3))
	// λ = (4 + 2 + 1 + 1)/3 = 8/3: fills (2/3, 5/3, 5/3) over 4 sources.
	for h := 4; h < 8; h++ {
		assert.InDeltaSlice(t, []float64{1.0 / 6, 5.0 / 12, 5.0 / 12}, row(h), 1e-12)
	}
	// Totals per copy are equal: 8/3 sources each.
	tot := make([]float64, 3)
	for h := 0; h < 8; h++ {
		for i, x := range row(h) {
			tot[i] += x
		}
	}
	assert.InDeltaSlice(t, []float64{8.0 / 3, 8.0 / 3, 8.0 / 3}, tot, 1e-12)
}

func TestLocalFractions(t *testing.T) {
	lp := LayerPlan{SlotExpert: []routing.Expert{0, 1, 0, 1}, SlotGPU: []GPU{0, 1, 2, 3}}
	f, err := LocalFractions(lp, 2, 4, 2)
	require.NoError(t, err)
	// Both experts have a copy on each node: every source uses its
	// node's copies (slots 0, 1 on node 0; 2, 3 on node 1).
	assert.Equal(t, []float64{1, 1, 0, 0}, f[0:4])
	assert.Equal(t, []float64{1, 1, 0, 0}, f[4:8])
	assert.Equal(t, []float64{0, 0, 1, 1}, f[8:12])
	assert.Equal(t, []float64{0, 0, 1, 1}, f[12:16])
	_, err = LocalFractions(lp, 2, 4, 3)
	assert.ErrorContains(t, err, "nodes of 3")
	_, err = LocalFractions(LayerPlan{SlotExpert: []routing.Expert{0}, SlotGPU: []GPU{0}}, 2, 4, 2)
	assert.ErrorContains(t, err, "expert 1 has no slot")
}

func TestLocalDispatchMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for it := 0; it < 200; it++ {
		nodes, P := 1+rng.IntN(4), 1+rng.IntN(4)
		G := nodes * P
		E := G + rng.IntN(2*G)
		perGPU := min(E, (E+G-1)/G+rng.IntN(3))
		p := &Plan{GPUs: G, Experts: E}
		for l := 0; l < 2; l++ {
			// Every expert once, then random extra copies on distinct GPUs.
			var lp LayerPlan
			has := make([]map[int]bool, G)
			fill := make([]int, G)
			for g := range has {
				has[g] = map[int]bool{}
			}
			order := rng.Perm(E)
			for i, e := range order {
				g := i % G
				lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
				lp.SlotGPU = append(lp.SlotGPU, GPU(g))
				has[g][e] = true
				fill[g]++
			}
			for g := range fill {
				for fill[g] < perGPU {
					e := rng.IntN(E)
					if has[g][e] {
						continue
					}
					lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
					lp.SlotGPU = append(lp.SlotGPU, GPU(g))
					has[g][e] = true
					fill[g]++
				}
			}
			p.Layers = append(p.Layers, lp)
		}
		m, err := LocalDispatchMap(p, P)
		require.NoError(t, err)
		q := p.GPUMajor()
		for l, lp := range q.Layers {
			frac, err := LocalFractions(lp, E, G, P)
			require.NoError(t, err)
			S := len(lp.SlotExpert)
			served := make([]int, S)
			for r := 0; r < G; r++ {
				for e := 0; e < E; e++ {
					s := m.Rank[r][l][e]
					require.Equal(t, routing.Expert(e), lp.SlotExpert[s], "it %d rank %d layer %d expert %d", it, r, l, e)
					g := int(lp.SlotGPU[s])
					own, node := false, false
					for s2, e2 := range lp.SlotExpert {
						if int(e2) == e && int(lp.SlotGPU[s2]) == r {
							own = true
						}
						if int(e2) == e && int(lp.SlotGPU[s2])/P == r/P {
							node = true
						}
					}
					if own {
						require.Equal(t, r, g)
					} else if node {
						require.Equal(t, r/P, g/P)
					}
					served[s]++
				}
			}
			for s := range served {
				modeled := 0.0
				for h := 0; h < G; h++ {
					modeled += frac[h*S+s]
				}
				require.InDelta(t, modeled, float64(served[s]), 1+1e-9, "it %d layer %d slot %d", it, l, s)
			}
		}
	}
	var buf bytes.Buffer
	buf.Write((&DispatchMap{GPUs: 2, GPUsPerNode: 1, Rank: [][][]int{{{0, 1}}, {{2, 1}}}}).Encode())
	assert.Equal(t, "{\n  \"num_gpus\": 2,\n  \"gpus_per_node\": 1,\n  \"logical_to_rank_dispatch_physical_map\": [\n    [[0,1]],\n    [[2,1]]\n  ]\n}\n", buf.String())
}
