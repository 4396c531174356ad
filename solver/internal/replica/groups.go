package replica

import (
	"math"
	"math/bits"
)

// maxAffinityGroups bounds the expert groups whose node choice looks at the
// tokens: a token's groups are a bit mask, and the table of masks has
// 2^groups entries per home.
const maxAffinityGroups = 16

// groupTable is one layer's tokens reduced to what decides their
// cross-node traffic when every group (and all its copies) sits on one
// node: w[h][mask] is the token weight whose experts span the groups in
// mask, sourced on node h (h = N: no known source, its home spread evenly
// over the GPUs as the cost model does).
type groupTable struct {
	N, groups int
	w         [][]float64
}

// newGroupTable builds layer l's table, or returns nil when the statistics
// have no per-token paths or there are too many groups.
func newGroupTable(p Problem, l, groups int) *groupTable {
	s := p.Stats
	if s.Patterns == nil || groups > maxAffinityGroups || groups < 2 {
		return nil
	}
	N, n := p.Cluster.Nodes, p.Cluster.GPUsPerNode
	size := s.Experts / groups
	t := &groupTable{N: N, groups: groups, w: make([][]float64, N+1)}
	for h := range t.w {
		t.w[h] = make([]float64, 1<<groups)
	}
	K := s.TopK
	for _, pt := range s.Patterns {
		mask := 0
		for _, e := range pt.Experts[l*K : (l+1)*K] {
			if e >= 0 {
				mask |= 1 << (int(e) / size)
			}
		}
		h := N
		if pt.Source >= 0 {
			h = int(pt.Source) / n
		}
		t.w[h][mask] += pt.Count
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
	nodeMask := make([]uint64, 1<<t.groups)
	for m := 1; m < len(nodeMask); m++ {
		low := bits.TrailingZeros(uint(m))
		nodeMask[m] = nodeMask[m&(m-1)] | 1<<nodeOf[low]
	}
	out, in = make([]float64, N), make([]float64, N)
	for h, row := range t.w {
		for m, w := range row {
			if w == 0 {
				continue
			}
			nm := nodeMask[m]
			used := float64(bits.OnesCount64(nm))
			if h == N {
				// Home spread evenly over the nodes: each used node is
				// remote for the N−1 of N homes elsewhere.
				for b := range N {
					share := w / float64(N)
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
			if nm&(1<<h) != 0 {
				r--
			}
			remote += w * r
			out[h] += w * r
			for b := range N {
				if b != h && nm&(1<<b) != 0 {
					in[b] += w
				}
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
	gload, capacity []float64 // per group; per node Σ speed
	perTok, copySec float64
	n               int
}

func (c *groupCost) of(nodeOf []int) float64 {
	nl := make([]float64, len(c.capacity))
	for gr, nd := range nodeOf {
		nl[nd] += c.gload[gr]
	}
	tail := 0.0
	for nd, v := range nl {
		tail = math.Max(tail, v/c.capacity[nd])
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
