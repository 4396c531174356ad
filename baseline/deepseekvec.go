package baseline

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// This file ports SGLang's deepseek_vec EPLB algorithm,
// python/sglang/srt/eplb/eplb_algorithms/deepseek_vec.py at
// sgl-project/sglang@68836b60f99d117ec96b5c8d7e49400724f25aca, selected by
// --eplb-algorithm deepseek_vec (global, "decode_rebalance_experts") or
// deepseek_vec_hierarchical ("prefill_rebalance_experts"); see
// eplb_algorithms/__init__.py at 046f88cb789d7d0e268dce5b7bdbe4ad3252d5ba,
// whose "auto" never picks it (auto is deepseek_hierarchical when the
// groups divide the nodes, else deepseek).
//
// Unlike DeepSeek's EPLB it sees every step's loads ([S][L][E]): each
// redundant slot goes to the expert whose extra copy most lowers the sum
// over steps of the step's largest per-copy load, and the slots are then
// dealt to GPUs in a snake over their per-copy loads (summed over steps),
// not packed.

// DeepSeekVecOptions are the optional settings of DeepSeekVec. The zero
// value is deepseek_vec's global policy without redundant slots.
type DeepSeekVecOptions struct {
	// RedundantSlots is the number of physical slots per layer beyond one
	// per expert; Experts+RedundantSlots must be a multiple of the GPU
	// count. 0 means no replication.
	RedundantSlots int
	// Hierarchical selects deepseek_vec_hierarchical: expert groups are
	// packed onto nodes first and every node replicates and places its own
	// experts. False is the global policy (one chunk of all slots).
	Hierarchical bool
	// Groups is the number of expert groups (DeepSeek-V3: 8), used only by
	// the hierarchical policy, where it must be a multiple of Nodes and
	// divide the expert count.
	Groups int
	// Nodes is the number of server nodes; used only by the hierarchical
	// policy. 0 means 1.
	Nodes int
	// FixDuplicates repairs layers where the snake put two copies of one
	// expert on the same GPU (it can: two copies of an expert have equal
	// per-copy loads and meet where the snake turns) by swapping slots
	// between GPUs of the same node (any two GPUs under the global policy),
	// as EPLBOptions.FixDuplicates does. False makes DeepSeekVec return an
	// error naming the duplicate instead.
	FixDuplicates bool
	// StackEPLB records deepseek_vec's log2phy on the plan, as
	// EPLBOptions.StackEPLB does.
	StackEPLB bool
}

// vecShape is a checked deepseek_vec problem.
type vecShape struct {
	steps, layers, experts, phys, local int
	groups, nodes                       int
	hierarchical                        bool
	chunk                               int // physical slots per chunk (P, or P/nodes)
}

