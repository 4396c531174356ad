// Package mip is moetuner's mixed-integer programming layer: a Model in
// column form with sparse rows, a Builder that assembles one row by row,
// an LP-file writer for debugging, a row-by-row feasibility check (never
// trust a backend's answer) and the Backend interface that mip/highs
// implements with HiGHS.
//
// It imports nothing of moetuner's, so every package that models a
// problem can be tested against HiGHS without an import cycle; all cgo
// lives in mip/highs.
package mip
