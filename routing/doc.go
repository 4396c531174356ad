// Package routing reads Mixture-of-Experts routing traces and aggregates
// them into the statistics that expert placement needs.
//
// # Model
//
// A Trace records, for each of T tokens and each of L MoE layers, the ids of
// the token's top-k experts, e in [0, E). Layers are indexed 0..L-1 in trace
// order (Layer); LayerNames maps them to the model's decoder-layer numbers
// (FLAME-MoE's MoE layers are 2..9, DeepSeek-V3's are 3..60). Rank 0 is the
// highest-gate expert when the source records an order. Within one token and
// layer the k ids are distinct; Trace.Validate and every reader reject a
// duplicate.
//
// Stats aggregate a trace, or come straight from count-only sources. All
// counts are float64:
//
//   - Load[l][e]: tokens routed to expert e at layer l. A token adds 1 to each
//     of its k experts, so Σ_e Load[l][e] = Tokens·k.
//   - Transitions[l][e1*E+e2], l in [0, L-1): adjacent-layer transitions,
//     row-major. Under TransitionAllPairs a token adds 1 for every pair
//     (e1 in its top-k at l, e2 in its top-k at l+1), k² in all; under
//     TransitionTop1 it adds 1 for (rank-0 at l, rank-0 at l+1) only.
//     Nil when the source has no per-token paths.
//   - CoActivation[l][a*E+b]: tokens with both a and b (a ≠ b) in their
//     top-k at layer l. Symmetric with a zero diagonal; a token adds
//     k(k-1) entries (each unordered pair twice).
//   - StepLoad[s][l][e]: Load restricted to step s, where steps are the
//     distinct Trace.Step ids in ascending order. Nil without steps.
//   - SourceLoad[r][l][e]: Load restricted to the tokens whose source (home)
//     rank is r (Trace.Source), for r = 0..max rank; tokens of unknown
//     source (-1) count in Load only, so Σ_r SourceLoad[r] ≤ Load. Nil
//     without sources, or when ranks·L·E would exceed 2^24 entries.
//   - Patterns: the histogram of distinct token paths. A path is the token's
//     Source (-1 when unknown) and, for each layer, its top-k ids sorted
//     ascending, flattened as Experts[l*TopK+j]. Patterns are sorted by
//     (Source, Experts...) compared numerically, and their counts add up
//     to Tokens; nil when unknown.
//
// Transitions and CoActivation are left nil when L·E² exceeds 2^24 entries
// (DeepSeek-V3, 58·256², is far below), StepLoad when steps·L·E exceeds
// 2^25. Every count except Patterns is exact.
//
// # Path sample
//
// A trace of N tokens keeps every path when N ≤ n₀ = ((k−1)/(2ε))² (122500
// for top-8 at the default ε = StatsOptions.PathError = 0.01). Longer traces
// keep a uniform random sample of n = ⌈n₀·N/(N−1+n₀)⌉ tokens, each path
// weighted N/n: the tokens with the n smallest hashes of their index in the
// trace (a fixed bijection), so the same trace gives the same sample on
// every run, in any chunking and for any GOMAXPROCS. n is the smallest size
// whose relative standard error of a per-token mean in [1, k] (GPUs or
// nodes a token's experts reach) is at most ε by Popoviciu's bound; see
// PathSampleSize. Stats.PathSample records N, n and that error, and
// Stats.Notes says the paths are sampled. Merge adds samples as strata:
// tokens and kept paths add up, errors combine as √(Σ(Tᵢεᵢ)²)/ΣTᵢ. Past
// MaxPatterns distinct paths (Merge) or the room in a stats file
// (WriteStats), patterns are thinned to an equal-weight sample by
// systematic sampling proportional to count, whose error adds in
// quadrature.
//
// # Notes
//
// Stats.Notes says, one sentence each, what was dropped or estimated
// because it grew too large and what that costs: transitions and
// co-activation past 2^24 entries (chain flow then needs patterns),
// per-step or per-source loads past their caps, paths sampled or thinned,
// patterns past MaxPatterns in exact mode. Merge keeps each note once.
// Readers never print; moetuner's commands print each note once on stderr.
//
// # Merge
//
// Stats.Merge adds stats of the same shape (Layers, Experts; TopK and
// LayerNames and ModelLayers when both state them; TransitionMode when both
// have transitions): Tokens, Load, Transitions and CoActivation add element
// by element, Patterns add count by key (PathSample as above), StepLoad
// concatenates (the other side's steps follow), SourceLoad adds rank by
// rank, Sources append, Notes are kept once each. When
// one side lacks Transitions, CoActivation, StepLoad, SourceLoad or
// Patterns the result lacks them too, since a partial sum would mislead.
// Merging into the zero Stats copies.
//
// # Layers
//
// LayerNames are the model's decoder-layer ids of the MoE layers (0-based,
// as the serving stacks number them), ModelLayers the model's
// num_hidden_layers with dense layers included, when the source records it.
// Readers drop dense layers (all-zero count rows, all -1 id rows) from Load
// and the traces but keep their place: LayerNames skips them and
// ModelLayers counts them.
//
// # Formats
//
// Load reads a file or directory; Detect picks the format from the
// extension and the first bytes unless LoadOptions.Format is set. Every
// reader error is a *ParseError (File, Line, Field, Err), and the message
// says what would fix it. Readers never panic and cap what they allocate:
// sizes a header declares are checked against caps and, for files, against
// the bytes present before anything is allocated for them.
//
// With LoadOptions.StatsOnly, for callers that need only Stats, NPY and
// JSONL traces are read in chunks of about 2^22 ids straight into the
// counters and never held (memory: the counters, a few chunks and the path
// sample, whatever the trace's length; up to 2^40 ids instead of 2^32), and
// the per-token serving-stack readers send their tokens to the counters as
// they assemble them. Source.Trace is then nil. The counts are kept per
// goroutine (up to 4, GOMAXPROCS) and added up, so the result does not
// depend on GOMAXPROCS. LoadOptions.Progress, when set, is told the file,
// bytes and tokens read per chunk and once when each file is done.
//
// FormatJSONL (.jsonl), moetuner's own per-token format: one JSON object per
// line,
//
//	{"moetuner_trace": 1, "experts": 64, "top_k": 6, "layer_names": [2, 3]}   optional header, first line only
//	{"layers": [[34, 28, ...], [60, 21, ...]], "weights": [[0.09, ...], ...], "source": 3, "step": 0}
//
// "layers" is required: L arrays of k distinct ids, the same L and k in
// every record. "weights" (same shape), "source" (≥ 0; absent or -1 =
// unknown) and "step" are optional; weights and step must be in every record
// or in none. Without a header Experts = max id + 1 and TopK comes from the
// first record. Blank lines are skipped. WriteJSONL writes this format
// deterministically.
//
// FormatNPY (.npy): a NumPy array of expert ids, dtype int16, int32, int64 or
// uint8, C order, shape [T, L, k] (or [T, L] meaning top-1). Experts is
// LoadOptions.Experts or max id + 1. Headers claiming more than 2^32
// elements (2^40 with StatsOnly) are refused, and a file whose size does
// not match its header's shape is refused before its data is read. WriteNPY
// writes int16, shape [T, L, k].
//
// FormatFLAME (.csv): FLAME-MoE per-layer router probabilities, header
// layer_id,token_id,expert_0,...,expert_{E-1}, one row per token. The
// selected experts are the columns > 0 (the same count k in every row),
// ordered by probability descending, ties by lower id; Weights are those
// probabilities. layer_id is ignored. A directory of such files is one
// trace: the layer number N comes from "layer<N>" in each file name, layers
// are sorted by N (LayerNames = the Ns), and rows are joined by position,
// with token_id required to be the same sequence in every file.
//
// FormatOLMoE (.json with "expert_counts" and "num_experts"): AllenAI's
// routing analysis: expert_counts[i][e] at decoder layers "layers"[i], top_k
// and num_tokens. Stats has Load = expert_counts, LayerNames = layers,
// TopK = top_k, Tokens = num_tokens. Its crosslayer counts pair skip layers
// (0→7, 7→15) rank by rank, which is neither adjacent nor k×k, so they stay
// out of Transitions; Source.OLMoE and ReadOLMoE keep them.
//
// FormatFiddler (.json with "expert_popularity"): Fiddler's [L][E]
// selection counts; TopK = LoadOptions.TopK or 2 (Mixtral), Tokens = mean
// row sum / TopK. total_input_tokens counts words and is ignored.
//
// FormatLogicalCount (.json with "logical_count", or a bare JSON array):
// EPLB / SGLang expert-distribution counts, [L][E] or [S][L][E] (then
// StepLoad is set and Load is the sum over steps). Values must be
// integers in [0, 2^53] (123.0 is fine; NaN and Infinity, which Python's
// json.dump writes, are errors). Layers that are zero in every step,
// such as DeepSeek-V3's 3 dense layers, are dropped unless
// LoadOptions.KeepZeroLayers, and LayerNames keeps the original row indices.
// TopK and Tokens come from LoadOptions.TopK (0 = unknown).
//
// NAME.npy may have a sibling NAME.source.npy, an integer array [T] holding
// each token's source rank (-1 unknown), which Load reads into
// Trace.Source.
//
// # Serving stacks
//
// FormatSGLangPT (.pt, a torch.save zip; read by internal/torchpt without
// running any pickle code): the dumps of SGLang's expert-distribution
// recorder, told apart by their keys.
//
//   - stat / stat_approx: {"logical_count": int [B, L_all, E], ...}, summed
//     over ranks. Each row of the circular buffer is a forward pass and a
//     StepLoad step; rows that are zero everywhere are the buffer's unfilled
//     rows and are dropped, not counted as idle steps. ModelLayers = L_all.
//     The dump is the buffer in buffer order without its write index: the
//     steps are put in time order from the one run of unfilled rows (the
//     oldest pass follows it); a full buffer (it may have wrapped) has no
//     such run, and then the steps stay in buffer order with
//     Stats.StepsUnordered set and a note.
//   - per_pass: {"records": [{"forward_pass_id", "rank",
//     "global_physical_count": int [L_all, P]}], "last_physical_to_logical_map":
//     int [L_all, P]}, one file per rank holding its own tokens' counts of
//     physical slots; slot p of layer l adds to logical expert map[l][p].
//     Steps are forward_pass_id (the same pass adds up across ranks),
//     SourceLoad[r] is rank r's records.
//   - per_token: records with "topk_ids_of_layer" int [L_all, T, W]:
//     physical slot ids, W = 8 columns padded with -1, dense layers all -1,
//     mapped to logical ids through the file's last_physical_to_logical_map.
//     Every token of a MoE layer must have the same number k of ids; a
//     physical id ≥ P (SGLang's fused shared experts) is an error. The
//     record's rank is each token's Source, its forward_pass_id the Step.
//
// E is the number of logical experts the map covers (max id + 1) unless
// LoadOptions.Experts; TopK comes from the data for per_token and from
// LoadOptions.TopK otherwise. A .pt holding only "physical_to_logical_map"
// is a placement (--init-expert-location) and is refused.
//
// FormatSGLangRoutedExperts (JSON with "routed_experts"): SGLang /generate
// responses with return_routed_experts, one object, an array or one per
// line; meta_info.routed_experts is base64 of int32 [positions,
// num_hidden_layers, k], logical ids. k is LoadOptions.TopK (required);
// num_hidden_layers is LoadOptions.ModelLayers or, when 0, inferred from
// prompt_tokens + completion_tokens (− 1). Layers whose ids are all 0 or −1
// are dense. Sources and steps are unknown.
//
// FormatTRTLLM (.safetensors): TensorRT-LLM's EXPERT_STATISTIC_PATH, a
// directory of meta_info.json ({"num_experts", "num_experts_per_token"})
// and rank{r}.safetensors, keys "{iteration}_{layer}" → [E] logical counts
// (any integer dtype). Iterations are steps, r is the source, layer the
// decoder-layer id; TopK and Tokens come from meta_info. Optional
// cooccurrence_rank{r}.safetensors ([E, E], diagonal ignored) give
// CoActivation; token_selected_experts_rank{r}.safetensors and
// rank{r}_raw.safetensors (expert_statistic.py at 7ce477f: the raw
// token_selected_experts, [T, k] per key) give the per-token trace (source
// r, step = iteration) when, for every rank and iteration, every layer has
// the same rows and the tokens add up to the counts; otherwise a note says
// they were left out. Without count files the token files alone are the
// trace. Other .safetensors files in the directory are skipped with a note.
// Under a load_balancer config TensorRT-LLM records physical slot ids and
// meta_info.json's num_experts is num_slots: with LoadOptions.SlotExperts
// (the placement that was serving) the slots fold back to logical experts
// and Source.Slots says so; without it, a num_experts other than
// LoadOptions.Experts is an error that says so. When every rank wrote the
// same data (no attention DP: every rank routes every token) one rank's
// files are read, with sources unknown, and a note says so. The safetensors
// header is checked (dtype, shape, offsets inside the file) before any data
// is read.
//
// FormatMegatron (router_trace_rank{r}.jsonl): Megatron-Core's
// --moe-routing-trace-path, one record per (step, layer): {"step", "block",
// "layer", "rank", "num_tokens", "topk", "top_indices": [[k ids] × tokens]}.
// The rows of one step are the same tokens in every layer; a token's Source
// is the file's rank and its Step the record's step. Records of the "mtp"
// block are skipped. Layer ids are taken as written, plus
// LoadOptions.MegatronLayerOffsets[rank]: in training a record's layer is
// the index within its pipeline stage's chunk, so stage files need their
// stage's offset. Files that record the same layers (after the offsets)
// are data-parallel ranks; files that record disjoint layer sets are
// pipeline stages, joined step by step into whole-model tokens (the i-th
// rank of each stage forms pipeline i, the source its first-stage rank),
// which also joins inference's global ids without offsets. With LoadOptions.ModelLayers known, ids
// that reach it are 1-based (inference's record_indices stamps
// layer_number) and are read one lower, with a note. In a directory the
// tracer's sidecar files (router_state_rank{r}.pt, hidden_states_rank{r}.bin,
// logits_rank{r}.bin) are skipped with a note.
//
// FormatVLLMLoadStats (JSONL with "record_type": "eplb_load_stats"): vLLM
// #41141's stats, one record per step with physical loads "expert_load"
// [L][P] and "p2l_map" [L][P]; load of slot p goes to logical expert
// p2l_map[l][p]. Steps are the records; layers are vLLM's 0-based MoE-layer
// indices (LayerNames nil). The PR's newer files open with an
// "eplb_load_meta" record (num_ranks, num_groups, num_nodes, num_layers,
// num_redundant_experts), checked against the loads (layers, slots,
// redundant slots) and returned as Source.Deployment; as vLLM's loader
// does, a second one or one after a stats record is an error. Other
// record types are skipped.
//
// FormatMoetunerStats (JSON with "schema": "moetuner.stats/v1"): what
// WriteStats writes (below), read back with every part it holds.
//
// # Directories
//
// A directory is one trace when it holds one stack's per-rank files:
// FLAME layer CSVs; SGLang .pt dumps of one recorder mode (per_token files
// become one Trace, tokens in file-name then record order; per_pass files
// one set of counts; stat files are merged); Megatron's
// router_trace_rank{r}.jsonl (one Trace, ranks in order); TensorRT-LLM's
// rank files. Every file must route the same layers with the same top-k;
// the error names the file that disagrees. A directory mixing these kinds
// is refused. Any other directory has its .jsonl, .json and .npy files
// loaded in name order and merged. LoadAll merges several paths.
//
// # Statistics files
//
// WriteStats writes Stats in two formats, with fixed formatting (one line
// per layer, shortest exact decimals), so equal stats give equal bytes.
//
// StatsMoetuner ("moetuner.stats/v1") is one JSON object:
//
//	{"schema": "moetuner.stats/v1", "experts": E, "top_k": k, "tokens": T,
//	 "layers": [decoder ids], "model_layers": L_all,        (when known)
//	 "load": [L][E],
//	 "transition_mode": "all-pairs"|"top1", "transitions": [L-1][E·E],
//	 "coactivation": [L][E·E], "step_load": [S][L][E], "source_load": [R][L][E],
//	 "path_sample": {"tokens": N, "kept": n, "rel_std_err": ε},
//	 "patterns": [{"source": r, "count": c, "experts": [L·k ids]}],
//	 "notes": ["..."]}
//
// where every key after "load" is present only when the stats have it and
// the E·E rows are row-major (e1·E + e2). Patterns beyond 2^26 ids, or
// beyond the room the other counts leave in 2^26 numbers, are thinned to a
// weighted sample that fits (path_sample and notes then say so); a file
// without path_sample has exact patterns. Stats of more than 2^26 other
// counts are refused. Load reads it back; reading several and merging them
// (moetuner stats a.json b.json --out all.json) adds them as Merge does.
//
// StatsLogicalCount is {"logical_count": [rows][E]}, the input SGLang's
// --init-expert-location and EPLB take: with ModelLayers known, rows
// 0..ModelLayers-1 with each MoE layer at its LayerNames row and dense rows
// zero; with only LayerNames, rows 0..max(LayerNames) (trailing dense layers
// cannot be known); with neither, the MoE rows alone, in order.
// LogicalCountRows says which.
package routing
