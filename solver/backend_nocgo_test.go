//go:build !cgo

package solver_test

import (
	"testing"

	"github.com/moetuner/moetuner/mip"
)

// testBackend skips the test: this build has no cgo, so no HiGHS.
func testBackend(t testing.TB) mip.Backend {
	t.Helper()
	t.Skip("needs HiGHS (mip/highs): build with CGO_ENABLED=1")
	return nil
}