func checkVec(steps, layers, experts, phys, local, groups, nodes int, hierarchical bool) (vecShape, error) {
	s := vecShape{steps: steps, layers: layers, experts: experts, phys: phys, local: local, groups: groups, nodes: nodes, hierarchical: hierarchical}
	switch {
	case steps < 1:
		return s, errors.New("baseline: deepseek-vec: no steps; pass at least one [layer][expert] load matrix")
	case layers < 1:
		return s, errors.New("baseline: deepseek-vec: no layers; pass one load row per MoE layer")
	case experts < 1 || experts > placement.MaxExperts:
		return s, fmt.Errorf("baseline: deepseek-vec: %d experts per layer; need [1,%d]", experts, placement.MaxExperts)
	case phys < experts || phys > placement.MaxExperts*8:
		return s, fmt.Errorf("baseline: deepseek-vec: %d physical slots per layer for %d experts; need [%d,%d]", phys, experts, experts, placement.MaxExperts*8)
	case local < 1 || phys%local != 0:
		return s, fmt.Errorf("baseline: deepseek-vec: %d slots per GPU do not divide the %d physical slots", local, phys)
	case phys/local > placement.MaxGPUs:
		return s, fmt.Errorf("baseline: deepseek-vec: %d GPUs; need at most %d", phys/local, placement.MaxGPUs)
	}
	s.chunk = phys
	if !hierarchical {
		return s, nil
	}
	gpus := phys / local
	switch {
	case nodes < 1:
		return s, fmt.Errorf("baseline: deepseek-vec: %d nodes; need at least 1", nodes)
	case groups < 1 || experts%groups != 0:
		return s, fmt.Errorf("baseline: deepseek-vec: %d experts do not split into %d equal groups; use a group count that divides %d", experts, groups, experts)
	case groups%nodes != 0:
		return s, fmt.Errorf("baseline: deepseek-vec: %d expert groups are not a multiple of the %d nodes, which the hierarchical policy needs; use the global policy", groups, nodes)
	case gpus%nodes != 0:
		return s, fmt.Errorf("baseline: deepseek-vec: %d GPUs do not split evenly over %d nodes; use a node count that divides %d", gpus, nodes, gpus)
	case experts%nodes != 0 || (phys-experts)%nodes != 0:
		return s, fmt.Errorf("baseline: deepseek-vec: %d experts and %d redundant slots must both split evenly over the %d nodes", experts, phys-experts, nodes)
	}
	s.chunk = phys / nodes
	return s, nil
}

// RebalanceExpertsVec is a port of SGLang's deepseek_vec
// rebalance_experts(tokens_per_expert, num_physical_experts,
// num_local_physical_experts, num_groups, num_nodes, enable_hierarchical)
// (python/sglang/srt/eplb/eplb_algorithms/deepseek_vec.py at
// sgl-project/sglang@68836b60). tokens[s][l][e] is the load of logical
// expert e at layer l in step s; numPhysical is the number of physical
// slots per layer and numLocal the slots per GPU.
//
// Loads are cast to float32 as the hierarchical path's .float() does;
// per-step sums follow PyTorch's CPU cascade sum and ties go where
// PyTorch's max, argmin and (stable) sort put them; the golden tests check
// this against the Python code run by PyTorch. It fails, naming the rule,
// on empty, ragged, negative or non-finite loads and on shapes the Python
// code asserts against. Two copies of one expert can land on one GPU,
// which placement.Plan.Validate rejects; DeepSeekVec repairs it.
func RebalanceExpertsVec(tokens [][][]float64, numPhysical, numLocal, numGroups, numNodes int, hierarchical bool) (*placement.EPLBMaps, error) {
	layers, experts := 0, 0
	if len(tokens) > 0 {
		layers = len(tokens[0])
		if layers > 0 {
			experts = len(tokens[0][0])
		}
	}
	s, err := checkVec(len(tokens), layers, experts, numPhysical, numLocal, numGroups, numNodes, hierarchical)
	if err != nil {
		return nil, err
	}
	for st, m := range tokens {
		if len(m) != layers {
			return nil, fmt.Errorf("baseline: deepseek-vec: tokens[%d] has %d layers but tokens[0] has %d; give every step the same layers", st, len(m), layers)
		}
		if err := checkLoadsOf("deepseek-vec", "deepseek_vec", fmt.Sprintf("tokens[%d]", st), m, experts); err != nil {
			return nil, err
		}
	}
	phy2log, rank, logcnt := runVec(s, tokens)
	return placement.NewEPLBMaps(s.layers, s.experts, s.phys, phy2log, rank, logcnt), nil
}

// runVec runs every layer of a checked problem; the layers are
// independent. It returns phy2log and rank ([L*P]) and logcnt ([L*E]).
func runVec(s vecShape, tokens [][][]float64) (phy2log, rank, logcnt []int) {
	L, E, P, S := s.layers, s.experts, s.phys, s.steps
	phy2log, rank, logcnt = make([]int, L*P), make([]int, L*P), make([]int, L*E)
	w := newVecWorker(s)
	for l := range L {
		for st := range S {
			for e, x := range tokens[st][l] {
				w.tok[st*E+e] = float32(x)
			}
		}
		w.layer(phy2log[l*P:(l+1)*P], rank[l*P:(l+1)*P], logcnt[l*E:(l+1)*E])
	}
	return phy2log, rank, logcnt
}

