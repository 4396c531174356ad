package costmodel

import (
	"fmt"

	"github.com/moetuner/moetuner/routing"
)

// InferModel returns the model preset matching stats' shape: the first
// (by name) with the same experts, MoE layers and top-k (top-k unknown
// matches any), else the first with the same experts and top-k. It fails,
// naming the shape, when no preset matches. The command line and
// solver.Solve both use it when no model is given.
func InferModel(stats *routing.Stats) (Model, error) {
	for _, name := range ModelNames() {
		m, _ := ModelPreset(name)
		if m.Experts == stats.Experts && m.Layers == stats.Layers && (stats.TopK == 0 || m.TopK == stats.TopK) {
			return m, nil
		}
	}
	for _, name := range ModelNames() {
		m, _ := ModelPreset(name)
		if m.Experts == stats.Experts && (stats.TopK == 0 || m.TopK == stats.TopK) {
			return m, nil
		}
	}
	return Model{}, fmt.Errorf("costmodel: no model preset has %d experts and top-%d like the trace; give the model (a preset name or a YAML file)", stats.Experts, stats.TopK)
}

// FitExperts adapts c to a model with few experts: with fewer than 16
// experts per layer and more GPUs per node than half of them, a node gets
// experts/2 GPUs, so that each GPU holds two experts (MoETuner's EP4 for
// Mixtral-8x7B's 8 experts). Per-GPU speeds are dropped when the GPU count
// changes. Other clusters are returned unchanged. The command line applies
// it unless --gpus-per-node is given.
func (c Cluster) FitExperts(experts int) Cluster {
	if experts < 16 && experts >= 2 && c.GPUsPerNode > experts/2 {
		c.GPUsPerNode = experts / 2
		c.Speed = nil
	}
	return c
}
