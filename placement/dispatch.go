package placement

import (
	"fmt"
	"slices"
	"strings"
)

// Dispatch names how a serving stack chooses, for a token on source GPU
// (EP rank) h, which copy of a replicated expert computes it. Single-copy
// experts are unaffected. The models themselves live in costmodel
// (costmodel.NewSplitter); each stack's rule is named for the stack and,
// where trees differ, the tree.
type Dispatch int

const (
	// DispatchEven: every source splits an expert's tokens evenly over all
	// its copies (or by the plan's SlotShare): EPLB's own model, and what a
	// per-token uniform choice gives in expectation.
	DispatchEven Dispatch = iota
	// DispatchLocal: a source uses the copy on its own GPU if there is
	// one, else the copies on its own node (evenly), else all copies with
	// the fractions that leave the copies as evenly loaded as possible
	// (water-filling, assuming every GPU sources the same number of
	// tokens): SGLang's static dispatch extended to the node as in SGLang
	// PR #19772 (node-local redundant experts).
	DispatchLocal
	// DispatchStaticMean is the expectation of SGLang's static table over
	// its random deal: a source uses the copy on its own GPU if there is
	// one, else splits evenly over all copies (StaticSplit). No GPU ever
	// sees this split; DispatchSGLangStatic is what they see.
	DispatchStaticMean
	// DispatchSGLangStatic is SGLang's static dispatch table exactly as
	// compute_logical_to_rank_dispatch_physical_map builds it
	// (python/sglang/srt/eplb/expert_location.py at sgl-project/sglang
	// 01fec5c): a rank uses the first copy on its own GPU; the ranks left
	// are dealt over all copies by _fair_choices with one
	// random.Random(42), layer by layer, expert by expert. A rank then
	// sends all its tokens of an expert to one copy. SGLang's default for
	// --ep-dispatch-algorithm static (with EPLB or an initial expert
	// location) in the trees before the same-node preference.
	DispatchSGLangStatic
	// DispatchSGLangStaticNode is the same table in the trees with the
	// same-node preference (_find_nearest_expert): a single copy serves
	// every rank without drawing, else a rank uses its own GPU's copy,
	// else the first copy on its node, else the deal.
	DispatchSGLangStaticNode
	// DispatchSGLangStaticNarrow is the newest tree's table: as
	// DispatchSGLangStaticNode, but a rank takes a same-node copy only
	// when that narrows the candidates (some, not all, copies on its
	// node).
	DispatchSGLangStaticNarrow
	// DispatchSGLangStaticGPUOnly is the newest tree's table when it does
	// not prefer the node (elastic EP scaled up: ep_join_mode "scale"): a
	// single copy serves every rank, else a rank uses its own GPU's copy,
	// else the deal.
	DispatchSGLangStaticGPUOnly
	// DispatchSGLangDynamic is SGLang's dynamic ("random") dispatch in the
	// newest tree, in expectation: a rank uses its nearest copy (own GPU,
	// else a same-node copy that narrows the candidates) and otherwise
	// picks a copy per token uniformly at random.
	DispatchSGLangDynamic
	// DispatchVLLM is vLLM's replica choice, per token by a hash of its
	// row in its rank's batch ((row × 2654435769) mod 2^32 mod copies):
	// costmodel counts it token by token where the statistics carry their
	// token order (routing.Stats.Order) and the searches plan on that count
	// (costmodel.Scenario.Splitter), else models it by its expectation, the
	// even split.
	DispatchVLLM
	// DispatchTRTLLM is TensorRT-LLM's load balancer's replica choice
	// (moeComputeRouteKernel): a round robin over an expert's copies
	// within every block of 1024 routed entries, offset by the block and,
	// with attention DP, by the rank; modeled by its expectation, the even
	// split.
	DispatchTRTLLM
)

var dispatchNames = []string{"even", "local", "static-mean", "sglang-static", "sglang-static-node", "sglang-static-node-narrow", "sglang-static-gpu-only", "sglang-dynamic", "vllm", "trtllm"}

// String returns the model's name as ParseDispatch reads it.
func (d Dispatch) String() string {
	if d.Valid() {
		return dispatchNames[d]
	}
	return fmt.Sprintf("Dispatch(%d)", int(d))
}

