package replica

import (
	"context"
	"math"
	"slices"
	"sort"

	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// placeLayer places one layer (see solveReplicated).
func placeLayer(ctx context.Context, p Problem, backend mip.Backend, l int, lay replicaLayout, speed []float64, groups int, lim task.Limit, opts Options) ([][]placement.GPU, LayerBalance, error) {
	m := lim.Meter(ctx)
	E, G := p.Stats.Experts, p.Cluster.GPUs()
	w := p.workloadLoads(l)
	src := lay.srcOf(l)
	static := src != nil && p.Current == nil && len(w) == 1
	staticNode := 0 // static swaps stay within a node where groups hold experts to nodes
	if groups > 0 {
		staticNode = p.Cluster.GPUsPerNode
	}
	pk := newPacker(G, lay.slots, speed, w, p.Across)
	agg := pk.aggWeight()
	all := make([]int, G)
	for g := range all {
		all[g] = g
	}
	var cp [][]placement.GPU
	if p.Current != nil {
		if err := pk.load(p.Current, l, E); err != nil {
			return nil, LayerBalance{}, err
		}
		running := pk.copies(E)
		mb := p.budget(l)
		moves := pk.improveCost(all, m, mb)
		if src != nil && len(w) == 1 {
			cp = staticFrom(p, l, mb, running, pk.copies(E), moves, speed, src, staticNode, m)
		}
	} else if groups > 0 {
		if err := pk.packGroups(p, l, agg, groups, all, m); err != nil {
			return nil, LayerBalance{}, err
		}
	} else {
		var err error
		if pk, err = packFresh(p, l, pk, agg, lay, all, static, len(w), m); err != nil {
			return nil, LayerBalance{}, err
		}
	}
	if cp == nil {
		cp = pk.copies(E)
	}
	if static {
		// The packer balances the even split; static dispatch serves a
		// copy on a source's GPU all that source's tokens.
		cp, _ = staticSwap(p.Stats.Load[l], cp, speed, src, staticNode, -1, 0, m)
	}
	if p.Dispatch.Closed() == placement.DispatchLocal && groups == 0 && p.Current == nil {
		spread := task.Limit{Deadline: lim.Deadline.Add(opts.SpreadGrace), Work: lim.Work}
		cp = spreadNodes(p, p.Stats.Load[l], cp, lay, speed, spread.Meter(ctx))
	}
	b := layerBalance(p.Stats.Load[l], cp, speed, lay, G, p.localP(), src)
	// One or two slots per GPU of equal speed: the exact pair method
	// proves a stronger bound and often packs to it.
	if backend != nil && groups == 0 && p.Current == nil && len(w) == 1 && p.Dispatch.Closed() == placement.DispatchEven && b.Gap() > 1e-6 {
		if single, double, ok := pairLayout(lay, speed); ok {
			s0 := speed[0]
			load := make([]float64, E)
			for e, x := range p.Stats.Load[l] {
				load[e] = x / s0
			}
			bound, better, _ := pairRefine(ctx, backend, load, single, double, b.Bound, b.Busiest, lim.Meter(ctx), opts)
			if better != nil {
				if nb := layerBalance(p.Stats.Load[l], better, speed, lay, G, 0, nil); nb.Busiest < b.Busiest {
					cp, b = better, nb
				}
			}
			b.Bound = math.Max(b.Bound, math.Min(bound, b.Busiest))
		}
	}
	// Few experts and slots: every copy count vector and packing can be
	// searched (exactPack gives up at once where they are too many). A
	// complete search proves the busiest load optimal.
	if groups == 0 && p.Current == nil && len(w) == 1 && p.Dispatch.Closed() == placement.DispatchEven && b.Gap() > 1e-6 {
		better, _, complete := exactPack(p.Stats.Load[l], speed, lay.slots, b.Busiest, lim.Meter(ctx))
		if better != nil {
			if nb := layerBalance(p.Stats.Load[l], better, speed, lay, G, 0, nil); nb.Busiest < b.Busiest {
				cp, b = better, nb
			}
		}
		if complete {
			b.Bound = math.Max(b.Bound, b.Busiest)
		}
	}
	// The same under expert groups, node by node, with the assignment of
	// groups to nodes searched over what the nodes' searches found. The
	// plan is taken only where the statistics have no token paths: with
	// them, which groups share a node sets the traffic packGroups traded
	// for, and the search only certifies.
	if groups > 0 && p.Current == nil && len(w) == 1 && p.Dispatch.Closed() == placement.DispatchEven && b.Gap() > 1e-6 {
		better, busiest, bound := exactGroups(p.Stats.Load[l], speed, lay.slots, groups, p.Cluster.GPUsPerNode, b.Busiest, lim.Meter(ctx))
		if better != nil && p.Stats.Patterns == nil {
			if nb := layerBalance(p.Stats.Load[l], better, speed, lay, G, 0, nil); nb.Busiest < b.Busiest && math.Abs(nb.Busiest-busiest) <= 1e-9*busiest {
				cp, b = better, nb
			}
		}
		// The bound holds whichever plan is kept; it is at most the
		// busiest load the searches found, hence at most b's.
		b.Bound = math.Max(b.Bound, math.Min(bound, b.Busiest))
	}
	return cp, b, nil
}

// packFresh packs layer l afresh on pk (agg its aggregate weights, all
// its GPUs): copy counts apportioned to the weights, at most one copy per
// node under local dispatch where that costs no balance, swaps to
// balance (not under static dispatch, whose swaps follow) and, with
// copies on distinct nodes and one workload, traffic first. It returns
// the packer that holds the plan.
func packFresh(p Problem, l int, pk *packer, agg []float64, lay replicaLayout, all []int, static bool, workloads int, m *task.Meter) (*packer, error) {
	E, G := p.Stats.Experts, p.Cluster.GPUs()
	experts := make([]int, E)
	for e := range experts {
		experts[e] = e
	}
	cnt, err := apportion(agg, experts, lay.total, G)
	if err != nil {
		return nil, err
	}
	// Local dispatch: at most one copy per node keeps every copy's
	// share exact and each node's tokens local, when the cap does not
	// raise the largest replica above the balance bound.
	if N := p.Cluster.Nodes; p.Dispatch.Closed() == placement.DispatchLocal && N > 1 && N < G {
		if capped, err := apportion(agg, experts, lay.total, N); err == nil {
			mean := 0.0
			for _, v := range agg {
				mean += v / float64(G)
			}
			if maxReplica(agg, capped) <= math.Max(maxReplica(agg, cnt), mean)*(1+1e-9) {
				pk.maxCopies, pk.perNode = N, p.Cluster.GPUsPerNode
				if pk.pack(capped, all) == nil {
					cnt = nil // packed with copies on distinct nodes
				} else {
					pk.maxCopies, pk.perNode = G, 0
				}
			}
		}
	}
	if cnt != nil {
		if err := pk.pack(cnt, all); err != nil {
			return nil, err
		}
	}
	if !static {
		// Under static dispatch the swaps below balance the split
		// the cost model counts, as well from the packing alone and
		// sooner (58 DeepSeek-V3 layers, 32 or 64 redundant slots).
		pk.improve(all, m)
	}
	if pk.perNode > 0 && workloads == 1 {
		pk = trafficFirst(pk, agg, lay, all, m)
	}
	return pk, nil
}

// trafficFirst tries, under local dispatch with copies on distinct nodes,
// the copy counts that cut cross-node traffic most among those that fit
// under pk's busiest load (trafficCounts), packed and improved the same
// way; it keeps them if the busiest load stays within max(pk's, 0.1 %
// above the bound) and the traffic drops, else returns pk.
func trafficFirst(pk *packer, agg []float64, lay replicaLayout, all []int, m *task.Meter) *packer {
	obj, _ := pk.score()
	maxSp := slices.Max(pk.speed)
	N := pk.G / pk.perNode
	cnt := trafficCounts(agg, lay.total, N, obj*pk.norm[0]*maxSp)
	if cnt == nil || slices.Equal(cnt, pk.cnt) {
		return pk
	}
	alt := newPacker(pk.G, pk.slots, pk.speed, pk.w, pk.across)
	alt.maxCopies, alt.perNode = N, pk.perNode
	if alt.pack(cnt, all) != nil {
		return pk
	}
	alt.improve(all, m)
	altObj, _ := alt.score()
	if altObj > math.Max(obj, pk.lowerBound()*1.001)*(1+1e-12) {
		return pk
	}
	if countsTraffic(agg, alt.cnt, N) >= countsTraffic(agg, pk.cnt, N) {
		return pk
	}
	return alt
}

// layerBalance certifies one layer's busiest load under load: the bound is
// max(mean, largest replica under the apportionment that minimises it).
func layerBalance(load []float64, copies [][]placement.GPU, speed []float64, lay replicaLayout, G, P int, src []float64) LayerBalance {
	total, sp, maxSp := 0.0, 0.0, 0.0
	for _, v := range load {
		total += v
	}
	for _, v := range speed {
		sp += v
		maxSp = math.Max(maxSp, v)
	}
	experts := make([]int, len(load))
	for e := range experts {
		experts[e] = e
	}
	mean := total / sp
	b := LayerBalance{Mean: mean, Busiest: busiestOverMean(load, copies, speed, P, src) * mean, Bound: mean}
	// apportion only fails for impossible slot counts, which layout()
	// has ruled out; the bound then stays at the mean.
	if cnt, err := apportion(load, experts, lay.total, G); err == nil {
		b.Bound = math.Max(mean, maxReplica(load, cnt)/maxSp)
	}
	b.Bound = math.Max(b.Bound, groupBound(load, speed, lay.slots, lay.groups, lay.perNode))
	if P > 0 {
		N := G / P
		b.Traffic = nodeTraffic(load, copies, P, N)
		if cnt := trafficCounts(load, lay.total, N, b.Busiest*maxSp); cnt != nil {
			b.TrafficBound = countsTraffic(load, cnt, N)
		}
	}
	return b
}

// trafficCounts returns the copy counts that minimise the cross-node
// traffic of local dispatch, Σ_e load_e·(N − min(n_e, N))/N, among those
// whose every copy fits under maxCopy (n_e ≥ ⌈load_e/maxCopy⌉), with
// Σ n_e = slots: the necessary minimum, then spare slots to the heaviest
// experts up to N copies each (each such copy saves load_e/N). Since any
// plan whose busiest GPU is at most maxCopy/max speed has copies no larger
// than maxCopy, their traffic bounds every such plan's from below. nil when
// the minimum exceeds slots.
func trafficCounts(load []float64, slots, N int, maxCopy float64) []int {
	E := len(load)
	cnt := make([]int, E)
	used := 0
	for e, x := range load {
		cnt[e] = 1
		if maxCopy > 0 {
			cnt[e] = max(1, int(math.Ceil(x/maxCopy-1e-9)))
		}
		used += cnt[e]
	}
	if used > slots {
		return nil
	}
	order := make([]int, E)
	for e := range order {
		order[e] = e
	}
	sort.SliceStable(order, func(i, j int) bool { return load[order[i]] > load[order[j]] })
	spare := slots - used
	for _, e := range order {
		for spare > 0 && cnt[e] < N {
			cnt[e]++
			spare--
		}
	}
	// Copies beyond N save nothing; put any left on the lightest experts.
	for i := len(order) - 1; spare > 0 && i >= 0; i-- {
		cnt[order[i]]++
		spare--
	}
	return cnt
}

// countsTraffic is the local-dispatch traffic of counts cnt with every
// expert's copies on distinct nodes.
func countsTraffic(load []float64, cnt []int, N int) float64 {
	t := 0.0
	for e, x := range load {
		t += x * float64(N-min(cnt[e], N)) / float64(N)
	}
	return t
}
