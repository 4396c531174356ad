// Package rebalance keeps an expert placement up to date while a model
// serves: a Rebalancer is fed every forward pass's expert counts (and, when
// the stack records them, its tokens' paths), keeps the recent ones per
// phase, and when asked proposes a placement that changes at most a
// budget of slots per layer (or only changes that pay for their
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
// Without per-token paths, Propose runs solver.Solve (strategy joint,
// replicated path) on the window load under Config.Dispatch (each rank
// sending an equal share) with Problem.Current = the running plan and
// Options.MaxMoves = the budget, which starts from the running plan and makes the best swap (or
// copy-count change) from the busiest GPU while one helps and the budget
// lasts. With Budget.Horizon H the solve also charges each changed slot
//
//	MoveCost = (ExpertBytes / link) / (H · perToken · mean tokens per GPU per step)
//
// in units of the layer's busiest/mean load, link being the NIC's
// per-direction bandwidth across nodes, else NVLink's. Each layer of the
// result is then scored on the window's steps by the per-step cost model
// (costmodel.StepTails: routed tokens plus activated experts per GPU, each
// GPU's tokens as Config.Dispatch deals them, the even split of
// costmodel.StepCompute under even dispatch; the compute tail averaged
// over the steps by weight) and kept only if it is cheaper than the
// running layer, its gain × H exceeds its modeled MigrationTime (with a
// Horizon), and it changes at most MaxMoves slots. Under SGLang's tables
// (placement.Dispatch.Dealt) the deal runs through the whole plan, so
// putting a layer back changes the deal of the layers after it: the plan
// that results is scored again and its layers decided again (a few
// rounds), and it is dropped for the running plan unless it is faster as
// a whole. So a proposal never exceeds its budget and never makes a
// modeled step slower.
//
// Decode steps are cheap in tokens and dear in weight reads: a GPU's time
// follows the experts its few tokens activate. The solve balances token
// counts, so decode steps enter its load with perExpert/perToken extra
// tokens for every expert they activate; the step-by-step score above is
// exact in the activated-expert model.
//
// # Per-token paths: affinity
//
// Counts cannot say which experts a token uses together, so the proposals
// above balance load only. A step that also carries its tokens
// (Step.Tokens, a routing.Trace: every token's top-k experts at every
// layer and the rank it lives on) lets Propose cut the copies that cross
// nodes. Each phase keeps, beside its counts, the histogram of its
// tokens' distinct paths (routing.Pattern: source rank and every layer's
// top-k), built as steps are observed: a step's tokens are added when it
// is observed and subtracted when it leaves the window, each token
// weighing what its step weighs (Decay^age), so Propose reads the
// histogram as it stands and never recounts the tokens. The per-token
// window is the count window's last Window steps; the steps among them
// observed without Tokens contribute no paths (PathSteps counts those
// that did). It holds at most as many tokens as routing keeps paths of
// any trace (routing.PathSampleSize at the default path error: 122,500
// for top-8), which bounds its memory: past that the oldest steps' paths
// are dropped, the newest step with tokens kept whatever its size. An unlimited window (Window < 0) keeps the paths of the
// steps of age below A, the least age with Decay^A ≤ 0.01
// (routing.DefaultPathError): the steps left out weigh that share of the
// decayed total, the error routing's path sample allows.
//
// When the window holds paths and the budget is not Fresh, Propose solves
// with routing.Stats of those paths (Load, Tokens, Patterns) under
// Config.Dispatch: the joint strategy's affinity search from the running
// plan (solver.Problem.Current) under Options.MaxMoves = Budget.MaxMoves
// and, with a Horizon, MoveCost as above. Budget.Time bounds the whole
// proposal: the solve gets what is left of it, and its reports of the
// running plan (solver.Result.CurrentReport) and of its own plan are the
// scores (Align only reorders slots within a GPU, which the cost model
// does not see); only a proposal with layers put back by the Horizon rule
// is scored once more, after the solve. The proposal is kept only if the
// cost model, on the same paths, finds its layer times (compute and
// all-to-all) lower than the running plan's, as a whole: SGLang's dealt
// tables draw one random stream over every layer, so one layer's change
// can move another's deal. With a Horizon a layer whose gain per step
// over Horizon steps does not pay its MigrationTime is first put back.
// Proposal.CurrentRemote and Remote are the remote-node copies per token
// and layer of the two plans on the window's tokens, CurrentLayerSec and
// LayerSec their modeled layer times. Fresh proposals plan on the counts
// only. The solve's evaluations take time that no deadline cuts: on the
// 32k DeepSeek-V3 trace's 8192-token window (58 layers, 256 experts, 32
// GPUs) 0.3–0.5 s each on a loaded 2-core machine, so a 2 s deadline
// leaves the search about a second.
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
// default sizes; Proposal.TimedOut says when it did. Proposals on
// per-token paths run the affinity search until Budget.Time, so they are
// reproducible only under a work budget (Config.Solver.Effort).
package rebalance
