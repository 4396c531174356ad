package solver_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/routing"
	. "github.com/moetuner/moetuner/solver"
)

// zipfLoads makes L layers of E expert loads with DeepSeek-like skew
// (Zipf exponent 1.1 over a random permutation per layer), fixed seed.
func zipfLoads(L, E int, seed uint64) [][]float64 {
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([][]float64, L)
	for l := range out {
		out[l] = make([]float64, E)
		perm := rng.Perm(E)
		for i, e := range perm {
			out[l][e] = math.Round(1e6 / math.Pow(float64(i+1), 1.1))
		}
	}
	return out
}

// BenchmarkScaling is the scaling table: the replicated joint strategy (with
// HiGHS for the exact pair method where GPUs hold two slots)
// (one redundant slot per GPU, 8 layers, GPUs 8 per node) for 8–256
// experts on 8–128 GPUs. Metrics: busiest/mean, the largest per-layer
// gap to the certified bound, and the same for greedy without replicas
// where it exists (E ≥ G).
func BenchmarkScaling(b *testing.B) {
	for _, E := range []int{8, 64, 128, 256} {
		for _, G := range []int{8, 32, 64, 128} {
			slots := E + G
			if slots%G != 0 {
				slots += G - slots%G
			}
			b.Run(fmt.Sprintf("E%d/G%d", E, G), func(b *testing.B) {
				stats := routing.StatsFromLoad(zipfLoads(8, E, uint64(E*1000+G)), 8)
				c, err := costmodel.ClusterPreset(fmt.Sprintf("%dxh100x8", G/8))
				if err != nil {
					b.Fatal(err)
				}
				m := costmodel.Model{Name: "synthetic", Layers: 8, Experts: E, TopK: 8, Hidden: 7168, FFN: 2048, BytesPerActivation: 2}
				p := Problem{Stats: stats, Cluster: c, Model: m, RedundantSlots: slots - E}
				var res *Result
				for b.Loop() {
					res, err = Solve(context.Background(), p, Options{Strategy: StrategyJoint, TimeLimit: 60 * time.Second})
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(res.Report.MeanBalance, "max/mean")
				b.ReportMetric(100*res.Balance.MaxGap, "gap%")
				if E >= G && E%G == 0 {
					pg := p
					pg.RedundantSlots = 0
					g, err := Solve(context.Background(), pg, Options{Strategy: StrategyGreedy})
					if err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(g.Report.MeanBalance, "greedy-max/mean")
				}
			})
		}
	}
}
