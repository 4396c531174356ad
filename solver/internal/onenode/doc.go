// Package onenode certifies a lower bound on the exact modeled time of
// every single-copy plan for the home flow on one node, where a layer's
// time depends on the plan only through its busiest GPU's routed tokens
// and its busiest GPU's distinct tokens (Cost).
//
// Bottleneck bound on the busiest GPU's token count (one node, home flow).
//
// In the home flow with homes spread evenly, GPU g's dispatch in-port
// carries (G−1)/G · D_g token copies, D_g the number of tokens with at least
// one expert on g, and its combine out-port the same. A lower bound on
// max_g D_g over every partition of the E experts into G groups of at most
// m = E/G therefore bounds the layer's communication time. homeLowerBound's
// counting argument only bounds Σ_g D_g; this file proves
//
//	no partition has max_g D_g ≤ z
//
// for a z as large as it can within a time budget, by column generation on
// the set-partitioning LP whose columns are the groups S with |S| ≤ m and
// N(S) ≤ z (N(S): tokens reaching S):
//
//	min Σ_S x_S  s.t.  Σ_{S∋e} x_S ≥ 1  (every expert),  x ≥ 0.
//
// A partition into G feasible groups is an LP solution of value G. The
// certificate is a weight vector π ≥ 0 (the LP duals, but any π will do)
// with
//
//	π(S) < Σ_e π_e / G  for every group S with |S| ≤ m and N(S) ≤ z,
//
// since then the G groups of any such partition would sum to less than
// Σ_e π_e. That condition is checked in Go by an exhaustive branch and
// bound over groups (coverSearchAll), so the bound does not rest on HiGHS:
// the LP only proposes π.
//
// z is searched between max_e load_e − 1 (always certified: that expert's
// group reaches load_e tokens) and the incumbent plan's busiest GPU (never
// certifiable). At a probe the LP either reaches value G (a fractional
// partition with every group at most z exists, so nothing at or above the
// largest group it uses can be certified), or stays above G while neither
// the heuristic pricing nor the exhaustive search finds an improving
// group: z is certified. The exhaustive search is most of the cost, so
// only two probes run it: the first, 5 % below the plan (on FLAME the LP
// bound lies 3–9 % below a good plan; while the LP stays feasible there,
// 5 % below its largest group again), and the last. The probes between
// them bisect with heuristic pricing only, and a probe where it finds no
// column counts as probably certified; the highest such z is then proved
// (or, when its proof turns up columns that make the LP feasible, the
// bisection goes on below). With under 4 s for the layer the search stops
// within 0.5 % of the plan, since the probes nearest the LP bound cost the
// most. Out of time at a probe, the highest probably certified z is tried
// with its π, and the last π on smaller z by bisection (a smaller z only
// removes groups).
//
// Tokens are unit weights (pattern counts must be integral), so
// max_g D_g > z means max_g D_g ≥ z+1.
package onenode
