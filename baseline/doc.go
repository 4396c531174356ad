// Package baseline holds the placements that need no solver, which every
// moetuner result is compared against: Contiguous (Megatron's default,
// expert e on GPU e/(E/G)), RoundRobin (e on GPU e mod G), Greedy (largest
// load first onto the least loaded GPU with a free slot) and EPLB, a
// bit-exact port of DeepSeek's rebalance_experts.
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
// # Determinism
//
// Every baseline is deterministic: ties break by lower expert and GPU
// index, and EPLB's layers are independent, so the same inputs give the
// same plan whatever the number of goroutines.
package baseline
