package placement

import (
	"errors"
	"fmt"
	"slices"
)

// EPLBMaps holds the three maps of DeepSeek's EPLB (deepseek-ai/EPLB,
// rebalance_experts) for L layers, E logical experts and R physical slots
// on G GPUs. Physical slot p lives on GPU p/(R/G).
type EPLBMaps struct {
	// Phy2Log[l][p] is the logical expert in physical slot p of layer l
	// ([L][R]).
	Phy2Log [][]int
	// Log2Phy[l][e][r] is the physical slot of replica r of logical expert
	// e at layer l, -1 beyond LogCnt[l][e] ([L][E][X], X the largest
	// LogCnt over all layers).
	Log2Phy [][][]int
	// LogCnt[l][e] is the number of replicas of logical expert e at layer l
	// ([L][E]).
	LogCnt [][]int
}

// NewEPLBMaps builds EPLBMaps from flat arrays for L layers, E experts and
// R slots per layer: phy2log[l*R+p] is slot p's expert, replica[l*R+p] its
// replica index among that expert's copies and logcnt[l*E+e] the copies of
// expert e. The arrays are kept (not copied); the inputs must be
// consistent (every replica index below its expert's count).
func NewEPLBMaps(L, E, R int, phy2log, replica, logcnt []int) *EPLBMaps {
	x := slices.Max(logcnt)
	res := &EPLBMaps{Phy2Log: make([][]int, L), Log2Phy: make([][][]int, L), LogCnt: make([][]int, L)}
	flat := make([]int, L*E*x)
	for i := range flat {
		flat[i] = -1
	}
	rows := make([][]int, L*E)
	for l := range L {
		res.Phy2Log[l] = phy2log[l*R : (l+1)*R : (l+1)*R]
		res.LogCnt[l] = logcnt[l*E : (l+1)*E : (l+1)*E]
		res.Log2Phy[l] = rows[l*E : (l+1)*E : (l+1)*E]
		for e := range E {
			i := (l*E + e) * x
			rows[l*E+e] = flat[i : i+x : i+x]
		}
		for p, e := range res.Phy2Log[l] {
			res.Log2Phy[l][e][replica[l*R+p]] = p
		}
	}
	return res
}

// EPLBMaps returns p as EPLB's three maps. It fails unless p validates
// with every GPU holding the same number of slots in every layer and every
// layer the same number of slots. Slots are taken GPU-major (GPUMajor), so
// slot p lies on GPU p/(R/GPUs) as EPLB requires; replica r of an expert in
// Log2Phy is its r-th slot in that order. For a plan from baseline.EPLB, Phy2Log and
// LogCnt therefore equal baseline.RebalanceExperts' (unless FixDuplicates swapped
// slots) and Log2Phy lists the same slots, possibly in another order.
func (p *Plan) EPLBMaps() (*EPLBMaps, error) {
	if err := p.Validate(ValidateOptions{EqualSlots: true}); err != nil {
		return nil, err
	}
	if len(p.Layers) == 0 {
		return nil, errors.New("placement: eplb: plan has no layers; EPLB's maps need one row per MoE layer")
	}
	q := p
	if !p.IsGPUMajor() {
		q = p.GPUMajor()
	}
	L, E, R := len(q.Layers), q.Experts, len(q.Layers[0].SlotExpert)
	for l, lp := range q.Layers {
		if len(lp.SlotExpert) != R {
			return nil, fmt.Errorf("placement: eplb: layer %d has %d slots but layer 0 has %d; EPLB needs the same number of physical slots in every layer (add replicas)", l, len(lp.SlotExpert), R)
		}
	}
	phy2log, replica, logcnt := make([]int, L*R), make([]int, L*R), make([]int, L*E)
	for l, lp := range q.Layers {
		cnt := logcnt[l*E : (l+1)*E]
		for s, e := range lp.SlotExpert {
			phy2log[l*R+s] = int(e)
			replica[l*R+s] = cnt[e]
			cnt[e]++
		}
	}
	return NewEPLBMaps(L, E, R, phy2log, replica, logcnt), nil
}
