package placement

import "github.com/moetuner/moetuner/routing"

// GPU is an expert-parallel rank, 0-based. GPU g lives on node g/GPUsPerNode.
type GPU int

// Plan places the physical expert slots of every MoE layer on GPUs.
type Plan struct {
	// GPUs is the number of expert-parallel ranks.
	GPUs int
	// Experts is the number of logical experts per layer.
	Experts int
	// Layers holds one LayerPlan per MoE layer.
	Layers []LayerPlan
	// Strategy names what produced the plan ("joint", "contiguous", ...);
	// informational.
	Strategy string
	// Meta records provenance (flow, objective, source trace, ...) as
	// free-form key/value pairs; nil and empty are equivalent. Writers emit
	// the keys sorted.
	Meta map[string]string
}

// LayerPlan maps the physical slots of one layer: slot s holds logical expert
// SlotExpert[s] on GPU SlotGPU[s]. With one copy per expert there are
// Experts slots; replication adds slots.
type LayerPlan struct {
	SlotExpert []routing.Expert
	SlotGPU    []GPU
	// SlotShare, when set, is the fraction of its expert's tokens each slot
	// serves (the copies of an expert add up to 1), as a dispatch-time
	// split such as SGLang's LP would send them; nil means every copy
	// serves an even share, as vLLM and SGLang's static dispatch do.
	SlotShare []float64
}
