package main

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// TestPlanLayout: the trace's layer ids and decoder-layer count win over
// the model's, the model fills in what the trace lacks, and what neither
// knows stays unknown. Swapping the precedence, or trusting a model of
// another shape, fails a case.
func TestPlanLayout(t *testing.T) {
	ds, _ := costmodel.ModelPreset("deepseek-v3")
	flame, _ := costmodel.ModelPreset("flame-moe-290m")
	mix, _ := costmodel.ModelPreset("mixtral-8x7b")
	cluster := costmodel.Cluster{Nodes: 4, GPUsPerNode: 8}
	stats := func(layers, experts int, names []int, model int) *routing.Stats {
		s := routing.StatsFromLoad(make([][]float64, layers), 8)
		s.Experts, s.LayerNames, s.ModelLayers = experts, names, model
		return s
	}
	ids := func(from, to int) []int {
		var out []int
		for i := from; i < to; i++ {
			out = append(out, i)
		}
		return out
	}
	noDecoder := mix
	noDecoder.DecoderLayers = 0
	cases := []struct {
		name  string
		stats *routing.Stats
		model costmodel.Model
		want  placement.Layout
	}{
		{"SGLang dump: the trace knows", stats(58, 256, ids(3, 61), 61), ds,
			placement.Layout{LayerIDs: ids(3, 61), ModelLayers: 61}},
		{"the trace wins over the preset", stats(58, 256, ids(2, 60), 62), ds,
			placement.Layout{LayerIDs: ids(2, 60), ModelLayers: 62}},
		{"npy trace: the preset knows", stats(58, 256, nil, 0), ds,
			placement.Layout{LayerIDs: ids(3, 61), ModelLayers: 61}},
		{"FLAME: the trace's ids, the preset's count", stats(8, 64, ids(2, 10), 0), flame,
			placement.Layout{LayerIDs: ids(2, 10), ModelLayers: 10}},
		{"every row a layer: the trace knows", stats(4, 8, nil, 4), ds,
			placement.Layout{ModelLayers: 4}},
		{"Mixtral: all MoE", stats(32, 8, nil, 0), mix,
			placement.Layout{LayerIDs: ids(0, 32), ModelLayers: 32}},
		{"a preset of another shape gives only its decoder-layer count", stats(3, 8, nil, 0), mix,
			placement.Layout{ModelLayers: 32}},
		{"a preset too small for the trace's ids", stats(2, 64, []int{11, 12}, 0), flame,
			placement.Layout{LayerIDs: []int{11, 12}}},
		{"nobody knows", stats(32, 8, nil, 0), noDecoder, placement.Layout{}},
		{"unsorted names are unknown", stats(2, 8, []int{5, 1}, 0), noDecoder, placement.Layout{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.want.GPUs, tc.want.Experts, tc.want.Layers = 32, tc.stats.Experts, tc.stats.Layers
			assert.Equal(t, tc.want, planLayout(tc.stats, tc.model, cluster))
		})
	}
}
