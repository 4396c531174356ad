package baseline

import (
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

func ex(xs ...int) []routing.Expert {
	out := make([]routing.Expert, len(xs))
	for i, x := range xs {
		out[i] = routing.Expert(x)
	}
	return out
}

func gp(xs ...int) []placement.GPU {
	out := make([]placement.GPU, len(xs))
	for i, x := range xs {
		out[i] = placement.GPU(x)
	}
	return out
}
