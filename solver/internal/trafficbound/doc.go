// Package trafficbound certifies lower bounds on the cross-node traffic of
// every placement of a layer: how far a plan's remote-node copies are from
// the best possible.
//
// # Quantity bounded
//
// Home flow (HomeRemote), per layer l: a token t (a routing.Pattern with
// weight Count, source GPU h on node A = h / GPUsPerNode, its distinct
// experts S_t at the layer) is sent to
//
//	R_t = Σ_{B ≠ A} (1 − Π_{e∈S_t} (1 − q_{e,B}(h)))
//
// remote nodes in expectation, q_{e,B}(h) the probability that h's token
// for e is served on node B under the dispatch (placement.Dispatch: even,
// static, local), exactly as costmodel counts it (Source −1: the mean over
// all h). HomeRemote bounds Σ_t Count_t·R_t from below over every placement:
// every expert at least one copy, copies of one expert on distinct GPUs, at
// most SlotsPerGPU[g] experts on GPU g (slots may stay empty). Chain flow
// (ChainCrossNode): the transitions into layer l ≥ 1 of single-copy plans,
// Σ_t Count_t·Σ_{g1 used at l−1} #{B used at l, B ≠ node(g1)}.
//
// # Certificate: a configuration LP over moment budgets
//
// R_t is the expected number of remote nodes used when every expert of t
// independently picks a copy by the dispatch's probabilities. Each pick
// puts t in a configuration c (homeConfigs): n_A experts on A and the rest
// in blocks on other nodes, with cost(c) = number of blocks and moments
// f(c) = (n_A, Π), Π the pairs of t's experts on a common node. For any
// ν ≥ 0 and every configuration, cost(c) ≥ min_c'(cost(c') + ν·f(c')) −
// ν·f(c), so taking expectations and summing over tokens
//
//	Σ_t Count_t·R_t ≥ Σ_k T_k·min_c (cost(c) + ν·f(c)) − ν_0·H* − ν_1·W*
//
// (T_k the weight of tokens with k distinct experts) as soon as H* and W*
// are upper bounds, over all placements, of the expected moment totals
//
//	H = Σ_t Count_t·Σ_{e∈S_t} q_{e,A}(h),   W = Σ_t Count_t·Σ_{a<b∈S_t} Σ_B q_{a,B}(h)·q_{b,B}(h).
//
// The best ν are the duals of the small LP "mix configurations per token
// group at least cost with moment totals within H*, W*" (multipliers);
// the bound is recomputed in Go from ν (certify), so it holds however ν
// was found. Bound.Value = max(0, that).
//
// The masters, each a proven upper bound computed in Go:
//
//   - H* (homeBudget): the transportation problem "each expert's primary
//     copy on a node, at most Σ_{g∈B} SlotsPerGPU[g] per node B, value the
//     expert's token weight sourced on that node", solved by augmenting
//     paths and certified by its Lagrangian dual at the final potentials.
//     Even dispatch adds nothing for replicas (a split over copies averages
//     at most the best copy node); static adds at most (1−1/c)·Σ_{h∈C}
//     weight of e's tokens sourced on h for an expert with copies on GPUs C
//     (its owners serve at home), maximized over copy counts with the
//     redundant slots by a dynamic program (maxExtra); local adds at most
//     one (expert, node) weight per redundant slot.
//   - W* (pairBudget): min of a spectral and a star bound (pairs.go) on
//     Σ_{a<b} C_ab⟨x_a, x_b⟩ over row-stochastic X (x_aB: expert a's share
//     on node B; unit rows but for at most one per redundant slot) with
//     node masses within the capacities, C the co-activation weights. The
//     spectral bound projects out the all-ones direction, shifts the
//     diagonal (tuned by Options.ShiftSteps Lanczos-estimated subgradient
//     steps) and is certified by one full eigendecomposition. Static
//     dispatch adds (k−1)·(most weight of owner-sourced tokens of
//     replicated experts), the pairs its own-GPU rule may add; local
//     dispatch is bounded by co-presence (primaries plus each extra copy's
//     best node of partners).
//   - Chain flow: the configurations of (layer l−1, layer l): node blocks
//     at l−1 spread over d_b GPUs, node blocks at l, and which share a
//     node, with cost Σ_b d_b·(n2 − [b shares]) (the transitions), moments
//     (Π1, Π2, Πg, X): node pairs at each layer, GPU pairs at l−1 (the
//     pair master with the GPUs as parts) and cross-layer pairs on a common
//     node, bounded by a singular-value bound (crossBound).
//
// With one node (or no tokens) the bound is 0, the optimum.
//
// # Cost and strength
//
// Per layer: one pass over the patterns, a transportation solve, about
// 17 Lanczos runs and one full eigendecomposition of an E×E matrix, and a
// tiny LP: about 0.1 s for 256 experts and 32k tokens on one core
// (Options.ShiftSteps trades time for a few percent of bound). The five
// starting shifts are compared on eigenvalues alone: by Lanczos without
// vectors, or, when a pair master has so many parts that Lanczos would
// take E/2 steps or more (the chain bound's GPUs on 8 × 8), by full
// eigendecompositions. Measured
// by BenchmarkHomeRemote (bench_test.go) against EPLB's plan and a
// node-level swap search that keeps EPLB's node loads: on the
// DeepSeek-V3-shaped synthetic trace (4 × 8 GPUs) the bound is 0.38 of
// the search's remote copies with 32 redundant slots and static dispatch
// and 0.49 without redundant slots; on FLAME-MoE (2 × 4 GPUs) 0.67 and
// 0.77. The chain-flow bound is weaker: about 0.3 of EPLB's transitions
// on the synthetic trace and 0.2 on FLAME (its cost is a product of the
// two layers' spreads, which the aggregate moments let the LP split
// between extreme tokens).
//
// # Plans under a balance cap
//
// With Options.MaxNodeLoad the home-flow bound holds for the plans whose
// nodes each serve at most that multiple of the mean node's load, and
// the pair budget uses it (balancedPairBudget): the co-activation that
// popularity alone explains (C ≈ α·L·Lᵀ, L the experts' loads) puts
// popular experts together, which a balanced plan cannot do, and the
// identity Σ_{a≠b} L_a·L_b⟨x_a,x_b⟩ = ‖Σ_a L_a·x_a‖² − Σ_a L_a²‖x_a‖²
// trades it, at a multiplier μ, for the nodes' loads, which the cap
// bounds. On the synthetic trace (4 × 8, 32 redundant slots, static
// dispatch, node cap 1.02; experiments balanced-bound) it raised layers
// 0, 20 and 40 from 0.966, 0.958 and 0.829 remote nodes per token to
// 1.221, 1.166 and 1.049 without the shift steps (91 ms a layer against
// 29 ms, one core), and to 1.348, 1.298 and 1.176 with them (165 ms).
//
// # What it cannot do
//
// Any bound built from first and second moments only (node shares and pair
// co-location, whatever the masters) is at most the configuration LP at
// the uniform point x_aB = 1/N, which a convex combination of placements
// reaches: on 4 nodes, top-8, 256 experts with known sources that is 2.03
// remote nodes per token (2.27 if the home-pair moment were matched
// exactly), and with the moments of the best plan found it is at most
// 1.71 on the synthetic trace's first layer, where the search reaches
// 2.28 without and 2.55 with a node-load limit. Without a load-balance
// constraint the optimum itself is lower than balanced plans (by about
// 10 % there), and the bound is over all placements. Bounds linear in the
// node choice (every expert split 1/N over the nodes) give at most
// (N−1)/N.
package trafficbound
