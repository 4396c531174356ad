package replay

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"time"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// Defaults of the CPU backend: Mixtral's FFN/hidden ratio of 3.5, and a
// sixteenth of the routed tokens, at which one GPU's share of a Mixtral
// layer (4096 tokens, 2 experts per GPU) runs 3-5 ms on one core, over a
// thousand times the thread clock's resolution, with the per-token work
// 96-100 % of an expert's time (calibration), while a round of two plans
// over 32 layers takes 3-5 s, so the five or more rounds a confidence
// interval needs take well under a minute. Measured on a loaded 2-core
// machine, the noise of a plan replayed against itself does not shrink at
// larger sizes (it comes from the other load's cache and memory traffic,
// in proportion to the work), so larger sizes only cost time; the README
// shows the measurement.
const (
	DefaultCPUHidden         = 128
	DefaultCPUFFN            = 448
	DefaultCPUTokenScale     = 1.0 / 16
	DefaultCPUMaxWeightBytes = 512 << 20
)

// CPU is the backend that really runs every GPU's expert FFNs on this
// machine's CPU with gonum, one virtual GPU after another on the calling
// goroutine, and times each GPU's share of each layer. An expert is SwiGLU in
// float32: Y = (SiLU(X·W1) ⊙ (X·W3))·W2 with X [tokens×Hidden], W1 and W3
// [Hidden×FFN], W2 [FFN×Hidden]: three GEMMs and the activation. The zero
// value uses DefaultCPUHidden × DefaultCPUFFN and DefaultCPUTokenScale.
type CPU struct {
	// Hidden and FFN are the scaled-down expert sizes; 0 means
	// DefaultCPUHidden and DefaultCPUFFN.
	Hidden, FFN int
	// TokenScale multiplies every slot's token count before running it
	// (rounded, at least 1 for a slot with tokens), to keep runs short on
	// large batches; 0 means DefaultCPUTokenScale, 1 the true counts.
	// Reported times are for the scaled counts.
	TokenScale float64
	// MaxWeightBytes caps the memory of the expert weights; 0 means
	// DefaultCPUMaxWeightBytes. Weights are allocated once per logical expert
	// and shared by all layers (values do not change the time, and one
	// expert's weights already exceed the caches); beyond the cap, expert e
	// uses weight set e mod n.
	MaxWeightBytes int64
}

// Name returns "cpu".
func (CPU) Name() string { return "cpu" }

// Sizes returns the hidden size, FFN size and token scale the backend runs,
// defaults applied.
func (b CPU) Sizes() (hidden, ffn int, tokenScale float64) {
	hidden, ffn, tokenScale = b.Hidden, b.FFN, b.TokenScale
	if hidden <= 0 {
		hidden = DefaultCPUHidden
	}
	if ffn <= 0 {
		ffn = DefaultCPUFFN
	}
	if tokenScale <= 0 {
		tokenScale = DefaultCPUTokenScale
	}
	return hidden, ffn, tokenScale
}

// ScaledTokens returns the token count the backend runs for n routed tokens.
func (b CPU) ScaledTokens(n int) int {
	_, _, scale := b.Sizes()
	if n == 0 {
		return 0
	}
	return max(1, int(math.Round(float64(n)*scale)))
}

type cpuExpert struct{ w1, w3, w2 []float32 }

// Run executes w's expert FFNs and returns the measured per-GPU times, with
// the communication modeled from opts (see RunOptions).
func (b CPU) Run(ctx context.Context, w *Workload, opts RunOptions) (*Measurement, error) {
	ms, err := b.runAll(ctx, []*Workload{w}, opts)
	if err != nil {
		return nil, err
	}
	return ms[0], nil
}

