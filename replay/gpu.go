package replay

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"
)

// ErrNoDevice is returned (wrapped, with the reason) by GPU.Run when no CUDA
// driver or device is usable on this machine.
var ErrNoDevice = errors.New("replay: no CUDA device")

// Defaults of the GPU backend: Mixtral-8x7B's expert shape.
const (
	DefaultGPUHidden = 4096
	DefaultGPUFFN    = 14336
)

// GPU is the backend that runs every virtual GPU's expert GEMMs on a real
// NVIDIA GPU through the CUDA driver API and cuBLAS, loaded at run time with
// purego (no cgo, no CUDA headers). Each expert is three bf16
// GEMMs at the model's real size, X·W1 and X·W3 [tokens×Hidden]·[Hidden×FFN]
// and [tokens×FFN]·W2 [FFN×Hidden]; the elementwise SiLU⊙ is left out (it
// would need a compiled kernel and is under 0.1 % of the flops). The zero
// value runs Mixtral's shape on device 0.
type GPU struct {
	// Hidden and FFN are the expert sizes; 0 means RunOptions.Model's, or
	// DefaultGPUHidden and DefaultGPUFFN when that is unset.
	Hidden, FFN int
	// Devices are the CUDA device ordinals; virtual GPU g runs on
	// Devices[g mod len(Devices)]. Nil means device 0 for all.
	Devices []int
	// MemFraction is the share of a device's free memory the backend may
	// allocate; 0 means 0.9.
	MemFraction float64

	// drv replaces the CUDA driver in tests.
	drv driver
}

// devPtr is a device address; event a CUDA event handle.
type (
	devPtr uintptr
	event  uintptr
)

// driver is the slice of CUDA the gpu backend needs. The cuda type
// implements it with purego; tests use a fake that records calls.
type driver interface {
	// DeviceCount returns the number of CUDA devices.
	DeviceCount() (int, error)
	// Use makes device dev current on the calling OS thread, creating its
	// context, stream and cuBLAS handle on first use.
	Use(dev int) error
	// MemInfo returns the current device's free and total memory in bytes.
	MemInfo() (free, total int64, err error)
	Alloc(bytes int64) (devPtr, error)
	Free(p devPtr) error
	// Fill sets n 16-bit elements at p to the bit pattern v.
	Fill(p devPtr, v uint16, n int64) error
	// Gemm enqueues C[m×n] = A[m×k]·B[k×n] (row-major, bf16) on
	// the current device's stream.
	Gemm(m, n, k int, a, b, c devPtr) error
	NewEvent() (event, error)
	// Record enqueues ev on the current device's stream.
	Record(ev event) error
	// Elapsed waits for end and returns the time between start and end.
	Elapsed(start, end event) (time.Duration, error)
	DestroyEvent(ev event) error
	// Close releases every handle, stream and context.
	Close() error
}

// Name returns "gpu".
func (GPU) Name() string { return "gpu" }

func (b GPU) sizes(opts RunOptions) (h, f int) {
	h, f = b.Hidden, b.FFN
	if h <= 0 {
		h = opts.Model.Hidden
	}
	if f <= 0 {
		f = opts.Model.FFN
	}
	if h <= 0 {
		h = DefaultGPUHidden
	}
	if f <= 0 {
		f = DefaultGPUFFN
	}
	return h, f
}

// gpuDevice holds one physical device's buffers.
type gpuDevice struct {
	weights        [][3]devPtr // weight sets: W1, W3 [H×F], W2 [F×H]
	x, gate, up, y devPtr
	start, end     []event // one pair per repeat
	allocs         []devPtr
}

// gpuRun is one GPU.Run: the driver, the workload, the expert and
// activation sizes, and the buffers of each physical device used so far.
type gpuRun struct {
	drv                driver
	w                  *Workload
	h, f, reps         int
	frac               float64
	maxTok             int64
	setBytes, actBytes int64
	maxSlots           int
	state              map[int]*gpuDevice
}

// release frees every device's buffers and events.
func (r *gpuRun) release() {
	for d, st := range r.state {
		if r.drv.Use(d) != nil {
			continue
		}
		for _, p := range st.allocs {
			r.drv.Free(p)
		}
		for _, ev := range append(st.start, st.end...) {
			r.drv.DestroyEvent(ev)
		}
	}
}