type vecWorker struct {
	s        vecShape
	tok      []float32 // [S*E] this layer, logical order
	mtok     []float32 // [S*E] in node-major ("mlog") order
	mlog2log []int     // [E]
	log2mlog []int     // [E]
	col      []float32 // [S] scratch for PyTorch's sum over steps
	vals     []float32 // [S*Epg] values of one chunk, step-major
	best     []int     // [S] each step's hottest expert of the chunk
}

func newVecWorker(s vecShape) *vecWorker {
	E, S := s.experts, s.steps
	return &vecWorker{s: s, tok: make([]float32, S*E), mtok: make([]float32, S*E), mlog2log: make([]int, E), log2mlog: make([]int, E),
		col: make([]float32, S), vals: make([]float32, S*E), best: make([]int, S)}
}

// layer computes one layer into phy2log, rank ([P]) and logcnt ([E]).
func (w *vecWorker) layer(phy2log, rank, logcnt []int) {
	s := w.s
	E, S := s.experts, s.steps
	for e := range E {
		w.mlog2log[e], w.log2mlog[e] = e, e
	}
	if s.hierarchical {
		w.packGroups()
	}
	for st := range S {
		for x, e := range w.mlog2log {
			w.mtok[st*E+x] = w.tok[st*E+e]
		}
	}
	phy2mlog := phy2log // written in mlog ids, relabelled below
	mcnt := make([]int, E)
	w.chunkwise(phy2mlog, rank, mcnt)
	for p, x := range phy2mlog {
		phy2log[p] = w.mlog2log[x]
	}
	for e := range E {
		logcnt[e] = mcnt[w.log2mlog[e]]
	}
}

// packGroups is pack_groups plus the log2mlog relabelling of
// prefill_rebalance_experts: groups in descending order of their load
// summed over steps (PyTorch's sort, torchArgsortDesc32) each go
// to the node with the least load among those with room (first on ties);
// a group's position on its node fixes its experts' node-major ids.
func (w *vecWorker) packGroups() {
	s := w.s
	E, S, G, N := s.experts, s.steps, s.groups, s.nodes
	gsize, perNode := E/G, G/N
	groupLoad := make([]float32, G)
	for e := range E {
		for st := range S {
			w.col[st] = w.tok[st*E+e]
		}
		// tokens_per_expert.sum(0) then .sum(-1) over the group; integer
		// counts below 2^24 sum exactly in any order.
		groupLoad[e/gsize] += torchSum32(w.col)
	}
	order := torchArgsortDesc32(groupLoad)
	nodeTok := make([]float32, N)
	nodeGroups := make([]int, N)
	for _, g := range order {
		best := -1
		for n := range N {
			if nodeGroups[n] >= perNode {
				continue
			}
			if best < 0 || nodeTok[n] < nodeTok[best] {
				best = n
			}
		}
		pos := best*perNode + nodeGroups[best]
		nodeTok[best] += groupLoad[g]
		nodeGroups[best]++
		for o := range gsize {
			w.log2mlog[g*gsize+o] = pos*gsize + o
			w.mlog2log[pos*gsize+o] = g*gsize + o
		}
	}
}

