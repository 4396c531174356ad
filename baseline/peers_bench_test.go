package baseline

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// deepSeekSteps is a DeepSeek-V3-shaped problem: 58 layers × 256 experts
// over 32 steps of skewed loads.
func deepSeekSteps(steps int) *routing.Stats {
	r := rand.New(rand.NewPCG(58, 256))
	st := &routing.Stats{Layers: 58, Experts: 256, Load: make([][]float64, 58)}
	for l := range st.Load {
		st.Load[l] = make([]float64, 256)
	}
	for range steps {
		m := randomWeight(r, 58, 256, 1)
		for l := range m {
			for e := range m[l] {
				m[l][e] = float64(int(m[l][e]/100) + r.IntN(50))
				st.Load[l][e] += m[l][e]
			}
		}
		st.StepLoad = append(st.StepLoad, m)
	}
	return st
}

// BenchmarkPeers times the ports on DeepSeek-V3's shape (32 GPUs, 32
// redundant slots, 32 steps) and reports the busiest/mean GPU load,
// averaged over layers.
func BenchmarkPeers(b *testing.B) {
	st := deepSeekSteps(32)
	cases := []struct {
		name string
		run  func() (float64, error)
	}{
		{"deepseek-vec", func() (float64, error) {
			p, err := DeepSeekVec(st, 32, DeepSeekVecOptions{RedundantSlots: 32, FixDuplicates: true})
			return ratio(st, p.Layers, err)
		}},
		{"deepseek-vec-hierarchical", func() (float64, error) {
			p, err := DeepSeekVec(st, 32, DeepSeekVecOptions{RedundantSlots: 32, Hierarchical: true, Groups: 8, Nodes: 4, FixDuplicates: true})
			return ratio(st, p.Layers, err)
		}},
		{"flashlb", func() (float64, error) {
			p, err := FlashLB(st, 32, FlashLBOptions{RedundantSlots: 32})
			return ratio(st, p.Layers, err)
		}},
		{"flashlb-16-stages", func() (float64, error) {
			p, err := FlashLB(st, 32, FlashLBOptions{RedundantSlots: 32, MaxStages: 16})
			return ratio(st, p.Layers, err)
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var r float64
			for b.Loop() {
				var err error
				if r, err = c.run(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(r, "busiest/mean")
		})
	}
}

func ratio(st *routing.Stats, layers []placement.LayerPlan, err error) (float64, error) {
	if err != nil {
		return 0, err
	}
	sum := 0.0
	for l, lp := range layers {
		loads := gpuLoads(st.Load[l], lp, 32)
		mean := 0.0
		for _, x := range loads {
			mean += x / 32
		}
		sum += slices.Max(loads) / mean
	}
	return sum / float64(len(layers)), nil
}