// setup makes device d current, allocating its weights, activations and
// events on first use.
func (r *gpuRun) setup(d int) (*gpuDevice, error) {
	drv, w := r.drv, r.w
	if st, ok := r.state[d]; ok {
		return st, drv.Use(d)
	}
	if err := drv.Use(d); err != nil {
		return nil, fmt.Errorf("replay: gpu: device %d: %w", d, err)
	}
	st := &gpuDevice{}
	r.state[d] = st
	free, _, err := drv.MemInfo()
	if err != nil {
		return nil, fmt.Errorf("replay: gpu: device %d: %w", d, err)
	}
	setBytes, actBytes, maxTok, frac := r.setBytes, r.actBytes, r.maxTok, r.frac
	budget := int64(float64(free) * frac)
	sets := int64(w.Plan.Experts)
	if sets*setBytes+actBytes > budget {
		sets = int64(r.maxSlots)
	}
	if sets*setBytes+actBytes > budget {
		sets = 1
	}
	if sets*setBytes+actBytes > budget {
		return nil, fmt.Errorf("replay: gpu: device %d: one expert (%d MiB) and activations for %d tokens (%d MiB) exceed %.0f%% of the %d MiB free", d, setBytes>>20, maxTok, actBytes>>20, 100*frac, free>>20)
	}
	hf := int64(r.h) * int64(r.f)
	for range sets {
		var ws [3]devPtr
		for j := range ws {
			if ws[j], err = r.alloc(st, d, hf); err != nil {
				return nil, err
			}
		}
		st.weights = append(st.weights, ws)
	}
	for _, p := range []*devPtr{&st.x, &st.gate, &st.up, &st.y} {
		elems := maxTok * int64(r.h)
		if p == &st.gate || p == &st.up {
			elems = maxTok * int64(r.f)
		}
		if *p, err = r.alloc(st, d, elems); err != nil {
			return nil, err
		}
	}
	for range r.reps {
		s, err := drv.NewEvent()
		if err != nil {
			return nil, fmt.Errorf("replay: gpu: %w", err)
		}
		st.start = append(st.start, s)
		e, err := drv.NewEvent()
		if err != nil {
			return nil, fmt.Errorf("replay: gpu: %w", err)
		}
		st.end = append(st.end, e)
	}
	return st, nil
}

// alloc allocates elems bf16 elements on device d for st and fills them.
func (r *gpuRun) alloc(st *gpuDevice, d int, elems int64) (devPtr, error) {
	p, err := r.drv.Alloc(elems * 2)
	if err != nil {
		return 0, fmt.Errorf("replay: gpu: device %d: alloc %d bytes: %w", d, elems*2, err)
	}
	st.allocs = append(st.allocs, p)
	// Small constant values keep the products finite (0x3c24 ≈ 0.01 in bf16).
	if err := r.drv.Fill(p, 0x3c24, elems); err != nil {
		return 0, fmt.Errorf("replay: gpu: device %d: fill: %w", d, err)
	}
	return p, nil
}

// enqueue runs GPU g's experts of layer l in iteration i.
func (r *gpuRun) enqueue(st *gpuDevice, i, l int, slots []int) error {
	drv, w, h, f := r.drv, r.w, r.h, r.f
	for _, s := range slots {
		n := w.SlotTokens[i][l][s]
		if n == 0 {
			continue
		}
		ws := st.weights[int(w.Plan.Layers[l].SlotExpert[s])%len(st.weights)]
		if err := drv.Gemm(n, f, h, st.x, ws[0], st.gate); err != nil {
			return err
		}
		if err := drv.Gemm(n, f, h, st.x, ws[1], st.up); err != nil {
			return err
		}
		if err := drv.Gemm(n, h, f, st.gate, ws[2], st.y); err != nil {
			return err
		}
	}
	return nil
}

