package placement

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/moetuner/moetuner/routing"
)

// The serving stacks store a layer as a rank-major slot list: entry p is
// the logical expert of physical slot p, and slot p lives on rank
// p/(P/ep_size). rankMajor and buildPlan convert between that and a Plan
// for every stack format.

// rankMajor returns the slot lists of p, one per layer, rank-major (see
// GPUMajor). It fails unless every layer has the same number P of slots
// and every GPU holds P/GPUs of them, which is what a rank-major list can
// express; stack names the target in the messages ("SGLang").
func rankMajor(p *Plan, format, stack string) ([][]int, error) {
	if len(p.Layers) == 0 {
		return nil, fmt.Errorf("placement: %s: plan has no layers; %s needs one slot list per MoE layer", format, stack)
	}
	q := p
	if !p.IsGPUMajor() {
		q = p.GPUMajor()
	}
	slots := len(q.Layers[0].SlotExpert)
	rows := make([][]int, len(q.Layers))
	for l, lp := range q.Layers {
		if len(lp.SlotExpert) != slots {
			return nil, fmt.Errorf("placement: %s: layer %d has %d slots but layer 0 has %d; %s needs the same number of physical slots in every layer (add replicas)", format, l, len(lp.SlotExpert), slots, stack)
		}
		count := q.SlotsPerGPU(l)
		for g, c := range count {
			if c != count[0] {
				return nil, fmt.Errorf("placement: %s: layer %d: GPU %d holds %d slots but GPU 0 holds %d; %s puts slot p on rank p/(P/ep_size), so every GPU needs the same number of slots (add replicas or move slots)", format, l, g, c, count[0], stack)
			}
		}
		row := make([]int, slots)
		for s, e := range lp.SlotExpert {
			row[s] = int(e)
		}
		rows[l] = row
	}
	return rows, nil
}

// rowSpec says how a stack's slot lists are named in messages and whether
// the stack loads two copies of one expert on one rank.
type rowSpec struct {
	format, stack string
	// cell names entry s of list l as the file does
	// ("physical_to_logical_map[4][9]").
	cell func(l, s int) string
	// list names list l as a whole.
	list func(l int) string
	// sameRank allows two copies of one expert on one rank (TensorRT-LLM);
	// they become one slot with the copies' share of the expert's tokens
	// (SlotShare), as an even split over the copies sends them.
	sameRank bool
}

// buildPlan builds a plan of gpus GPUs from rank-major slot lists: rows[l]
// is MoE layer l's list. experts 0 takes the largest id plus one. The plan
// is not validated.
func buildPlan(rows [][]int, gpus, experts int, spec rowSpec) (*Plan, error) {
	if len(rows) == 0 {
		return nil, fmt.Errorf("placement: %s: no MoE layers; add one slot list per MoE layer", spec.format)
	}
	slots := len(rows[0])
	for l, row := range rows {
		if len(row) != slots {
			return nil, fmt.Errorf("placement: %s: %s has %d slots but %s has %d; give every layer the same number of slots", spec.format, spec.list(l), len(row), spec.list(0), slots)
		}
	}
	if slots == 0 || slots%gpus != 0 {
		return nil, fmt.Errorf("placement: %s: the slot lists have %d slots, not a positive multiple of %d GPUs; %s puts slot p on rank p/(P/ep_size), so check the GPU count (ep_size)", spec.format, slots, gpus, spec.stack)
	}
	seen := 0
	for l, row := range rows {
		for s, e := range row {
			if e < 0 || e >= MaxExperts || (experts > 0 && e >= experts) {
				top := experts
				if top == 0 {
					top = MaxExperts
				}
				return nil, fmt.Errorf("placement: %s: %s is %d; logical expert ids must be in [0,%d)", spec.format, spec.cell(l, s), e, top)
			}
			seen = max(seen, e+1)
		}
	}
	if experts == 0 {
		experts = seen
	}
	perGPU := slots / gpus
	p := &Plan{GPUs: gpus, Experts: experts, Layers: make([]LayerPlan, len(rows))}
	first := make(map[[2]int]int, slots) // (expert, GPU) -> first slot
	for l, row := range rows {
		clear(first)
		lp := LayerPlan{SlotExpert: make([]routing.Expert, 0, slots), SlotGPU: make([]GPU, 0, slots)}
		var copies map[[2]int]int
		for s, e := range row {
			k := [2]int{e, s / perGPU}
			if f, dup := first[k]; dup {
				if !spec.sameRank {
					return nil, fmt.Errorf("placement: %s: %s: expert %d is on rank %d twice (slots %d and %d of %d per rank); %s needs the copies of an expert on different ranks, so the file is wrong or for another GPU count than %d", spec.format, spec.list(l), e, k[1], f, s, perGPU, spec.stack, gpus)
				}
				if copies == nil {
					copies = make(map[[2]int]int)
				}
				copies[k]++
				continue
			}
			first[k] = s
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
			lp.SlotGPU = append(lp.SlotGPU, GPU(k[1]))
		}
		if copies != nil {
			lp.SlotShare = shares(row, lp, copies)
		}
		p.Layers[l] = lp
	}
	return p, nil
}

// shares returns the share of its expert's tokens every slot of lp serves
// when the copies in row split them evenly: a slot standing for c copies
// (1 + extra[(expert, GPU)]) of an expert with n copies serves c/n.
func shares(row []int, lp LayerPlan, extra map[[2]int]int) []float64 {
	total := make(map[int]int)
	for _, e := range row {
		total[e]++
	}
	out := make([]float64, len(lp.SlotExpert))
	for s, e := range lp.SlotExpert {
		c := 1 + extra[[2]int{int(e), int(lp.SlotGPU[s])}]
		out[s] = float64(c) / float64(total[int(e)])
	}
	return out
}

// trivialRow is SGLang's trivial map of one layer: slot p holds expert
// p mod experts.
func trivialRow(slots, experts int) []int {
	row := make([]int, slots)
	for p := range row {
		row[p] = p % experts
	}
	return row
}

func jsonString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}

func appendInts[T ~int](b []byte, xs []T) []byte {
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return append(b, ']')
}

// appendIntsSpaced writes xs as a YAML/JSON flow list with ", " between
// entries.
func appendIntsSpaced(b []byte, xs []int) []byte {
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return append(b, ']')
}

// appendLines writes the body of a JSON array with one indented line per
// entry of rows, each written by line.
func appendLines[T any](b []byte, rows []T, line func([]byte, T) []byte) []byte {
	for i, r := range rows {
		b = append(b, "    "...)
		b = line(b, r)
		b = appendRowEnd(b, i, len(rows))
	}
	return b
}

// appendNested writes rows as one JSON array of int arrays.
func appendNested(b []byte, rows [][]int) []byte {
	b = append(b, '[')
	for i, row := range rows {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendInts(b, row)
	}
	return append(b, ']')
}

func appendRowEnd(b []byte, i, n int) []byte {
	if i < n-1 {
		b = append(b, ',')
	}
	return append(b, '\n')
}
