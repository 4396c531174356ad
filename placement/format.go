package placement

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/moetuner/moetuner/routing"
)

// Format names a plan file format.
type Format string

const (
	// FormatJSON is moetuner's own JSON (schema "moetuner.placement/v1").
	FormatJSON Format = "moetuner"
	// FormatYAML is the same document as FormatJSON in YAML.
	FormatYAML Format = "yaml"
	// FormatSGLang is the {"physical_to_logical_map": [[...]]} JSON that
	// SGLang's --init-expert-location loads.
	FormatSGLang Format = "sglang"
)

// Schema is the value of the "schema" field of moetuner plan files.
const Schema = "moetuner.placement/v1"

// ErrNeedGPUs is returned (wrapped) when an SGLang file is read without the
// GPU count, which the file does not record; read it with ReadSGLang.
var ErrNeedGPUs = errors.New("placement: SGLang physical_to_logical_map does not record the GPU count; read it with ReadSGLang(r, gpus)")

// FormatFromPath tells the format from a file name: ".sglang.json" is
// FormatSGLang, other ".json" is FormatJSON, ".yaml" and ".yml" are
// FormatYAML (case-insensitive). Other names give an error.
func FormatFromPath(path string) (Format, error) {
	name := strings.ToLower(filepath.Base(path))
	switch {
	case strings.HasSuffix(name, ".sglang.json"):
		return FormatSGLang, nil
	case strings.HasSuffix(name, ".json"):
		return FormatJSON, nil
	case strings.HasSuffix(name, ".yaml"), strings.HasSuffix(name, ".yml"):
		return FormatYAML, nil
	}
	return "", fmt.Errorf("placement: cannot tell the format of %q from its name; use .json, .yaml, .yml or .sglang.json, or name the format", path)
}

// fileLayer and fileDoc are the moetuner JSON/YAML document. Pointers and
// nil slices let the reader tell a missing field from a zero one.
type fileLayer struct {
	SlotExpert []routing.Expert `json:"slot_expert" yaml:"slot_expert,flow"`
	SlotGPU    []GPU            `json:"slot_gpu" yaml:"slot_gpu,flow"`
}

type fileDoc struct {
	Schema   *string           `json:"schema" yaml:"schema"`
	Strategy string            `json:"strategy" yaml:"strategy"`
	GPUs     *int              `json:"gpus" yaml:"gpus"`
	Experts  *int              `json:"experts" yaml:"experts"`
	Layers   []fileLayer       `json:"layers" yaml:"layers"`
	Meta     map[string]string `json:"meta" yaml:"meta"`
}

type sglangDoc struct {
	PhysicalToLogicalMap [][]int `json:"physical_to_logical_map"`
	LogicalCount         any     `json:"logical_count"`
}

// Write validates p (ValidateOptions{}) and writes it to w in format. The
// output depends only on p: the same plan gives the same bytes. FormatSGLang
// reorders slots GPU-major (see GPUMajor) and fails unless every GPU holds
// the same number of slots in every layer and every layer has the same
// number of slots.
func Write(w io.Writer, p *Plan, format Format) error {
	data, err := encode(p, format)
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}

