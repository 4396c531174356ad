//go:build linux

package replay

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"
)

// TestGemmExABI checks that purego passes cublasGemmEx's 19 mixed
// arguments (ints, pointers, float pointers; most spill to the stack) the
// way C receives them, by calling a C function with the same signature
// built here with gcc. The real cuBLAS cannot be called without a GPU.
func TestGemmExABI(t *testing.T) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "gemmex.c")
	lib := filepath.Join(dir, "libgemmex.so")
	require.NoError(t, os.WriteFile(src, []byte(`
#include <stdint.h>
long long fake_gemm_ex(void *h, int ta, int tb, int m, int n, int k, const float *alpha,
	const void *a, int atype, int lda, const void *b, int btype, int ldb, const float *beta,
	void *c, int ctype, int ldc, int compute, int algo) {
	if ((uintptr_t)h != 0x1234 || ta != 0 || tb != 1 || m != 11 || n != 12 || k != 13) return -1;
	if (*alpha != 1.5f || *beta != 0.25f) return -2;
	if ((uintptr_t)a != 0xA000 || atype != 14 || lda != 21) return -3;
	if ((uintptr_t)b != 0xB000 || btype != 14 || ldb != 22) return -4;
	if ((uintptr_t)c != 0xC000 || ctype != 14 || ldc != 23) return -5;
	if (compute != 68 || algo != -1) return -6;
	return 42;
}
`), 0o644))
	out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-o", lib, src).CombinedOutput()
	require.NoError(t, err, string(out))
	h, err := purego.Dlopen(lib, purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(t, err)
	defer purego.Dlclose(h)
	var c cuda
	purego.RegisterLibFunc(&c.cublasGemmEx, h, "fake_gemm_ex")
	alpha, beta := float32(1.5), float32(0.25)
	got := c.cublasGemmEx(0x1234, 0, 1, 11, 12, 13, &alpha, 0xA000, 14, 21, 0xB000, 14, 22, &beta, 0xC000, 14, 23, 68, -1)
	require.Equal(t, int32(42), got)
}
