//go:build !cgo

package main

import (
	"errors"

	"github.com/moetuner/moetuner/mip"
)

// writeMPSFile would write m as MPS through HiGHS (--write-model
// PREFIX.mps); this build has no cgo, so HiGHS is not linked in.
func writeMPSFile(*mip.Model, string) error {
	return errors.New("moetuner: --write-model PREFIX.mps writes through HiGHS, and this binary was built without cgo; give --write-model PREFIX (CPLEX LP, written in Go), or rebuild with CGO_ENABLED=1 and a C++ toolchain")
}