func encode(p *Plan, format Format) ([]byte, error) {
	if err := p.Validate(ValidateOptions{}); err != nil {
		return nil, err
	}
	switch format {
	case FormatJSON:
		return encodeJSON(p), nil
	case FormatYAML:
		return encodeYAML(p)
	case FormatSGLang:
		return encodeSGLang(p)
	}
	return nil, fmt.Errorf("placement: unknown format %q; use %q, %q or %q", format, FormatJSON, FormatYAML, FormatSGLang)
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
		d.Layers[l] = fileLayer{SlotExpert: lp.SlotExpert, SlotGPU: lp.SlotGPU}
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

func encodeSGLang(p *Plan) ([]byte, error) {
	if len(p.Layers) == 0 {
		return nil, errors.New("placement: sglang: plan has no layers; SGLang needs one row per MoE layer")
	}
	q := p.GPUMajor()
	slots := len(q.Layers[0].SlotExpert)
	var b []byte
	b = append(b, "{\n  \"physical_to_logical_map\": [\n"...)
	for l, lp := range q.Layers {
		if len(lp.SlotExpert) != slots {
			return nil, fmt.Errorf("placement: sglang: layer %d has %d slots but layer 0 has %d; SGLang needs the same number of physical slots in every layer (add replicas)", l, len(lp.SlotExpert), slots)
		}
		count := q.SlotsPerGPU(l)
		for g, c := range count {
			if c != count[0] {
				return nil, fmt.Errorf("placement: sglang: layer %d: GPU %d holds %d slots but GPU 0 holds %d; SGLang puts slot p on GPU p/(P/GPUs), so every GPU needs the same number of slots (add replicas or move slots)", l, g, c, count[0])
			}
		}
		b = append(b, "    "...)
		b = appendInts(b, lp.SlotExpert)
		if l < len(q.Layers)-1 {
			b = append(b, ',')
		}
		b = append(b, '\n')
	}
	return append(b, "  ]\n}\n"...), nil
}

// Read reads a plan in format from r and validates it (ValidateOptions{}).
// An empty format detects it from the content. FormatSGLang, given or
// detected, fails with an error wrapping ErrNeedGPUs; use ReadSGLang.
func Read(r io.Reader, format Format) (*Plan, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	return decode(data, format)
}

// ReadFile reads the plan file at path, detecting the format from the name
// (".yaml", ".yml") or, for JSON and other names, from the content (a
// "schema" field means moetuner JSON, "physical_to_logical_map" means
// SGLang). SGLang files fail with an error wrapping ErrNeedGPUs; use
// ReadSGLang for them.
func ReadFile(path string) (*Plan, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	var format Format
	if f, err := FormatFromPath(path); err == nil && f == FormatYAML {
		format = f
	}
	p, err := decode(data, format)
	if err != nil {
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	return p, nil
}

// detect guesses the format of data: a JSON object with "schema" is
// moetuner JSON, one with "physical_to_logical_map" or "logical_count" is
// SGLang, any other JSON object is taken as moetuner JSON (so that the
// reader names what is missing), and anything else as YAML.
func detect(data []byte) Format {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return FormatYAML
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		if json.Valid(data) {
			return FormatJSON
		}
		return FormatYAML // a YAML flow mapping, or broken JSON
	}
	if _, ok := keys["schema"]; ok {
		return FormatJSON
	}
	_, p2l := keys["physical_to_logical_map"]
	_, lc := keys["logical_count"]
	if p2l || lc {
		return FormatSGLang
	}
	return FormatJSON
}

func decode(data []byte, format Format) (*Plan, error) {
	if format == "" {
		format = detect(data)
	}
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
	case FormatSGLang:
		return nil, fmt.Errorf("%w", ErrNeedGPUs)
	default:
		return nil, fmt.Errorf("placement: unknown format %q; use %q, %q or %q", format, FormatJSON, FormatYAML, FormatSGLang)
	}
	return fromDoc(&doc, string(format))
}

