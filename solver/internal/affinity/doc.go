// Package affinity is the joint strategy's search at production scale:
// from a balanced plan it moves experts' copies between GPUs so that the
// tokens' paths cross fewer nodes, within a balance cap and a move budget.
// Its two flows have separate searches and files:
//
//   - the home flow (Solve; home*.go): the layers are independent; each is
//     searched on its own, first on a node-level proxy annealing
//     (homeproxy.go), then with exact node-level swaps, balancing within
//     nodes and an exact annealing (homesearch.go) on the layer's
//     counters (homelayer.go, homemove.go);
//   - the chain flow (SolveChain; chain*.go): the layers are coupled
//     through their transitions, so one cross-layer proxy annealing
//     (chainproxy.go, chainanneal.go, chainrelabel.go), balancing within
//     nodes (chainbalance.go), an exact annealing on the chain's counters
//     (chainexact.go, chainexactanneal.go) and a polish on the cost
//     model's incremental evaluator (chainpolish.go); under a short
//     limit an alignment of every layer to its neighbours' nodes
//     (chainalign.go) and a gain-cached refinement on the exact
//     counters (chainfm.go) take the proxy's place.
//
// problem.go holds what both share (Problem, Options, Result, the move
// budget); schedule.go the annealing schedules and the layer blocks. The
// shares of the limit each phase gets come from the solver's budget table
// (Options.Shares) for the home flow; the chain flow's are Options.Chain
// (ChainShares).
package affinity
