package replay

import (
	"errors"
	"fmt"
	"time"

	"github.com/ebitengine/purego"
)

// The CUDA libraries tried, in order.
var (
	cudaLibs   = []string{"libcuda.so.1", "libcuda.so"}
	cublasLibs = []string{"libcublas.so", "libcublas.so.13", "libcublas.so.12", "libcublas.so.11"}
)

// cuda implements driver with the CUDA driver API and cuBLAS, loaded with
// purego. Only integers and pointers cross the boundary and no callbacks are
// registered (purego's callbacks are unreliable on Linux). Gemm calls cublasGemmEx with bf16 inputs and
// outputs and fp32 accumulation (19 arguments: purego ≥ v0.11 passes up to
// 32, spilling to the stack as the C ABI does).
type cuda struct {
	cuInit                    func(flags uint32) int32
	cuDeviceGetCount          func(n *int32) int32
	cuDeviceGet               func(dev *int32, ordinal int32) int32
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) int32
	cuDevicePrimaryCtxRelease func(dev int32) int32
	cuCtxSetCurrent           func(ctx uintptr) int32
	cuMemGetInfo              func(free, total *uint64) int32
	cuMemAlloc                func(p *uint64, size uint64) int32
	cuMemFree                 func(p uint64) int32
	cuMemsetD16               func(p uint64, v uint16, n uint64) int32
	cuStreamCreate            func(s *uintptr, flags uint32) int32
	cuStreamDestroy           func(s uintptr) int32
	cuStreamSynchronize       func(s uintptr) int32
	cuEventCreate             func(ev *uintptr, flags uint32) int32
	cuEventRecord             func(ev, stream uintptr) int32
	cuEventSynchronize        func(ev uintptr) int32
	cuEventElapsedTime        func(ms *float32, start, end uintptr) int32
	cuEventDestroy            func(ev uintptr) int32

	cublasCreate    func(h *uintptr) int32
	cublasDestroy   func(h uintptr) int32
	cublasSetStream func(h, stream uintptr) int32
	cublasGemmEx    func(h uintptr, ta, tb int32, m, n, k int32, alpha *float32, a uintptr, atype, lda int32, b uintptr, btype, ldb int32, beta *float32, c uintptr, ctype, ldc int32, compute, algo int32) int32

	devs map[int]*cudaDev
	cur  *cudaDev
}

type cudaDev struct {
	ordinal int32
	ctx     uintptr
	stream  uintptr
	blas    uintptr
}

type cuError struct {
	call string
	code int32
}

func (e *cuError) Error() string { return fmt.Sprintf("%s failed with status %d", e.call, e.code) }

func check(call string, code int32) error {
	if code != 0 {
		return &cuError{call, code}
	}
	return nil
}

func dlopenAny(names []string) (uintptr, string, error) {
	var errs []error
	for _, n := range names {
		h, err := purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return h, n, nil
		}
		errs = append(errs, err)
	}
	return 0, "", errors.Join(errs...)
}

// register binds fn to sym in lib, turning purego's panic on a missing
// symbol into an error.
func register(lib uintptr, fn any, sym string) (err error) {
	if _, err := purego.Dlsym(lib, sym); err != nil {
		return fmt.Errorf("symbol %s: %w", sym, err)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("symbol %s: %v", sym, r)
		}
	}()
	purego.RegisterLibFunc(fn, lib, sym)
	return nil
}

// loadCUDA opens libcuda and libcublas and initialises the driver; every
// failure wraps ErrNoDevice.
func loadCUDA() (*cuda, error) {
	lib, _, err := dlopenAny(cudaLibs)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot load the CUDA driver (%v)", ErrNoDevice, err)
	}
	blas, _, err := dlopenAny(cublasLibs)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot load cuBLAS (%v)", ErrNoDevice, err)
	}
	c := &cuda{devs: map[int]*cudaDev{}}
	for _, r := range []struct {
		lib uintptr
		fn  any
		sym string
	}{
		{lib, &c.cuInit, "cuInit"},
		{lib, &c.cuDeviceGetCount, "cuDeviceGetCount"},
		{lib, &c.cuDeviceGet, "cuDeviceGet"},
		{lib, &c.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
		{lib, &c.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
		{lib, &c.cuCtxSetCurrent, "cuCtxSetCurrent"},
		{lib, &c.cuMemGetInfo, "cuMemGetInfo_v2"},
		{lib, &c.cuMemAlloc, "cuMemAlloc_v2"},
		{lib, &c.cuMemFree, "cuMemFree_v2"},
		{lib, &c.cuMemsetD16, "cuMemsetD16_v2"},
		{lib, &c.cuStreamCreate, "cuStreamCreate"},
		{lib, &c.cuStreamDestroy, "cuStreamDestroy_v2"},
		{lib, &c.cuStreamSynchronize, "cuStreamSynchronize"},
		{lib, &c.cuEventCreate, "cuEventCreate"},
		{lib, &c.cuEventRecord, "cuEventRecord"},
		{lib, &c.cuEventSynchronize, "cuEventSynchronize"},
		{lib, &c.cuEventElapsedTime, "cuEventElapsedTime"},
		{lib, &c.cuEventDestroy, "cuEventDestroy_v2"},
		{blas, &c.cublasCreate, "cublasCreate_v2"},
		{blas, &c.cublasDestroy, "cublasDestroy_v2"},
		{blas, &c.cublasSetStream, "cublasSetStream_v2"},
		{blas, &c.cublasGemmEx, "cublasGemmEx"},
	} {
		if err := register(r.lib, r.fn, r.sym); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNoDevice, err)
		}
	}
	if err := check("cuInit", c.cuInit(0)); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDevice, err)
	}
	return c, nil
}