// Valid reports whether d names a model.
func (d Dispatch) Valid() bool { return d >= 0 && int(d) < len(dispatchNames) }

// PerSource reports whether a source's split over an expert's copies
// depends on where the source is.
func (d Dispatch) PerSource() bool {
	switch d {
	case DispatchEven, DispatchVLLM, DispatchTRTLLM:
		return false
	}
	return true
}

// Dealt reports whether d is SGLang's static table, whose deal depends on
// the whole plan (the random stream runs through every layer and expert).
func (d Dispatch) Dealt() bool {
	switch d {
	case DispatchSGLangStatic, DispatchSGLangStaticNode, DispatchSGLangStaticNarrow, DispatchSGLangStaticGPUOnly:
		return true
	}
	return false
}

// Closed is the plan-independent model a search that splits one expert
// at a time in closed form plans with for d: d itself, or for SGLang's
// tables the closed form nearest to them (StaticSplit for the plain deal,
// LocalSplit for the same-node trees and dynamic dispatch, even for
// vLLM). Evaluate always scores d itself.
func (d Dispatch) Closed() Dispatch {
	switch d {
	case DispatchSGLangStatic, DispatchSGLangStaticGPUOnly:
		return DispatchStaticMean
	case DispatchSGLangStaticNode, DispatchSGLangStaticNarrow, DispatchSGLangDynamic:
		return DispatchLocal
	case DispatchVLLM, DispatchTRTLLM:
		return DispatchEven
	}
	return d
}

// ParseDispatch parses a name String returns; "static" is
// "sglang-static" (SGLang's table), "" is "even".
func ParseDispatch(s string) (Dispatch, error) {
	switch s {
	case "":
		return DispatchEven, nil
	case "static":
		return DispatchSGLangStatic, nil
	}
	for i, n := range dispatchNames {
		if n == s {
			return Dispatch(i), nil
		}
	}
	return 0, fmt.Errorf("placement: unknown dispatch %q (want %s)", s, strings.Join(dispatchNames, ", "))
}

// StaticSplit fills frac, of length G·len(gpus), with DispatchStaticMean's
// fractions for one expert whose copies sit on the distinct GPUs gpus:
// frac[h·len(gpus)+i] is 1 for the copy on h when h holds one, and 1/n for
// every copy otherwise. Every source's fractions sum to 1.
func StaticSplit(gpus []int32, G int, frac []float64) {
	n := len(gpus)
	clear(frac[:G*n])
	if n == 0 {
		return
	}
	w := 1 / float64(n)
	for h := 0; h < G; h++ {
		row := frac[h*n : (h+1)*n]
		own := slices.Index(gpus, int32(h))
		if own >= 0 {
			row[own] = 1
			continue
		}
		for i := range row {
			row[i] = w
		}
	}
}

// Split fills frac as LocalSplit or StaticSplit do for d's closed form
// (d.Closed()); for DispatchEven every source splits evenly.
func (d Dispatch) Split(gpus []int32, G, gpusPerNode int, frac []float64) {
	switch d.Closed() {
	case DispatchLocal:
		LocalSplit(gpus, G, gpusPerNode, frac)
	case DispatchStaticMean:
		StaticSplit(gpus, G, frac)
	default:
		n := len(gpus)
		clear(frac[:G*n])
		for i := range frac[:G*n] {
			frac[i] = 1 / float64(n)
		}
	}
}

