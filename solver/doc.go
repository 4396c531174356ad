// Package solver decides which GPU holds which expert: Solve takes routing
// statistics, a cluster and a model (a Problem), searches with a Strategy
// within a time or work budget (Options), and returns a validated plan
// scored by the cost model, with its evidence (a Result). The strategies
// are the baselines (contiguous, round-robin, greedy, eplb,
// eplb-hierarchical: no search), moetuner (the paper's two ILPs) and
// joint (the default: an ILP on modeled layer time, replica packing,
// local searches and the affinity search, by problem). Evaluate scores
// any plan as Solve does. For example:
//
//	p := solver.Problem{Stats: stats, Cluster: cluster} // Model inferred
//	res, err := solver.Solve(ctx, p, solver.Options{Effort: 1})
//	// res.Plan, res.Objective (seconds), res.Status, res.Gap
//	err = placement.WriteFileWith("plan.sglang.json", res.Plan, placement.FormatSGLang, res.Layout)
//
// The ILPs are solved by a mip.Backend, HiGHS (mip/highs) by default in a
// build with cgo; a build without cgo runs every strategy but those that
// need an ILP, which return a *BackendError (see Options.Backend).
//
// The package is a facade: Problem, Options, Result, Strategy, Solve and
// Evaluate; every time split of a solve is in one table (budget.go, with
// why each is what it is), and each method lives in a package of its own
// under solver/internal (paper, jointilp, search, onenode, replica,
// affinity), which this documentation describes.
//
// # Deadlines
//
// The budget is the smaller of Options.TimeLimit and the time left before
// the context's deadline. Once any valid plan exists (the best baseline
// takes milliseconds) a deadline or a cancel ends the solve with the best
// validated plan found so far and StatusStopped.
//
// Every strategy's plan is validated (placement.Plan.Validate) and scored
// with costmodel.Evaluate; a backend's objective is never trusted: each ILP
// objective is recomputed in Go from the plan and checked against the
// backend's, and a backend solution is checked row by row (MIP.Check).
//
// # Notation
//
// L layers (Stats.Layers), E experts per layer, G = Cluster.GPUs() GPUs on
// N = Cluster.Nodes nodes of n = GPUsPerNode, P[l][e] = Stats.Load,
// R[l][e1][e2] = Stats.Transitions (layer l to l+1, k×k pairs by default),
// C[l][a][b] = Stats.CoActivation. Times inside the MIPs are microseconds.
//
// # Strategy "moetuner" (arXiv 2502.06643, its printed errors fixed)
//
// ILP 1, one per layer (E1: each expert in exactly one cluster; E2: no
// stray sum over tokens):
//
//	min Σ_c d_c
//	    Σ_c x[c][e] = 1 ∀e;   Σ_e x[c][e] ≥ 1 ∀c            (non-empty)
//	    d_c ≥ ±(Σ_e P[l][e]·x[c][e] − T̄_l),  T̄_l = Σ_e P[l][e]/G
//	    Σ_e P·x[c] ≥ Σ_e P·x[c+1]                            (symmetry)
//
// Cluster sizes may differ (the paper's design). Ties in Σ|T−T̄| are not
// broken by the largest cluster (the paper does not either).
//
// ILP 2, all layers at once (E3: layer-(l+1) clusters; E4: max over GPU
// pairs; E5: no self-traffic; E6: l = 0..L−2), with y a permutation per
// layer and the RLT (Adams–Johnson) linearisation of y·y:
//
//	min Σ_{l<L−1} M_l
//	    M_l ≥ Σ_{c1,c2} C'[l][c1][c2]·z[l][c1][g1][c2][g2]·s(g1,g2)  ∀ g1≠g2
//	    Σ_{c2} z[l][c1][g1][c2][g2] = y[l][c1][g1] ∀ g2
//	    Σ_{c1} z[l][c1][g1][c2][g2] = y[l+1][c2][g2] ∀ g1
//	    Σ_g y[l][c][g] = 1,  Σ_c y[l][c][g] = 1,
//	    Σ_l Σ_c |c|·y[l][c][g] = E·L/G ∀g                     (Eq. 13)
//
// where C'[l][c1][c2] aggregates R over the clusters and s(g1,g2) is the
// seconds per token on the link (TokenBytes over the per-direction NVLink
// bandwidth within a node, over the NIC bandwidth across nodes). When Eq. 13
// cannot hold (E·L mod G ≠ 0, or ILP 1's sizes do not fit) Solve returns an
// *InfeasibleError (errors.Is(err, ErrInfeasible)).
//
// # Strategy "joint" (the default)
//
// One ILP on modeled layer time with x[l][e][g] ∈ {0,1}, Σ_g x = 1, and
// Σ_e x[l][e][g] = E/G slots per GPU per layer (the serving stacks need
// equal slots). Per layer:
//
//	Tc_l ≥ (α·Σ_e P[l][e]·x[l][e][g] + β·E/G)/speed_g   ∀g   (compute tail)
//
// with α, β from Cluster.Coefficients. Communication is priced per GPU
// port (NVLink in/out at half the quoted NVLink bandwidth, NIC in/out) as in
// costmodel, for tokens whose homes are spread evenly over the GPUs.
//
// Home flow. N_g = Σ_e P·x[e][g] − Σ_{(a,b)} C[a][b]·y[a][b][g] counts the
// distinct tokens GPU g receives, with y ≤ x[a][g], y ≤ x[b][g] for the
// MaxPairs most co-activated pairs (exact for top-2, a pairwise estimate
// for larger k); M_B is the same per node. The dispatch phase satisfies
//
//	Td ≥ (n−1)/n·N_g·s_nv,  Td ≥ (Σ_{g'∈node(g), g'≠g} N_g')/n·s_nv
//	Td ≥ (N−1)/G·M_B·s_nic, Td ≥ Σ_{B'≠B} M_B'/G·s_nic
//
// (the second pair only on several nodes: one NIC copy per destination node,
// then NVLink forwarding), s = TokenBytes/bandwidth. Combine mirrors
// dispatch, so communication is 2·Td plus two latencies. Layers are
// independent and solved in parallel; the bound is the sum of their bounds.
//
// Chain flow. Layer 0 dispatches from homes, the last layer also combines
// to homes (as above, without pair savings); in between, the traffic from
// layer l−1 into layer l leaving GPU g is Σ_e rowsum(R)[e]·x[l−1][e][g] −
// Σ_{(a,b)} R[a][b]·v[a][b][g] and entering g is Σ_e colsum(R)[e]·x[l][e][g]
// − Σ R·v, with v ≤ x[l−1][a][g], v ≤ x[l][b][g] for the MaxPairs heaviest
// transitions; node-level v likewise prices the NICs (spread over the n NICs
// of a node). All layers form one ILP.
//
// Objective: Σ_l Tc_l + comm_l (Sequential) or Σ_l T_l + comm_l/4 with
// T_l ≥ (1+σ)·Tc_l, T_l ≥ comm_l (Overlapped).
//
// In the chain flow the monolithic ILP (half the time) is followed by a
// layer-by-layer descent: with layers l−1 and l+1 fixed, the traffic into
// and out of layer l is linear in x[l] over every transition pair, so each
// step is an exact small ILP; a step is kept only if the exact cost model
// improves.
//
// The ILP is warm-started from the best of the greedy, EPLB, contiguous
// and round-robin baselines under the exact cost model, so its model objective
// is never worse than the warm start's (checked). Because the ILP prices
// duplicates only pairwise, the plan is then polished by pairwise expert
// swaps scored by the exact costmodel.Evaluator (as is the baseline), and
// the better one is returned. Result.Bound is HiGHS's dual bound on the
// ILP's model objective and Result.Gap the relative gap of the returned
// plan under that model; Result.Objective is the exact cost model's time.
// On interchangeable GPUs the ILP breaks symmetry (on one node the k-th
// heaviest expert may use only GPUs 0..k; across nodes the heaviest sits
// on GPU 0) and adds star cuts Σ_b y[a][b][g] ≤ (slots−1)·x[a][g].
//
// One node, home flow, per-token patterns (homes unknown, equal speeds,
// single copies): a layer's exact modeled time is then a function of two
// numbers only, the busiest GPU's routed tokens and the busiest GPU's
// distinct tokens max_g D_g (homeCost). Joint gives the ILP 2 % of the
// time and the swap polish to 3 %, then anneals each layer's partition on
// that exact cost to 25 % (package search: swaps scored by popcounts over
// per-GPU token bitsets, half of them from the GPU with the most distinct
// tokens), and certifies per layer a lower bound z+1 ≤ max_g D_g over
// every partition with the rest (package onenode): column generation on the
// set-partitioning LP whose columns are the groups reaching at most z
// tokens, priced by randomised greedy groups and by climbs from the LP's
// support columns, master LP by a small warm-started simplex, and a certificate π with π(S) < Σπ/G for every
// such group, checked by exhaustive branch and bound in Go.
// A layer whose bound converges early is bounded again with groups capped
// at λ−1 routed tokens (λ: the plan's busiest GPU), so every plan lies in
// one of two corners, (mean, z_cap+1) or (λ, z+1), and costs at least the
// cheaper. Result.CostBound folds these into homeLowerBound; time left
// once every layer's bound has converged goes to more annealing.
//
// # Joint with replicas (Problem.RedundantSlots, SlotsPerGPU, ExpertGroups,
// Scenarios, Current)
//
// Layers are independent and run in parallel, each with a fair share of
// the time. Per layer: copy counts by Jefferson/D'Hondt apportionment
// (minimising the largest replica P_e/c_e, copies on distinct GPUs), copies
// packed largest first onto the least loaded GPU with room, then a local
// search on the score Σ_s busiest_s/mean_s (or max_s) over the workloads:
// swaps of two copies between GPUs (scored in O(workloads) from each
// workload's three largest GPU loads) and, when no swap helps and the layer
// is more than 0.1 % above its bound, moving one copy from one expert to
// another, alone or followed by swaps. With ExpertGroups, groups go to
// nodes first (balanced, then swapped) and copies stay on their group's
// node. Under static dispatch with per-token sources those loads are not
// what the GPUs get: a copy on a source's own GPU serves all that
// source's tokens for the expert, the other sources splitting evenly
// (placement.StaticSplit; local dispatch on one node splits the same
// way). There the even-split search is skipped and the
// packing is balanced on the static split itself (the layer's source
// shares, costmodel.SourceShares): swaps of two copies between the
// busiest GPU and another (on its node with ExpertGroups), best first,
// until none lowers the busiest. From a running plan (Current) the same
// swaps continue both from it and from what the even-split search made of
// it, within what is left of Options.MaxMoves and paying
// Problem.MoveCost a slot, and the better of the three is kept. Each
// layer is certified against
//
//	busiest ≥ max(Σ_e P_e / Σ_g speed_g, min_c max_e P_e/c_e / max_g speed_g)
//
// (the second term is the apportionment's optimum), reported in
// Result.Balance and Result.Gap. With ExpertGroups (up to 12 groups) the
// bound also holds the groups to nodes: whichever groups a node holds,
// their tokens land on its GPUs and their copies on its slots, so the
// busiest GPU is at least the least, over every assignment of groups to
// nodes that fills the nodes' slots, of the largest node's load over its
// speed and largest replica (a dynamic program over subsets of groups).
// Under even dispatch a grouped layer whose gap stays open is searched
// node by node: for every node and set of groups below the incumbent,
// the node's exhaustive search, then the same program over what they
// found (the plan, taken where there are no token paths, whose traffic
// the groups' node choice was traded for) and over what they proved
// (the bound: their optimum where complete, the groups' bound where not).
// When every GPU has the same speed and one
// or two slots (and a MIP backend is given), the layer is then solved by
// the exact pair method: for a threshold T, the copy counts
// that reach it are an ILP over Hall's condition for pairing large copies
// with small partners. HiGHS proves infeasibility in growing steps above
// the bound (half the layer's time), then bisection on T looks for counts
// that pack lower (a relaxation only in allowing two copies of one expert
// on a GPU, which the packing repairs or gives up on). Under even
// dispatch a layer whose gap stays open is then searched exhaustively
// where that is possible: every copy count vector whose copies fit under
// the incumbent, each packed by branch and bound; the search gives up at
// its first check when the vectors left would outlast the layer's time
// (or work) at the rate measured, so only small layers (Mixtral's 8
// experts on 4 GPUs with 4 redundant slots: 8 to 90 ms a layer) run it, and a
// complete search proves the layer optimal. Both bounds hold for even
// splits; under SplitOptimal the certificate falls back to the first
// (and the groups' bound, which holds for any split). With
// per-token statistics the plan is then
// polished on the exact cost model (slot swaps that keep copies on distinct
// GPUs), trading balance for communication. Problem.Split = SplitOptimal
// finally splits each expert's tokens over its copies by a max flow that
// minimises the busiest GPU (SGLang's dispatch LP), stored as
// LayerPlan.SlotShare. Current starts from a running plan and changes at
// most Options.MaxMoves slots per layer (or only moves worth
// Problem.MoveCost).
//
// Problem.MaxImbalance caps every layer's busiest/mean in the joint plan,
// whichever path made it. The home flow's affinity search treats it as a
// constraint: every phase charges the busiest GPU's (at the node level,
// the busiest node's) compute above the cap at G seconds a second, and
// while a layer is above it half the last annealing's moves start on the
// busiest GPU; a layer that starts within the cap ends within it. A
// layer still above the cap is repaired by moves
// off the busiest GPU that lower the GPUs' squared excess over the cap,
// taking the cheapest on the exact cost of those that meet it. The moves
// swap copies between the busiest GPU and the others, and re-apportion
// copies where there are redundant slots: a slot whose expert has
// another copy takes a copy of one of the busiest GPU's experts, or a
// spare copy there holds a lighter expert (so a plan whose copy counts
// fit old loads, from Current, follows new ones). A layer the moves
// leave above it starts again from the balance-first baseline's layer.
// Expert groups keep the moves within a node, and Current with Options.MaxMoves bounds the changed slots. A cap
// no plan is found under is an *InfeasibleError with the worst layer, a
// lower bound on its balance for the plan's copy counts (the expert that
// sets it and the lightest copies beside it) and the fields to change.
// A cap below a bound that holds for every plan with these slots (the
// mean and the largest replica, and without copies one expert with the
// lightest beside it) is refused before the search, and one below the
// solve's certificate for a layer (exhaustive search on small layers)
// before the repair, naming the least cap that might be met.
//
// Under local dispatch (Problem.Dispatch = placement.DispatchLocal: a
// token uses its own GPU's, else its node's copy) copies are capped at one
// per node and packed and swapped only onto distinct nodes, whenever the
// cap does not raise the largest replica above the balance bound: every
// copy then serves exactly P_e/c_e, and each node holding a copy keeps that
// expert's tokens off the NICs. Otherwise (an expert needs more copies than
// there are nodes) whole GPUs trade nodes, first to restore the even
// split's busiest load (a lone copy on a node would serve the whole node),
// then to cut Σ_e P_e·(nodes − nodes holding e)/nodes. Balance is
// certified on the loads local dispatch gives. With copies on distinct
// nodes, the counts are then re-chosen for traffic: every expert gets the
// ⌈P_e/busiest⌉ copies its copies need to fit under the balanced plan's
// busiest load, spare copies go to the heaviest experts up to one per
// node; the result is packed and swapped again and kept if it stays as
// balanced (within 0.1 % of the bound). The same rule applied to the final
// busiest load is a lower bound on the traffic of every plan at least as
// balanced (Result.Balance.TrafficGap).
//
// # Several nodes with per-token paths (the affinity search)
//
// On several nodes, with per-token paths, one workload and no expert
// groups, joint with replicas (or with layers past the ILP's size)
// starts from the replicated path's packing (or the best
// baseline) and runs the affinity search (solver/internal/affinity):
// per layer, exact per-token node counters, a proxy annealed over
// nodes, exact node-level swaps (a gain-cached Fiduccia–Mattheyses
// refinement of the node cut is built beside them, not yet the default),
// largest-first packing within nodes and
// an annealing on the full surrogate; the chain flow anneals across the
// layers. Where the start's busiest NVLink port takes at least 0.8 of the
// busiest NIC port's time in some layer (PCIe-class nodes), the home
// flow's counters also hold every token's reach per GPU and the NVLink
// ports, forwarding included, and a phase costs the slower of the two;
// where NVLink takes longer than the NICs, the phases that trade only NIC
// copies (the proxy, the node-level swaps) are skipped.
// The plan is kept only if the cost model scores it no slower than the
// start. Under SplitOptimal the search places copies as for
// even splits, and the shares are chosen afterwards, as for every
// strategy.
//
// With a running plan (Current) that has the problem's slots on every
// GPU: under Options.MaxMoves or Problem.MoveCost the search starts from
// the replicated path's budgeted plan, skips the proxies and the packing
// and balancing within nodes (they move copies freely), refuses every
// move that would take a layer past MaxMoves changed slots
// (placement.ChangedSlots against Current) and charges each changed slot
// MoveCost times the layer's mean GPU compute; the plan is checked
// against the budget again before it is kept. With free moves Current
// bounds nothing, on this path or any other: Solve plans the layers
// afresh and returns Current only when the cost model scores it faster
// (Result.Note says so).
package solver
