package placement

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// encodeVLLM writes the one expert-to-rank map vLLM's placement file holds.
func encodeVLLM(p *Plan) ([]byte, error) {
	if len(p.Layers) == 0 {
		return nil, errors.New("placement: vllm: plan has no layers; nothing to write")
	}
	var first []GPU
	for l := range p.Layers {
		gpus := p.ExpertGPUs(l)
		row := make([]GPU, len(gpus))
		for e, gs := range gpus {
			if len(gs) != 1 {
				return nil, fmt.Errorf("placement: vllm: layer %d: expert %d has %d copies; vLLM's expert_to_ep_rank allows exactly one copy per expert, so write replicated plans in the vllm-map format (eplb_config.initial_expert_map_path)", l, e, len(gs))
			}
			row[e] = gs[0]
		}
		if first == nil {
			first = row
			continue
		}
		for e, g := range row {
			if g != first[e] {
				return nil, fmt.Errorf("placement: vllm: layer %d puts expert %d on GPU %d but layer 0 puts it on GPU %d; vLLM's expert_to_ep_rank is one map for all layers, so write per-layer plans in the vllm-map format (eplb_config.initial_expert_map_path)", l, e, g, first[e])
			}
		}
	}
	var b []byte
	b = append(b, "{\n  \"expert_to_ep_rank\": "...)
	b = appendInts(b, first)
	return append(b, "\n}\n"...), nil
}

// ReadVLLM reads vLLM's {"expert_to_ep_rank": [E ranks]} placement file
// for gpus expert-parallel ranks and applies the map to each of layers
// layers (the file holds one map for all layers): it is ReadWith(r,
// FormatVLLM, Layout{GPUs: gpus, Layers: layers}). Experts is the length of
// the map; every rank must be in [0,gpus). Slots are laid out as in
// FromAssignment; the plan is validated and Strategy and Meta are empty.
func ReadVLLM(r io.Reader, gpus, layers int) (*Plan, error) {
	if gpus < 1 || gpus > MaxGPUs {
		return nil, fmt.Errorf("placement: vllm: gpus is %d; pass the expert-parallel size, in [1,%d]", gpus, MaxGPUs)
	}
	if layers < 1 || layers > maxLayers {
		return nil, fmt.Errorf("placement: vllm: layers is %d; pass the number of MoE layers, in [1,%d]", layers, maxLayers)
	}
	return ReadWith(r, FormatVLLM, Layout{GPUs: gpus, Layers: layers})
}