func fromDoc(d *fileDoc, format string) (*Plan, error) {
	if format == string(FormatJSON) {
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
	p := &Plan{GPUs: *d.GPUs, Experts: *d.Experts, Strategy: d.Strategy, Layers: make([]LayerPlan, len(d.Layers))}
	if len(d.Meta) > 0 {
		p.Meta = d.Meta
	}
	for l, fl := range d.Layers {
		if fl.SlotExpert == nil {
			return nil, fmt.Errorf("placement: %s: layers[%d]: missing \"slot_expert\"; add the logical expert of every slot", format, l)
		}
		if fl.SlotGPU == nil {
			return nil, fmt.Errorf("placement: %s: layers[%d]: missing \"slot_gpu\"; add the GPU of every slot", format, l)
		}
		p.Layers[l] = LayerPlan{SlotExpert: fl.SlotExpert, SlotGPU: fl.SlotGPU}
	}
	if err := p.Validate(ValidateOptions{}); err != nil {
		return nil, err
	}
	return p, nil
}

// ReadSGLang reads an SGLang {"physical_to_logical_map": [[...]]} file for
// gpus expert-parallel ranks: row l lists the logical expert of every
// physical slot p of layer l, and slot p lives on GPU p/(P/gpus), so P must
// be a multiple of gpus. Experts is inferred as the largest expert id plus
// one; check it against the model with Validate(ValidateOptions{Experts:
// E}). The plan is validated; Strategy and Meta are empty.
func ReadSGLang(r io.Reader, gpus int) (*Plan, error) {
	if gpus < 1 || gpus > MaxGPUs {
		return nil, fmt.Errorf("placement: sglang: gpus is %d; pass the expert-parallel size (ep_size), in [1,%d]", gpus, MaxGPUs)
	}
	var doc sglangDoc
	dec := json.NewDecoder(r)
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("placement: sglang: %v; want {\"physical_to_logical_map\": [[...], ...]}", err)
	}
	if doc.PhysicalToLogicalMap == nil {
		if doc.LogicalCount != nil {
			return nil, errors.New("placement: sglang: file has \"logical_count\" (load statistics), not \"physical_to_logical_map\"; read it as routing statistics")
		}
		return nil, errors.New("placement: sglang: missing \"physical_to_logical_map\"; want {\"physical_to_logical_map\": [[...], ...]} with one row per MoE layer")
	}
	rows := doc.PhysicalToLogicalMap
	if len(rows) == 0 {
		return nil, errors.New("placement: sglang: physical_to_logical_map has no rows; add one row per MoE layer")
	}
	slots := len(rows[0])
	if slots == 0 || slots%gpus != 0 {
		return nil, fmt.Errorf("placement: sglang: physical_to_logical_map rows have %d slots, not a positive multiple of %d GPUs; check the GPU count (ep_size)", slots, gpus)
	}
	perGPU := slots / gpus
	p := &Plan{GPUs: gpus, Layers: make([]LayerPlan, len(rows))}
	for l, row := range rows {
		if len(row) != slots {
			return nil, fmt.Errorf("placement: sglang: physical_to_logical_map[%d] has %d slots but row 0 has %d; give every layer the same number of slots", l, len(row), slots)
		}
		lp := LayerPlan{SlotExpert: make([]routing.Expert, slots), SlotGPU: make([]GPU, slots)}
		for s, e := range row {
			if e < 0 || e >= MaxExperts {
				return nil, fmt.Errorf("placement: sglang: physical_to_logical_map[%d][%d] is %d; logical expert ids must be in [0,%d)", l, s, e, MaxExperts)
			}
			p.Experts = max(p.Experts, e+1)
			lp.SlotExpert[s] = routing.Expert(e)
			lp.SlotGPU[s] = GPU(s / perGPU)
		}
		p.Layers[l] = lp
	}
	if err := p.Validate(ValidateOptions{}); err != nil {
		return nil, err
	}
	return p, nil
}

// WriteFile writes p to path in format (empty: FormatFromPath) atomically:
// it encodes the plan first, writes a temporary file in the same directory,
// syncs it and renames it over path. On any failure the temporary file is
// removed and an existing file at path is left as it was.
func WriteFile(path string, p *Plan, format Format) error {
	if format == "" {
		f, err := FormatFromPath(path)
		if err != nil {
			return err
		}
		format = f
	}
	data, err := encode(p, format)
	if err != nil {
		return err
	}
	return writeAtomic(path, data)
}

func writeAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("placement: write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
			err = fmt.Errorf("placement: write %s: %w", path, err)
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	// Make the rename itself durable; a failure here leaves a complete file
	// in place, so it is not reported.
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
