package placement

import (
	"fmt"
	"slices"
	"strings"
)

// MaxGPUs and MaxExperts bound Plan.GPUs and Plan.Experts in Validate, so
// that a hostile or corrupt file cannot make the validator allocate without
// limit. Both are far above any real deployment.
const (
	MaxGPUs    = 1 << 20
	MaxExperts = 1 << 20
)

// ValidateOptions are the optional constraints of Validate. The zero value
// checks only the structural rules.
type ValidateOptions struct {
	// Experts is the expected number of logical experts per layer; 0 uses
	// Plan.Experts without checking it against anything.
	Experts int
	// Layers is the expected number of layers; 0 accepts any number.
	Layers int
	// SlotsPerGPU is the slot capacity of every GPU in every layer (len
	// GPUs); nil means no cap.
	SlotsPerGPU []int
	// EqualSlots requires every GPU to hold the same number of slots within
	// each layer, as SGLang and EPLB do (slot p on GPU p/(P/GPUs)).
	EqualSlots bool
	// TotalExpertsPerGPU caps the slots of every GPU summed over all layers
	// (len GPUs): expert weights in memory over the whole model. Nil means
	// no cap.
	TotalExpertsPerGPU []int
}

// ValidationError reports the first rule a plan breaks. Layer, Slot, GPU
// and Expert are -1 where they do not apply.
type ValidationError struct {
	Layer, Slot, GPU, Expert int
	// Reason says what is wrong and what would fix it.
	Reason string
}

// Error returns "placement: layer L: REASON", without the layer part for
// plan-wide problems.
func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString("placement: ")
	if e.Layer >= 0 {
		fmt.Fprintf(&b, "layer %d: ", e.Layer)
	}
	b.WriteString(e.Reason)
	return b.String()
}

func verr(layer, slot, gpu, expert int, format string, args ...any) *ValidationError {
	return &ValidationError{Layer: layer, Slot: slot, GPU: gpu, Expert: expert, Reason: fmt.Sprintf(format, args...)}
}

// Validate checks p and returns nil or a *ValidationError for the first
// broken rule (layers in order, within a layer the rules in the order of
// the package documentation). Options whose lengths do not match p.GPUs
// give a plain error.
func (p *Plan) Validate(opts ValidateOptions) error {
	if p == nil {
		return verr(-1, -1, -1, -1, "nil plan")
	}
	if p.GPUs < 1 || p.GPUs > MaxGPUs {
		return verr(-1, -1, -1, -1, "gpus is %d; set it to the number of expert-parallel ranks, in [1,%d]", p.GPUs, MaxGPUs)
	}
	if p.Experts < 1 || p.Experts > MaxExperts {
		return verr(-1, -1, -1, -1, "experts is %d; set it to the number of logical experts per layer, in [1,%d]", p.Experts, MaxExperts)
	}
	if opts.Experts != 0 && opts.Experts != p.Experts {
		return verr(-1, -1, -1, -1, "plan has %d experts per layer but ValidateOptions.Experts is %d; make a plan for this model, or give the model's experts", p.Experts, opts.Experts)
	}
	if opts.Layers != 0 && opts.Layers != len(p.Layers) {
		return verr(-1, -1, -1, -1, "plan has %d layers but ValidateOptions.Layers is %d; make a plan for this model, or give the model's MoE layers", len(p.Layers), opts.Layers)
	}
	if opts.SlotsPerGPU != nil && len(opts.SlotsPerGPU) != p.GPUs {
		return fmt.Errorf("placement: ValidateOptions.SlotsPerGPU has %d entries for %d GPUs", len(opts.SlotsPerGPU), p.GPUs)
	}
	if opts.TotalExpertsPerGPU != nil && len(opts.TotalExpertsPerGPU) != p.GPUs {
		return fmt.Errorf("placement: ValidateOptions.TotalExpertsPerGPU has %d entries for %d GPUs", len(opts.TotalExpertsPerGPU), p.GPUs)
	}
	for _, opt := range []struct {
		name string
		caps []int
	}{{"SlotsPerGPU", opts.SlotsPerGPU}, {"TotalExpertsPerGPU", opts.TotalExpertsPerGPU}} {
		for g, c := range opt.caps {
			if c < 0 {
				return fmt.Errorf("placement: ValidateOptions.%s[%d] is %d; capacities must be non-negative", opt.name, g, c)
			}
		}
	}
	// The buffers are allocated once and reset through the slots that set
	// them, so that the work per layer follows the slot count, not GPUs or
	// Experts (which a corrupt file may set very large).
	total := make([]int, p.GPUs)
	count := make([]int, p.GPUs)
	placed := make([]bool, p.Experts)
	var touched []int
	for l, lp := range p.Layers {
		if len(lp.SlotExpert) != len(lp.SlotGPU) {
			return verr(l, -1, -1, -1, "slot_expert has %d slots but slot_gpu has %d; give both one entry per slot", len(lp.SlotExpert), len(lp.SlotGPU))
		}
		for s, e := range lp.SlotExpert {
			g := lp.SlotGPU[s]
			if e < 0 || int(e) >= p.Experts {
				return verr(l, s, int(g), int(e), "slot %d: expert %d out of range [0,%d); use an expert id below %d", s, e, p.Experts, p.Experts)
			}
			if g < 0 || int(g) >= p.GPUs {
				return verr(l, s, int(g), int(e), "slot %d: GPU %d out of range [0,%d); use a GPU id below %d or raise gpus", s, g, p.GPUs, p.GPUs)
			}
		}
		if lp.SlotShare != nil {
			if err := checkShares(l, lp, p.Experts); err != nil {
				return err
			}
		}
		seen := make(map[[2]int]struct{}, len(lp.SlotExpert))
		for s, e := range lp.SlotExpert {
			g := lp.SlotGPU[s]
			k := [2]int{int(e), int(g)}
			if _, dup := seen[k]; dup {
				return verr(l, s, int(g), int(e), "expert %d has two copies on GPU %d (slot %d); remove one", e, g, s)
			}
			seen[k] = struct{}{}
		}
		distinct := 0
		for _, e := range lp.SlotExpert {
			if !placed[e] {
				placed[e] = true
				distinct++
			}
		}
		if distinct < p.Experts {
			for e, ok := range placed {
				if !ok {
					return verr(l, -1, -1, e, "expert %d has no slot; place it on at least one GPU", e)
				}
			}
		}
		for _, e := range lp.SlotExpert {
			placed[e] = false
		}

		touched = touched[:0]
		for _, g := range lp.SlotGPU {
			if count[g] == 0 {
				touched = append(touched, int(g))
			}
			count[g]++
			total[g]++
		}
		slices.Sort(touched)
		err := checkCounts(l, count, touched, opts)
		for _, g := range touched {
			count[g] = 0
		}
		if err != nil {
			return err
		}
	}
	for g, c := range total {
		if opts.TotalExpertsPerGPU != nil && c > opts.TotalExpertsPerGPU[g] {
			return verr(-1, -1, g, -1, "GPU %d holds %d expert copies over all layers, memory for %d; move %d to another GPU", g, c, opts.TotalExpertsPerGPU[g], c-opts.TotalExpertsPerGPU[g])
		}
	}
	return nil
}

