// Command experiments runs the measurements behind BENCHMARKS.md that
// are not benchmarks of the public API: searches and bounds of the
// solver's internal methods on a real trace, each printing what it
// found. It is a harness for developers, run from the repository:
//
//	go run ./solver/internal/experiments <experiment> [flags]
//
// It lives under solver/internal so that it may call the methods'
// internals (the few entry points it needs are in
// solver/internal/affinity/experiment.go and
// solver/internal/trafficbound/experiment.go); the solver does not use
// it. Results in seconds depend on the machine: each experiment runs for
// its -limit of wall time.
//
// Every experiment takes
//
//	-trace PATH   a per-token trace (any format routing.Load reads); default
//	              shared/traces/synthetic-deepseek-v3/ds3-prefill4096-32k.npy,
//	              looked up from the working directory and its parents
//	-nodes N      nodes of 8 GPUs (the h100x8 preset), default 4
//
// and the experiments are:
//
// home [-limit 20s] [-cap 0]: the home flow's affinity search
// (affinity.Solve, 2 layers at a time, phase shares 0.4/0.25/0.15)
// from EPLB's plan with 8 redundant slots per node (FixDuplicates),
// DeepSeek-V3, SGLang's static dispatch in expectation (static-mean).
// -cap is the search's MaxImbalance (0: none). It prints EPLB's and the
// search's remote copies per token and layer, modelled time and balance,
// a line per layer from the search's phases, the dispatch and combine
// times and NIC loads of layers 0–2, and the busiest NIC port over the
// mean.
//
// chain [-limit 45s] [-shares p,x]: the chain flow's search
// (affinity.SolveChain) from EPLB's plan (one copy per expert),
// DeepSeek-V3. -shares gives the proxy's and the exact counters' shares
// of the limit (default 0.6,0.3; the polish gets the rest). A limit that
// leaves under a dozen evaluations of the plan takes the short path (the
// alignment and the gain-cached refinement in place of the proxy): -limit
// 5s measures it. It prints compute and all-to-all time, the busiest NIC
// ports over the mean, and cross-node bytes, time and balance before and
// after.
//
// chain-ceiling [-limit 240s] [-capx 0]: how far the cross-node
// transitions alone could fall at EPLB's balance (affinity.ChainCeiling):
// the exact chain counters annealed on their NIC copies only, from EPLB's
// plan, every layer's compute tail held to EPLB's; -capx x lets a
// layer's tail rise to x times its mean GPU's where that is above
// EPLB's. A heuristic, not a bound. It prints the swaps scored and
// cross-node bytes, time and balance before and after.
//
// holdout-floor [-redundant-slots 32] [-dispatch sglang-static]: how low
// a plan made on a trace's first half can keep the busiest GPU on its
// second half. It measures the per-GPU spread of loads between the halves
// for EPLB's plan made on the first (√2 times one half's sampling noise
// σ), and prints the floor 1 + c_G·√2·σ of a plan balanced exactly on the
// first half (c_G: the expected maximum of G standard normals), and
// 1 + c_G·σ of one balanced on the true rates, from the measured spread
// and from the Poisson count's σ = 1/√(tokens a GPU computes in a half).
//
// node-ceiling [-layers 0,1,2] [-limit 20s]: how far any node placement
// could go: a plain simulated annealing of one copy per expert over the
// nodes, on the exact count of distinct remote nodes per token, from
// EPLB's nodes, every node's load under caps of 1.01, 1.02 and 1.10 of
// the mean and no cap, for -limit each. It prints EPLB's and the best
// count per token and the node balance.
//
// relax-node [-layers 0,1,2] [-limit 10s] [-iters 400] [-eta 1]: whether
// a relaxation finds a better node placement than that annealing at cap
// 1.02: entropic mirror descent on the expected count of independent
// rounding over exactly balanced node loads (-iters iterations, step
// -eta relative to each expert's load), rounded, then annealed for what
// is left of -limit, against the annealing from EPLB for all of it.
//
// hub-copies [-layers 0,1,2] [-limit 20s]: whether copies under static
// dispatch pay for an unbalanced node placement: the annealing under caps
// of 1.02 to 1.40, then up to 8 copies per node added greedily (each the
// one that removes the most node overload per remote copy it adds) until
// every node is under 1.02 of the mean. It prints the node loads before
// and after and the remote count against EPLB's.
//
// bound-budgets [-layers 0,20]: where the home-flow lower bound
// (trafficbound.HomeRemote, even dispatch, one copy per expert) loses:
// the bound and its budgets H* (experts served at home) and W* (pairs on
// a common node) against the moments of EPLB's plan and of a node-level
// swap search from it (trafficbound.NodeSearch), the configuration LP
// with each budget replaced by the search plan's moment, and a
// balance-aware pair budget for plans within 1.02 of the mean node load,
// minimized over a grid of μ.
//
// balanced-bound [-layers 0,20] [-slots 9] [-cap 1.02] [-dispatch
// static-mean]: the home-flow bound over every plan and over the plans
// whose nodes carry at most -cap of the mean load
// (trafficbound.Options.MaxNodeLoad), without and with the shift steps,
// and the time of each, for -slots slots per GPU under -dispatch (even,
// static-mean, local or vllm).
//
// The exit status is 0 when the experiment ran, 1 when it failed and 2
// for bad flags.
package main
