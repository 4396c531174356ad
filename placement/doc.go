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
// Format names the five formats; FormatFromPath picks one from a file
// name, Write and WriteFile write, Read, ReadFile, ReadSGLang, ReadEPLB and
// ReadVLLM read.
// Writers validate the plan first and never write an invalid one; readers
// validate what they read. WriteFile is atomic (temporary file in the same
// directory, fsync, rename).
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
// split; absent means even shares). The SGLang, EPLB and vLLM files have
// no place for shares and drop them: those stacks split at run time.
// Unknown fields are errors, to catch misspellings.
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
// --init-expert-location loads:
//
//	{
//	  "physical_to_logical_map": [
//	    [0,2,1,3],
//	    [0,2,1,3]
//	  ]
//	}
//
// Row l lists the logical expert of every physical slot p of layer l, and
// SGLang puts slot p on GPU p/(P/ep_size), so the GPUs are implicit. The
// writer therefore reorders the slots GPU-major (a stable sort on SlotGPU;
// the placement is unchanged, only slot indices move) and fails unless
// every GPU holds the same number of slots and every layer the same P. The
// file records neither the GPU count nor the strategy or meta: ReadSGLang
// takes the GPU count and infers Experts as the largest id plus one, and
// Read and ReadFile return an error wrapping ErrNeedGPUs for such files.
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
// Slots are GPU-major as in FormatSGLang (slot p on GPU p/(R/num_gpus)),
// with the same requirements on the plan. log2phy[l][e] lists the slots of
// expert e in ascending order, padded with -1 to the largest logcnt. The
// reader checks that the three maps agree; without "num_gpus" it needs
// ReadEPLB(r, gpus).
//
// FormatVLLM ("vllm", ".vllm.json") is the {"expert_to_ep_rank": [...]}
// file of vLLM's --expert-placement-file (vllm-project/vllm#34811): the EP
// rank of every expert, one map for all layers and no replicas. The writer
// fails for replicated plans and for plans whose layers differ, and says
// to use FormatSGLang or FormatEPLB instead; ReadVLLM(r, gpus, layers)
// repeats the map for every layer.
//
// # Determinism
//
// Everything here is deterministic: writers emit fixed formatting and sorted keys, so
// the same plan always gives the same bytes.
package placement