// LocalSplit fills frac, of length G·len(gpus), with DispatchLocal's
// fractions for one expert whose copies sit on the distinct GPUs gpus
// (nodes of gpusPerNode GPUs): frac[h·len(gpus)+i] is the fraction of the
// expert's tokens from source GPU h that go to the copy on gpus[i]. Every
// source's fractions sum to 1.
func LocalSplit(gpus []int32, G, gpusPerNode int, frac []float64) {
	n := len(gpus)
	clear(frac[:G*n])
	if n == 0 {
		return
	}
	if n == 1 {
		for h := 0; h < G; h++ {
			frac[h] = 1
		}
		return
	}
	P := int32(gpusPerNode)
	// a[i] counts the sources (in units of one GPU's tokens) that copy i
	// receives from its own GPU and node; remote sources are filled after.
	var aBuf [16]float64
	a := aBuf[:0]
	if n > len(aBuf) {
		a = make([]float64, 0, n)
	}
	a = a[:n]
	remote := 0
	for h := int32(0); h < int32(G); h++ {
		row := frac[int(h)*n : int(h+1)*n]
		own := -1
		onNode := 0
		for i, g := range gpus {
			if g == h {
				own = i
			}
			if g/P == h/P {
				onNode++
			}
		}
		switch {
		case own >= 0:
			row[own] = 1
			a[own]++
		case onNode > 0:
			w := 1 / float64(onNode)
			for i, g := range gpus {
				if g/P == h/P {
					row[i] = w
					a[i] += w
				}
			}
		default:
			row[0] = -1 // remote marker, filled below
			remote++
		}
	}
	if remote == 0 {
		return
	}
	// Water-fill R = remote sources onto the copies: level λ with
	// Σ max(0, λ − a_i) = R.
	sorted := slices.Clone(a)
	slices.Sort(sorted)
	R := float64(remote)
	lambda := sorted[n-1] + R/float64(n)
	sum := 0.0
	for j := 0; j < n; j++ {
		sum += sorted[j]
		// Level if only the j+1 lowest copies receive.
		l := (R + sum) / float64(j+1)
		if j == n-1 || l <= sorted[j+1] {
			lambda = l
			break
		}
	}
	fill := make([]float64, n)
	for i := range a {
		fill[i] = max(0, lambda-a[i]) / R
	}
	for h := 0; h < G; h++ {
		row := frac[h*n : (h+1)*n]
		if row[0] == -1 {
			copy(row, fill)
		}
	}
}

// LocalFractions returns, for layer plan lp on G GPUs in nodes of
// gpusPerNode, the share of each slot under DispatchLocal: out[h·S+s] is
// the fraction of expert lp.SlotExpert[s]'s tokens from source GPU h that
// slot s computes (S = len(lp.SlotExpert)). Two slots of one expert on one
// GPU share that GPU's fraction evenly.
func LocalFractions(lp LayerPlan, experts, G, gpusPerNode int) ([]float64, error) {
	S := len(lp.SlotExpert)
	if len(lp.SlotGPU) != S {
		return nil, fmt.Errorf("placement: %d slot experts but %d slot GPUs", S, len(lp.SlotGPU))
	}
	if gpusPerNode < 1 || G%gpusPerNode != 0 {
		return nil, fmt.Errorf("placement: %d GPUs do not split into nodes of %d", G, gpusPerNode)
	}
	byExpert := make([][]int, experts)
	for s, e := range lp.SlotExpert {
		if e < 0 || int(e) >= experts {
			return nil, fmt.Errorf("placement: slot %d: expert %d out of range [0,%d)", s, e, experts)
		}
		if g := lp.SlotGPU[s]; g < 0 || int(g) >= G {
			return nil, fmt.Errorf("placement: slot %d: GPU %d out of range [0,%d)", s, g, G)
		}
		byExpert[e] = append(byExpert[e], s)
	}
	out := make([]float64, G*S)
	var gpus []int32
	var frac []float64
	for e, slots := range byExpert {
		if len(slots) == 0 {
			return nil, fmt.Errorf("placement: expert %d has no slot", e)
		}
		gpus = gpus[:0]
		for _, s := range slots {
			g := int32(lp.SlotGPU[s])
			if !slices.Contains(gpus, g) {
				gpus = append(gpus, g)
			}
		}
		n := len(gpus)
		if cap(frac) < G*n {
			frac = make([]float64, G*n)
		}
		frac = frac[:G*n]
		LocalSplit(gpus, G, gpusPerNode, frac)
		for _, s := range slots {
			g := int32(lp.SlotGPU[s])
			i := slices.Index(gpus, g)
			same := 0
			for _, s2 := range slots {
				if lp.SlotGPU[s2] == lp.SlotGPU[s] {
					same++
				}
			}
			for h := 0; h < G; h++ {
				out[h*S+s] = frac[h*n+i] / float64(same)
			}
		}
	}
	return out, nil
}

