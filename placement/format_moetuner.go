package placement

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"

	"gopkg.in/yaml.v3"

	"github.com/moetuner/moetuner/routing"
)

// Schema is the value of the "schema" field of moetuner plan files.
const Schema = "moetuner.placement/v1"

// fileLayer and fileDoc are the moetuner JSON/YAML document. Pointers and
// nil slices let the reader tell a missing field from a zero one.
type fileLayer struct {
	SlotExpert []routing.Expert `json:"slot_expert" yaml:"slot_expert,flow"`
	SlotGPU    []GPU            `json:"slot_gpu" yaml:"slot_gpu,flow"`
	SlotShare  []float64        `json:"slot_share,omitempty" yaml:"slot_share,flow,omitempty"`
}

type fileDoc struct {
	Schema   *string           `json:"schema" yaml:"schema"`
	Strategy string            `json:"strategy" yaml:"strategy"`
	GPUs     *int              `json:"gpus" yaml:"gpus"`
	Experts  *int              `json:"experts" yaml:"experts"`
	Layers   []fileLayer       `json:"layers" yaml:"layers"`
	Meta     map[string]string `json:"meta" yaml:"meta"`
}

// encodeJSON writes the document by hand so that the layout is fixed: one
// line per layer, two-space indentation elsewhere.
func encodeJSON(p *Plan) []byte {
	var b []byte
	b = append(b, "{\n"...)
	b = fmt.Appendf(b, "  \"schema\": %s,\n", jsonString(Schema))
	b = fmt.Appendf(b, "  \"strategy\": %s,\n", jsonString(p.Strategy))
	b = fmt.Appendf(b, "  \"gpus\": %d,\n", p.GPUs)
	b = fmt.Appendf(b, "  \"experts\": %d,\n", p.Experts)
	if len(p.Layers) == 0 {
		b = append(b, "  \"layers\": [],\n"...)
	} else {
		b = append(b, "  \"layers\": [\n"...)
		for l, lp := range p.Layers {
			b = append(b, "    {\"slot_expert\": "...)
			b = appendInts(b, lp.SlotExpert)
			b = append(b, ", \"slot_gpu\": "...)
			b = appendInts(b, lp.SlotGPU)
			if lp.SlotShare != nil {
				b = append(b, ", \"slot_share\": ["...)
				for i, v := range lp.SlotShare {
					if i > 0 {
						b = append(b, ", "...)
					}
					b = strconv.AppendFloat(b, v, 'g', 17, 64)
				}
				b = append(b, ']')
			}
			b = append(b, '}')
			if l < len(p.Layers)-1 {
				b = append(b, ',')
			}
			b = append(b, '\n')
		}
		b = append(b, "  ],\n"...)
	}
	if len(p.Meta) == 0 {
		b = append(b, "  \"meta\": {}\n"...)
	} else {
		b = append(b, "  \"meta\": {\n"...)
		keys := slices.Sorted(func(yield func(string) bool) {
			for k := range p.Meta {
				if !yield(k) {
					return
				}
			}
		})
		for i, k := range keys {
			b = fmt.Appendf(b, "    %s: %s", jsonString(k), jsonString(p.Meta[k]))
			if i < len(keys)-1 {
				b = append(b, ',')
			}
			b = append(b, '\n')
		}
		b = append(b, "  }\n"...)
	}
	return append(b, "}\n"...)
}

func toDoc(p *Plan) fileDoc {
	schema, gpus, experts := Schema, p.GPUs, p.Experts
	d := fileDoc{Schema: &schema, Strategy: p.Strategy, GPUs: &gpus, Experts: &experts,
		Layers: make([]fileLayer, len(p.Layers)), Meta: p.Meta}
	for l, lp := range p.Layers {
		d.Layers[l] = fileLayer(lp)
	}
	if d.Meta == nil {
		d.Meta = map[string]string{}
	}
	return d
}

func encodeYAML(p *Plan) ([]byte, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(toDoc(p)); err != nil {
		return nil, fmt.Errorf("placement: yaml: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("placement: yaml: %w", err)
	}
	return b.Bytes(), nil
}

// decodeMoetuner reads moetuner's own JSON or YAML document.
func decodeMoetuner(data []byte, format Format, l Layout) (*Plan, error) {
	var doc fileDoc
	switch format {
	case FormatJSON:
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&doc); err != nil {
			return nil, fmt.Errorf("placement: moetuner json: %v; fix the document (see the placement package doc for the shape)", err)
		}
		if _, err := dec.Token(); err != io.EOF {
			return nil, errors.New("placement: moetuner json: data after the top-level object; keep one object per file")
		}
	case FormatYAML:
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&doc); err != nil {
			if err == io.EOF {
				return nil, errors.New("placement: yaml: empty document; write a plan with schema, gpus, experts and layers")
			}
			return nil, fmt.Errorf("placement: yaml: %v; fix the document (see the placement package doc for the shape)", err)
		}
		var extra yaml.Node
		if err := dec.Decode(&extra); err != io.EOF {
			return nil, errors.New("placement: yaml: more than one document; keep one plan per file")
		}
	}
	return fromDoc(&doc, format, l)
}

func fromDoc(d *fileDoc, f Format, l Layout) (*Plan, error) {
	format := string(f)
	if f == FormatJSON {
		format = "moetuner json"
	}
	switch {
	case d.Schema == nil:
		return nil, fmt.Errorf("placement: %s: missing \"schema\"; add \"schema\": %q", format, Schema)
	case *d.Schema != Schema:
		return nil, fmt.Errorf("placement: %s: schema is %q, want %q; this version reads only %s", format, *d.Schema, Schema, Schema)
	case d.GPUs == nil:
		return nil, fmt.Errorf("placement: %s: missing \"gpus\"; add the number of expert-parallel ranks", format)
	case d.Experts == nil:
		return nil, fmt.Errorf("placement: %s: missing \"experts\"; add the number of logical experts per layer", format)
	case d.Layers == nil:
		return nil, fmt.Errorf("placement: %s: missing \"layers\"; add one {slot_expert, slot_gpu} entry per MoE layer", format)
	}
	if l.GPUs != 0 && *d.GPUs != l.GPUs {
		return nil, &GPUCountError{Format: f, Field: "gpus", File: *d.GPUs, Given: l.GPUs}
	}
	p := &Plan{GPUs: *d.GPUs, Experts: *d.Experts, Strategy: d.Strategy, Layers: make([]LayerPlan, len(d.Layers))}
	if len(d.Meta) > 0 {
		p.Meta = d.Meta
	}
	for i, fl := range d.Layers {
		if fl.SlotExpert == nil {
			return nil, fmt.Errorf("placement: %s: layers[%d]: missing \"slot_expert\"; add the logical expert of every slot", format, i)
		}
		if fl.SlotGPU == nil {
			return nil, fmt.Errorf("placement: %s: layers[%d]: missing \"slot_gpu\"; add the GPU of every slot", format, i)
		}
		p.Layers[i] = LayerPlan(fl)
	}
	if err := p.Validate(ValidateOptions{}); err != nil {
		return nil, err
	}
	return p, nil
}
