package stackdispatch

import "fmt"

// SGLangDynamicShares appends to out, for each position of cands, the share
// of rank's tokens routed to this expert that SGLang's dynamic dispatch sends
// to that copy in expectation, and returns the extended slice. Upstream
// (_topk_ids_logical_to_physical_dynamic, python/sglang/srt/eplb/
// expert_location_dispatch.py@68836b60f99d117ec96b5c8d7e49400724f25aca)
// draws torch.randint(0, 65536) per token and takes it modulo the number of
// candidates in the rank's logical_to_all_physical_map row, so copy i of n
// gets (65536/n + [i < 65536 mod n]) / 65536 (not exactly 1/n unless n is a
// power of two). The torch draws themselves cannot be reproduced here; only
// their expectation. In the trees with a same-node rule and SGLangInitByMapping
// that row was first narrowed for the rank to its nearest copy
// (SGLangNearest), which then gets 1; v and init name the tree and the init
// as for SGLangStaticTable. cands must be non-empty; an empty list appends
// nothing.
func SGLangDynamicShares(cands []int32, rank, slotsPerGPU, gpusPerNode int, v SGLangVariant, init SGLangInit, out []float64) []float64 {
	n := len(cands)
	if n == 0 {
		return out
	}
	if v != SGLangStaticPlain && init == SGLangInitByMapping {
		if p := SGLangNearest(cands, rank, slotsPerGPU, gpusPerNode, v); p != -1 {
			for _, c := range cands {
				if c == p {
					out = append(out, 1)
					p = -2 // a repeated id (never in SGLang's lists) gets nothing
				} else {
					out = append(out, 0)
				}
			}
			return out
		}
	}
	const draws = 65536
	for i := 0; i < n; i++ {
		hits := draws / n
		if i < draws%n {
			hits++
		}
		out = append(out, float64(hits)/draws)
	}
	return out
}

// vllmKnuth is the multiplier of vLLM's replica hash, floor(2^32 / phi).
const vllmKnuth = 2654435769

// VLLMReplica returns the index, into the expert's row of vLLM's
// logical_to_physical_map, of the copy vLLM sends a token to (newest tree:
// _eplb_map_and_record_i32_kernel in vllm-project/vllm
// vllm/distributed/eplb/cuda_platform_backend.py@
// 645f77552e82d2bc7c3ffc8f3bfaedb511ed95f3): ((tokenIndex * 2654435769) &
// 0xFFFFFFFF) mod copies, computed in int64 by Triton; the low 32 bits of
// the product are the same in Go's wrapping uint64 arithmetic for every int64
// tokenIndex, so the result is exact. tokenIndex is offs // top_k, the row of
// the token in the topk_ids tensor of this rank's forward pass: its index in
// the rank's local batch (padding rows included), restarting at 0 every
// forward pass and the same for every MoE layer and every k of the token.
// copies < 1 is treated as 1 (the kernel's tl.maximum(replica_count, 1)).
// Under vLLM's MLB routing (VLLM_MLB_L2_ALGORITHM, vllm/distributed/eplb/
// mlb_runtime.py) the kernel samples from MLB's replica shares instead; that
// is not modelled here.
func VLLMReplica(tokenIndex int64, copies int) int {
	if copies < 1 {
		copies = 1
	}
	h := (uint64(tokenIndex) * vllmKnuth) & 0xffffffff
	return int(h % uint64(copies))
}

// VLLMReplicaFlat returns the copy index of the tree before the hash
// (vllm/model_executor/layers/fused_moe/router/base_router.py@
// 03919875d63dee772b22935326c8ad468683e43e and the torch path it matched):
// offs mod copies, offs = token row * top_k + k, the flat position in this
// rank's topk_ids. copies < 1 is treated as 1. (Older still, vLLM drew
// (rand_like * copies).long() per entry: uniform, 1/copies per copy in
// expectation.)
func VLLMReplicaFlat(flatIndex int64, copies int) int {
	if copies < 1 {
		copies = 1
	}
	return int(flatIndex % int64(copies))
}

// trtllmBlock is the number of flat top-k entries one thread block of
// moeComputeRouteKernel routes (THREAD_COUNT 256 x ITEM_PER_THREAD 4).
const trtllmBlock = 256 * 4

// TRTLLMRoute appends to out the global slot id TensorRT-LLM's
// moeComputeRouteKernel (NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/
// moeLoadBalance/moeLoadBalanceKernels.cu@
// ada8389ee4c35f398d95701e231e8b2405ebc606) gives each entry of experts, one
// rank's token_selected_experts for one forward pass flattened token-major
// (entry f = token*topK + k), and returns the extended slice. replicas[e]
// lists expert e's global slot ids in placementInfo.globalSlotIds order
// (ascending slot id as the kernels' tests build it). The kernel cuts the
// entries into blocks of 1024; in block b an entry of an expert with c > 1
// copies takes copy (b + rankOffset + the number of earlier entries of the
// same expert in the block) mod c. rankOffset is the EP rank when attention
// DP is on (route(offset_by_ep_rank=use_dp) in
// tensorrt_llm/_torch/modules/fused_moe) and 0 otherwise. An expert id outside
// [0, len(replicas)) gets invalidSlot (the kernel writes epSize *
// slotCountPerRank). It fails when an expert that occurs has no copy.
func TRTLLMRoute(experts []int32, replicas [][]int32, rankOffset int, invalidSlot int32, out []int32) ([]int32, error) {
	seen := make([]int, len(replicas))
	for start := 0; start < len(experts); start += trtllmBlock {
		clear(seen)
		b := start / trtllmBlock
		for _, e := range experts[start:min(start+trtllmBlock, len(experts))] {
			if e < 0 || int(e) >= len(replicas) {
				out = append(out, invalidSlot)
				continue
			}
			c := len(replicas[e])
			if c == 0 {
				return out, fmt.Errorf("stackdispatch: expert %d has no slot", e)
			}
			if c == 1 {
				out = append(out, replicas[e][0])
				continue
			}
			idx := b + rankOffset + seen[e]
			seen[e]++
			out = append(out, replicas[e][idx%c])
		}
	}
	return out, nil
}
