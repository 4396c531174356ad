// Package costmodel models what a placement of MoE experts on GPUs costs:
// the hardware (Cluster), the model's shape (Model), how tokens move (Flow),
// and Evaluate(plan, stats, cluster, model, Options) → Report.
//
// # Indices and units
//
// GPU g ∈ [0,G), G = Nodes·GPUsPerNode, lives on node g/GPUsPerNode with
// local index g mod GPUsPerNode. Layer l ∈ [0,L) indexes the MoE layers of
// the stats. Bytes are float64; times are float64 seconds internally and
// time.Duration (rounded to the nanosecond) in the Report; TimeSec keeps the
// unrounded seconds. TB = Model.TokenBytes() = Hidden·BytesPerActivation.
//
// # Shares (even split of replicated experts)
//
// In layer l, expert e with c_e slots sends w[e][g] = (slots of e on g)/c_e
// of its tokens to GPU g, as serving stacks split evenly among copies.
//
//	tokens_g    = Σ_e Load[l][e]·w[e][g]
//	Compute_g   = (tokens_g·perToken + slots_g·perExpert) / Speed[g]
//	ComputeTail = max_g Compute_g
//
// with (perToken, perExpert) = Cluster.Coefficients(model).
//
// # Dispatch (Options.Dispatch; Splitter, Scenario.Splitter, NewSplitter)
//
// Which copy computes a token is the serving stack's rule, one model per
// placement.Dispatch, bound to the plan by Scenario.Splitter (NewSplitter's
// models, or vLLM's counted hash) and asked by every search: w_h[e][g], the share of expert e's tokens sourced on GPU h that
// GPU g computes. SGLang's static tables (sglang-static and its trees)
// give every rank all or nothing of an expert: the table SGLang deals from
// random.Random(42) over every decoder layer's row of the map it loads
// (internal/stackdispatch reproduces it bit for bit), so the busiest GPU is
// the one SGLang's ranks really fill. A plan that stands for SGLang running
// its EPLB algorithm itself (placement.Plan.StackEPLB) is dealt as
// init_by_eplb: the algorithm's log2phy rows as candidate lists, one
// stream; every other plan as a map loaded from a file (init_by_mapping).
// vllm is vLLM's hash counted token by
// token when the statistics carry their token order (Stats.Order,
// HashOrder; home flow), else its expectation, even; the counted hash
// splits per source (Scenario.PerSource). sglang-dynamic and
// trtllm are modeled by their expectation (the nearest copy, else even;
// even); static-mean is the expectation of SGLang's table over its deal. The
// source shares src[h][e] come from Stats.SourceLoad (exact per-rank
// counts) when the trace has it, else from the paths' sources.
//
// # Terms: the compute rule, the layer-time rule, the balance measure
//
// Terms (Scenario.Terms) holds the coefficients and is the one place the
// formulas below are written; Cap and MoveBudget are the balance cap and
// the move budget every search consults. Balance, the one balance measure,
// is the busiest GPU's tokens per unit of speed over Σ tokens / Σ speed.
//
// # Local dispatch (Options.Dispatch = placement.DispatchLocal, home flow)
//
// The split then depends on the source GPU h: h's tokens for e go to e's
// copy on h if there is one, else evenly to e's copies on h's node, else
// over all copies with the fractions f_i = max(0, λ − a_i)/R, where a_i
// counts the sources copy i already serves, R the sources left (GPUs on
// nodes without a copy) and λ solves Σ_i max(0, λ − a_i) = R
// (water-filling: the copies end as evenly loaded as these preferences
// allow, assuming every GPU sources the same tokens). Then
//
//	tokens_g = Σ_e Σ_h Load[l][e]·src[h][e]·w_h[e][g]
//
// with src[h][e] the share of e's tokens sourced on h (from patterns with a
// Source, else 1/G), and every mass below uses w_h instead of w. A copy of
// e on every node keeps e's tokens off the NICs entirely; with n_e ≤ nodes
// copies on distinct nodes each copy gets exactly Load/n_e. Plans with
// SlotShare and the chain flow are rejected.
//
// # Per-token destinations
//
// A token whose layer-l expert set is S must reach GPU g with probability
//
//	p_g = 1 − Π_{e∈S} (1 − w[e][g])
//
// (exactly 0 or 1 with single copies: one copy per distinct GPU), and node B
// with probability q_B = 1 − Π_{e∈S} (1 − Σ_{g∈B} w[e][g]). A pattern with
// Source s ∈ [0,G) has home s; Source −1 spreads its Count evenly, 1/G to
// every home.
//
// # Home flow (standard expert parallelism)
//
// Every layer dispatches each token from its home h (node A, local index i)
// and combines back. Dispatch[src][dst] (bytes, summed over patterns ×
// Count):
//
//	g ≠ h on node A:        Dispatch[h][g] += p_g·TB              (NVLink)
//	node B ≠ A, r = B's GPU with local index i:
//	                        Dispatch[h][r] += q_B·TB              (NIC, one copy per node)
//	g ∈ B, g ≠ r:           Dispatch[r][g] += p_g·TB              (NVLink forwarding)
//	Combine[dst][src] = Dispatch[src][dst]
//
// # Chain flow (MoETuner Eq. 9, ExFlow)
//
// Layer 0 dispatches from the homes as above. For l ≥ 1 a token's layer-
// (l−1) partial result sits on g1 with probability p^{l−1}_{g1} and moves
// directly to the GPUs of its layer-l experts; this transition is
// attributed to layer l's Dispatch:
//
//	g2 ≠ g1 on node(g1):    Dispatch[g1][g2] += p^{l−1}_{g1}·p^l_{g2}·TB
//	node B ≠ node(g1), r = B's GPU with g1's local index:
//	                        Dispatch[g1][r]  += p^{l−1}_{g1}·q^l_B·TB
//	g2 ∈ B, g2 ≠ r:         Dispatch[r][g2]  += p^{l−1}_{g1}·p^l_{g2}·TB
//
// Layers 0..L−2 have no combine; layer L−1 combines back to the homes
// exactly as in home flow. (With L = 1 chain flow equals home flow.)
//
// # Count-only stats (Stats.Patterns == nil)
//
// Home flow then routes every (token, expert) pair on its own from a
// uniform home (no dedupe of experts sharing a GPU or node), so traffic is
// an upper bound of the pattern-exact value:
//
//	a_g = Σ_e Load[l][e]·w[e][g],  a_B = Σ_{g∈B} a_g
//	home h: p_g·Count → a_g/G,  q_B·Count → a_B/G
//
// Chain flow uses Transitions R[l−1][e1·E+e2]:
//
//	M[g1][g2] = Σ_{e1,e2} R[l−1][e1·E+e2]·w^{l−1}[e1][g1]·w^l[e2][g2]
//
// in place of p^{l−1}_{g1}·p^l_{g2}·Count, and Σ_{g2∈B} M[g1][g2] in place of
// the node copy (again without dedupe). An all-pairs R counts every source
// partial to every destination; a top-1 R counts one pair per token. Chain
// flow with neither Patterns nor Transitions is an error.
//
// # Links
//
// Every GPU has four ports: NVLink out and in (NVLinkBytesPerSec each) and
// NIC out and in (NICBytesPerSec each). An entry Dispatch[s][d] loads s's
// and d's NVLink ports when s and d share a node, their NIC ports
// otherwise. A phase (dispatch or combine) takes
//
//	max over GPUs and ports of bytes/bandwidth
//	  + NICLatency if the phase has NIC bytes, else NVLinkLatency if it has NVLink bytes
//
// CommTime = DispatchTime + CombineTime; CrossNodeBytes = NIC bytes of both
// phases.
//
// # Layer times (compute–communication overlap, arXiv 2507.03114)
//
//	Sequential = DispatchTime + ComputeTail + CombineTime
//	Ideal      = max(ComputeTail, CommTime)
//	Overlapped = max(ComputeTail·(1+σ), CommTime) + CommTime/Chunks
//	Time       = Sequential or Overlapped per Options.Mode
//
// σ = Cluster.SigmaValue(); CommTime/Chunks is the exposed first dispatch
// and last combine chunk. Report sums the layers.
//
// # Presets
//
// ClusterPreset and ModelPreset hold the hardware of MoETuner's Tables 2–3
// and the models moetuner has traces for; latencies (NVLink 3 µs, NIC 8 µs)
// and FLAME-MoE-290M's hidden/FFN sizes are assumptions. LoadCluster and
// LoadModel accept a preset name or a YAML file that may start from
// `base: <preset>` and override any field; unknown fields are errors.
package costmodel
