package baseline

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"sync"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// EPLBOptions are the optional settings of EPLB. The zero value is EPLB's
// global policy without redundant slots.
type EPLBOptions struct {
	// RedundantSlots is the number of physical slots per layer beyond one
	// per expert (EPLB's num_replicas - E); Experts+RedundantSlots must be
	// a multiple of the GPU count. 0 means no replication.
	RedundantSlots int
	// Groups is the number of expert groups (DeepSeek-V3: 8). 0 or 1 means
	// one group, which selects the global policy. With more groups and
	// Groups a multiple of Nodes, EPLB keeps every group on one node (the
	// hierarchical policy); otherwise it falls back to the global policy,
	// as deepseek-ai/EPLB does.
	Groups int
	// Nodes is the number of server nodes; the GPU count must be a multiple
	// of it. 0 means 1.
	Nodes int
	// FixDuplicates repairs layers where EPLB put two copies of one expert
	// on the same GPU (deepseek-ai/EPLB#22) by swapping slots between GPUs
	// of the same node (of any two GPUs under the global policy), each swap
	// chosen to keep the busier of the two GPUs as light as possible.
	// False makes EPLB return an error naming the duplicate instead.
	FixDuplicates bool
	// StackEPLB records EPLB's log2phy on the plan (Plan.StackEPLB), for a
	// plan that stands for the serving stack running EPLB itself (SGLang's
	// init_by_eplb), so that SGLang's static dispatch deals it as the stack
	// would. Leave it unset for a plan that will be written to a file.
	StackEPLB bool
}

// eplbShape is a checked EPLB problem.
type eplbShape struct {
	layers, experts, replicas int
	groups, nodes, gpus       int // after the global fallback
	hierarchical              bool
}

func (s eplbShape) strategy() string {
	if s.groups == 1 && s.nodes == 1 {
		return "eplb"
	}
	return "eplb-hierarchical"
}

// checkEPLB applies deepseek-ai/EPLB's rules in its order: the
// hierarchical policy when numGroups is a multiple of numNodes, else the
// global one (groups = nodes = 1).
func checkEPLB(layers, experts, numReplicas, numGroups, numNodes, numGPUs int) (eplbShape, error) {
	s := eplbShape{layers: layers, experts: experts, replicas: numReplicas, groups: numGroups, nodes: numNodes, gpus: numGPUs}
	switch {
	case layers < 1:
		return s, errors.New("baseline: eplb: no layers; pass one load row per MoE layer")
	case experts < 1 || experts > placement.MaxExperts:
		return s, fmt.Errorf("baseline: eplb: %d experts per layer; need [1,%d]", experts, placement.MaxExperts)
	case numGPUs < 1 || numGPUs > placement.MaxGPUs:
		return s, fmt.Errorf("baseline: eplb: %d GPUs; need [1,%d]", numGPUs, placement.MaxGPUs)
	case numGroups < 1:
		return s, fmt.Errorf("baseline: eplb: %d expert groups; need at least 1 (1 selects the global policy)", numGroups)
	case numNodes < 1:
		return s, fmt.Errorf("baseline: eplb: %d nodes; need at least 1", numNodes)
	case numReplicas < 1 || numReplicas > placement.MaxExperts*8:
		return s, fmt.Errorf("baseline: eplb: %d physical slots per layer; need [1,%d]", numReplicas, placement.MaxExperts*8)
	}
	s.hierarchical = numGroups%numNodes == 0
	if !s.hierarchical {
		s.groups, s.nodes = 1, 1
	}
	switch {
	case experts%s.groups != 0:
		return s, fmt.Errorf("baseline: eplb: %d experts do not split into %d equal groups; use a group count that divides %d", experts, s.groups, experts)
	case s.gpus%s.nodes != 0:
		return s, fmt.Errorf("baseline: eplb: %d GPUs do not split evenly over %d nodes; use a node count that divides %d", s.gpus, s.nodes, s.gpus)
	case numReplicas%s.gpus != 0:
		return s, fmt.Errorf("baseline: eplb: %d physical slots do not split evenly over %d GPUs; use a slot count that is a multiple of %d (redundant slots %d more or %d fewer)",
			numReplicas, s.gpus, s.gpus, s.gpus-numReplicas%s.gpus, numReplicas%s.gpus)
	case numReplicas < experts:
		return s, fmt.Errorf("baseline: eplb: %d physical slots for %d experts; every expert needs a slot, so use at least %d", numReplicas, experts, experts)
	}
	return s, nil
}

