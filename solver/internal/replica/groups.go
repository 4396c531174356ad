package replica

import (
	"math"
	"math/bits"
)

// maxAffinityGroups bounds the expert groups whose node choice looks at the
// tokens: a token's groups are a 32-bit mask.
const maxAffinityGroups = 32

// groupTable is one layer's tokens reduced to what decides their
// cross-node traffic when every group (and all its copies) sits on one
// node: the token weight w of every (home node h, groups used mask) that
// occurs (h = N: no known source, its home spread evenly over the GPUs as
// the cost model does). At most one entry per pattern.
type groupTable struct {
	N, groups int
	entries   []groupEntry
}

type groupEntry struct {
	h    int
	mask uint32
	w    float64
}

// newGroupTable builds layer l's table, or returns nil when the statistics
// have no per-token paths, or there are more groups or nodes than its
// masks hold.
func newGroupTable(p Problem, l, groups int) *groupTable {
	s := p.Stats
	N, n := p.Cluster.Nodes, p.Cluster.GPUsPerNode
	if s.Patterns == nil || groups > maxAffinityGroups || groups < 2 || N > 64 {
		return nil
	}
	size := s.Experts / groups
	K := s.TopK
	at := map[[2]uint32]int{}
	t := &groupTable{N: N, groups: groups}
	for _, pt := range s.Patterns {
		var mask uint32
		for _, e := range pt.Experts[l*K : (l+1)*K] {
			if e >= 0 {
				mask |= 1 << (int(e) / size)
			}
		}
		h := N
		if pt.Source >= 0 {
			h = int(pt.Source) / n
		}
		k := [2]uint32{uint32(h), mask}
		i, ok := at[k]
		if !ok {
			i = len(t.entries)
			at[k] = i
			t.entries = append(t.entries, groupEntry{h: h, mask: mask})
		}
		t.entries[i].w += pt.Count
	}
	return t
}

// traffic returns, with nodeOf the node of every group, the token weight
// of remote nodes reached (Σ over tokens of the nodes holding its groups
// other than its home's: exactly the cost model's remote-node copies,
// because every copy of a group's experts sits on the group's node under
// any dispatch), and every node's copies out (from its tokens' homes) and
// in (to its experts) in the dispatch.
func (t *groupTable) traffic(nodeOf []int) (remote float64, out, in []float64) {
	N := t.N
	out, in = make([]float64, N), make([]float64, N)
	for _, en := range t.entries {
		var nm uint64
		for m := en.mask; m != 0; m &= m - 1 {
			nm |= 1 << nodeOf[bits.TrailingZeros32(m)]
		}
		w := en.w
		used := float64(bits.OnesCount64(nm))
		if en.h == N {
			// Home spread evenly over the nodes: each used node is
			// remote for the N−1 of N homes elsewhere.
			share := w / float64(N)
			for b := range N {
				if nm&(1<<b) != 0 {
					out[b] += share * (used - 1)
					in[b] += w * float64(N-1) / float64(N)
				} else {
					out[b] += share * used
				}
			}
			remote += w * used * float64(N-1) / float64(N)
			continue
		}
		r := used
		if nm&(1<<en.h) != 0 {
			r--
		}
		remote += w * r
		out[en.h] += w * r
		for b := range N {
			if b != en.h && nm&(1<<b) != 0 {
				in[b] += w
			}
		}
	}
	return remote, out, in
}

// groupCost prices a group-to-node assignment as the cost model does, to
// first order: the compute of the busiest node's tokens spread over its
// GPUs' speeds (perTok a token at speed 1), plus dispatch and combine
// through the busiest node's NIC ports, its copies out or in (the larger)
// spread over its n ports (copySec one copy through one port).
type groupCost struct {
	t               *groupTable
	gload, capacity []float64 // per group its tokens; per node Σ speed
	perTok, copySec float64
	n               int
	// load is every expert's tokens, size the experts per group, slots
	// every node's slots and fastest its fastest GPU's speed: a node's
	// compute is at least its largest replica's once its slots are
	// apportioned (one hot expert can outweigh the node's mean).
	load    []float64
	size    int
	slots   []int
	fastest []float64
}

func (c *groupCost) of(nodeOf []int) float64 {
	N := len(c.capacity)
	nl := make([]float64, N)
	members := make([][]int, N)
	for gr, nd := range nodeOf {
		nl[nd] += c.gload[gr]
		for e := gr * c.size; e < (gr+1)*c.size; e++ {
			members[nd] = append(members[nd], e)
		}
	}
	tail := 0.0
	for nd, v := range nl {
		tail = math.Max(tail, v/c.capacity[nd])
		if cnt, err := apportion(c.load, members[nd], c.slots[nd], c.n); err == nil {
			for _, e := range members[nd] {
				tail = math.Max(tail, c.load[e]/float64(cnt[e])/c.fastest[nd])
			}
		}
	}
	_, out, in := c.t.traffic(nodeOf)
	port := 0.0
	for b := range out {
		port = math.Max(port, math.Max(out[b], in[b]))
	}
	return c.perTok*tail + 2*c.copySec*port/float64(c.n)
}

// refine improves nodeOf (groups/N groups per node) by swapping groups of
// different nodes while the cost falls, best swap first, and returns it.
// It stops when the meter's budget ends.
func (c *groupCost) refine(nodeOf []int, stop func() bool) []int {
	cur := c.of(nodeOf)
	for !stop() {
		bestA, bestB, best := -1, -1, cur
		for a := range nodeOf {
			for b := a + 1; b < len(nodeOf); b++ {
				if nodeOf[a] == nodeOf[b] {
					continue
				}
				nodeOf[a], nodeOf[b] = nodeOf[b], nodeOf[a]
				if v := c.of(nodeOf); v < best*(1-1e-12) {
					bestA, bestB, best = a, b, v
				}
				nodeOf[a], nodeOf[b] = nodeOf[b], nodeOf[a]
			}
		}
		if bestA < 0 {
			break
		}
		nodeOf[bestA], nodeOf[bestB] = nodeOf[bestB], nodeOf[bestA]
		cur = best
	}
	return nodeOf
}
