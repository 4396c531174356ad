// Package rebalance keeps an expert placement up to date while a model
// serves: a Rebalancer is fed every forward pass's expert counts, keeps the
// recent ones per phase, and when asked proposes a placement that changes
// at most a budget of slots per layer (or only changes that pay for their
// migration), for a control plane to install. Backtest replays a recorded
// time series of per-step loads under several policies side by side (a
// static plan, EPLB and moetuner re-planned on a cadence as SGLang and vLLM
// do, and the Rebalancer) and scores each as the public rebalancing
// harness does.
//
// # Windows
//
// Every phase (prefill, decode, or unknown) has its own window. Window W
// keeps the last W steps, each weighted Decay^age (age 0 for the newest);
// with no limit (Window < 0) the window is the decayed sum Σ Decay^age·step
// over every step, as TensorRT-LLM's online balancer keeps it. The window
// load is the weighted sum, its weight Σ Decay^age.
//
// # Proposals
//
// Propose runs solver.Solve (strategy joint, replicated path) on the window
// load with Problem.Current = the running plan and Options.MaxMoves = the
// budget, which starts from the running plan and makes the best swap (or
// copy-count change) from the busiest GPU while one helps and the budget
// lasts. With Budget.Horizon H the solve also charges each changed slot
//
//	MoveCost = (ExpertBytes / link) / (H · perToken · mean tokens per GPU per step)
//
// in units of the layer's busiest/mean load, link being the NIC's
// per-direction bandwidth across nodes, else NVLink's. Each layer of the
// result is then scored on the window's steps by the per-step cost model
// (costmodel.StepCompute: routed tokens plus activated experts per GPU,
// the compute tail averaged over the steps by weight) and kept only if it
// is cheaper than the running layer, its gain × H exceeds its modeled
// MigrationTime (with a Horizon), and it changes at most MaxMoves slots.
// So a proposal never exceeds its budget and never makes a modeled step
// slower.
//
// Decode steps are cheap in tokens and dear in weight reads: a GPU's time
// follows the experts its few tokens activate. The solve balances token
// counts, so decode steps enter its load with perExpert/perToken extra
// tokens for every expert they activate; the step-by-step score above is
// exact in the activated-expert model.
//
// # Counting moves
//
// A slot changes when its GPU receives an expert copy it did not hold
// (ChangedSlots); Align keeps every staying copy in its old slot, so the
// placement files differ in exactly those slots. BytesMoved is changed
// slots × Model.ExpertBytes().
//
// # Determinism
//
// Proposals and backtests are functions of their inputs: layers are solved
// independently, moves chosen in a fixed order with fixed tie-breaks, no
// map is iterated, and the time budget (DefaultTime) does not bind at the
// default sizes; Proposal.TimedOut says when it did.
package rebalance
