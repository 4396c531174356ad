package placement

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

type trtllmDoc struct {
	NumSlots            *int          `yaml:"num_slots"`
	Assignments         map[int][]int `yaml:"initial_global_assignments"`
	LayerUpdatesPerIter *int          `yaml:"layer_updates_per_iter"`
	// EPSize is not TensorRT-LLM's config but its scripts write it.
	EPSize *int `yaml:"ep_size"`
}

// encodeTRTLLM writes TensorRT-LLM's moe_load_balancer YAML: num_slots,
// the rank-major slot list of every MoE layer keyed by decoder-layer
// index, and layer_updates_per_iter 0 (a static placement). It writes no
// ep_size, which the strict config may reject.
func encodeTRTLLM(p *Plan, l Layout) ([]byte, error) {
	rows, err := rankMajor(p, "trtllm", "TensorRT-LLM")
	if err != nil {
		return nil, err
	}
	ids := l.decoderIDs()
	if len(ids) != len(rows) {
		return nil, fmt.Errorf("placement: trtllm: plan has %d layers but the layout places %d MoE layers; set Layout.LayerIDs to the plan's layers", len(rows), len(ids))
	}
	b := fmt.Appendf(nil, "num_slots: %d\ninitial_global_assignments:\n", len(rows[0]))
	for i, row := range rows {
		b = fmt.Appendf(b, "  %d: ", ids[i])
		b = appendIntsSpaced(b, row)
		b = append(b, '\n')
	}
	return append(b, "layer_updates_per_iter: 0\n"...), nil
}

// decodeTRTLLM reads the load-balancer YAML. The plan's layers are the
// decoder layers it lists, ascending; where the layout knows the MoE
// layers the file must list exactly those (TensorRT-LLM fails on a missing
// one). Two copies of one expert on one rank, which TensorRT-LLM allows,
// become one slot with their share of the expert's tokens.
func decodeTRTLLM(data []byte, l Layout) (*Plan, error) {
	d, err := parseTRTLLM(data)
	if err != nil {
		return nil, err
	}
	return trtllmPlan(d, l)
}

// parseTRTLLM decodes the load-balancer YAML strictly (unknown keys are
// errors, as in TensorRT-LLM's config) and checks what needs no layout.
func parseTRTLLM(data []byte) (*trtllmDoc, error) {
	var d trtllmDoc
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&d); err != nil {
		if err == io.EOF {
			return nil, errors.New("placement: trtllm: empty document; want num_slots, initial_global_assignments and layer_updates_per_iter")
		}
		msg := err.Error()
		if strings.Contains(msg, "not found in type") {
			return nil, fmt.Errorf("placement: trtllm: %v; TensorRT-LLM's moe_load_balancer takes num_slots, initial_global_assignments and layer_updates_per_iter", msg)
		}
		return nil, fmt.Errorf("placement: trtllm: %v; want num_slots: P and initial_global_assignments: {decoder layer: [P logical expert ids]}", msg)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		return nil, errors.New("placement: trtllm: more than one YAML document; keep one load-balancer config per file")
	}
	switch {
	case d.NumSlots == nil || *d.NumSlots < 1:
		return nil, errors.New("placement: trtllm: \"num_slots\" must be the physical slots per layer, at least 1")
	case len(d.Assignments) == 0:
		return nil, errors.New("placement: trtllm: missing \"initial_global_assignments\"; add one list of num_slots logical expert ids per MoE layer, keyed by decoder-layer index")
	case d.LayerUpdatesPerIter != nil && *d.LayerUpdatesPerIter < 0:
		return nil, fmt.Errorf("placement: trtllm: layer_updates_per_iter is %d; want 0 (static) or more", *d.LayerUpdatesPerIter)
	}
	return &d, nil
}

