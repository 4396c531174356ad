//go:build cgo

package solver

import (
	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/mip/highs"
)

// defaultBackend is Options.Backend's default: HiGHS (mip/highs), linked
// statically through cgo.
func defaultBackend() mip.Backend { return highs.Backend{} }
