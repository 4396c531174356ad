//go:build cgo

package solver_test

import (
	"testing"

	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/mip/highs"
)

// testBackend is the backend the tests that pass one explicitly use.
func testBackend(t testing.TB) mip.Backend {
	t.Helper()
	return highs.Backend{}
}
