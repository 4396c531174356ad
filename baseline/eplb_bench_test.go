package baseline

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moetuner/moetuner/internal/sharedfiles"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// deepSeekPrefill is the SGLang DeepSeek-V3 prefill statistics file in the
// shared data next to the repository, which stays out of the repository.
const deepSeekPrefill = "shared/traces/sglang-deepseek-v3-expert-counts/prefill_in4096.json"

// syntheticSkewed is a DeepSeek-V3-shaped load (58 layers × 256 experts)
// with log-normal expert popularity, from a fixed seed.
func syntheticSkewed() *routing.Stats {
	r := rand.New(rand.NewPCG(42, 58))
	load := make([][]float64, 58)
	for l := range load {
		load[l] = make([]float64, 256)
		for e := range load[l] {
			load[l][e] = math.Round(1000 * math.Exp(r.NormFloat64()))
		}
	}
	return routing.StatsFromLoad(load, 8)
}

// busiestOverMean returns the mean over layers and the worst layer of the
// busiest GPU's load over the mean GPU load, with every expert's tokens
// split evenly over its copies.
func busiestOverMean(p *placement.Plan, load [][]float64) (mean, worst float64) {
	gpu := make([]float64, p.GPUs)
	copies := make([]int, p.Experts)
	for l, lp := range p.Layers {
		clear(gpu)
		clear(copies)
		for _, e := range lp.SlotExpert {
			copies[e]++
		}
		total, busiest := 0.0, 0.0
		for s, e := range lp.SlotExpert {
			gpu[lp.SlotGPU[s]] += load[l][e] / float64(copies[e])
		}
		for _, x := range gpu {
			total += x
			busiest = max(busiest, x)
		}
		if total == 0 {
			continue
		}
		ratio := busiest / (total / float64(p.GPUs))
		mean += ratio
		worst = max(worst, ratio)
	}
	return mean / float64(len(p.Layers)), worst
}

// BenchmarkEPLB times EPLB on the DeepSeek-V3 prefill shape: 58 layers ×
// 256 experts, 32 redundant slots (288 per layer) on 32 GPUs, with the
// global policy and with 8 groups on 4 nodes. "port" is RebalanceExperts
// alone; "plan" is EPLB, which also builds the placement.Plan and repairs duplicate
// copies (FixDuplicates). It reports the busiest/mean GPU load, averaged
// over layers and for the worst layer.
func BenchmarkEPLB(b *testing.B) {
	inputs := []struct {
		name  string
		stats func(b *testing.B) *routing.Stats
	}{
		{"synthetic", func(*testing.B) *routing.Stats { return syntheticSkewed() }},
		{"deepseek-prefill4096", func(b *testing.B) *routing.Stats {
			path := sharedfiles.Find(deepSeekPrefill)
			if path == "" {
				b.Skip("shared DeepSeek statistics not found; skipping")
			}
			// routing.Load drops the three all-zero dense layers.
			src, err := routing.Load(path, routing.LoadOptions{})
			if err != nil {
				b.Fatal(err)
			}
			return src.Stats
		}},
	}
	policies := []struct {
		name string
		opts EPLBOptions
	}{
		{"global", EPLBOptions{RedundantSlots: 32, FixDuplicates: true}},
		{"hierarchical", EPLBOptions{RedundantSlots: 32, Groups: 8, Nodes: 4, FixDuplicates: true}},
	}
	const gpus = 32
	for _, in := range inputs {
		b.Run(in.name, func(b *testing.B) {
			st := in.stats(b)
			for _, pol := range policies {
				b.Run(pol.name+"/port", func(b *testing.B) {
					groups, nodes := max(pol.opts.Groups, 1), max(pol.opts.Nodes, 1)
					var res *placement.EPLBMaps
					for b.Loop() {
						var err error
						res, err = RebalanceExperts(st.Load, st.Experts+pol.opts.RedundantSlots, groups, nodes, gpus)
						if err != nil {
							b.Fatal(err)
						}
					}
					p := &placement.Plan{GPUs: gpus, Experts: st.Experts, Layers: make([]placement.LayerPlan, len(res.Phy2Log))}
					for l, row := range res.Phy2Log {
						lp := placement.LayerPlan{SlotExpert: make([]routing.Expert, len(row)), SlotGPU: make([]placement.GPU, len(row))}
						for s, e := range row {
							lp.SlotExpert[s], lp.SlotGPU[s] = routing.Expert(e), placement.GPU(s/(len(row)/gpus))
						}
						p.Layers[l] = lp
					}
					mean, worst := busiestOverMean(p, st.Load)
					b.ReportMetric(mean, "busiest/mean")
					b.ReportMetric(worst, "worst-busiest/mean")
				})
				b.Run(pol.name+"/plan", func(b *testing.B) {
					var p *placement.Plan
					for b.Loop() {
						var err error
						if p, err = EPLB(st, gpus, pol.opts); err != nil {
							b.Fatal(err)
						}
					}
					mean, worst := busiestOverMean(p, st.Load)
					b.ReportMetric(mean, "busiest/mean")
					b.ReportMetric(worst, "worst-busiest/mean")
				})
			}
		})
	}
}