// RebalanceExperts is a bit-exact port of DeepSeek's
// rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus)
// (deepseek-ai/EPLB eplb.py at d52c72d, with the GPU-level packing of the
// global policy from e1100fe). weight[l][e] is the load of logical expert e
// at layer l; numReplicas is the number of physical slots per layer.
//
// When numGroups is a multiple of numNodes the hierarchical policy packs
// expert groups onto nodes, replicates within each node and packs replicas
// onto the node's GPUs; otherwise the global policy does the same with one
// group and one node. It fails, naming the rule, when weight is empty,
// ragged, negative or not finite, when numGroups does not divide the
// expert count (hierarchical policy), numNodes does not divide numGPUs,
// numGPUs does not divide numReplicas, or numReplicas is below the expert
// count.
//
// As in PyTorch, loads are cast to float32 and per-replica loads are
// float32 quotients; sorts are stable (lower index first among equal
// loads) and ties in the argmax and in the lightest pack go to the lowest
// index. Group loads are the float32 rounding of the exact sum, which
// equals PyTorch's whenever the sum is exact in float32 (integer counts
// below 2^24 per group). EPLB's packing can put two copies of one expert on
// one GPU (deepseek-ai/EPLB#22); RebalanceExperts reproduces that, and a
// placement.Plan built from such maps fails Validate. EPLB with
// EPLBOptions.FixDuplicates repairs it.
func RebalanceExperts(weight [][]float64, numReplicas, numGroups, numNodes, numGPUs int) (*placement.EPLBMaps, error) {
	experts := 0
	if len(weight) > 0 {
		experts = len(weight[0])
	}
	s, err := checkEPLB(len(weight), experts, numReplicas, numGroups, numNodes, numGPUs)
	if err != nil {
		return nil, err
	}
	if err := checkLoads("weight", weight, experts); err != nil {
		return nil, err
	}
	m := runEPLB(s, weight)
	return m.result(), nil
}

func checkLoads(name string, load [][]float64, experts int) error {
	return checkLoadsOf("eplb", "EPLB", name, load, experts)
}

// checkLoadsOf checks a [layer][expert] load matrix for the algorithm
// named algo in errors (what in prose) that works in float32.
func checkLoadsOf(algo, what, name string, load [][]float64, experts int) error {
	for l, row := range load {
		if len(row) != experts {
			return fmt.Errorf("baseline: %s: %s[%d] has %d experts but %s[0] has %d; give every layer the same experts", algo, name, l, len(row), name, experts)
		}
		for e, x := range row {
			if x < 0 || math.IsNaN(x) || x > math.MaxFloat32 {
				return fmt.Errorf("baseline: %s: %s[%d][%d] is %v; loads must be non-negative and finite in float32, where %s works", algo, name, l, e, x, what)
			}
		}
	}
	return nil
}

// eplbMaps is the raw output of runEPLB in flat arrays: phy2log and rank
// are [L*R], logcnt [L*E].
type eplbMaps struct {
	s                     eplbShape
	phy2log, rank, logcnt []int
}

func (m *eplbMaps) result() *placement.EPLBMaps {
	return placement.NewEPLBMaps(m.s.layers, m.s.experts, m.s.replicas, m.phy2log, m.rank, m.logcnt)
}

// runEPLB runs every layer of a checked problem, spreading the layers over
// up to GOMAXPROCS goroutines. Layers are independent and each writes only
// its own rows, so the result does not depend on the split.
func runEPLB(s eplbShape, weight [][]float64) *eplbMaps {
	L, E, R := s.layers, s.experts, s.replicas
	m := &eplbMaps{s: s, phy2log: make([]int, L*R), rank: make([]int, L*R), logcnt: make([]int, L*E)}
	workers := min(runtime.GOMAXPROCS(0), L, 8)
	if L*R < 4096 {
		workers = 1 // not worth a goroutine
	}
	if workers <= 1 {
		w := newEPLBWorker(s)
		for l := range L {
			w.layer(weight[l], m.phy2log[l*R:(l+1)*R], m.rank[l*R:(l+1)*R], m.logcnt[l*E:(l+1)*E])
		}
		return m
	}
	var wg sync.WaitGroup
	for k := range workers {
		wg.Go(func() {
			w := newEPLBWorker(s)
			for l := k; l < L; l += workers {
				w.layer(weight[l], m.phy2log[l*R:(l+1)*R], m.rank[l*R:(l+1)*R], m.logcnt[l*E:(l+1)*E])
			}
		})
	}
	wg.Wait()
	return m
}

