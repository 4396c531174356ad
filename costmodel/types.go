package costmodel

import "time"

// Cluster describes the hardware: Nodes × GPUsPerNode expert-parallel GPUs,
// NVLink inside a node, one NIC per GPU between nodes.
type Cluster struct {
	Name        string `yaml:"name"`
	Nodes       int    `yaml:"nodes"`
	GPUsPerNode int    `yaml:"gpus_per_node"`
	// NVLinkGBps is the NVLink bandwidth per GPU as vendors quote it
	// (bidirectional aggregate, GB/s = 1e9 bytes/s); each direction gets
	// half. H100/H200 SXM: 900.
	NVLinkGBps float64 `yaml:"nvlink_gbps"`
	// NICGbps is the NIC bandwidth per GPU per direction in Gbit/s
	// (ConnectX-7: 400). Ignored on one node.
	NICGbps float64 `yaml:"nic_gbps"`
	// NVLinkLatency and NICLatency are added once per all-to-all phase that
	// uses the link at all.
	NVLinkLatency time.Duration `yaml:"nvlink_latency"`
	NICLatency    time.Duration `yaml:"nic_latency"`
	// GPUMemBytes is the memory per GPU available for expert weights; 0
	// means unlimited.
	GPUMemBytes int64 `yaml:"gpu_mem_bytes"`
	// MemBytes, when set, gives every GPU its own memory for expert
	// weights (heterogeneous clusters); it overrides GPUMemBytes.
	MemBytes []int64 `yaml:"mem_bytes,flow,omitempty"`
	// TFLOPS is the dense bf16 peak per GPU at speed 1; HBMGBps the memory
	// bandwidth. They set the default compute coefficients.
	TFLOPS  float64 `yaml:"tflops"`
	HBMGBps float64 `yaml:"hbm_gbps"`
	// Efficiency is the achieved fraction of TFLOPS in expert GEMMs
	// (default 0.6).
	Efficiency float64 `yaml:"efficiency"`
	// TokenCost and ExpertCost, when non-zero, override the coefficients
	// derived from TFLOPS/HBMGBps: time per routed token per expert, and
	// fixed time per expert held (weight reads, launch), at speed 1.
	TokenCost  time.Duration `yaml:"token_cost"`
	ExpertCost time.Duration `yaml:"expert_cost"`
	// Speed is the relative speed of each GPU (nil: all 1); compute time is
	// divided by it.
	Speed []float64 `yaml:"speed"`
	// Sigma is the compute slowdown while communication overlaps it
	// (default 0.189, measured mean; allowed range [0, 0.4] is advisory).
	Sigma *float64 `yaml:"sigma"`
}

// Model describes the MoE model's shape.
type Model struct {
	Name    string `yaml:"name"`
	Layers  int    `yaml:"layers"`  // MoE layers
	Experts int    `yaml:"experts"` // routed experts per layer
	TopK    int    `yaml:"top_k"`
	Hidden  int    `yaml:"hidden"` // hidden size
	FFN     int    `yaml:"ffn"`    // expert intermediate size
	// BytesPerActivation is bytes per activation element (bf16: 2).
	BytesPerActivation int `yaml:"bytes_per_activation"`
	// BytesPerExpert is the weight size of one expert (3·Hidden·FFN·dtype
	// for a SwiGLU expert); 0 derives it from Hidden, FFN and
	// BytesPerActivation.
	BytesPerExpert int64 `yaml:"bytes_per_expert"`
	// ExpertGroups is the number of routing groups of group-limited
	// routing (DeepSeek-V3: 8 groups, a token uses at most 4); 0 when the
	// model routes freely. EPLB's hierarchical policy keeps a group on one
	// node.
	ExpertGroups int `yaml:"expert_groups"`
	// DecoderLayers is the model's number of decoder layers, dense ones
	// included (num_hidden_layers); 0 when unknown. Placement files indexed
	// by decoder layer (SGLang's physical_to_logical_map, TensorRT-LLM's
	// initial_global_assignments) need it when the trace does not record
	// the layer ids.
	DecoderLayers int `yaml:"decoder_layers,omitempty"`
	// MoELayerIDs are the decoder-layer indices of the Layers MoE layers,
	// ascending. Nil means the last Layers of the DecoderLayers decoder
	// layers (dense layers first, as DeepSeek-V3's first_k_dense_replace
	// puts them); set it for models that interleave dense and MoE layers.
	MoELayerIDs []int `yaml:"moe_layer_ids,flow,omitempty"`
}

// MoELayers returns the decoder-layer index of every MoE layer (len
// Layers), or nil when DecoderLayers is 0 (unknown) or the fields do not
// fit together (Validate reports it).
func (m Model) MoELayers() []int {
	if m.DecoderLayers < 1 || m.DecoderLayers < m.Layers || m.Layers < 1 {
		return nil
	}
	if m.MoELayerIDs != nil {
		if len(m.MoELayerIDs) != m.Layers {
			return nil
		}
		return append([]int(nil), m.MoELayerIDs...)
	}
	ids := make([]int, m.Layers)
	for i := range ids {
		ids[i] = m.DecoderLayers - m.Layers + i
	}
	return ids
}

// Flow selects how tokens move between GPUs; see the package doc.
type Flow int

const (
	// FlowHome is standard expert parallelism: every layer dispatches each
	// token from its home GPU to the GPUs of its experts and combines back.
	FlowHome Flow = iota
	// FlowChain is MoETuner's Eq. 9 / ExFlow: a token continues from the
	// GPUs that processed its layer-l experts to those of layer l+1.
	FlowChain
)

// Mode selects which modeled layer time is the headline (and the joint
// solver's objective).
type Mode int

const (
	// Sequential: dispatch, compute, combine one after the other.
	Sequential Mode = iota
	// Overlapped: compute overlaps communication and is slowed by Sigma.
	Overlapped
)