// Run replays w on the GPU(s). Without a usable CUDA driver or device it
// returns an error wrapping ErrNoDevice.
//
// Memory: weights are allocated once per logical expert (shared by all
// layers, as values do not change the time) when they fit in MemFraction of
// the free memory, else as many weight sets as the busiest virtual GPU
// holds in any layer (at least one), which expert e reuses as set e mod n.
// Activations are sized for the largest slot's token count.
func (b GPU) Run(ctx context.Context, w *Workload, opts RunOptions) (*Measurement, error) {
	runtime.LockOSThread() // CUDA contexts are current per OS thread
	defer runtime.UnlockOSThread()
	drv := b.drv
	if drv == nil {
		d, err := loadCUDA()
		if err != nil {
			return nil, err
		}
		drv = d
	}
	defer drv.Close()
	n, err := drv.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDevice, err)
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: the driver reports no devices", ErrNoDevice)
	}
	devs := b.Devices
	if len(devs) == 0 {
		devs = []int{0}
	}
	for _, d := range devs {
		if d < 0 || d >= n {
			return nil, fmt.Errorf("replay: gpu: device %d out of range [0,%d)", d, n)
		}
	}
	h, f := b.sizes(opts)
	m := newMeasurement("gpu", w, opts)
	if err := modelComm(m, w, opts); err != nil {
		return nil, err
	}
	reps, warm := opts.repeats(), opts.warmup()
	frac := b.MemFraction
	if frac <= 0 || frac > 1 {
		frac = 0.9
	}
	maxTok := int64(max(1, w.maxSlotTokens()))
	setBytes := 3 * int64(h) * int64(f) * 2
	actBytes := maxTok * (2*int64(h) + 2*int64(f)) * 2
	maxSlots := 1
	for l := range w.Layers() {
		for _, s := range w.Plan.SlotsPerGPU(l) {
			maxSlots = max(maxSlots, s)
		}
	}
	// Only the physical devices actually used get buffers.
	run := &gpuRun{drv: drv, w: w, h: h, f: f, reps: reps, frac: frac, maxTok: maxTok,
		setBytes: setBytes, actBytes: actBytes, maxSlots: maxSlots, state: map[int]*gpuDevice{}}
	defer run.release()
	setup, enqueue := run.setup, run.enqueue
	devOf := func(g int) int { return devs[g%len(devs)] }
	// Warm-up: every device runs the first layer of every virtual GPU.
	for range warm {
		for g, slots := range w.GPUSlots(0) {
			st, err := setup(devOf(g))
			if err != nil {
				return nil, err
			}
			if err := drv.Record(st.start[0]); err != nil {
				return nil, fmt.Errorf("replay: gpu: %w", err)
			}
			if err := enqueue(st, 0, 0, slots); err != nil {
				return nil, fmt.Errorf("replay: gpu: warm-up: %w", err)
			}
			if err := drv.Record(st.end[0]); err != nil {
				return nil, fmt.Errorf("replay: gpu: %w", err)
			}
			if _, err := drv.Elapsed(st.start[0], st.end[0]); err != nil {
				return nil, fmt.Errorf("replay: gpu: warm-up: %w", err)
			}
		}
	}
	times := make([]time.Duration, reps)
	for i := range w.Iterations() {
		for l := range w.Layers() {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			for g, slots := range w.GPUSlots(l) {
				st, err := setup(devOf(g))
				if err != nil {
					return nil, err
				}
				for r := range reps {
					if err := drv.Record(st.start[r]); err != nil {
						return nil, fmt.Errorf("replay: gpu: %w", err)
					}
					if err := enqueue(st, i, l, slots); err != nil {
						return nil, fmt.Errorf("replay: gpu: iteration %d layer %d GPU %d: %w", i, l, g, err)
					}
					if err := drv.Record(st.end[r]); err != nil {
						return nil, fmt.Errorf("replay: gpu: %w", err)
					}
				}
				for r := range reps {
					if times[r], err = drv.Elapsed(st.start[r], st.end[r]); err != nil {
						return nil, fmt.Errorf("replay: gpu: %w", err)
					}
				}
				m.GPUTime[i][l][g] = median(times)
			}
		}
	}
	m.Compute = Measured
	m.ComputeNote = fmt.Sprintf("cuBLAS bf16 GEMMs, fp32 accumulation (3 per expert, no SiLU⊙) at hidden %d, FFN %d with the true token counts, timed with CUDA events, virtual GPUs one after another on device(s) %v; median of %d repeats after %d warm-up", h, f, devs, reps, warm)
	m.finish(opts)
	return m, nil
}