// ReadTRTLLMSlots reads a TensorRT-LLM load-balancer YAML as TensorRT-LLM
// numbers its slots: the decoder layers of initial_global_assignments,
// ascending, and for each the logical expert of every global slot
// (rank-major), two copies of one expert on one rank kept as two slots
// (a Plan merges them into one). It needs no layout: the slot order does
// not depend on the GPU count. Every list must have num_slots
// non-negative ids.
func ReadTRTLLMSlots(r io.Reader) (layers []int, slots [][]int, err error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxFileBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("placement: trtllm: read: %w", err)
	}
	if len(data) > MaxFileBytes {
		return nil, nil, fmt.Errorf("placement: trtllm: larger than %d bytes", MaxFileBytes)
	}
	d, err := parseTRTLLM(data)
	if err != nil {
		return nil, nil, err
	}
	layers = slices.Sorted(maps.Keys(d.Assignments))
	for _, id := range layers {
		row := d.Assignments[id]
		if id < 0 {
			return nil, nil, fmt.Errorf("placement: trtllm: initial_global_assignments has decoder layer %d; keys are decoder-layer indices, 0 or more", id)
		}
		if len(row) != *d.NumSlots {
			return nil, nil, fmt.Errorf("placement: trtllm: initial_global_assignments[%d] has %d entries, want num_slots %d", id, len(row), *d.NumSlots)
		}
		for s, e := range row {
			if e < 0 {
				return nil, nil, fmt.Errorf("placement: trtllm: initial_global_assignments[%d][%d] is %d; want a logical expert id, 0 or more", id, s, e)
			}
		}
		slots = append(slots, slices.Clone(row))
	}
	return layers, slots, nil
}

// trtllmPlan builds the plan of a parsed load-balancer YAML for layout l.
func trtllmPlan(d *trtllmDoc, l Layout) (*Plan, error) {
	gpus := l.GPUs
	switch {
	case d.EPSize != nil && (*d.EPSize < 1 || *d.EPSize > MaxGPUs):
		return nil, fmt.Errorf("placement: trtllm: ep_size is %d; want the expert-parallel size, in [1,%d]", *d.EPSize, MaxGPUs)
	case d.EPSize != nil && gpus != 0 && *d.EPSize != gpus:
		return nil, &GPUCountError{Format: FormatTRTLLM, Field: "ep_size", File: *d.EPSize, Given: gpus}
	case d.EPSize != nil:
		gpus = *d.EPSize
	case gpus == 0:
		return nil, needGPUs("trtllm", "a load-balancer config without ep_size")
	}
	slots := *d.NumSlots
	if slots%gpus != 0 {
		return nil, fmt.Errorf("placement: trtllm: num_slots %d is not divisible by %d GPUs (ep_size); TensorRT-LLM needs the same number of slots on every rank", slots, gpus)
	}
	ids := make([]int, 0, len(d.Assignments))
	for id := range d.Assignments {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		switch {
		case id < 0:
			return nil, fmt.Errorf("placement: trtllm: initial_global_assignments has decoder layer %d; keys are decoder-layer indices, 0 or more", id)
		case l.ModelLayers > 0 && id >= l.ModelLayers:
			return nil, fmt.Errorf("placement: trtllm: initial_global_assignments has decoder layer %d but the model has %d decoder layers (Layout.ModelLayers)", id, l.ModelLayers)
		}
	}
	if want := l.decoderIDs(); want != nil {
		for _, id := range want {
			if _, ok := d.Assignments[id]; !ok {
				return nil, fmt.Errorf("placement: trtllm: initial_global_assignments has no entry for decoder layer %d, a MoE layer; TensorRT-LLM needs one for every MoE layer", id)
			}
		}
		for _, id := range ids {
			if !slices.Contains(want, id) {
				return nil, fmt.Errorf("placement: trtllm: initial_global_assignments has decoder layer %d, which the layout does not list as a MoE layer; check Layout.LayerIDs", id)
			}
		}
	}
	rows := make([][]int, len(ids))
	for i, id := range ids {
		rows[i] = d.Assignments[id]
		if len(rows[i]) != slots {
			return nil, fmt.Errorf("placement: trtllm: initial_global_assignments[%d] has %d entries, want num_slots %d", id, len(rows[i]), slots)
		}
	}
	return buildValid(rows, gpus, l.Experts, rowSpec{
		format: "trtllm", stack: "TensorRT-LLM", sameRank: true,
		cell: func(i, s int) string { return fmt.Sprintf("initial_global_assignments[%d][%d]", ids[i], s) },
		list: func(i int) string { return fmt.Sprintf("initial_global_assignments[%d]", ids[i]) },
	})
}
