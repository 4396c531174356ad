// Package stackdispatch reproduces, as exact functions, how each serving
// stack sends a token routed to a logical expert to one of that expert's
// physical copies, so that a placement can be scored as the stack really
// dispatches it.
//
// Conventions. A physical id p (SGLang's physical expert id, TensorRT-LLM's
// global slot id) lives on GPU p / slotsPerGPU and on node p / (slotsPerGPU *
// gpusPerNode); EP rank r is GPU r and sits on node r / gpusPerNode. A
// candidate list is a logical expert's physical ids in the order the stack
// holds them (ascending physical id when SGLang builds them from a
// physical_to_logical_map; EPLB's log2phy order when it takes them from
// init_by_eplb).
//
// SGLang, --ep-dispatch-algorithm static (SGLangStaticTable): one table
// [rank][layer][expert] -> physical id built at startup by
// compute_logical_to_rank_dispatch_physical_map
// (python/sglang/srt/eplb/expert_location.py) from one random.Random(42)
// consumed layer by layer, expert by expert; every token of a rank goes to the
// one copy the table names. Three upstream trees differ (SGLangVariant), and
// in the trees with a same-node rule a table read from a physical_to_logical_map
// is built per rank from candidates narrowed for that rank (SGLangInit), which
// changes the random stream each rank sees. See SGLangStaticTable for the rule
// of which inputs move the stream.
//
// SGLang, dynamic (SGLangDynamicShares): per token, randint(0, 65536) modulo
// the number of candidates, over that rank's candidate list.
//
// vLLM (VLLMReplica, VLLMReplicaFlat): a replica chosen per token from its row
// index in the rank's batch (newest) or its flat top-k position (older).
//
// TensorRT-LLM (TRTLLMRoute): a round robin inside blocks of 1024 flat top-k
// entries, offset by the block index and, with attention DP, by the EP rank.
//
// CountTokens recounts, token by token, what a dispatch rule sends to each
// GPU; tests use it to check any load model against the rule itself.
package stackdispatch
