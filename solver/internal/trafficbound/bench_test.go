package trafficbound

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/internal/sharedfiles"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// remoteByLayer is Σ_t Count·R_t per layer for plan, from costmodel (a
// layer's CrossNodeBytes are both phases of token bytes).
func remoteByLayer(b *testing.B, st *routing.Stats, plan *placement.Plan, nodes, gpusPerNode int, d placement.Dispatch) []float64 {
	cl, err := costmodel.ClusterPreset("h200x8")
	if err != nil {
		b.Fatal(err)
	}
	cl = cl.WithNodes(nodes)
	cl.GPUsPerNode = gpusPerNode
	m := costmodel.Model{Name: "bench", Layers: st.Layers, Experts: st.Experts, TopK: st.TopK, Hidden: 64, FFN: 64, BytesPerActivation: 2}
	rep, err := costmodel.Scenario{Stats: st, Cluster: cl, Model: m, Dispatch: d}.Evaluate(plan)
	if err != nil {
		b.Fatal(err)
	}
	out := make([]float64, st.Layers)
	for l, lr := range rep.Layers {
		out[l] = lr.CrossNodeBytes / 2 / m.TokenBytes()
	}
	return out
}

// nodePlan turns a node assignment into a layer plan: on each node the
// experts go to its GPUs by decreasing load onto the least loaded GPU
// with a free slot, then the free slots take copies of the node's
// hottest experts on another GPU of the same node (a node-local copy
// changes no remote count under any dispatch).
func nodePlan(load []float64, node []int, N, P, slots int) placement.LayerPlan {
	var lp placement.LayerPlan
	for B := range N {
		var ex []int
		for e, n := range node {
			if n == B {
				ex = append(ex, e)
			}
		}
		slices.SortStableFunc(ex, func(a, b int) int { return cmpDesc(load[a], load[b]) })
		gl := make([]float64, P)
		free := slices.Repeat([]int{slots}, P)
		holds := make([][]int, P)
		put := func(e int, skip int) bool {
			best := -1
			for g := range P {
				if free[g] > 0 && g != skip && !slices.Contains(holds[g], e) && (best < 0 || gl[g] < gl[best]) {
					best = g
				}
			}
			if best < 0 {
				return false
			}
			free[best]--
			gl[best] += load[e]
			holds[best] = append(holds[best], e)
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
			lp.SlotGPU = append(lp.SlotGPU, placement.GPU(B*P+best))
			return true
		}
		for _, e := range ex {
			if !put(e, -1) {
				panic("node over capacity")
			}
		}
		for i := 0; sum(free) > 0 && len(ex) > 0; i++ {
			put(ex[i%len(ex)], -1)
			if i > 4*len(ex) {
				break
			}
		}
	}
	return lp
}

// BenchmarkHomeRemote bounds every layer of the shared DeepSeek-V3-shaped
// trace (4 nodes × 8 GPUs, 32 redundant slots, static dispatch; and
// without redundant slots) and of the repository's FLAME-MoE trace (2 ×
// 4 GPUs), timing the bound (2 layers at a time) and reporting its ratio
// to EPLB's plan (all layers) and to a node-level swap search that keeps
// node loads within EPLB's (every 8th layer, for time).
func BenchmarkHomeRemote(b *testing.B) {
	for _, tc := range []struct {
		name               string
		path               string
		nodes, gpus, slots int
		d                  placement.Dispatch
	}{
		{"ds3/static-r32", "shared/traces/synthetic-deepseek-v3/ds3-prefill4096-32k.npy", 4, 8, 9, placement.DispatchStaticMean},
		{"ds3/even-r0", "shared/traces/synthetic-deepseek-v3/ds3-prefill4096-32k.npy", 4, 8, 8, placement.DispatchEven},
		{"flame/static-r8", "testdata/flame-moe-290m", 2, 4, 9, placement.DispatchStaticMean},
		{"flame/even-r0", "testdata/flame-moe-290m", 2, 4, 8, placement.DispatchEven},
	} {
		b.Run(tc.name, func(b *testing.B) {
			path := sharedfiles.Find(tc.path)
			if path == "" {
				b.Skipf("%s not found; skipping", tc.path)
			}
			src, err := routing.Load(path, routing.LoadOptions{})
			if err != nil {
				b.Fatal(err)
			}
			st := src.Stats
			G := tc.nodes * tc.gpus
			R := G*tc.slots - st.Experts
			eplb, err := baseline.EPLB(st, G, baseline.EPLBOptions{RedundantSlots: R, FixDuplicates: true})
			if err != nil {
				b.Fatal(err)
			}
			eplbCost := remoteByLayer(b, st, eplb, tc.nodes, tc.gpus, tc.d)
			// Comparison plan on every 8th layer (the others keep EPLB's).
			search := &placement.Plan{GPUs: G, Experts: st.Experts, Layers: slices.Clone(eplb.Layers)}
			var sampled []int
			for l := 0; l < st.Layers; l += 8 {
				sampled = append(sampled, l)
				node, nodeLoad := make([]int, st.Experts), make([]float64, tc.nodes)
				copies := make([]int, st.Experts)
				for _, e := range eplb.Layers[l].SlotExpert {
					copies[e]++
				}
				seen := make([]bool, st.Experts)
				for s, e := range eplb.Layers[l].SlotExpert {
					B := int(eplb.Layers[l].SlotGPU[s]) / tc.gpus
					nodeLoad[B] += st.Load[l][e] / float64(copies[e])
					if !seen[e] {
						seen[e], node[e] = true, B
					}
				}
				limit := slices.Max(nodeLoad)
				per := make([]float64, tc.nodes) // start: EPLB's primaries, moved to fit the slots
				cnt := make([]int, tc.nodes)
				for e, B := range node {
					per[B] += st.Load[l][e]
					cnt[B]++
				}
				for e := range node {
					for cnt[node[e]] > tc.gpus*tc.slots {
						B := slices.Index(cnt, slices.Min(cnt))
						cnt[node[e]]--
						cnt[B]++
						node[e] = B
					}
				}
				limit = max(limit, slices.Max(per))
				node = NodeSearch(st, l, tc.nodes, tc.gpus, node, limit, 3)
				search.Layers[l] = nodePlan(st.Load[l], node, tc.nodes, tc.gpus, tc.slots)
			}
			if err := search.Validate(placement.ValidateOptions{}); err != nil {
				b.Fatal(err)
			}
			searchCost := remoteByLayer(b, st, search, tc.nodes, tc.gpus, tc.d)
			var bounds []Bound
			for b.Loop() {
				bounds, err = HomeRemoteLayers(context.Background(), st, Uniform(tc.nodes, tc.gpus, tc.slots), tc.d, Options{Parallel: 2})
				if err != nil {
					b.Fatal(err)
				}
			}
			var lb, ep, lbS, ep2, se float64
			for l, bd := range bounds {
				lb += bd.Value
				ep += eplbCost[l]
				if slices.Contains(sampled, l) {
					lbS += bd.Value
					ep2 += eplbCost[l]
					se += searchCost[l]
				}
			}
			tl := st.Tokens * float64(st.Layers)
			b.ReportMetric(lb/ep, "bound/eplb")
			b.ReportMetric(lbS/se, "bound/search")
			b.ReportMetric(se/ep2, "search/eplb")
			b.ReportMetric(lb/tl, "bound/token-layer")
			b.ReportMetric(ep/tl, "eplb/token-layer")
			b.ReportMetric(se/(st.Tokens*float64(len(sampled))), "search/token-layer")
			if math.IsNaN(lb) {
				b.Fatal("NaN bound")
			}
		})
	}
}
