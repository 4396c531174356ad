package replica

import (
	"math"
	"math/bits"
)

// maxBoundGroups bounds the expert groups whose node assignment
// groupBound searches: it visits N · 3^groups subset pairs.
const maxBoundGroups = 12

// groupBound is a lower bound on one layer's busiest load (tokens per
// unit of speed) over every plan with lay's slots that keeps each of
// groups groups of consecutive experts, and all its copies, on one node
// of perNode GPUs: whichever groups a node holds, all their tokens land
// on its GPUs (at least their load over the node's speed, under any
// dispatch and split), and an expert's copies fit on its node's GPUs (at
// least its largest replica under the apportionment of the node's slots
// that minimises it). The bound is the least, over every assignment of
// groups to nodes whose experts fill the nodes' slots, of the largest of
// these over the nodes. 0 when there are no groups, more than
// maxBoundGroups of them, or no assignment fills the slots.
func groupBound(load, speed []float64, slots []int, groups, perNode int) float64 {
	E, G := len(load), len(slots)
	if groups <= 0 || groups > maxBoundGroups || perNode <= 0 || G%perNode != 0 || E%groups != 0 {
		return 0
	}
	N, size := G/perNode, E/groups
	nodeSpeed, nodeFast := make([]float64, N), make([]float64, N)
	nodeSlots, nodeWidest := make([]int, N), make([]int, N)
	for g, s := range slots {
		nodeSlots[g/perNode] += s
		nodeWidest[g/perNode] = max(nodeWidest[g/perNode], s)
		nodeSpeed[g/perNode] += speed[g]
		nodeFast[g/perNode] = math.Max(nodeFast[g/perNode], speed[g])
	}
	full := 1<<groups - 1
	gload := make([]float64, groups)
	for e, v := range load {
		gload[e/size] += v
	}
	// val[nd][mask]: node nd's bound when it holds the groups in mask
	// (+Inf when their experts cannot fill its slots: too few or too many
	// for them, or fewer than one GPU's slots).
	val := make([][]float64, N)
	experts := make([]int, 0, E)
	for nd := range N {
		val[nd] = make([]float64, full+1)
		for mask := range full + 1 {
			n := bits.OnesCount(uint(mask)) * size
			if n > nodeSlots[nd] || n*perNode < nodeSlots[nd] || n < nodeWidest[nd] {
				val[nd][mask] = math.Inf(1)
				continue
			}
			if mask == 0 {
				continue // a node without slots holds nothing
			}
			sum := 0.0
			experts = experts[:0]
			for k := range groups {
				if mask&(1<<k) != 0 {
					sum += gload[k]
					for e := k * size; e < (k+1)*size; e++ {
						experts = append(experts, e)
					}
				}
			}
			v := sum / nodeSpeed[nd]
			if cnt, err := apportion(load, experts, nodeSlots[nd], perNode); err == nil {
				v = math.Max(v, maxReplica(load, cnt)/nodeFast[nd])
			} else {
				v = math.Inf(1)
			}
			val[nd][mask] = v
		}
	}
	// best[mask]: the least largest bound when nodes nd.. hold exactly
	// the groups in mask, filled from the last node back.
	best := make([]float64, full+1)
	for mask := range best {
		best[mask] = val[N-1][mask]
	}
	next := make([]float64, full+1)
	for nd := N - 2; nd >= 0; nd-- {
		for mask := range next {
			b := math.Inf(1)
			// Every sub ⊆ mask for node nd, the rest for the nodes after.
			for sub := mask; ; sub = (sub - 1) & mask {
				if v := val[nd][sub]; v < b {
					b = math.Min(b, math.Max(v, best[mask&^sub]))
				}
				if sub == 0 {
					break
				}
			}
			next[mask] = b
		}
		best, next = next, best
	}
	if math.IsInf(best[full], 1) {
		return 0
	}
	return best[full]
}
