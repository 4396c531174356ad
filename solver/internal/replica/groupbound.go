package replica

import (
	"cmp"
	"math"
	"math/bits"
	"slices"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
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
	gn := newGroupNodes(load, speed, slots, groups, perNode)
	if gn == nil {
		return 0
	}
	v, _ := gn.assign(gn.val)
	if math.IsInf(v, 1) {
		return 0
	}
	return v
}

// groupNodes is groupBound's instance: val[nd][mask] is node nd's bound
// when it holds the groups in mask (+Inf when their experts cannot fill
// its slots: too few or too many for them, or fewer than one GPU's
// slots).
type groupNodes struct {
	N, groups, size, perNode int
	val                      [][]float64
}

// newGroupNodes builds groupBound's instance; nil when there are no
// groups or too many.
func newGroupNodes(load, speed []float64, slots []int, groups, perNode int) *groupNodes {
	E, G := len(load), len(slots)
	if groups <= 0 || groups > maxBoundGroups || perNode <= 0 || G%perNode != 0 || E%groups != 0 {
		return nil
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
	return &groupNodes{N: N, groups: groups, size: size, perNode: perNode, val: val}
}

// assign is the least, over every assignment of the groups to the nodes
// (node nd holding mask[nd]), of the largest val[nd][mask[nd]], and an
// assignment that reaches it (nil when every one is +Inf): a dynamic
// program over subsets, from the last node back, N · 3^groups steps.
func (gn *groupNodes) assign(val [][]float64) (float64, []int) {
	full := 1<<gn.groups - 1
	N := gn.N
	// best[nd][mask]: the least largest value when nodes nd.. hold
	// exactly the groups in mask; pick[nd][mask] node nd's part of it.
	best := make([][]float64, N)
	pick := make([][]int32, N)
	best[N-1] = slices.Clone(val[N-1])
	pick[N-1] = make([]int32, full+1)
	for mask := range pick[N-1] {
		pick[N-1][mask] = int32(mask)
	}
	for nd := N - 2; nd >= 0; nd-- {
		best[nd] = make([]float64, full+1)
		pick[nd] = make([]int32, full+1)
		for mask := range best[nd] {
			b, p := math.Inf(1), int32(-1)
			// Every sub ⊆ mask for node nd, the rest for the nodes after.
			for sub := mask; ; sub = (sub - 1) & mask {
				if v := val[nd][sub]; v < b {
					if w := math.Max(v, best[nd+1][mask&^sub]); w < b {
						b, p = w, int32(sub)
					}
				}
				if sub == 0 {
					break
				}
			}
			best[nd][mask], pick[nd][mask] = b, p
		}
	}
	if math.IsInf(best[0][full], 1) {
		return best[0][full], nil
	}
	masks := make([]int, N)
	left := full
	for nd := range N {
		masks[nd] = int(pick[nd][left])
		left &^= masks[nd]
	}
	return best[0][full], masks
}

// exactGroups is exactPack under expert groups: for every node and set of
// groups whose bound is below hi, the node's own exhaustive search
// (exactPack on its GPUs, its slots and those groups' experts), then the
// assignment of groups to nodes (groupNodes.assign) over what those
// searches found. It returns the best plan found below hi (nil if none)
// and its busiest load, and a lower bound on every grouped plan's: the
// same assignment over what the searches proved (their optimum where
// complete, groupBound's value where not), at most hi. The bound reaches
// the busiest load when every search that matters was complete.
func exactGroups(load, speed []float64, slots []int, groups, perNode int, hi float64, m *task.Meter) (copies [][]placement.GPU, busiest, bound float64) {
	gn := newGroupNodes(load, speed, slots, groups, perNode)
	if gn == nil {
		return nil, hi, 0
	}
	full := 1<<groups - 1
	found := make([][]float64, gn.N) // a plan's busiest load, +Inf: none below hi
	proven := make([][]float64, gn.N)
	plans := make([]map[int][][]placement.GPU, gn.N)
	type job struct{ nd, mask int }
	var jobs []job
	for nd := range gn.N {
		found[nd] = make([]float64, full+1)
		proven[nd] = slices.Clone(gn.val[nd])
		plans[nd] = map[int][][]placement.GPU{}
		for mask := range full + 1 {
			found[nd][mask] = math.Inf(1)
			if v := gn.val[nd][mask]; v < hi {
				jobs = append(jobs, job{nd, mask})
			} else if !math.IsInf(v, 1) {
				proven[nd][mask] = hi // at least hi, which is all the bound needs
			}
			if mask == 0 && gn.val[nd][0] == 0 {
				found[nd][0] = 0 // an empty node without slots
			}
		}
	}
	// The most promising sets first: a meter that runs out leaves the
	// rest at their bounds.
	slices.SortStableFunc(jobs, func(a, b job) int { return cmp.Compare(gn.val[a.nd][a.mask], gn.val[b.nd][b.mask]) })
	for _, j := range jobs {
		if j.mask == 0 {
			continue
		}
		lo := j.nd * perNode
		var sub []float64
		for k := range groups {
			if j.mask&(1<<k) != 0 {
				sub = append(sub, load[k*gn.size:(k+1)*gn.size]...)
			}
		}
		cp, b, complete := exactPack(sub, speed[lo:lo+perNode], slots[lo:lo+perNode], hi, m)
		if cp != nil {
			found[j.nd][j.mask] = b
			plans[j.nd][j.mask] = cp
		}
		if complete {
			if cp != nil {
				proven[j.nd][j.mask] = b
			} else {
				proven[j.nd][j.mask] = hi
			}
		}
	}
	bound, _ = gn.assign(proven)
	bound = math.Min(bound, hi)
	v, masks := gn.assign(found)
	if masks == nil || v >= hi {
		return nil, hi, bound
	}
	copies = make([][]placement.GPU, len(load))
	for nd, mask := range masks {
		cp := plans[nd][mask]
		i := 0
		for k := range groups {
			if mask&(1<<k) == 0 {
				continue
			}
			for e := k * gn.size; e < (k+1)*gn.size; e++ {
				for _, g := range cp[i] {
					copies[e] = append(copies[e], placement.GPU(nd*perNode+int(g)))
				}
				i++
			}
		}
	}
	return copies, v, bound
}
