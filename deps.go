//go:build tools

// Package moetuner pins dependencies used across the packages.
package moetuner

import (
	_ "codeberg.org/sbinet/npyio"
	_ "github.com/bartolsthoorn/gohighs/highs"
	_ "github.com/stretchr/testify/require"
	_ "gonum.org/v1/gonum/mat"
	_ "gopkg.in/yaml.v3"
)