// chunkwise is make_redundant_experts_chunkwise for one layer of mtok:
// chunk c owns experts [c*Epg, (c+1)*Epg) and slots [c*C, (c+1)*C); it
// writes every slot's expert (mlog ids), its replica index and the copy
// counts.
func (w *vecWorker) chunkwise(phy2mlog, rank, cnt []int) {
	s := w.s
	E, P, S, C := s.experts, s.phys, s.steps, s.chunk
	chunks := P / C
	epg := E / chunks
	rpg := (P - E) / chunks
	for c := range chunks {
		for j := range epg {
			phy2mlog[c*C+j], rank[c*C+j] = c*epg+j, 0
		}
	}
	for x := range cnt {
		cnt[x] = 1
	}
	// tokens_per_expert + arange(E) * 1e-4: an int32 arange times a Python
	// float is float32 (the scalar rounded to float32), then a float32 add.
	const tieStep = float32(1e-4)
	diff := make([]float32, S*E)
	for st := range S {
		for x := range E {
			diff[st*E+x] = w.mtok[st*E+x] + float32(x)*tieStep
		}
	}
	for i := range rpg {
		for c := range chunks {
			base := c * epg
			vals := w.vals[:S*epg]
			for st := range S {
				row := diff[st*E+base : st*E+base+epg]
				// score.max(-1): the hottest per-copy load, first index on ties.
				m, v := 0, row[0]/float32(cnt[base])
				for j := 1; j < epg; j++ {
					if x := row[j] / float32(cnt[base+j]); x > v {
						m, v = j, x
					}
				}
				// score with m's entry replaced by its load over one more
				// copy (score1, without the tie offsets), then its max.
				nm := w.mtok[st*E+base+m] / float32(cnt[base+m]+1)
				for j := range epg {
					if j != m {
						nm = max32(nm, row[j]/float32(cnt[base+j]))
					}
				}
				w.best[st] = m
				for j := range epg {
					vals[st*epg+j] = v
				}
				vals[st*epg+m] = nm
			}
			// values.sum(0).argmin(-1): first index on ties.
			pick, pv := -1, float32(0)
			for j := range epg {
				for st := range S {
					w.col[st] = vals[st*epg+j]
				}
				if x := torchSum32(w.col); pick < 0 || x < pv {
					pick, pv = j, x
				}
			}
			p := c*C + epg + i
			phy2mlog[p], rank[p] = base+pick, cnt[base+pick]
			cnt[base+pick]++
		}
	}
	if s.local <= 1 {
		return
	}
	// Load-balancing between GPUs: slots in descending order of their
	// expert's load (summed over steps) per copy, dealt in a snake over the
	// chunk's GPUs.
	total := make([]float32, E)
	for x := range E {
		for st := range S {
			w.col[st] = w.mtok[st*E+x]
		}
		total[x] = torchSum32(w.col)
	}
	K := s.local
	gpc := C / K // GPUs per chunk (num_local_groups)
	score := make([]float32, C)
	idx := make([]int, C)
	oldP, oldR := make([]int, C), make([]int, C)
	for c := range chunks {
		for j := range C {
			x := phy2mlog[c*C+j]
			score[j] = total[x] / float32(cnt[x])
			idx[j] = j
		}
		copy(idx, torchArgsortDesc32(score))
		copy(oldP, phy2mlog[c*C:(c+1)*C])
		copy(oldR, rank[c*C:(c+1)*C])
		// indices.view(K, gpc); odd rows reversed; transposed to (gpc, K):
		// slot g*K+k of the chunk takes sorted position k*gpc + g (k even)
		// or k*gpc + gpc-1-g (k odd).
		for g := range gpc {
			for k := range K {
				r := k*gpc + g
				if k%2 == 1 {
					r = k*gpc + gpc - 1 - g
				}
				phy2mlog[c*C+g*K+k] = oldP[idx[r]]
				rank[c*C+g*K+k] = oldR[idx[r]]
			}
		}
	}
}

func max32(a, b float32) float32 {
	if b > a {
		return b
	}
	return a
}