func decodeVLLM(data []byte, l Layout) (*Plan, error) {
	var d struct {
		ExpertToEPRank []int `json:"expert_to_ep_rank"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("placement: vllm: %v; want {\"expert_to_ep_rank\": [...]}", err)
	}
	row := d.ExpertToEPRank
	switch {
	case row == nil:
		return nil, errors.New("placement: vllm: missing \"expert_to_ep_rank\"; want {\"expert_to_ep_rank\": [...]} with the EP rank of every expert")
	case len(row) == 0 || len(row) > MaxExperts:
		return nil, fmt.Errorf("placement: vllm: expert_to_ep_rank has %d entries; need one per expert, in [1,%d]", len(row), MaxExperts)
	case l.GPUs == 0:
		return nil, needGPUs("vllm", "expert_to_ep_rank")
	case l.moeLayers() == 0:
		return nil, needLayers("vllm", "expert_to_ep_rank holds one map for every MoE layer, and the layout does not say how many there are; set Layout.Layers")
	}
	assign := make([]GPU, len(row))
	for e, g := range row {
		if g < 0 || g >= l.GPUs {
			return nil, fmt.Errorf("placement: vllm: expert_to_ep_rank[%d] is %d; ranks must be in [0,%d)", e, g, l.GPUs)
		}
		assign[e] = GPU(g)
	}
	p := FromAssignment(l.GPUs, sameEveryLayer(l.moeLayers(), assign), "")
	if err := p.Validate(ValidateOptions{}); err != nil {
		return nil, err
	}
	return p, nil
}

// encodeVLLMMap writes the [[P], ...] list of vLLM's
// eplb_config.initial_expert_map_path, one line per MoE layer.
func encodeVLLMMap(p *Plan) ([]byte, error) {
	rows, err := rankMajor(p, "vllm-map", "vLLM")
	if err != nil {
		return nil, err
	}
	b := []byte("[\n")
	for i, row := range rows {
		b = append(b, "  "...)
		b = appendInts(b, row)
		b = appendRowEnd(b, i, len(rows))
	}
	return append(b, "]\n"...), nil
}

func decodeVLLMMap(data []byte, l Layout) (*Plan, error) {
	var rows [][]int
	if err := strictJSON(data, &rows); err != nil {
		var one []int
		if err1 := strictJSON(data, &one); err1 != nil {
			return nil, fmt.Errorf("placement: vllm-map: %v; want a JSON list [[P logical expert ids], ...] with one list per MoE layer, or one list [P] for all of them", err)
		}
		n := l.moeLayers()
		if n == 0 {
			return nil, needLayers("vllm-map", "the file holds one list for every MoE layer, and the layout does not say how many there are; set Layout.Layers")
		}
		rows = make([][]int, n)
		for i := range rows {
			rows[i] = one
		}
	}
	if l.GPUs == 0 {
		return nil, needGPUs("vllm-map", "an initial expert map")
	}
	if n := l.moeLayers(); n != 0 && len(rows) != n {
		return nil, &CountError{Format: FormatVLLMMap, Subject: "the map", What: "lists (one per MoE layer)", LayoutField: l.layersField(), File: len(rows), Given: n}
	}
	return buildValid(rows, l.GPUs, l.Experts, rowSpec{
		format: "vllm-map", stack: "vLLM",
		cell: func(i, s int) string { return fmt.Sprintf("[%d][%d]", i, s) },
		list: func(i int) string { return fmt.Sprintf("list %d", i) },
	})
}

// strictJSON decodes one JSON value into v and fails on anything after it.
func strictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the top-level value; keep one per file")
	}
	return nil
}

// buildValid is buildPlan followed by Validate.
func buildValid(rows [][]int, gpus, experts int, spec rowSpec) (*Plan, error) {
	p, err := buildPlan(rows, gpus, experts, spec)
	if err != nil {
		return nil, err
	}
	if err := p.Validate(ValidateOptions{}); err != nil {
		return nil, err
	}
	return p, nil
}

// mappingRecord is the eplb_initial_mapping record of vLLM's offline EPLB.
type mappingRecord struct {
	RecordType          *string          `json:"record_type"`
	Version             *int             `json:"version"`
	NumRedundantExperts *int             `json:"num_redundant_experts"`
	NumSlots            *int             `json:"num_slots"`
	Assignments         map[string][]int `json:"initial_global_assignments"`
}

const (
	recordMapping   = "eplb_initial_mapping"
	recordLoadStats = "eplb_load_stats"
)

// encodeVLLMMapping writes one eplb_initial_mapping record as a JSON line.
func encodeVLLMMapping(p *Plan) ([]byte, error) {
	rows, err := rankMajor(p, "vllm-mapping", "vLLM")
	if err != nil {
		return nil, err
	}
	slots := len(rows[0])
	b := fmt.Appendf(nil, `{"record_type":%q,"version":1,"num_redundant_experts":%d,"num_slots":%d,"initial_global_assignments":{`, recordMapping, slots-p.Experts, slots)
	for i, row := range rows {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `"%d":`, i)
		b = appendInts(b, row)
	}
	return append(b, "}}\n"...), nil
}

func decodeVLLMMapping(data []byte, l Layout) (*Plan, error) {
	var rec *mappingRecord
	recLine, stats := 0, 0
	for i, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r mappingRecord
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("placement: vllm-mapping: line %d: %v; want one JSON object per line", i+1, err)
		}
		switch {
		case r.RecordType == nil:
			return nil, fmt.Errorf("placement: vllm-mapping: line %d: missing \"record_type\"; want {\"record_type\": %q, ...}", i+1, recordMapping)
		case *r.RecordType == recordLoadStats:
			stats++
			continue
		case *r.RecordType != recordMapping:
			return nil, fmt.Errorf("placement: vllm-mapping: line %d: record_type is %q; want %q", i+1, *r.RecordType, recordMapping)
		case rec != nil:
			return nil, fmt.Errorf("placement: vllm-mapping: lines %d and %d both hold an %s record; keep one placement per file", recLine, i+1, recordMapping)
		}
		rec, recLine = &r, i+1
	}
	if rec == nil {
		if stats > 0 {
			return nil, fmt.Errorf("placement: vllm-mapping: the file holds %d %s records (load statistics) and no %s; read it as routing statistics (a trace)", stats, recordLoadStats, recordMapping)
		}
		return nil, fmt.Errorf("placement: vllm-mapping: no %s record; want one JSON line {\"record_type\": %q, \"version\": 1, \"num_redundant_experts\", \"num_slots\", \"initial_global_assignments\"}", recordMapping, recordMapping)
	}
	at := fmt.Sprintf("placement: vllm-mapping: line %d: ", recLine)
	switch {
	case rec.Version == nil || *rec.Version != 1:
		return nil, errors.New(at + "\"version\" must be 1, the version this reader knows")
	case rec.NumSlots == nil || *rec.NumSlots < 1:
		return nil, errors.New(at + "\"num_slots\" must be the physical slots per layer, at least 1")
	case rec.NumRedundantExperts == nil || *rec.NumRedundantExperts < 0 || *rec.NumRedundantExperts >= *rec.NumSlots:
		return nil, fmt.Errorf(at+"\"num_redundant_experts\" must be in [0,num_slots %d)", *rec.NumSlots)
	case len(rec.Assignments) == 0:
		return nil, errors.New(at + "missing \"initial_global_assignments\"; add one list of num_slots logical expert ids per MoE layer, keyed \"0\", \"1\", ...")
	case l.GPUs == 0:
		return nil, needGPUs("vllm-mapping", "an eplb_initial_mapping record")
	}
	slots, experts := *rec.NumSlots, *rec.NumSlots-*rec.NumRedundantExperts
	if l.Experts != 0 && experts != l.Experts {
		return nil, fmt.Errorf(at+"num_slots %d minus num_redundant_experts %d is %d logical experts, but the model has %d (Layout.Experts); the redundant count must match the server's", slots, *rec.NumRedundantExperts, experts, l.Experts)
	}
	rows := make([][]int, len(rec.Assignments))
	keys := make([]string, 0, len(rec.Assignments))
	for k := range rec.Assignments {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		i, err := strconv.Atoi(k)
		if err != nil || i < 0 || i >= len(rows) || strconv.Itoa(i) != k {
			return nil, fmt.Errorf(at+"initial_global_assignments key %q; want the MoE-layer indices \"0\" to \"%d\", one per layer", k, len(rows)-1)
		}
		if len(rec.Assignments[k]) != slots {
			return nil, fmt.Errorf(at+"initial_global_assignments[%q] has %d entries, want num_slots %d", k, len(rec.Assignments[k]), slots)
		}
		rows[i] = rec.Assignments[k]
	}
	return buildValid(rows, l.GPUs, experts, rowSpec{
		format: "vllm-mapping", stack: "vLLM",
		cell: func(i, s int) string { return fmt.Sprintf("initial_global_assignments[\"%d\"][%d]", i, s) },
		list: func(i int) string { return fmt.Sprintf("initial_global_assignments[\"%d\"]", i) },
	})
}
