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
	// FormatEPLB is DeepSeek EPLB's three maps as JSON:
	// {"num_gpus": G, "phy2log": [L][R], "log2phy": [L][E][X], "logcnt": [L][E]}.
	FormatEPLB Format = "eplb"
	// FormatVLLM is the {"expert_to_ep_rank": [E ranks]} JSON of vLLM's
	// --expert-placement-file: one map for all layers, no replicas.
	FormatVLLM Format = "vllm"
)

// maxVLLMLayers bounds the layers argument of ReadVLLM, which allocates
// one row per layer.
const maxVLLMLayers = 1 << 12

// Schema is the value of the "schema" field of moetuner plan files.
const Schema = "moetuner.placement/v1"

// ErrNeedGPUs is returned (wrapped) when an SGLang file is read without the
// GPU count, which the file does not record; read it with ReadSGLang.
var ErrNeedGPUs = errors.New("placement: SGLang physical_to_logical_map does not record the GPU count; read it with ReadSGLang(r, gpus)")

// needGPUsError is an ErrNeedGPUs with a message for another format.
type needGPUsError struct{ msg string }

func (e *needGPUsError) Error() string { return e.msg }
func (e *needGPUsError) Unwrap() error { return ErrNeedGPUs }

// FormatFromPath tells the format from a file name: ".sglang.json" is
// FormatSGLang, ".eplb.json" FormatEPLB, ".vllm.json" FormatVLLM, other
// ".json" is FormatJSON, ".yaml" and ".yml" are FormatYAML
// (case-insensitive). Other names give an error.
func FormatFromPath(path string) (Format, error) {
	name := strings.ToLower(filepath.Base(path))
	switch {
	case strings.HasSuffix(name, ".sglang.json"):
		return FormatSGLang, nil
	case strings.HasSuffix(name, ".eplb.json"):
		return FormatEPLB, nil
	case strings.HasSuffix(name, ".vllm.json"):
		return FormatVLLM, nil
	case strings.HasSuffix(name, ".json"):
		return FormatJSON, nil
	case strings.HasSuffix(name, ".yaml"), strings.HasSuffix(name, ".yml"):
		return FormatYAML, nil
	}
	return "", fmt.Errorf("placement: cannot tell the format of %q from its name; use .json, .yaml, .yml, .sglang.json, .eplb.json or .vllm.json, or name the format", path)
}

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

type sglangDoc struct {
	PhysicalToLogicalMap [][]int `json:"physical_to_logical_map"`
	LogicalCount         any     `json:"logical_count"`
}

// Write validates p (ValidateOptions{}) and writes it to w in format. The
// output depends only on p: the same plan gives the same bytes. FormatSGLang
// and FormatEPLB reorder slots GPU-major (see GPUMajor) and fail unless
// every GPU holds the same number of slots in every layer and every layer
// has the same number of slots. FormatVLLM fails unless the plan has one
// copy of every expert and the same expert-to-GPU map in every layer.
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
	case FormatEPLB:
		return encodeEPLB(p)
	case FormatVLLM:
		return encodeVLLM(p)
	}
	return nil, unknownFormat(format)
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
		d.Layers[l] = fileLayer{SlotExpert: lp.SlotExpert, SlotGPU: lp.SlotGPU, SlotShare: lp.SlotShare}
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
// An empty format detects it from the content. FormatSGLang and
// FormatVLLM, given or detected, fail with an error wrapping ErrNeedGPUs;
// use ReadSGLang or ReadVLLM. FormatEPLB needs "num_gpus" in the file
// (else ErrNeedGPUs; use ReadEPLB).
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
// SGLang, "phy2log" EPLB, "expert_to_ep_rank" vLLM). SGLang and vLLM files
// fail with an error wrapping ErrNeedGPUs; use ReadSGLang or ReadVLLM for
// them.
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
// SGLang, one with "phy2log", "log2phy" or "logcnt" is EPLB, one with
// "expert_to_ep_rank" is vLLM, any other JSON object is taken as moetuner
// JSON (so that the reader names what is missing), and anything else as
// YAML.
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
	for _, k := range []string{"phy2log", "log2phy", "logcnt"} {
		if _, ok := keys[k]; ok {
			return FormatEPLB
		}
	}
	if _, ok := keys["expert_to_ep_rank"]; ok {
		return FormatVLLM
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
	case FormatEPLB:
		return decodeEPLB(data, 0)
	case FormatVLLM:
		return nil, &needGPUsError{"placement: vllm: expert_to_ep_rank records neither the GPU count nor the number of layers; read it with ReadVLLM(r, gpus, layers)"}
	default:
		return nil, unknownFormat(format)
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
		p.Layers[l] = LayerPlan{SlotExpert: fl.SlotExpert, SlotGPU: fl.SlotGPU, SlotShare: fl.SlotShare}
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
	return WriteFileAtomic(path, data)
}

