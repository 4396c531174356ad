// Package baseline holds the placements that need no solver, which every
// moetuner result is compared against: Contiguous (Megatron's default,
// expert e on GPU e/(E/G)), RoundRobin (e on GPU e mod G), Greedy (largest
// load first onto the least loaded GPU with a free slot), EPLB, a
// bit-exact port of DeepSeek's rebalance_experts, and the other
// algorithms the serving stacks ship: DeepSeekVec (SGLang's deepseek_vec)
// and FlashLB (vllm-ascend's FlashLB policy).
//
// # EPLB
//
// RebalanceExperts is a bit-exact port of DeepSeek's rebalance_experts
// (deepseek-ai/EPLB), hierarchical when the expert groups split evenly over
// the nodes and global otherwise, returning its phy2log, log2phy and
// logcnt (placement.EPLBMaps). EPLB runs it on routing statistics and
// returns a placement.Plan whose slot p is EPLB's physical slot p. EPLB's
// packing can put two copies of one expert on one GPU (deepseek-ai/EPLB#22:
// the README example under the global policy, and 20 of 58 layers with the
// global and 48 with the hierarchical policy on SGLang's DeepSeek-V3
// prefill statistics on 32 GPUs), which placement.Plan.Validate rejects:
// EPLB then fails with an error naming the copies, or with
// EPLBOptions.FixDuplicates swaps slots between GPUs of the same node until
// no GPU holds two copies.
//
// # The stacks' other algorithms
//
// DeepSeekVec and RebalanceExpertsVec port SGLang's deepseek_vec and
// deepseek_vec_hierarchical, which see every step's loads ([S][L][E],
// routing.Stats.StepLoad; a trace without steps is one step): a redundant
// slot goes to the expert whose extra copy most lowers the sum over steps
// of the step's largest per-copy load, and the slots are dealt to GPUs in
// a snake. They follow PyTorch's numerics (float32, its cascade sum over
// steps, its CPU sort as PyTorch 1.13 runs it) and are checked against
// the Python code run by PyTorch (testdata/peers, scripts/peers_oracle.py);
// no upstream example exists. Like EPLB they can put two copies of an
// expert on one GPU, which DeepSeekVecOptions.FixDuplicates repairs.
//
// FlashLB and FlashLBLayer port vllm-ascend's FlashLB (the version of
// vllm-project/vllm-ascend#3042 with multi-stage hotness): the summed
// load as one stage by default, as upstream's max_stage_window of 1 has
// it, or per-step loads as stages (pooled to FlashLBOptions.MaxStages),
// replica counts from
// stage-weighted marginal gains, a grouped binary search over how many
// of each group's slots are extra copies, and placement by
// max(load + copy, stage max) / mean, in numba's types and with numba's
// argsort. It reproduces the pull request's example (busiest device 205
// where EPLB gives 232).
//
// # Determinism
//
// Every baseline is deterministic: ties break by lower expert and GPU
// index, and EPLB's layers are independent, so the same inputs give the
// same plan whatever the number of goroutines.
package baseline