// torchSum32 is PyTorch's CPU float32 sum of xs along a reduced dimension
// (aten/src/ATen/native/cpu/SumKernel.cpp, multi_row_sum): float32
// accumulators in four levels, each level flushed into the next every
// 2^levelPower rows, levelPower = max(4, ceil(log2 n)/4).
func torchSum32(xs []float32) float32 {
	n := len(xs)
	const levels = 4
	power := 4
	if lg := ceilLog2(n) / levels; lg > power {
		power = lg
	}
	step := 1 << power
	mask := step - 1
	var acc [levels]float32
	i := 0
	for i+step <= n {
		for range step {
			acc[0] += xs[i]
			i++
		}
		for j := 1; j < levels; j++ {
			acc[j] += acc[j-1]
			acc[j-1] = 0
			if i&(mask<<(j*power)) != 0 {
				break
			}
		}
	}
	for ; i < n; i++ {
		acc[0] += xs[i]
	}
	for j := 1; j < levels; j++ {
		acc[0] += acc[j]
	}
	return acc[0]
}

// ceilLog2 is c10's CeilLog2: 0 for n <= 1, else ceil(log2(n)).
func ceilLog2(n int) int {
	if n <= 1 {
		return 0
	}
	return bits.Len(uint(n - 1))
}

// stepLoads returns stats' per-step loads as deepseek_vec and FlashLB
// take them ([S][L][E]) and whether they are real steps: without
// StepLoad, the one aggregate Load is the only step.
func stepLoads(stats *routing.Stats) ([][][]float64, bool) {
	if len(stats.StepLoad) > 0 {
		return stats.StepLoad, true
	}
	return [][][]float64{stats.Load}, false
}

// DeepSeekVec places the experts of every layer with SGLang's deepseek_vec
// (RebalanceExpertsVec) on stats' per-step loads (StepLoad; without steps
// the aggregate Load is one step, and Meta["steps"] says "1 (aggregate)"):
// Experts+opts.RedundantSlots physical slots per layer on gpus GPUs. Slot p
// of every layer is deepseek_vec's physical slot p, on GPU p/((Experts+
// RedundantSlots)/gpus). Strategy is "deepseek-vec" or
// "deepseek-vec-hierarchical".
//
// It fails on malformed stats or options, on shapes deepseek_vec asserts
// against, and, unless opts.FixDuplicates is set, when two copies of one
// expert landed on one GPU, naming the layer, expert, GPU and slots. The
// plan it returns validates.
func DeepSeekVec(stats *routing.Stats, gpus int, opts DeepSeekVecOptions) (*placement.Plan, error) {
	if stats == nil {
		return nil, errors.New("baseline: deepseek-vec: nil stats")
	}
	if len(stats.Load) != stats.Layers {
		return nil, fmt.Errorf("baseline: deepseek-vec: stats.Load has %d layers, stats.Layers is %d", len(stats.Load), stats.Layers)
	}
	switch {
	case opts.RedundantSlots < 0:
		return nil, fmt.Errorf("baseline: deepseek-vec: DeepSeekVecOptions.RedundantSlots is %d; need 0 or more", opts.RedundantSlots)
	case gpus < 1 || gpus > placement.MaxGPUs:
		return nil, fmt.Errorf("baseline: deepseek-vec: %d GPUs; need [1,%d]", gpus, placement.MaxGPUs)
	case (stats.Experts+opts.RedundantSlots)%gpus != 0:
		n := stats.Experts + opts.RedundantSlots
		return nil, fmt.Errorf("baseline: deepseek-vec: %d physical slots do not split evenly over %d GPUs; use a slot count that is a multiple of %d (redundant slots %d more or %d fewer)",
			n, gpus, gpus, gpus-n%gpus, n%gpus)
	}
	nodes := max(opts.Nodes, 1)
	P := stats.Experts + opts.RedundantSlots
	steps, real := stepLoads(stats)
	s, err := checkVec(len(steps), stats.Layers, stats.Experts, P, P/gpus, opts.Groups, nodes, opts.Hierarchical)
	if err != nil {
		return nil, err
	}
	for st, m := range steps {
		name := "stats.Load"
		if real {
			name = fmt.Sprintf("stats.StepLoad[%d]", st)
		}
		if len(m) != stats.Layers {
			return nil, fmt.Errorf("baseline: deepseek-vec: %s has %d layers, stats.Layers is %d", name, len(m), stats.Layers)
		}
		if err := checkLoadsOf("deepseek-vec", "deepseek_vec", name, m, stats.Experts); err != nil {
			return nil, err
		}
	}
	phy2log, rank, logcnt := runVec(s, steps)
	strategy, domain := "deepseek-vec", gpus
	if opts.Hierarchical {
		strategy, domain = "deepseek-vec-hierarchical", gpus/nodes
	}
	p, err := slotPlan(strategy, stats, gpus, phy2log, rank, logcnt, domain, opts.FixDuplicates)
	if err != nil {
		return nil, err
	}
	if opts.StackEPLB {
		p.StackEPLB = vecStackEPLB(s, p, rank)
	}
	p.Meta["redundant_slots"] = strconv.Itoa(opts.RedundantSlots)
	p.Meta["steps"] = strconv.Itoa(len(steps))
	if !real {
		p.Meta["steps"] = "1 (aggregate)"
	}
	if opts.Hierarchical {
		p.Meta["expert_groups"], p.Meta["nodes"] = strconv.Itoa(opts.Groups), strconv.Itoa(nodes)
	}
	return p, nil
}

