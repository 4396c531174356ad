package onenode

import (
	"math"
	"math/bits"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
)

// Layer is one layer's tokens as bitsets: sets[e] holds the tokens
// that route to expert e.
type Layer struct {
	E, G, m, W int
	sets       [][]uint64
	load       []int
	// lcap, when > 0, also limits a group's routed tokens Σ_{e∈S} load_e:
	// the bound then holds for plans whose busiest GPU routes at most lcap.
	lcap int
}

// fits reports whether routed tokens ld respect lcap.
func (c *Layer) fits(ld int) bool { return c.lcap <= 0 || ld <= c.lcap }

// groupLoad returns Σ_{e∈S} load_e.
func (c *Layer) groupLoad(S []int) int {
	n := 0
	for _, e := range S {
		n += c.load[e]
	}
	return n
}

// Layers builds the bitsets of every layer from per-token patterns
// with integral counts (a count of c stands for c tokens); ok is false when
// a count is not integral or the tokens are too many to expand.
func Layers(sc costmodel.Scenario) ([]*Layer, bool) {
	s := sc.Stats
	G := sc.Cluster.GPUs()
	if s.Patterns == nil || s.Experts%G != 0 {
		return nil, false
	}
	T := 0
	for i := range s.Patterns {
		c := s.Patterns[i].Count
		if c < 0 || c != math.Trunc(c) || c > 1<<20 {
			return nil, false
		}
		T += int(c)
		if T > 1<<20 {
			return nil, false
		}
	}
	W := (T + 63) / 64
	// The bitsets take L·E·W words; beyond 256 MiB the bound is skipped.
	// Annealing counts experts per token and GPU in a byte.
	if s.Layers*s.Experts*W > 1<<25 || s.TopK > 255 {
		return nil, false
	}
	out := make([]*Layer, s.Layers)
	k := s.TopK
	for l := range out {
		c := &Layer{E: s.Experts, G: G, m: s.Experts / G, W: W, sets: make([][]uint64, s.Experts), load: make([]int, s.Experts)}
		words := make([]uint64, s.Experts*W)
		for e := range c.sets {
			c.sets[e] = words[e*W : (e+1)*W]
		}
		t := 0
		for i := range s.Patterns {
			pt := &s.Patterns[i]
			for range int(pt.Count) {
				for _, e := range pt.Experts[l*k : (l+1)*k] {
					c.sets[e][t>>6] |= 1 << (t & 63)
				}
				t++
			}
		}
		for e := range c.sets {
			c.load[e] = popcount(c.sets[e])
		}
		out[l] = c
	}
	return out, true
}

func popcount(w []uint64) int {
	n := 0
	for _, x := range w {
		n += bits.OnesCount64(x)
	}
	return n
}

// cover returns N(S), the tokens with at least one expert in S.
func (c *Layer) cover(S []int) int {
	n := 0
	for w := 0; w < c.W; w++ {
		var x uint64
		for _, e := range S {
			x |= c.sets[e][w]
		}
		n += bits.OnesCount64(x)
	}
	return n
}

// marginalUpTo returns |sets[e] \ cov|, stopping early once it exceeds
// limit (the result is then some value > limit).
func (c *Layer) marginalUpTo(e int, cov []uint64, limit int) int {
	n := 0
	for w, x := range c.sets[e] {
		n += bits.OnesCount64(x &^ cov[w])
		if n > limit {
			return n
		}
	}
	return n
}

// maxGroupCover returns max over the groups of part of N(S).
func (c *Layer) maxGroupCover(part [][]int) int {
	best := 0
	for _, S := range part {
		best = max(best, c.cover(S))
	}
	return best
}

// planGroups returns layer l's partition of a single-copy plan: the experts
// on each GPU.
func planGroups(plan *placement.Plan, l, G int) [][]int {
	part := make([][]int, G)
	lp := plan.Layers[l]
	for s, e := range lp.SlotExpert {
		g := int(lp.SlotGPU[s])
		part[g] = append(part[g], int(e))
	}
	return part
}

// Sets returns, per expert, the bitset of the tokens that route to it
// (W words each). The slices are the layer's own: read them only.
func (c *Layer) Sets() [][]uint64 { return c.sets }

// Words is W, the words of one token bitset.
func (c *Layer) Words() int { return c.W }

// GPUs and Experts are the layer's shape.
func (c *Layer) GPUs() int { return c.G }

// Experts returns the layer's expert count.
func (c *Layer) Experts() int { return c.E }

// Cover returns N(S), the tokens with at least one expert in S.
func (c *Layer) Cover(S []int) int { return c.cover(S) }