func (c *cuda) DeviceCount() (int, error) {
	var n int32
	err := check("cuDeviceGetCount", c.cuDeviceGetCount(&n))
	return int(n), err
}

func (c *cuda) Use(ordinal int) error {
	if d, ok := c.devs[ordinal]; ok {
		c.cur = d
		return check("cuCtxSetCurrent", c.cuCtxSetCurrent(d.ctx))
	}
	d := &cudaDev{}
	if err := check("cuDeviceGet", c.cuDeviceGet(&d.ordinal, int32(ordinal))); err != nil {
		return err
	}
	if err := check("cuDevicePrimaryCtxRetain", c.cuDevicePrimaryCtxRetain(&d.ctx, d.ordinal)); err != nil {
		return err
	}
	c.devs[ordinal] = d
	if err := check("cuCtxSetCurrent", c.cuCtxSetCurrent(d.ctx)); err != nil {
		return err
	}
	if err := check("cuStreamCreate", c.cuStreamCreate(&d.stream, 1 /* CU_STREAM_NON_BLOCKING */)); err != nil {
		return err
	}
	if err := check("cublasCreate_v2", c.cublasCreate(&d.blas)); err != nil {
		return err
	}
	if err := check("cublasSetStream_v2", c.cublasSetStream(d.blas, d.stream)); err != nil {
		return err
	}
	c.cur = d
	return nil
}

func (c *cuda) MemInfo() (free, total int64, err error) {
	var f, t uint64
	err = check("cuMemGetInfo_v2", c.cuMemGetInfo(&f, &t))
	return int64(f), int64(t), err
}

func (c *cuda) Alloc(bytes int64) (devPtr, error) {
	var p uint64
	err := check("cuMemAlloc_v2", c.cuMemAlloc(&p, uint64(bytes)))
	return devPtr(p), err
}

func (c *cuda) Free(p devPtr) error { return check("cuMemFree_v2", c.cuMemFree(uint64(p))) }

func (c *cuda) Fill(p devPtr, v uint16, n int64) error {
	if err := check("cuMemsetD16_v2", c.cuMemsetD16(uint64(p), v, uint64(n))); err != nil {
		return err
	}
	return check("cuStreamSynchronize", c.cuStreamSynchronize(0))
}

// Gemm computes row-major C = A·B as column-major Cᵀ = Bᵀ·Aᵀ, so cuBLAS
// sees (n×k)·(k×m) with leading dimensions n, k and n.
func (c *cuda) Gemm(m, n, k int, a, b, out devPtr) error {
	const (
		cudaR16BF        = 14 // cudaDataType CUDA_R_16BF
		cublasCompute32F = 68 // CUBLAS_COMPUTE_32F
		cublasGemmDflt   = -1 // CUBLAS_GEMM_DEFAULT
	)
	one, zero := float32(1), float32(0)
	return check("cublasGemmEx", c.cublasGemmEx(c.cur.blas, 0, 0, int32(n), int32(m), int32(k), &one,
		uintptr(b), cudaR16BF, int32(n), uintptr(a), cudaR16BF, int32(k), &zero, uintptr(out), cudaR16BF, int32(n),
		cublasCompute32F, cublasGemmDflt))
}

func (c *cuda) NewEvent() (event, error) {
	var ev uintptr
	err := check("cuEventCreate", c.cuEventCreate(&ev, 0))
	return event(ev), err
}

func (c *cuda) Record(ev event) error {
	return check("cuEventRecord", c.cuEventRecord(uintptr(ev), c.cur.stream))
}

func (c *cuda) Elapsed(start, end event) (time.Duration, error) {
	if err := check("cuEventSynchronize", c.cuEventSynchronize(uintptr(end))); err != nil {
		return 0, err
	}
	var ms float32
	if err := check("cuEventElapsedTime", c.cuEventElapsedTime(&ms, uintptr(start), uintptr(end))); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * 1e6), nil
}

func (c *cuda) DestroyEvent(ev event) error {
	return check("cuEventDestroy_v2", c.cuEventDestroy(uintptr(ev)))
}

func (c *cuda) Close() error {
	var errs []error
	for o, d := range c.devs {
		if err := check("cuCtxSetCurrent", c.cuCtxSetCurrent(d.ctx)); err != nil {
			errs = append(errs, err)
			continue
		}
		if d.blas != 0 {
			errs = append(errs, check("cublasDestroy_v2", c.cublasDestroy(d.blas)))
		}
		if d.stream != 0 {
			errs = append(errs, check("cuStreamDestroy_v2", c.cuStreamDestroy(d.stream)))
		}
		errs = append(errs, check("cuDevicePrimaryCtxRelease_v2", c.cuDevicePrimaryCtxRelease(d.ordinal)))
		delete(c.devs, o)
	}
	return errors.Join(errs...)
}
