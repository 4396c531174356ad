//go:build cgo

package main

import (
	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/mip/highs"
)

// writeMPSFile writes m as MPS through HiGHS (--write-model PREFIX.mps).
func writeMPSFile(m *mip.Model, path string) error { return highs.WriteModel(m, path) }