// slotPlan builds a GPU-major plan from flat per-layer slot maps
// (phy2log and rank [L*P], logcnt [L*E]): slot p on GPU p/(P/gpus).
// Duplicates on a GPU are repaired within domains of gpusPerDomain GPUs when
// fix is set (rank swapped with its slots) and reported as an error
// otherwise.
func slotPlan(strategy string, stats *routing.Stats, gpus int, phy2log, rank, logcnt []int, gpusPerDomain int, fix bool) (*placement.Plan, error) {
	L, E := stats.Layers, stats.Experts
	P := len(phy2log) / L
	perGPU := P / gpus
	p := &placement.Plan{GPUs: gpus, Experts: E, Layers: make([]placement.LayerPlan, L), Strategy: strategy, Meta: map[string]string{}}
	slotExpert := make([]routing.Expert, L*P)
	slotGPU := make([]placement.GPU, L*P)
	for i, e := range phy2log {
		slotExpert[i] = routing.Expert(e)
		slotGPU[i] = placement.GPU(i % P / perGPU)
	}
	swaps := 0
	seen := make([]int, E)
	stamp := 0
	for l := range L {
		row := slotExpert[l*P : (l+1)*P : (l+1)*P]
		p.Layers[l] = placement.LayerPlan{SlotExpert: row, SlotGPU: slotGPU[l*P : (l+1)*P : (l+1)*P]}
		dup := false
		for g := 0; g < gpus && !dup; g++ {
			stamp++
			for a := g * perGPU; a < (g+1)*perGPU; a++ {
				if seen[row[a]] == stamp {
					if !fix {
						first := slices.Index(row[g*perGPU:a], row[a]) + g*perGPU
						return nil, fmt.Errorf("baseline: %s: layer %d: two copies of expert %d on GPU %d (slots %d and %d); set FixDuplicates to repair the plan by swapping slots within the node",
							strategy, l, row[a], g, first, a)
					}
					dup = true
					break
				}
				seen[row[a]] = stamp
			}
		}
		if !dup {
			continue
		}
		n, err := fixDuplicates(l, row, rank[l*P:(l+1)*P], stats.Load[l], logcnt[l*E:(l+1)*E], gpus, perGPU, gpusPerDomain)
		if err != nil {
			return nil, fmt.Errorf("baseline: %s: %s", strategy, strings.TrimPrefix(err.Error(), "baseline: eplb: "))
		}
		swaps += n
	}
	if swaps > 0 {
		p.Meta["duplicates_fixed"] = strconv.Itoa(swaps)
	}
	return p, nil
}