func unknownFormat(format Format) error {
	return fmt.Errorf("placement: unknown format %q; use %q, %q, %q, %q or %q", format, FormatJSON, FormatYAML, FormatSGLang, FormatEPLB, FormatVLLM)
}

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
				return nil, fmt.Errorf("placement: vllm: layer %d: expert %d has %d copies; vLLM's expert_to_ep_rank allows exactly one copy per expert, so write replicated plans in the sglang or eplb format", l, e, len(gs))
			}
			row[e] = gs[0]
		}
		if first == nil {
			first = row
			continue
		}
		for e, g := range row {
			if g != first[e] {
				return nil, fmt.Errorf("placement: vllm: layer %d puts expert %d on GPU %d but layer 0 puts it on GPU %d; vLLM's expert_to_ep_rank is one map for all layers, so write per-layer plans in the sglang or eplb format", l, e, g, first[e])
			}
		}
	}
	var b []byte
	b = append(b, "{\n  \"expert_to_ep_rank\": "...)
	b = appendInts(b, first)
	return append(b, "\n}\n"...), nil
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
// used for files without it and must match it otherwise. Unknown keys are
// ignored. The three maps must agree: logcnt[l][e] counts e in phy2log[l],
// and log2phy[l][e] lists exactly those slots, then -1 up to X. The plan is
// validated; Experts is len(logcnt[0]), Strategy and Meta are empty.
func ReadEPLB(r io.Reader, gpus int) (*Plan, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	if gpus < 0 || gpus > MaxGPUs {
		return nil, fmt.Errorf("placement: eplb: gpus is %d; pass 0 (take \"num_gpus\" from the file) or the expert-parallel size, in [1,%d]", gpus, MaxGPUs)
	}
	return decodeEPLB(data, gpus)
}

func decodeEPLB(data []byte, gpus int) (*Plan, error) {
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
		return nil, fmt.Errorf("placement: eplb: the file says num_gpus %d but %d GPUs were given; check the expert-parallel size", *d.NumGPUs, gpus)
	case d.NumGPUs != nil:
		gpus = *d.NumGPUs
	case gpus == 0:
		return nil, &needGPUsError{"placement: eplb: missing \"num_gpus\"; add it to the file or read it with ReadEPLB(r, gpus)"}
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

// ReadVLLM reads vLLM's {"expert_to_ep_rank": [E ranks]} placement file for
// gpus expert-parallel ranks and applies the map to each of layers layers
// (the file holds one map for all layers). Experts is the length of the
// map; every rank must be in [0,gpus). Slots are laid out as in
// FromAssignment; the plan is validated and Strategy and Meta are empty.
func ReadVLLM(r io.Reader, gpus, layers int) (*Plan, error) {
	if gpus < 1 || gpus > MaxGPUs {
		return nil, fmt.Errorf("placement: vllm: gpus is %d; pass the expert-parallel size, in [1,%d]", gpus, MaxGPUs)
	}
	if layers < 1 || layers > maxVLLMLayers {
		return nil, fmt.Errorf("placement: vllm: layers is %d; pass the number of MoE layers, in [1,%d]", layers, maxVLLMLayers)
	}
	var d struct {
		ExpertToEPRank []int `json:"expert_to_ep_rank"`
	}
	dec := json.NewDecoder(r)
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("placement: vllm: %v; want {\"expert_to_ep_rank\": [...]}", err)
	}
	row := d.ExpertToEPRank
	switch {
	case row == nil:
		return nil, errors.New("placement: vllm: missing \"expert_to_ep_rank\"; want {\"expert_to_ep_rank\": [...]} with the EP rank of every expert")
	case len(row) == 0 || len(row) > MaxExperts:
		return nil, fmt.Errorf("placement: vllm: expert_to_ep_rank has %d entries; need one per expert, in [1,%d]", len(row), MaxExperts)
	}
	assign := make([]GPU, len(row))
	for e, g := range row {
		if g < 0 || g >= gpus {
			return nil, fmt.Errorf("placement: vllm: expert_to_ep_rank[%d] is %d; ranks must be in [0,%d)", e, g, gpus)
		}
		assign[e] = GPU(g)
	}
	p := FromAssignment(gpus, sameEveryLayer(layers, assign), "")
	if err := p.Validate(ValidateOptions{}); err != nil {
		return nil, err
	}
	return p, nil
}
