package affinity

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/internal/sharedfiles"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// shared32k is the shared 32k-token DeepSeek-V3 trace's statistics on 4
// nodes × 8 H100 with EPLB's plan of redundant extra slots; it skips b
// when the trace is absent.
func shared32k(b *testing.B, redundant int) (*routing.Stats, costmodel.Cluster, costmodel.Model, *placement.Plan) {
	path := sharedfiles.Find("shared/traces/synthetic-deepseek-v3/ds3-prefill4096-32k.npy")
	if path == "" {
		b.Skip("the shared synthetic trace is absent")
	}
	src, err := routing.Load(path, routing.LoadOptions{})
	require.NoError(b, err)
	c, err := costmodel.ClusterPreset("4xh100x8")
	require.NoError(b, err)
	m, err := costmodel.ModelPreset("deepseek-v3")
	require.NoError(b, err)
	plan, err := baseline.EPLB(src.Stats, c.GPUs(), baseline.EPLBOptions{Nodes: c.Nodes, RedundantSlots: redundant, FixDuplicates: redundant > 0})
	require.NoError(b, err)
	return src.Stats, c, m, plan
}

// homeState32k is layer 10's home-flow state on the shared 32k trace, 4 ×
// 8 GPUs, 32 redundant slots, SGLang's table, EPLB's plan.
func homeState32k(b *testing.B) *state {
	st, c, m, plan := shared32k(b, 32)
	sc := costmodel.Scenario{Stats: st, Cluster: c, Model: m, Dispatch: placement.DispatchSGLangStatic}
	slots := make([]int, c.GPUs())
	for g := range slots {
		slots[g] = (st.Experts + 32) / c.GPUs()
	}
	p := Problem{Scenario: sc, Slots: slots, Start: plan}
	sh, err := newShape(p)
	require.NoError(b, err)
	return newState(buildLayer(p, sh, 10), int32Copies(plan.ExpertGPUs(10)))
}

// BenchmarkHomeSwap32k prices swaps of two single-copy experts on
// different nodes: the general trial (try) against the same price read
// from the counters (acrossNodes), and the relocation gains of one expert
// to every node (singleReloc).
func BenchmarkHomeSwap32k(b *testing.B) {
	s := homeState32k(b)
	sh := s.ly.sh
	var singles [][2]int
	for g := range s.held {
		for i, e := range s.held[g] {
			if len(s.cs[e].gpus) == 1 {
				singles = append(singles, [2]int{g, i})
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func() move {
		for {
			x, y := singles[rng.IntN(len(singles))], singles[rng.IntN(len(singles))]
			if x[0]/sh.P != y[0]/sh.P {
				return move{kind: moveSwap, a: x[0], ia: x[1], b: y[0], ib: y[1]}
			}
		}
	}
	b.Run("try", func(b *testing.B) {
		for b.Loop() {
			s.try(pick(), levelNode)
		}
	})
	b.Run("acrossNodes", func(b *testing.B) {
		for b.Loop() {
			s.acrossNodes(pick(), levelNode)
		}
	})
	b.Run("singleReloc", func(b *testing.B) {
		dR := make([]float64, sh.N)
		for b.Loop() {
			mv := pick()
			s.singleReloc(int(s.held[mv.a][mv.ia]), mv.a/sh.P, dR)
		}
	})
}
