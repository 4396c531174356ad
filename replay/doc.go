// Package replay checks expert placements by replaying their work: it takes
// a placement.Plan and routing data, builds every iteration's per-GPU work,
// and times (or simulates) each MoE layer GPU by GPU. It shares no code with
// the solver it checks (it must not import solver).
//
// # Workload
//
// NewWorkload cuts a per-token routing.Trace into consecutive batches of
// WorkloadOptions.BatchTokens tokens (one iteration each), or expands
// count-only routing.Stats (Fiddler, logical_count) into Iterations batches
// by multinomial sampling: per iteration and layer, BatchTokens·TopK draws of
// an expert with probability Load[l][e]/Σ_e Load[l][e], from a PCG generator
// (math/rand/v2) seeded with Seed, in iteration, layer, draw order. Layers
// are sampled independently (count data has no per-token paths). An expert
// with c copies splits its n tokens as WorkloadOptions.Dispatch says: under
// vLLM's dispatch, on a trace with source ranks, token by token by vLLM's
// hash of the token's row in its rank's forward pass (each batch is every
// rank's forward pass; costmodel.VLLMHashCounts); under the other
// per-source dispatches by the shares costmodel.NewSplitter gives each
// source; otherwise evenly over its slots in slot order, the first n mod c
// slots taking one more. Each iteration keeps its batch's routing.Stats
// (with the batch's token order when the hash is counted) for the cost
// model.
//
// # Measurement (the MoETuner paper's definitions)
//
// GPUTime[i][l][g] is GPU g's expert compute in layer l of iteration i.
//
//	tail_l  = mean_i max_g GPUTime[i][l][g]      slowest GPU, averaged over iterations
//	mean_l  = mean_i mean_g GPUTime[i][l][g]     average over GPUs, then iterations
//	layer   = dispatch + max_g GPUTime + combine (sequential) or the overlap simulation
//	E2E     = mean_i Σ_l layer[i][l]
//
// Tail, Mean and Comm sum the per-layer values over layers.
//
// Dispatch and combine are always modeled: costmodel.Evaluate on the
// iteration's batch gives each phase's bottleneck port time plus latency. A
// single device cannot run a real all-to-all, so the cpu and gpu backends
// measure compute and label communication Modeled (Measurement.Compute,
// Measurement.Communication and their notes say which is which).
//
// Overlapped mode (costmodel.Overlapped) is simulated, not a formula: the
// batch is cut into Chunks pieces, the link sends dispatch chunks in order,
// each GPU computes chunk k after dispatch chunk k has arrived, combine
// chunk k follows once all GPUs finished chunk k, the link serves one chunk
// at a time first-come first-served, and compute runs at 1/(1+σ) speed
// whenever the link is busy (σ = Cluster.SigmaValue()). The result lies
// between max(compute, comm) and compute + comm.
//
// # Backends
//
// Sim computes GPU g's time as (α·tokens_g + β·slots_g)/speed_g with (α,
// β) = Cluster.Coefficients(Model); in sequential mode on a whole trace in
// one batch it reproduces costmodel.Evaluate's per-layer times.
//
// CPU runs every GPU's experts for real with gonum in float32, as SwiGLU:
// Y = (SiLU(X·W1) ⊙ (X·W3))·W2, three GEMMs and the activation, at a
// scaled-down size (default hidden 128, FFN 448: Mixtral's ratio 3.5) with
// the token counts multiplied by TokenScale (default 1/16; 1 runs the true
// counts) to bound the run time. GEMMs are issued in tiles small enough that gonum's Sgemm stays
// serial, so the timing is single-threaded whatever GOMAXPROCS is. Virtual
// GPUs run one after another; each GPU's share of a layer is repeated
// RunOptions.Repeats times after a warm-up and the median kept. Several
// plans replayed together (RunInterleaved, Compare) are interleaved GPU
// share by GPU share: each repeat of a GPU's share of a layer runs every
// plan's share back to back, in an order that alternates, so a burst of
// other load, a frequency change or a cold cache hits every plan alike and
// no plan always runs first. Only relative
// results (plan against plan, model against measurement at the same size)
// are meaningful: a CPU at hidden 256 says nothing about H100 latency, and
// the modeled communication is that of the full-size model, so a cpu
// Measurement's layer time and E2E mix scales.
//
// GPU runs the same three GEMMs per expert in bf16 with cuBLAS at
// the model's real size (Mixtral: hidden 4096, FFN 14336), with the true
// token counts, through the CUDA driver API loaded at run time with purego
// (libcuda.so.1, libcublas.so.*; no cgo, builds with CGO_ENABLED=0). Each
// virtual GPU's share of a layer is bracketed by CUDA events; virtual GPUs
// run one after another on one device, or on GPU.Devices round-robin, so
// their concurrency and the real all-to-all are not measured. It calls
// cublasGemmEx with CUDA_R_16BF operands and CUBLAS_COMPUTE_32F (19
// arguments, which purego v0.11 passes). The SiLU⊙ is not run (under 0.1 %
// of the flops; it would need a compiled kernel). Without a
// driver or device Run returns an error wrapping ErrNoDevice.
//
// # Confidence
//
// Compare repeats rounds (every plan once per round) and reports each
// plan's difference against the first, for the tail, the mean and the
// layer time (E2E), with a percentile bootstrap confidence interval:
//
//	estimate = S_j(all rounds)/S_0(all rounds) − 1
//	S_j(R)   = the summary of plan j with every GPUTime entry the median over the rounds R
//	interval = the (1−Level)/2 and (1+Level)/2 quantiles of the estimate over
//	           Resamples resamples R* of the rounds, drawn with replacement,
//	           the same R* for every plan (a round measured all plans: pairs stay paired)
//
// from a PCG generator seeded with CompareOptions.Seed, so the same rounds
// give the same interval. An interval that contains 0 is "within noise". A
// difference is resolved when its interval excludes 0 or lies within
// ±Resolution; Compare stops when every difference is resolved (after at
// least MinRounds rounds), at MaxRounds, or when the Budget would be
// exceeded. Stopping on resolution is a sequential test: it makes a 95 %
// interval a little less than 95 % sure; MinRounds limits the effect.
//
// # Calibration
//
// Calibrate fits time = PerToken·tokens + PerExpert·experts to per-GPU
// observations (Observations of a cpu or gpu Measurement) by least squares on
// the relative error, and reports the fit's error per GPU-layer and for the
// per-layer tail. Fit.Apply sets Cluster.TokenCost and ExpertCost;
// WriteCluster writes the cluster YAML atomically. CheckModel compares
// costmodel.Evaluate's per-GPU compute with a measurement; for the cpu
// backend pass a Model with the cpu's Hidden and FFN (and its TokenScale),
// so that the prediction and the measurement describe the same work.
package replay
