//go:build !cgo

package solver

import "github.com/moetuner/moetuner/mip"

// defaultBackend is Options.Backend's default. This build has no cgo, so
// HiGHS (mip/highs) is not linked in and there is none: the strategies
// that need an ILP return a *BackendError.
func defaultBackend() mip.Backend { return nil }