// checkCounts checks the per-layer capacity rules on count, whose non-zero
// entries are exactly the sorted GPUs in touched.
func checkCounts(l int, count, touched []int, opts ValidateOptions) error {
	if opts.SlotsPerGPU != nil {
		for _, g := range touched {
			if c := count[g]; c > opts.SlotsPerGPU[g] {
				return verr(l, -1, g, -1, "GPU %d holds %d slots, capacity %d; move %d to another GPU", g, c, opts.SlotsPerGPU[g], c-opts.SlotsPerGPU[g])
			}
		}
	}
	if opts.EqualSlots {
		// The first GPU whose count differs from GPU 0's is either a
		// touched GPU with another count or the first untouched one.
		for i, g := range touched {
			if g != i {
				if count[0] != 0 {
					return verr(l, -1, i, -1, "GPU %d holds 0 slots but GPU 0 holds %d; every GPU needs the same number (add replicas or move slots)", i, count[0])
				}
				return verr(l, -1, g, -1, "GPU %d holds %d slots but GPU 0 holds 0; every GPU needs the same number (add replicas or move slots)", g, count[g])
			}
			if count[g] != count[0] {
				return verr(l, -1, g, -1, "GPU %d holds %d slots but GPU 0 holds %d; every GPU needs the same number (add replicas or move slots)", g, count[g], count[0])
			}
		}
		if n := len(touched); n > 0 && n < len(count) {
			return verr(l, -1, n, -1, "GPU %d holds 0 slots but GPU 0 holds %d; every GPU needs the same number (add replicas or move slots)", n, count[0])
		}
	}
	return nil
}

// checkShares checks a layer's optional per-slot token shares: one per
// slot, finite, non-negative, adding up to 1 over each expert's copies.
func checkShares(l int, lp LayerPlan, experts int) error {
	if len(lp.SlotShare) != len(lp.SlotExpert) {
		return verr(l, -1, -1, -1, "slot_share has %d entries for %d slots; give one share per slot or none", len(lp.SlotShare), len(lp.SlotExpert))
	}
	sum := make(map[int]float64)
	for s, v := range lp.SlotShare {
		if v < 0 || v > 1 || v != v {
			return verr(l, s, int(lp.SlotGPU[s]), int(lp.SlotExpert[s]), "slot %d: share %v outside [0,1]; shares are fractions of the expert's tokens", s, v)
		}
		sum[int(lp.SlotExpert[s])] += v
	}
	for e := range experts {
		if v, ok := sum[e]; ok && (v < 1-1e-9 || v > 1+1e-9) {
			return verr(l, -1, -1, e, "expert %d: its copies' shares add up to %v, not 1; rescale them", e, v)
		}
	}
	return nil
}