// eplbWorker holds the scratch buffers of one goroutine, allocated once.
type eplbWorker struct {
	s                    eplbShape
	w                    []float32 // [E] the layer's loads in float32
	groupLoad            []float32 // [groups]
	groupPack, groupRank []int     // [groups]
	log2mlog, mlog2log   []int     // [E] logical <-> node-major ids
	mlogW                []float32 // [E] loads in node-major order
	mlogCnt              []int     // [E] replica counts, node-major
	repHeap              []uint64  // [E/N] replication heap
	phy2mlog, phyRank    []int     // [R] per node: node-local mlog and replica rank
	phyW                 []float32 // [R/N] per-replica load
	pack, rankIn         []int     // [max(groups, R/N)]
	pphy2phy             []int     // [R/N]
	order                []uint64  // [max(groups, R/N)] packing order
	packHeap             []uint64  // [max(N, G/N)]
	packW                []float32 // [max(N, G/N)]
	packN                []int     // [max(N, G/N)]
}

func newEPLBWorker(s eplbShape) *eplbWorker {
	E, R, N := s.experts, s.replicas, s.nodes
	items := max(s.groups, R/N)
	packs := max(N, s.gpus/N)
	return &eplbWorker{
		s: s, w: make([]float32, E),
		groupLoad: make([]float32, s.groups), groupPack: make([]int, s.groups), groupRank: make([]int, s.groups),
		log2mlog: make([]int, E), mlog2log: make([]int, E), mlogW: make([]float32, E), mlogCnt: make([]int, E),
		repHeap: make([]uint64, E/N), phy2mlog: make([]int, R), phyRank: make([]int, R), phyW: make([]float32, R/N),
		pack: make([]int, items), rankIn: make([]int, items), pphy2phy: make([]int, R/N), order: make([]uint64, items),
		packHeap: make([]uint64, packs), packW: make([]float32, packs), packN: make([]int, packs),
	}
}

// layer computes one layer: phy2log and rank ([R]) and logcnt ([E]).
func (w *eplbWorker) layer(load []float64, phy2log, rank, logcnt []int) {
	s := w.s
	E, R, N, G := s.experts, s.replicas, s.nodes, s.gpus
	gsize := E / s.groups    // experts per group
	gpn := s.groups / N      // groups per node
	em, rm := E/N, R/N       // experts and slots per node
	gm, perGPU := G/N, R/G   // GPUs per node, slots per GPU
	for e, x := range load { // weight.float()
		w.w[e] = float32(x)
	}

	// Step 1: pack groups onto nodes and relabel experts node-major.
	for j := range s.groups {
		sum := 0.0
		for _, x := range w.w[j*gsize : (j+1)*gsize] {
			sum += float64(x)
		}
		w.groupLoad[j] = float32(sum)
	}
	w.balancedPacking(w.groupLoad, N, w.groupPack, w.groupRank)
	for j := range s.groups {
		base := (w.groupPack[j]*gpn + w.groupRank[j]) * gsize
		for o := range gsize {
			w.log2mlog[j*gsize+o] = base + o
			w.mlog2log[base+o] = j*gsize + o
		}
	}
	for i, e := range w.mlog2log {
		w.mlogW[i] = w.w[e]
	}

	for n := range N {
		mw := w.mlogW[n*em : (n+1)*em]
		cnt := w.mlogCnt[n*em : (n+1)*em]
		p2m := w.phy2mlog[n*rm : (n+1)*rm]
		prk := w.phyRank[n*rm : (n+1)*rm]

		// Step 2: replicate within the node, each new replica to the
		// expert with the largest load per replica (first index on ties).
		// A max-heap on (load per replica, -index) finds the same expert
		// as EPLB's argmax over all of them.
		for i := range em {
			cnt[i], p2m[i], prk[i] = 1, i, 0
		}
		if rm > em {
			h := w.repHeap[:em]
			for i, x := range mw {
				h[i] = floatKey(x)<<32 | uint64(^uint32(i))
			}
			for i := em/2 - 1; i >= 0; i-- {
				siftDownMax(h, i)
			}
			for k := em; k < rm; k++ {
				best := int(^uint32(h[0]))
				p2m[k], prk[k] = best, cnt[best]
				cnt[best]++
				h[0] = floatKey(mw[best]/float32(cnt[best]))<<32 | uint64(^uint32(best))
				siftDownMax(h, 0)
			}
		}

		// Step 3: pack the node's replicas onto its GPUs.
		for k, i := range p2m {
			w.phyW[k] = mw[i] / float32(cnt[i])
		}
		w.balancedPacking(w.phyW[:rm], gm, w.pack[:rm], w.rankIn[:rm])
		for k := range rm {
			w.pphy2phy[w.pack[k]*perGPU+w.rankIn[k]] = k
		}
		for j, k := range w.pphy2phy {
			p := n*rm + j
			phy2log[p] = w.mlog2log[n*em+p2m[k]]
			rank[p] = prk[k]
		}
	}
	for e := range E {
		logcnt[e] = w.mlogCnt[w.log2mlog[e]]
	}
}

