// Package placement holds expert placement plans for Mixture-of-Experts
// models: which GPU holds which expert in every MoE layer, how plans are
// checked, how they are read and written (atomically), and how a serving
// stack dispatches tokens among an expert's copies. It holds no placement
// algorithm: the baselines are in package baseline, the solvers in
// package solver.
//
// # Slots
//
// A Plan has GPUs expert-parallel ranks (GPU ids 0..GPUs-1) and Experts
// logical experts per layer (routing.Expert ids 0..Experts-1). Each layer l
// is a list of physical slots: slot s of Layers[l] holds a copy of logical
// expert SlotExpert[s] on GPU SlotGPU[s]. Without replication a layer has
// exactly Experts slots, one per expert; a replicated expert simply has
// several slots on different GPUs, so the same type carries EPLB- or
// SGLang-style redundant experts (P = Experts + redundant slots) without
// change. Layers may have different slot counts.
//
// Slot order carries no meaning in a Plan, but FromAssignment,
// FromReplicas and GPUMajor lay slots out GPU-major: all
// slots of GPU 0 first (by ascending expert id), then GPU 1, and so on.
// When every GPU holds S slots, slot s therefore lives on GPU s/S, which is
// SGLang's and EPLB's convention (slot p on GPU p/(P/ep_size)).
//
// # Validation
//
// Plan.Validate returns a *ValidationError for the first rule broken, in
// this order:
//
//  1. 1 ≤ GPUs ≤ MaxGPUs and 1 ≤ Experts ≤ MaxExperts;
//  2. Experts equals ValidateOptions.Experts and len(Layers) equals
//     ValidateOptions.Layers, where those are set;
//
// then, layer by layer:
//
//  3. len(SlotExpert) == len(SlotGPU);
//  4. every slot's expert is in [0, Experts) and its GPU in [0, GPUs);
//  5. no expert has two copies on the same GPU;
//  6. every expert has at least one slot;
//  7. no GPU holds more slots than ValidateOptions.SlotsPerGPU[g];
//  8. with ValidateOptions.EqualSlots, every GPU holds the same number of
//     slots (required by SGLang and EPLB);
//
// and finally, over the whole model:
//
//  9. no GPU holds more slots summed over all layers than
//     ValidateOptions.TotalExpertsPerGPU[g] (expert weights in memory).
//
// Error messages say what would fix the plan, for example
// "placement: layer 3: expert 5 has two copies on GPU 2 (slot 9); remove one".
//
// # File formats
//
// Formats lists the formats; FormatFromPath picks one from a file name.
// WriteWith and WriteFileWith write, ReadWith and ReadFileWith read; Write,
// WriteFile, Read and ReadFile are the same with the zero Layout, and
// ReadSGLang, ReadEPLB and ReadVLLM are shorthands for ReadWith. Writers
// validate the plan first and never write an invalid one; readers
// validate what they read. Every file moetuner writes goes through
// WriteFileAtomic (temporary file in the same directory, fsync, rename).
// ReadFileWith detects the format from the content, never from the name.
//
// # Layout: what the files do not record
//
// A Plan has one layer per MoE layer and knows its GPU count. The serving
// stacks' files record less, or index layers differently, so readers and
// writers take a Layout:
//
//   - Layout.GPUs is the expert-parallel size for files that do not
//     record it (SGLang, vLLM, TensorRT-LLM without ep_size, EPLB without
//     num_gpus); 0 makes such a read fail with an error wrapping
//     ErrNeedGPUs. Where the file records it (moetuner's "gpus", EPLB's
//     "num_gpus", vllm-ascend's "device_count", TensorRT-LLM's "ep_size")
//     a different non-zero Layout.GPUs is a *GPUCountError naming both.
//   - Layout.LayerIDs[l] is the decoder-layer index of plan layer l
//     (DeepSeek-V3: 3..60) and Layout.ModelLayers the model's decoder
//     layers, dense ones included (num_hidden_layers: 61). LayerIDs nil
//     means every decoder layer is a MoE layer. SGLang's map needs both,
//     TensorRT-LLM's YAML the ids; a layout that lacks them makes the
//     writer (and CheckLayout, which answers before any plan exists) fail
//     with an error wrapping ErrNeedLayers.
//   - Layout.Experts and Layout.Layers, where set, are checked against
//     what is read and written; files that do not record the expert count
//     take Layout.Experts, else the largest expert id plus one.
//
// Every stack format lays a layer out as a rank-major slot list: entry p
// is the logical expert in physical slot p, and slot p lives on rank
// p/(P/ep_size). Writers therefore reorder slots GPU-major (see GPUMajor;
// the placement is unchanged, only slot indices move) and fail unless
// every GPU holds the same number of slots and every layer the same P.
// None of them has a place for SlotShare, which they drop: those stacks
// split at run time. SGLang, vLLM, vllm-ascend and EPLB load at most one
// copy of an expert per rank, so their readers reject a second one (a Plan
// cannot hold one either); TensorRT-LLM loads two, and its reader makes
// them one slot serving both copies' share of the expert's tokens.
//
// FormatJSON ("moetuner", ".json") is moetuner's own file. The layout is
// fixed: two-space indentation, one line per layer, integer lists without
// spaces, meta keys sorted, a final newline:
//
//	{
//	  "schema": "moetuner.placement/v1",
//	  "strategy": "round-robin",
//	  "gpus": 2,
//	  "experts": 4,
//	  "layers": [
//	    {"slot_expert": [0,2,1,3], "slot_gpu": [0,0,1,1]},
//	    {"slot_expert": [0,2,1,3], "slot_gpu": [0,0,1,1]}
//	  ],
//	  "meta": {
//	    "source": "trace.jsonl"
//	  }
//	}
//
// "schema", "gpus", "experts" and "layers" are required, and every layer
// needs "slot_expert" and "slot_gpu"; "strategy" and "meta" (string to
// string: provenance such as the flow model, objective and source trace)
// are optional, and so is a layer's "slot_share" (LayerPlan.SlotShare: the
// fraction of its expert's tokens each slot serves, for a dispatch-time
// split; absent means even shares). Unknown fields are errors, to catch
// misspellings. Layers are the MoE layers in order; the file does not say
// which decoder layers they are.
//
// FormatYAML ("yaml", ".yaml", ".yml") is the same document in YAML
// (gopkg.in/yaml.v3, two-space indentation, flow-style integer lists):
//
//	schema: moetuner.placement/v1
//	strategy: round-robin
//	gpus: 2
//	experts: 4
//	layers:
//	  - slot_expert: [0, 2, 1, 3]
//	    slot_gpu: [0, 0, 1, 1]
//	meta:
//	  source: trace.jsonl
//
// FormatSGLang ("sglang", ".sglang.json") is the file SGLang's
// --init-expert-location loads, with exactly one key:
//
//	{
//	  "physical_to_logical_map": [
//	    [0,1,2,0],
//	    [0,1,2,0],
//	    [0,1,2,0],
//	    [2,0,1,0]
//	  ]
//	}
//
// It is [num_hidden_layers][P]: row d is decoder layer d. Rows of MoE
// layers (Layout.LayerIDs) hold their rank-major slot lists; rows of dense
// layers hold SGLang's own trivial map arange(P) % E. Above, a model of
// four decoder layers whose layers 1 and 3 are MoE; P = 4 on 2 GPUs, 3
// experts. P must equal E + SGLang's --ep-num-redundant-experts. The
// reader takes Layout.LayerIDs' rows (every other row must be the trivial
// map) or, without them, every row. FormatSGLangPT ("sglang-pt",
// ".sglang.pt", ".pt") is the same dict saved the way torch.save saves it,
// the map an int64 tensor [L_all, P]; torch.load(weights_only=True) loads
// it, and the reader takes a tensor or nested lists, never running pickle
// code.
//
// FormatEPLB ("eplb", ".eplb.json") holds DeepSeek EPLB's three maps
// (Plan.EPLBMaps) and the GPU count, one line per layer in every map:
//
//	{
//	  "num_gpus": 2,
//	  "phy2log": [
//	    [0,1,2,0]
//	  ],
//	  "log2phy": [
//	    [[0,3],[1,-1],[2,-1]]
//	  ],
//	  "logcnt": [
//	    [2,1,1]
//	  ]
//	}
//
// One row per MoE layer, slot p on GPU p/(R/num_gpus). log2phy[l][e]
// lists the slots of expert e in ascending order, padded with -1 to the
// largest logcnt. The reader checks that the three maps agree; without
// "num_gpus" it takes Layout.GPUs.
//
// FormatVLLM ("vllm", ".vllm.json") is the {"expert_to_ep_rank": [...]}
// file of vLLM's --expert-placement-file (vllm-project/vllm#34811): the EP
// rank of every expert, one map for all layers and no replicas. The writer
// fails for replicated plans and for plans whose layers differ and says
// to use FormatVLLMMap; the reader repeats the map for Layout.Layers
// layers.
//
// FormatVLLMMap ("vllm-map", ".vllm-map.json") is the JSON of vLLM's
// eplb_config.initial_expert_map_path (vllm-project/vllm#49572): one
// rank-major list of P logical ids per MoE layer, 0-based. The reader also
// takes the single-list form [P], repeated for every MoE layer.
//
//	[
//	  [0,1,2,0],
//	  [2,0,1,0]
//	]
//
// FormatVLLMMapping ("vllm-mapping", ".vllm-mapping.jsonl") is the mapping
// record of vLLM's offline EPLB (vllm-project/vllm#41141), one JSON line,
// lists keyed by MoE-layer index as strings; E = num_slots −
// num_redundant_experts, which must match the server's redundant count:
//
//	{"record_type":"eplb_initial_mapping","version":1,"num_redundant_experts":1,"num_slots":4,"initial_global_assignments":{"0":[0,1,2,0],"1":[2,0,1,0]}}
//
// The reader skips "eplb_load_stats" lines and wants exactly one mapping.
//
// FormatVLLMAscend ("vllm-ascend", ".vllm-ascend.json") is the
// expert_map_path file of vllm-ascend and MindIE: per MoE layer, per
// device, the logical experts of its slots; replicas are repeated ids on
// different devices, every device holds the same number in every layer
// (vllm-ascend stacks them into one tensor), layers and devices count in
// list order:
//
//	{
//	  "moe_layer_count": 2,
//	  "layer_list": [
//	    {"layer_id": 0, "device_count": 2, "device_list": [{"device_id": 0, "device_expert": [0,1]}, {"device_id": 1, "device_expert": [2,0]}]},
//	    {"layer_id": 1, "device_count": 2, "device_list": [{"device_id": 0, "device_expert": [2,0]}, {"device_id": 1, "device_expert": [1,0]}]}
//	  ]
//	}
//
// FormatTRTLLM ("trtllm", ".trtllm.yaml") is the YAML TensorRT-LLM's
// moe_config.load_balancer loads: num_slots (P, divisible by ep_size), the
// rank-major list of every MoE layer keyed by its decoder-layer index
// (Layout.LayerIDs; a missing MoE layer is an error in TensorRT-LLM), and
// layer_updates_per_iter 0 for a static placement:
//
//	num_slots: 4
//	initial_global_assignments:
//	  1: [0, 1, 2, 0]
//	  3: [2, 0, 1, 0]
//	layer_updates_per_iter: 0
//
// The writer leaves out ep_size, which TensorRT-LLM's scripts add but its
// strict config may reject; the reader takes it as the GPU count when
// present.
//
// Load statistics in the {"logical_count": [num_hidden_layers][E]} JSON
// that SGLang's --init-expert-location also takes (it then runs its own
// EPLB) are routing's (routing.WriteStats), not a plan format.
//
// # Determinism
//
// Everything here is deterministic: writers emit fixed formatting and sorted keys, so
// the same plan always gives the same bytes.
package placement
