package rebalance

import (
	"fmt"
	"math"
	"slices"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/internal/assign"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// DefaultPlan returns the placement the serving stacks start with when
// told nothing: slot p of every layer holds expert p mod experts and lives
// on GPU p/(slots/gpus) (SGLang's trivial map, vLLM's initial map), with
// slots = experts + redundant. It fails unless gpus divides the slots.
func DefaultPlan(layers, experts, redundant, gpus int) (*placement.Plan, error) {
	slots := experts + redundant
	switch {
	case layers < 1 || experts < 1 || gpus < 1 || redundant < 0:
		return nil, fmt.Errorf("rebalance: default plan of %d layers × %d experts + %d redundant slots on %d GPUs: every count must be positive (redundant ≥ 0)", layers, experts, redundant, gpus)
	case slots%gpus != 0:
		return nil, fmt.Errorf("rebalance: %d experts + %d redundant slots do not divide over %d GPUs; choose the redundant slots so that the GPU count divides the slots", experts, redundant, gpus)
	case slots/gpus > experts:
		return nil, fmt.Errorf("rebalance: %d slots per GPU exceed the %d experts: the default map would put two copies of an expert on one GPU; use at most %d redundant slots", slots/gpus, experts, experts*(gpus-1))
	}
	per := slots / gpus
	p := &placement.Plan{GPUs: gpus, Experts: experts, Strategy: "default", Layers: make([]placement.LayerPlan, layers)}
	for l := range p.Layers {
		lp := placement.LayerPlan{SlotExpert: make([]routing.Expert, slots), SlotGPU: make([]placement.GPU, slots)}
		for s := range slots {
			lp.SlotExpert[s], lp.SlotGPU[s] = routing.Expert(s%experts), placement.GPU(s/per)
		}
		p.Layers[l] = lp
	}
	return p, nil
}

// ChangedSlots returns, for every layer, the slots of next that hold an
// expert copy their GPU did not hold in prev: the expert weights a switch
// from prev to next must move onto a GPU. Copies that stay on their GPU
// count as unchanged wherever their slot is (Align puts them back in their
// old slots). The plans must have the same layers.
func ChangedSlots(prev, next *placement.Plan) ([]int, error) {
	if err := sameShape(prev, next); err != nil {
		return nil, err
	}
	out := make([]int, len(next.Layers))
	for l := range next.Layers {
		out[l] = placement.ChangedSlots(prev.Layers[l], next.Layers[l])
	}
	return out, nil
}

func sameShape(prev, next *placement.Plan) error {
	switch {
	case prev == nil || next == nil:
		return fmt.Errorf("rebalance: nil plan")
	case len(prev.Layers) != len(next.Layers):
		return fmt.Errorf("rebalance: plans of %d and %d layers", len(prev.Layers), len(next.Layers))
	case prev.GPUs != next.GPUs:
		return fmt.Errorf("rebalance: plans on %d and %d GPUs", prev.GPUs, next.GPUs)
	case prev.Experts != next.Experts:
		return fmt.Errorf("rebalance: plans of %d and %d experts", prev.Experts, next.Experts)
	}
	return nil
}

// key is a (GPU, expert) pair.
func key(g placement.GPU, e routing.Expert, experts int) int64 {
	return int64(g)*int64(experts) + int64(e)
}

// Align returns next with its slots reordered so that every copy that
// stays on its GPU keeps the slot it had in prev, and the new copies of a
// GPU fill the slots it frees (ascending expert id into ascending slots).
// A serving stack that loads the aligned plan then rewrites exactly
// ChangedSlots slots, as vLLM's preserve_intragpu_slots does. Layers whose
// GPUs hold different slot counts in prev and next are left as they are in
// next. Strategy and Meta are next's, and so is next.StackEPLB, its
// log2phy rows renumbered to the aligned slots in the same replica order:
// a copy keeps its GPU, so the stack's dispatch deals the aligned plan as
// it deals next.
func Align(prev, next *placement.Plan) (*placement.Plan, error) {
	if err := sameShape(prev, next); err != nil {
		return nil, err
	}
	out := next.Clone()
	for l := range next.Layers {
		lp, to, ok := alignLayer(prev.Layers[l], next.Layers[l], next.GPUs, next.Experts)
		if !ok {
			continue
		}
		out.Layers[l] = lp
		if out.StackEPLB != nil && l < len(out.StackEPLB.Log2Phy) {
			for _, row := range out.StackEPLB.Log2Phy[l] {
				for j, s := range row {
					if s >= 0 && int(s) < len(to) {
						row[j] = int32(to[s])
					}
				}
			}
		}
	}
	return out, nil
}

// alignLayer aligns next with prev (Align) and returns, with the aligned
// layer, to[s]: the aligned slot of next's slot s.
func alignLayer(prev, next placement.LayerPlan, gpus, experts int) (placement.LayerPlan, []int, bool) {
	if len(prev.SlotExpert) != len(next.SlotExpert) || next.SlotShare != nil {
		return next, nil, false
	}
	count := make([]int, gpus)
	for _, g := range prev.SlotGPU {
		count[g]++
	}
	for _, g := range next.SlotGPU {
		count[g]--
	}
	if slices.ContainsFunc(count, func(c int) bool { return c != 0 }) {
		return next, nil, false
	}
	// next's slots per (GPU, expert), ascending.
	want := make(map[int64][]int, len(next.SlotExpert))
	for s, e := range next.SlotExpert {
		k := key(next.SlotGPU[s], e, experts)
		want[k] = append(want[k], s)
	}
	n := len(prev.SlotExpert)
	out := placement.LayerPlan{SlotExpert: make([]routing.Expert, n), SlotGPU: slices.Clone(prev.SlotGPU)}
	to := make([]int, n)
	free := make([][]int, gpus) // per GPU, its free slots ascending
	for s, e := range prev.SlotExpert {
		g := prev.SlotGPU[s]
		if k := key(g, e, experts); len(want[k]) > 0 {
			to[want[k][0]] = s
			want[k] = want[k][1:]
			out.SlotExpert[s] = e
			continue
		}
		free[g] = append(free[g], s)
	}
	incoming := make([][]int, gpus) // per GPU, next's slots of its new copies
	for s, e := range next.SlotExpert {
		g := next.SlotGPU[s]
		if k := key(g, e, experts); len(want[k]) > 0 && want[k][0] == s {
			want[k] = want[k][1:]
			incoming[g] = append(incoming[g], s)
		}
	}
	for g := range gpus {
		slices.SortStableFunc(incoming[g], func(a, b int) int { return int(next.SlotExpert[a]) - int(next.SlotExpert[b]) })
		for i, s := range free[g] {
			out.SlotExpert[s] = next.SlotExpert[incoming[g][i]]
			to[incoming[g][i]] = s
		}
	}
	return out, to, true
}

// MigrationTime models, in seconds, the weight transfers of a switch from
// prev to next: layer by layer (as vLLM's rearrange_expert_weights_inplace
// moves them), every copy new on a GPU is received from a GPU that held
// the expert in prev, one on the same node over NVLink when there is one,
// else over the NICs; among the candidate senders the one with the fewest
// bytes to send so far (then the lowest GPU) sends. A layer takes its
// busiest port's bytes over that port's per-direction bandwidth (NVLink in
// and out, NIC in and out, as in costmodel), and the layers add up.
// Bytes per copy are m.ExpertBytes().
func MigrationTime(prev, next *placement.Plan, c costmodel.Cluster, m costmodel.Model) (float64, error) {
	per, err := migrationPerLayer(prev, next, c, m)
	total := 0.0
	for _, v := range per {
		total += v
	}
	return total, err
}

// migrationPerLayer is MigrationTime layer by layer.
func migrationPerLayer(prev, next *placement.Plan, c costmodel.Cluster, m costmodel.Model) ([]float64, error) {
	if err := sameShape(prev, next); err != nil {
		return nil, err
	}
	if next.GPUs != c.GPUs() {
		return nil, fmt.Errorf("rebalance: plans on %d GPUs, cluster of %d", next.GPUs, c.GPUs())
	}
	G, B := next.GPUs, float64(m.ExpertBytes())
	nv, nic := c.NVLinkBytesPerSec(), c.NICBytesPerSec()
	out := make([]float64, len(next.Layers))
	var ports [4][]float64 // NVLink in, out, NIC in, out (bytes)
	for i := range ports {
		ports[i] = make([]float64, G)
	}
	for l := range next.Layers {
		for i := range ports {
			clear(ports[i])
		}
		holders := prev.ExpertGPUs(l)
		held := make(map[int64]int, len(prev.Layers[l].SlotExpert))
		for s, e := range prev.Layers[l].SlotExpert {
			held[key(prev.Layers[l].SlotGPU[s], e, next.Experts)]++
		}
		lp := next.Layers[l]
		for s, e := range lp.SlotExpert {
			g := lp.SlotGPU[s]
			if k := key(g, e, next.Experts); held[k] > 0 {
				held[k]--
				continue
			}
			src, local := -1, false
			for _, h := range holders[e] { // ascending: ties go to the lowest GPU
				same := c.NodeOf(int(h)) == c.NodeOf(int(g))
				port := outPort(same)
				if src < 0 || (same && !local) || (same == local && ports[port][h] < ports[port][src]) {
					src, local = int(h), same
				}
			}
			if local {
				ports[0][g] += B
				ports[1][src] += B
				continue
			}
			ports[2][g] += B
			if src >= 0 {
				ports[3][src] += B
			}
		}
		layer := 0.0
		for g := range G {
			layer = math.Max(layer, math.Max(ports[0][g], ports[1][g])/nv)
			if nic > 0 {
				layer = math.Max(layer, math.Max(ports[2][g], ports[3][g])/nic)
			} else if ports[2][g] > 0 || ports[3][g] > 0 {
				layer = math.Max(layer, math.Max(ports[2][g], ports[3][g])/nv)
			}
		}
		out[l] = layer
	}
	return out, nil
}

func outPort(local bool) int {
	if local {
		return 1
	}
	return 3
}

// LayerPAR returns the busiest GPU's load over the mean GPU load of layer
// lp under load (tokens per expert), every copy of an expert serving an
// even share: the balance measure the public rebalancing harness scores
// (PAR). A layer without load scores 1.
func LayerPAR(lp placement.LayerPlan, gpus int, load []float64) float64 {
	cnt := make([]int, len(load))
	for _, e := range lp.SlotExpert {
		cnt[e]++
	}
	gl := make([]float64, gpus)
	total := 0.0
	for s, e := range lp.SlotExpert {
		gl[lp.SlotGPU[s]] += load[e] / float64(cnt[e])
	}
	for e, v := range load {
		if cnt[e] > 0 {
			total += v
		}
	}
	if total <= 0 {
		return 1
	}
	return slices.Max(gl) / (total / float64(gpus))
}

// StepPAR is LayerPAR averaged over the layers of plan for one step's
// loads load[l][e].
func StepPAR(plan *placement.Plan, load [][]float64) float64 {
	s := 0.0
	for l, lp := range plan.Layers {
		s += LayerPAR(lp, plan.GPUs, load[l])
	}
	return s / float64(len(plan.Layers))
}

// Relabel returns next with the GPUs of every layer permuted so that as
// many expert copies as possible stay on the GPU that held them in prev
// (an assignment problem on the copies two GPUs share, solved exactly by
// the Hungarian method), then aligned with prev (Align). A fresh plan
// numbers its GPUs arbitrarily; relabelled it moves only what it must.
// Only layers whose GPUs all hold the same number of slots in both plans
// are permuted, and only when every GPU has the same speed and memory
// (relabelling must not change what the plan costs); the others are as in
// next.
func Relabel(prev, next *placement.Plan, c costmodel.Cluster) (*placement.Plan, error) {
	if err := sameShape(prev, next); err != nil {
		return nil, err
	}
	G := next.GPUs
	out := next.Clone()
	for g := 1; g < G; g++ {
		if c.SpeedOf(g) != c.SpeedOf(0) || c.MemOf(g) != c.MemOf(0) {
			return Align(prev, out)
		}
	}
	for l := range out.Layers {
		pp, np := prev.SlotsPerGPU(l), next.SlotsPerGPU(l)
		if slices.ContainsFunc(pp, func(n int) bool { return n != pp[0] }) || !slices.Equal(pp, np) {
			continue
		}
		// share[a][b]: copies GPU a holds in prev and GPU b in next.
		share := make([][]float64, G)
		for a := range share {
			share[a] = make([]float64, G)
		}
		byGPU := func(lp placement.LayerPlan) [][]routing.Expert {
			out := make([][]routing.Expert, G)
			for s, e := range lp.SlotExpert {
				out[lp.SlotGPU[s]] = append(out[lp.SlotGPU[s]], e)
			}
			for _, es := range out {
				slices.Sort(es)
			}
			return out
		}
		pe, ne := byGPU(prev.Layers[l]), byGPU(next.Layers[l])
		for a := range G {
			for b := range G {
				share[a][b] = -float64(commonSorted(pe[a], ne[b]))
			}
		}
		to := hungarian(share) // next's GPU b becomes GPU to[b]
		lp := &out.Layers[l]
		for s, g := range lp.SlotGPU {
			lp.SlotGPU[s] = placement.GPU(to[g])
		}
	}
	return Align(prev, out)
}

// commonSorted counts the elements two sorted multisets share.
func commonSorted(a, b []routing.Expert) int {
	n, i, j := 0, 0, 0
	for i < len(a) && j < len(b) {
		switch {
		case a[i] == b[j]:
			n++
			i++
			j++
		case a[i] < b[j]:
			i++
		default:
			j++
		}
	}
	return n
}

// hungarian solves the square assignment problem min Σ_a cost[a][to⁻¹(a)]
// exactly (Kuhn–Munkres with potentials, O(n³)) and returns, for every
// column b, the row it is assigned to (assign.Min). Ties go the same way every time.
func hungarian(cost [][]float64) []int {
	n := len(cost)
	to, _ := assign.Min(n, n, func(i, j int) float64 { return cost[i][j] })
	return to
}