// balancedPacking is EPLB's balanced_packing for one row: len(weight)/packs
// items per pack; items in descending weight (stable: lower index first)
// each go to the lightest pack that still has room (lowest index on ties).
// It writes the pack and the arrival rank of every item. The packs with
// room sit in a binary heap ordered by (load, index), which picks the same
// pack as EPLB's linear scan in O(log packs).
func (w *eplbWorker) balancedPacking(weight []float32, packs int, pack, rankIn []int) {
	n := len(weight)
	per := n / packs
	if per == 1 {
		for i := range n {
			pack[i], rankIn[i] = i, 0
		}
		return
	}
	// Ascending (^weight, index) keys: descending weight, then lower index
	// first, which is the stable descending sort.
	order := w.order[:n]
	for i, x := range weight {
		order[i] = uint64(^uint32(floatKey(x)))<<32 | uint64(i)
	}
	slices.Sort(order)
	pw, pn, h := w.packW[:packs], w.packN[:packs], w.packHeap[:packs]
	clear(pw)
	clear(pn)
	for k := range h {
		h[k] = uint64(k) // all loads 0: index order is a valid heap
	}
	for _, key := range order {
		it := int(uint32(key))
		k := int(uint32(h[0]))
		pack[it], rankIn[it] = k, pn[k]
		pw[k] += weight[it]
		pn[k]++
		if pn[k] == per {
			last := len(h) - 1
			h[0] = h[last]
			h = h[:last]
		} else {
			h[0] = floatKey(pw[k])<<32 | uint64(k)
		}
		siftDownMin(h, 0)
	}
}

// floatKey maps a non-negative float32 to an integer in the same order
// (-0 as +0), so that heaps and sorts compare plain integers.
func floatKey(x float32) uint64 {
	if x == 0 {
		return 0
	}
	return uint64(math.Float32bits(x))
}

