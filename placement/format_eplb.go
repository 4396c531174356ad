package placement

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/moetuner/moetuner/routing"
)

// encodeEPLB writes EPLBMaps with one line per layer in every map.
func encodeEPLB(p *Plan) ([]byte, error) {
	m, err := p.EPLBMaps()
	if err != nil {
		return nil, err
	}
	var b []byte
	b = fmt.Appendf(b, "{\n  \"num_gpus\": %d,\n", p.GPUs)
	b = append(b, "  \"phy2log\": [\n"...)
	b = appendLines(b, m.Phy2Log, appendInts[int])
	b = append(b, "  ],\n  \"log2phy\": [\n"...)
	b = appendLines(b, m.Log2Phy, appendNested)
	b = append(b, "  ],\n  \"logcnt\": [\n"...)
	b = appendLines(b, m.LogCnt, appendInts[int])
	return append(b, "  ]\n}\n"...), nil
}

type eplbDoc struct {
	NumGPUs *int      `json:"num_gpus"`
	Phy2Log [][]int   `json:"phy2log"`
	Log2Phy [][][]int `json:"log2phy"`
	LogCnt  [][]int   `json:"logcnt"`
}

// ReadEPLB reads a FormatEPLB file: {"num_gpus": G, "phy2log": [L][R],
// "log2phy": [L][E][X], "logcnt": [L][E]}, where slot p lives on GPU
// p/(R/G). gpus 0 takes the GPU count from "num_gpus"; a positive gpus is
// used for files without it and must match it otherwise (a
// *GPUCountError). It is ReadWith(r, FormatEPLB, Layout{GPUs: gpus}).
// Unknown keys are ignored. The three maps must agree: logcnt[l][e] counts
// e in phy2log[l], and log2phy[l][e] lists exactly those slots, then -1 up
// to X. The plan is validated; Experts is len(logcnt[0]), Strategy and
// Meta are empty.
func ReadEPLB(r io.Reader, gpus int) (*Plan, error) {
	if gpus < 0 || gpus > MaxGPUs {
		return nil, fmt.Errorf("placement: eplb: gpus is %d; pass 0 (take \"num_gpus\" from the file) or the expert-parallel size, in [1,%d]", gpus, MaxGPUs)
	}
	return ReadWith(r, FormatEPLB, Layout{GPUs: gpus})
}

func decodeEPLB(data []byte, layout Layout) (*Plan, error) {
	gpus := layout.GPUs
	var d eplbDoc
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("placement: eplb: %v; want {\"num_gpus\": G, \"phy2log\": [[...]], \"log2phy\": [[[...]]], \"logcnt\": [[...]]}", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("placement: eplb: data after the top-level object; keep one object per file")
	}
	switch {
	case d.Phy2Log == nil:
		return nil, errors.New("placement: eplb: missing \"phy2log\"; add the logical expert of every physical slot, one row per MoE layer")
	case d.Log2Phy == nil:
		return nil, errors.New("placement: eplb: missing \"log2phy\"; add the slots of every logical expert, one row per MoE layer")
	case d.LogCnt == nil:
		return nil, errors.New("placement: eplb: missing \"logcnt\"; add the replica count of every logical expert, one row per MoE layer")
	}
	switch {
	case d.NumGPUs != nil && gpus != 0 && *d.NumGPUs != gpus:
		return nil, &GPUCountError{Format: FormatEPLB, Field: "num_gpus", File: *d.NumGPUs, Given: gpus}
	case d.NumGPUs != nil:
		gpus = *d.NumGPUs
	case gpus == 0:
		return nil, &needError{"placement: eplb: missing \"num_gpus\"; add it to the file or set Layout.GPUs to the expert-parallel size", ErrNeedGPUs}
	}
	if gpus < 1 || gpus > MaxGPUs {
		return nil, fmt.Errorf("placement: eplb: num_gpus is %d; need the expert-parallel size, in [1,%d]", gpus, MaxGPUs)
	}
	L := len(d.Phy2Log)
	if L == 0 {
		return nil, errors.New("placement: eplb: phy2log has no rows; add one row per MoE layer")
	}
	if len(d.LogCnt) != L || len(d.Log2Phy) != L {
		return nil, fmt.Errorf("placement: eplb: phy2log has %d layers, log2phy %d and logcnt %d; give all three one row per MoE layer", L, len(d.Log2Phy), len(d.LogCnt))
	}
	R, E := len(d.Phy2Log[0]), len(d.LogCnt[0])
	if R == 0 || R%gpus != 0 {
		return nil, fmt.Errorf("placement: eplb: phy2log rows have %d slots, not a positive multiple of %d GPUs; check num_gpus", R, gpus)
	}
	if E < 1 || E > MaxExperts {
		return nil, fmt.Errorf("placement: eplb: logcnt rows have %d experts; need [1,%d]", E, MaxExperts)
	}
	X := -1
	perGPU := R / gpus
	p := &Plan{GPUs: gpus, Experts: E, Layers: make([]LayerPlan, L)}
	count := make([]int, E)
	for l := range L {
		phy, cnt, l2p := d.Phy2Log[l], d.LogCnt[l], d.Log2Phy[l]
		if len(phy) != R || len(cnt) != E || len(l2p) != E {
			return nil, fmt.Errorf("placement: eplb: layer %d has %d slots, %d logcnt and %d log2phy entries; layer 0 has %d slots and %d experts", l, len(phy), len(cnt), len(l2p), R, E)
		}
		clear(count)
		lp := LayerPlan{SlotExpert: make([]routing.Expert, R), SlotGPU: make([]GPU, R)}
		for s, e := range phy {
			if e < 0 || e >= E {
				return nil, fmt.Errorf("placement: eplb: phy2log[%d][%d] is %d; logical expert ids must be in [0,%d)", l, s, e, E)
			}
			count[e]++
			lp.SlotExpert[s], lp.SlotGPU[s] = routing.Expert(e), GPU(s/perGPU)
		}
		for e, slots := range l2p {
			if X < 0 {
				X = len(slots)
			}
			if len(slots) != X {
				return nil, fmt.Errorf("placement: eplb: log2phy[%d][%d] has %d entries but log2phy[0][0] has %d; pad every row with -1 to the same length", l, e, len(slots), X)
			}
			if cnt[e] != count[e] {
				return nil, fmt.Errorf("placement: eplb: logcnt[%d][%d] is %d but expert %d fills %d slots of phy2log[%d]; the maps disagree", l, e, cnt[e], e, count[e], l)
			}
			if cnt[e] > X {
				return nil, fmt.Errorf("placement: eplb: logcnt[%d][%d] is %d but log2phy rows hold %d slots; the maps disagree", l, e, cnt[e], X)
			}
			for r, s := range slots {
				switch {
				case r >= cnt[e] && s != -1:
					return nil, fmt.Errorf("placement: eplb: log2phy[%d][%d][%d] is %d; entries beyond logcnt (%d) must be -1", l, e, r, s, cnt[e])
				case r < cnt[e] && (s < 0 || s >= R || phy[s] != e):
					return nil, fmt.Errorf("placement: eplb: log2phy[%d][%d][%d] is %d, not a slot of expert %d in phy2log[%d]; the maps disagree", l, e, r, s, e, l)
				case r < cnt[e] && slices.Contains(slots[:r], s):
					return nil, fmt.Errorf("placement: eplb: log2phy[%d][%d] lists slot %d twice; the maps disagree", l, e, s)
				}
			}
		}
		p.Layers[l] = lp
	}
	if err := p.Validate(ValidateOptions{}); err != nil {
		return nil, err
	}
	return p, nil
}