// runAll runs several workloads of the same shape (one per plan, same
// routing data) in one pass, interleaved as finely as possible: for every
// iteration, layer and GPU, each timed repeat runs every workload's share of
// it back to back, in an order that alternates from repeat to repeat and
// from entry to entry (A B, B A, …). A burst of other load, a frequency
// change or a cold cache then hits every plan alike, and no plan always
// runs first. All workloads share one set of expert weights and buffers.
func (b CPU) runAll(ctx context.Context, ws []*Workload, opts RunOptions) ([]*Measurement, error) {
	h, f, scale := b.Sizes()
	w0 := ws[0]
	ms := make([]*Measurement, len(ws))
	maxSlot := 0
	for j, w := range ws {
		if w.Iterations() != w0.Iterations() || w.Layers() != w0.Layers() || w.GPUs() != w0.GPUs() || w.Plan.Experts != w0.Plan.Experts {
			return nil, fmt.Errorf("replay: workload %d has %d iterations × %d layers × %d GPUs, workload 0 %d × %d × %d; interleaved plans must replay the same routing data on the same GPUs",
				j, w.Iterations(), w.Layers(), w.GPUs(), w0.Iterations(), w0.Layers(), w0.GPUs())
		}
		ms[j] = newMeasurement("cpu", w, opts)
		if err := modelComm(ms[j], w, opts); err != nil {
			return nil, err
		}
		maxSlot = max(maxSlot, w.maxSlotTokens())
	}
	capBytes := b.MaxWeightBytes
	if capBytes <= 0 {
		capBytes = DefaultCPUMaxWeightBytes
	}
	setBytes := int64(3*h*f) * 4
	sets := int(min(int64(w0.Plan.Experts), max(1, capBytes/setBytes)))
	experts := make([]cpuExpert, sets)
	for e := range experts {
		experts[e] = cpuExpert{w1: fill(h*f, e, 1), w3: fill(h*f, e, 2), w2: fill(f*h, e, 3)}
	}
	maxTok := b.ScaledTokens(maxSlot)
	x := fill(maxTok*h, 0, 4)
	gate := make([]float32, maxTok*f)
	up := make([]float32, maxTok*f)
	y := make([]float32, maxTok*h)
	runGPU := func(w *Workload, i, l int, slots []int) {
		for _, s := range slots {
			n := b.ScaledTokens(w.SlotTokens[i][l][s])
			if n == 0 {
				continue
			}
			ex := experts[int(w.Plan.Layers[l].SlotExpert[s])%sets]
			gemm(n, f, h, x, ex.w1, gate)
			gemm(n, f, h, x, ex.w3, up)
			swiglu(gate[:n*f], up[:n*f])
			gemm(n, h, f, gate, ex.w2, y)
		}
	}
	// Thread CPU time only means something on one locked thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for range opts.warmup() {
		for _, w := range ws {
			for _, slots := range w.GPUSlots(0) {
				runGPU(w, 0, 0, slots)
			}
		}
	}
	reps := opts.repeats()
	times := make([][]time.Duration, len(ws))
	for j := range times {
		times[j] = make([]time.Duration, reps)
	}
	slots := make([][][]int, len(ws))
	for i := range w0.Iterations() {
		for l := range w0.Layers() {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			for j, w := range ws {
				slots[j] = w.GPUSlots(l)
			}
			for g := range w0.GPUs() {
				for r := range reps {
					for k := range ws {
						j := k
						if (r+g+l)%2 == 1 {
							j = len(ws) - 1 - k
						}
						start := threadTime()
						runGPU(ws[j], i, l, slots[j][g])
						times[j][r] = threadTime() - start
					}
				}
				for j := range ws {
					ms[j].GPUTime[i][l][g] = median(times[j])
				}
			}
		}
	}
	for _, m := range ms {
		m.Compute = Measured
		m.ComputeNote = fmt.Sprintf("gonum float32 SwiGLU experts (3 GEMMs + SiLU⊙) at hidden %d, FFN %d, token scale %g, single-threaded, timed by the thread's CPU clock; median of %d repeats after %d warm-up", h, f, scale, reps, opts.warmup())
		if len(ws) > 1 {
			m.ComputeNote += fmt.Sprintf("; %d plans interleaved GPU by GPU, alternating order", len(ws))
		}
		m.finish(opts)
	}
	return ms, nil
}

// fill returns n deterministic small values, so the arithmetic stays finite.
func fill(n, a, b int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((i*7+a*13+b*31)%17-8) / 256
	}
	return v
}

// Tiles keep gonum's Sgemm serial: it goes parallel from 4 blocks of 64×64
// up, so a tile of at most 64 rows × 192 columns runs on the caller's
// goroutine and the timing does not depend on GOMAXPROCS or on other load.
const (
	tileRows = 64
	tileCols = 192
)

var impl gonum.Implementation

// gemm computes c[m×n] = a[m×k]·b[k×n], row-major, single-threaded.
func gemm(m, n, k int, a, b, c []float32) {
	for i := 0; i < m; i += tileRows {
		mi := min(tileRows, m-i)
		for j := 0; j < n; j += tileCols {
			nj := min(tileCols, n-j)
			impl.Sgemm(blas.NoTrans, blas.NoTrans, mi, nj, k, 1, a[i*k:], k, b[j:], n, 0, c[i*n+j:], n)
		}
	}
}

// swiglu sets gate = SiLU(gate) ⊙ up.
func swiglu(gate, up []float32) {
	for i, g := range gate {
		gate[i] = g / (1 + float32(math.Exp(float64(-g)))) * up[i]
	}
}
