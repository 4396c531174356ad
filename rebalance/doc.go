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
// # Backtests
//
// Backtest replays a series steps[s][l][e]. Every policy installs its first
// plan at step T = FirstWindow, made from steps [0, T) (moetuner's fresh
// plan; EPLB's own for PolicyEPLB); it is what the server starts with, so
// it moves nothing. The dynamic policies re-plan at T + k·N from steps
// [t − W, t) and the plan made at t is in force from step t: no step is
// scored with a plan that saw it. For every scored step s ≥ T,
//
//	PAR_s = (1/L) Σ_l max_g load_g / mean_g load_g,   load_g = Σ_{copies on g} n_e / c_e
//
// under the plan in force (LayerPAR, StepPAR); transit is the changed
// slots of every plan change (ChangedSlots, after Align, as the stacks
// would rewrite them); the harness score is
//
//	60 s × mean_s PAR_s + transit × BytesPerExpert / 900 GB/s + calls × CallSec
//
// (Harness); moetuner's modeled time is Σ_s costmodel.StepTime of the
// plan in force plus MigrationTime at every change. A fresh plan
// (PolicyMoETuner, Budget.Fresh) numbers its GPUs arbitrarily, so its
// GPUs are first matched to the running plan's (Relabel); EPLB's are not,
// as neither SGLang nor vLLM does (vLLM keeps staying experts in their
// slots, which Align does for every policy).
//
// The recommendation is the policy with the lowest harness score, or
// "a static plan is enough" when static's score is within 2 × 60 s × the
// standard error of the mean per-step PAR difference between static and
// that policy: the part of the gap that the steps' own noise explains.
//
// # Determinism
//
// Proposals and backtests are functions of their inputs: layers are solved
// independently, moves chosen in a fixed order with fixed tie-breaks, no
// map is iterated, and the time budget (DefaultTime) does not bind at the
// default sizes; Proposal.TimedOut says when it did.
package rebalance