func siftDownMin(h []uint64, i int) {
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && h[c+1] < h[c] {
			c++
		}
		if h[c] >= h[i] {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

func siftDownMax(h []uint64, i int) {
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && h[c+1] > h[c] {
			c++
		}
		if h[c] <= h[i] {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// EPLB places the experts of every layer with DeepSeek's EPLB
// (RebalanceExperts) on stats.Load: Experts+opts.RedundantSlots physical
// slots per layer on gpus GPUs, opts.Groups expert groups on opts.Nodes
// nodes. Slot p of every layer is EPLB's physical slot p, on GPU
// p/((Experts+RedundantSlots)/gpus), so the slot order is exactly EPLB's
// phy2log (unless FixDuplicates swapped slots). Strategy is "eplb" for the
// global policy and "eplb-hierarchical" otherwise; Meta records the
// policy, the redundant slots and the number of swaps FixDuplicates made.
//
// It fails on malformed stats or options (see RebalanceExperts for the
// divisibility rules), and, unless opts.FixDuplicates is set, when EPLB put
// two copies of one expert on one GPU (deepseek-ai/EPLB#22), with an error
// naming the layer, expert, GPU and slots. The plan it returns validates.
func EPLB(stats *routing.Stats, gpus int, opts EPLBOptions) (*placement.Plan, error) {
	if stats == nil {
		return nil, errors.New("baseline: eplb: nil stats")
	}
	if len(stats.Load) != stats.Layers {
		return nil, fmt.Errorf("baseline: eplb: stats.Load has %d layers, stats.Layers is %d", len(stats.Load), stats.Layers)
	}
	groups, nodes := opts.Groups, opts.Nodes
	switch {
	case opts.RedundantSlots < 0:
		return nil, fmt.Errorf("baseline: eplb: EPLBOptions.RedundantSlots is %d; need 0 or more", opts.RedundantSlots)
	case groups < 0:
		return nil, fmt.Errorf("baseline: eplb: EPLBOptions.Groups is %d; need 0 or more (0 and 1 select the global policy)", groups)
	case nodes < 0:
		return nil, fmt.Errorf("baseline: eplb: EPLBOptions.Nodes is %d; need 0 or more (0 means 1)", nodes)
	}
	groups, nodes = max(groups, 1), max(nodes, 1)
	s, err := checkEPLB(stats.Layers, stats.Experts, stats.Experts+opts.RedundantSlots, groups, nodes, gpus)
	if err != nil {
		return nil, err
	}
	if err := checkLoads("stats.Load", stats.Load, stats.Experts); err != nil {
		return nil, err
	}
	m := runEPLB(s, stats.Load)

	L, R, E := s.layers, s.replicas, s.experts
	perGPU := R / gpus
	p := &placement.Plan{GPUs: gpus, Experts: E, Layers: make([]placement.LayerPlan, L), Strategy: s.strategy()}
	slotExpert := make([]routing.Expert, L*R)
	slotGPU := make([]placement.GPU, L*R)
	for i, e := range m.phy2log {
		slotExpert[i] = routing.Expert(e)
		slotGPU[i] = placement.GPU(i % R / perGPU)
	}
	for l := range L {
		p.Layers[l] = placement.LayerPlan{SlotExpert: slotExpert[l*R : (l+1)*R : (l+1)*R], SlotGPU: slotGPU[l*R : (l+1)*R : (l+1)*R]}
	}
	policy := "global"
	if s.strategy() != "eplb" {
		policy = "hierarchical"
	}
	p.Meta = map[string]string{"eplb_policy": policy, "redundant_slots": strconv.Itoa(opts.RedundantSlots)}
	if s.strategy() != "eplb" {
		p.Meta["expert_groups"], p.Meta["nodes"] = strconv.Itoa(s.groups), strconv.Itoa(s.nodes)
	}

	swaps := 0
	seen := make([]int, E) // seen[e] == stamp: e already on the GPU being scanned
	stamp := 0
	for l := range L {
		row := slotExpert[l*R : (l+1)*R]
		g, first, a := -1, -1, -1
	scan:
		for g = range gpus {
			stamp++
			for a = g * perGPU; a < (g+1)*perGPU; a++ {
				if e := row[a]; seen[e] == stamp {
					first = slices.Index(row[g*perGPU:a], e) + g*perGPU
					break scan
				}
				seen[row[a]] = stamp
			}
		}
		if first < 0 {
			continue
		}
		if !opts.FixDuplicates {
			return nil, fmt.Errorf("baseline: eplb: layer %d: EPLB put two copies of expert %d on GPU %d (slots %d and %d), a known defect of its packing (deepseek-ai/EPLB#22); set EPLBOptions.FixDuplicates to repair the plan by swapping slots within the node",
				l, row[a], g, first, a)
		}
		n, err := fixDuplicates(l, row, m.rank[l*R:(l+1)*R], stats.Load[l], m.logcnt[l*E:(l+1)*E], gpus, perGPU, gpus/s.nodes)
		if err != nil {
			return nil, err
		}
		swaps += n
	}
	if swaps > 0 {
		p.Meta["duplicates_fixed"] = strconv.Itoa(swaps)
	}
	if opts.StackEPLB {
		one := s
		one.layers = 1
		zero := runEPLB(one, [][]float64{make([]float64, E)})
		p.StackEPLB = &placement.StackEPLB{Log2Phy: log2phyRows(L, E, slotExpert, m.rank),
			Unrouted: log2phyRows(1, E, zero.phy2log, zero.rank)[0]}
	}
	// The plan validates by construction (the tests check it): GPU-major
	// with R/G slots per GPU, every expert has a copy, and the loop above
	// removed or rejected every duplicate.
	return p, nil
}

// fixDuplicates removes every second copy of an expert on a GPU of one
// layer (row, GPU-major with perGPU slots per GPU) by swapping it with a
// slot of another GPU of the same domain (gpusPerDomain consecutive GPUs:
// a node, or all GPUs under the global policy). Slot loads are EPLB's
// per-replica loads. Among the swaps that leave both GPUs free of the
// expert they receive, it takes the one that minimises the larger of the
// two GPUs' new loads (ties: the lower slot). Every swap removes one
// duplicate and creates none, so it ends after at most R swaps; it returns
// their number. rank (EPLB's replica index of every slot; nil for none)
// is swapped with the slots, so a copy keeps its place in log2phy.
func fixDuplicates(l int, row []routing.Expert, rank []int, load []float64, logcnt []int, gpus, perGPU, gpusPerDomain int) (int, error) {
	slotLoad := make([]float64, len(row))
	for s, e := range row {
		slotLoad[s] = float64(float32(load[e]) / float32(logcnt[e]))
	}
	gpuLoad := make([]float64, gpus)
	for s, x := range slotLoad {
		gpuLoad[s/perGPU] += x
	}
	on := func(e routing.Expert, g int) bool {
		return slices.Contains(row[g*perGPU:(g+1)*perGPU], e)
	}
	swaps := 0
	for {
		// The first duplicate: slot a repeats an expert earlier on its GPU.
		a := -1
		for s := range row {
			g := s / perGPU
			if slices.Contains(row[g*perGPU:s], row[s]) {
				a = s
				break
			}
		}
		if a < 0 {
			return swaps, nil
		}
		g, e := a/perGPU, row[a]
		d := g / gpusPerDomain
		best, bestMax := -1, math.Inf(1)
		for h := d * gpusPerDomain; h < (d+1)*gpusPerDomain; h++ {
			if h == g || on(e, h) {
				continue
			}
			for b := h * perGPU; b < (h+1)*perGPU; b++ {
				if on(row[b], g) {
					continue
				}
				ng := gpuLoad[g] - slotLoad[a] + slotLoad[b]
				nh := gpuLoad[h] - slotLoad[b] + slotLoad[a]
				if mx := max(ng, nh); mx < bestMax {
					best, bestMax = b, mx
				}
			}
		}
		if best < 0 {
			copies := 0
			for s := d * gpusPerDomain * perGPU; s < (d+1)*gpusPerDomain*perGPU; s++ {
				if row[s] == e {
					copies++
				}
			}
			lo, hi := d*gpusPerDomain, (d+1)*gpusPerDomain-1
			if copies > gpusPerDomain {
				return swaps, fmt.Errorf("baseline: eplb: layer %d: expert %d has %d copies on GPUs %d-%d, more than their %d GPUs, so no swap within GPUs %d-%d can separate them; use fewer redundant slots or fewer nodes",
					l, e, copies, lo, hi, gpusPerDomain, lo, hi)
			}
			return swaps, fmt.Errorf("baseline: eplb: layer %d: expert %d has two copies on GPU %d and no swap within GPUs %d-%d can separate them; use fewer redundant slots or fewer nodes",
				l, e, g, lo, hi)
		}
		h := best / perGPU
		gpuLoad[g] += slotLoad[best] - slotLoad[a]
		gpuLoad[h] += slotLoad[a] - slotLoad[best]
		row[a], row[best] = row[best], row[a]
		if rank != nil {
			rank[a], rank[best] = rank[best], rank[a]
		}
		slotLoad[a], slotLoad[best] = slotLoad[best], slotLoad[a]
		swaps++
	}
}