// DispatchMap is a per-rank static dispatch table for DispatchLocal:
// Rank[r][l][e] is the physical slot (GPU-major numbering, as in the
// SGLang and EPLB files: slot p on GPU p/(slots/GPUs)) that rank r sends
// layer l's expert e tokens to. It has the shape of SGLang's
// logical_to_rank_dispatch_physical_map for all ranks.
type DispatchMap struct {
	GPUs, GPUsPerNode int
	Rank              [][][]int
}

// LocalDispatchMap rounds DispatchLocal to one slot per (rank, layer,
// expert): the copy on the rank's own GPU, else one of its node's copies
// (ranks of the node in turn), else the copy that has served the fewest
// ranks so far (ranks in order, ties to the lower slot): the integer
// version of the water-filling, so each copy serves within one rank of
// the modeled share. Every GPU must hold the same number of slots in every
// layer, as for FormatSGLang.
func LocalDispatchMap(p *Plan, gpusPerNode int) (*DispatchMap, error) {
	if err := p.Validate(ValidateOptions{}); err != nil {
		return nil, err
	}
	G := p.GPUs
	if gpusPerNode < 1 || G%gpusPerNode != 0 {
		return nil, fmt.Errorf("placement: dispatch map: %d GPUs do not split into nodes of %d", G, gpusPerNode)
	}
	q := p.GPUMajor()
	m := &DispatchMap{GPUs: G, GPUsPerNode: gpusPerNode, Rank: make([][][]int, G)}
	for r := range m.Rank {
		m.Rank[r] = make([][]int, len(q.Layers))
	}
	P := gpusPerNode
	for l, lp := range q.Layers {
		count := q.SlotsPerGPU(l)
		for g, c := range count {
			if c != count[0] {
				return nil, fmt.Errorf("placement: dispatch map: layer %d: GPU %d holds %d slots but GPU 0 holds %d; slot numbers need the same count on every GPU", l, g, c, count[0])
			}
		}
		slots := make([][]int, p.Experts)
		for s, e := range lp.SlotExpert {
			slots[e] = append(slots[e], s)
		}
		for r := range m.Rank {
			m.Rank[r][l] = make([]int, p.Experts)
		}
		served := make([]int, 0, 8)
		for e, ss := range slots {
			served = served[:0]
			for range ss {
				served = append(served, 0)
			}
			var remote []int
			for node := 0; node < G/P; node++ {
				var local []int // indices into ss on this node
				for i, s := range ss {
					if int(lp.SlotGPU[s])/P == node {
						local = append(local, i)
					}
				}
				turn := 0
				for r := node * P; r < (node+1)*P; r++ {
					own := -1
					for _, i := range local {
						if int(lp.SlotGPU[ss[i]]) == r {
							own = i
							break
						}
					}
					switch {
					case own >= 0:
						m.Rank[r][l][e] = ss[own]
						served[own]++
					case len(local) > 0:
						i := local[turn%len(local)]
						turn++
						m.Rank[r][l][e] = ss[i]
						served[i]++
					default:
						remote = append(remote, r)
					}
				}
			}
			for _, r := range remote {
				best := 0
				for i := range ss {
					if served[i] < served[best] {
						best = i
					}
				}
				m.Rank[r][l][e] = ss[best]
				served[best]++
			}
		}
	}
	return m, nil
}

// Encode writes m as JSON: {"num_gpus", "gpus_per_node",
// "logical_to_rank_dispatch_physical_map": [rank][layer][expert]}.
func (m *DispatchMap) Encode() []byte {
	var b []byte
	b = fmt.Appendf(b, "{\n  \"num_gpus\": %d,\n  \"gpus_per_node\": %d,\n  \"logical_to_rank_dispatch_physical_map\": [\n", m.GPUs, m.GPUsPerNode)
	b = appendLines(b, m.Rank, appendNested)
	return append(b, "  ]\n}\n"...)
}

// WriteDispatchMap writes LocalDispatchMap(p, gpusPerNode) to path
// atomically.
func WriteDispatchMap(path string, p *Plan, gpusPerNode int) error {
	m, err := LocalDispatchMap(p, gpusPerNode)
	if err != nil {
		return err
	}
	return WriteFileAtomic(path, m.Encode())
}
