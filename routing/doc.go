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
//   - Patterns: the histogram of distinct token paths. A path is the token's
//     Source (-1 when unknown) and, for each layer, its top-k ids sorted
//     ascending, flattened as Experts[l*TopK+j]. Patterns are sorted by
//     (Source, Experts...) compared numerically, and nil when unknown or when
//     more than MaxPatterns distinct paths occur.
//
// Transitions and CoActivation are left nil when L·E² exceeds 2^24 entries
// (DeepSeek-V3, 58·256², is far below).
//
// # Merge
//
// Stats.Merge adds stats of the same shape (Layers, Experts; TopK and
// LayerNames when both state them; TransitionMode when both have
// transitions): Tokens, Load, Transitions and CoActivation add element by
// element, Patterns add count by key, StepLoad concatenates (the other
// side's steps follow), Sources append. When one side lacks Transitions,
// CoActivation, StepLoad or Patterns the result lacks them too, since a
// partial sum would mislead. Merging into the zero Stats copies.
//
// # Formats
//
// Load reads a file or directory; Detect picks the format from the
// extension and the first bytes unless LoadOptions.Format is set. Every
// reader error is a *ParseError (File, Line, Field, Err), and the message
// says what would fix it. Readers never panic and cap what they allocate.
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
// elements are refused. WriteNPY writes int16, shape [T, L, k].
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
// non-negative integers (123.0 is fine). Layers that are zero in every step,
// such as DeepSeek-V3's 3 dense layers, are dropped unless
// LoadOptions.KeepZeroLayers, and LayerNames keeps the original row indices.
// TopK and Tokens come from LoadOptions.TopK (0 = unknown).
//
// A directory that is not a FLAME directory has its .jsonl, .json and .npy
// files loaded in name order and merged. LoadAll merges several paths.
package routing
