package placement

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Format names a plan file format; see the package documentation for the
// exact structure of each.
type Format string

const (
	// FormatJSON is moetuner's own JSON (schema "moetuner.placement/v1").
	FormatJSON Format = "moetuner"
	// FormatYAML is the same document as FormatJSON in YAML.
	FormatYAML Format = "yaml"
	// FormatSGLang is the {"physical_to_logical_map": [[...]]} JSON that
	// SGLang's --init-expert-location loads: one row per decoder layer,
	// dense ones included.
	FormatSGLang Format = "sglang"
	// FormatSGLangPT is the same map saved with torch.save (a .pt file).
	// Not supported yet: reading and writing it fail with an error saying
	// so.
	FormatSGLangPT Format = "sglang-pt"
	// FormatEPLB is DeepSeek EPLB's three maps as JSON:
	// {"num_gpus": G, "phy2log": [L][R], "log2phy": [L][E][X], "logcnt": [L][E]}.
	FormatEPLB Format = "eplb"
	// FormatVLLM is the {"expert_to_ep_rank": [E ranks]} JSON of vLLM's
	// --expert-placement-file: one map for all layers, no replicas.
	FormatVLLM Format = "vllm"
	// FormatVLLMMap is the [[P], ...] JSON of vLLM's
	// eplb_config.initial_expert_map_path: one physical-to-logical list
	// per MoE layer.
	FormatVLLMMap Format = "vllm-map"
	// FormatVLLMMapping is vLLM's offline-EPLB mapping JSONL: one
	// {"record_type": "eplb_initial_mapping", ...} record.
	FormatVLLMMapping Format = "vllm-mapping"
	// FormatVLLMAscend is the {"moe_layer_count", "layer_list"} device-list
	// JSON of vllm-ascend and MindIE (expert_map_path).
	FormatVLLMAscend Format = "vllm-ascend"
	// FormatTRTLLM is TensorRT-LLM's moe_load_balancer YAML (num_slots,
	// initial_global_assignments keyed by decoder layer).
	FormatTRTLLM Format = "trtllm"
)

// Formats lists every plan format, in the order the documentation
// describes them.
var Formats = []Format{FormatJSON, FormatYAML, FormatSGLang, FormatSGLangPT, FormatEPLB, FormatVLLM, FormatVLLMMap, FormatVLLMMapping, FormatVLLMAscend, FormatTRTLLM}

// MaxFileBytes bounds the size of a plan file the readers accept: far
// above any real placement (DeepSeek-V3's SGLang map is about 100 kB).
const MaxFileBytes = 1 << 28

// suffixes maps file-name endings to formats, longest first where one
// ends another.
var suffixes = []struct {
	suffix string
	format Format
}{
	{".sglang.json", FormatSGLang},
	{".sglang.pt", FormatSGLangPT},
	{".eplb.json", FormatEPLB},
	{".vllm-map.json", FormatVLLMMap},
	{".vllm-ascend.json", FormatVLLMAscend},
	{".vllm.json", FormatVLLM},
	{".vllm-mapping.jsonl", FormatVLLMMapping},
	{".trtllm.yaml", FormatTRTLLM},
	{".trtllm.yml", FormatTRTLLM},
	{".pt", FormatSGLangPT},
	{".json", FormatJSON},
	{".yaml", FormatYAML},
	{".yml", FormatYAML},
}

// FormatFromPath tells the format from a file name (case-insensitive):
// ".sglang.json" FormatSGLang, ".sglang.pt" and ".pt" FormatSGLangPT,
// ".eplb.json" FormatEPLB, ".vllm.json" FormatVLLM, ".vllm-map.json"
// FormatVLLMMap, ".vllm-mapping.jsonl" FormatVLLMMapping,
// ".vllm-ascend.json" FormatVLLMAscend, ".trtllm.yaml" and ".trtllm.yml"
// FormatTRTLLM, other ".json" FormatJSON, other ".yaml" and ".yml"
// FormatYAML. Other names give an error.
func FormatFromPath(path string) (Format, error) {
	name := strings.ToLower(filepath.Base(path))
	for _, s := range suffixes {
		if strings.HasSuffix(name, s.suffix) {
			return s.format, nil
		}
	}
	return "", fmt.Errorf("placement: cannot tell the format of %q from its name; end it in .json (moetuner), .yaml, .sglang.json, .sglang.pt, .eplb.json, .vllm.json, .vllm-map.json, .vllm-mapping.jsonl, .vllm-ascend.json or .trtllm.yaml, or name the format", path)
}

// Write validates p and writes it to w in format; it is WriteWith with the
// zero Layout, enough for every format but FormatSGLang and FormatTRTLLM,
// which fail with an error wrapping ErrNeedLayers.
func Write(w io.Writer, p *Plan, format Format) error {
	return WriteWith(w, p, format, Layout{})
}

// WriteWith validates p (ValidateOptions{} and the counts l knows) and
// writes it to w in format, placing its layers among the model's decoder
// layers as l says. The output depends only on p and l: the same plan
// gives the same bytes. Every format but FormatJSON and FormatYAML lays
// slots out rank-major (slot p on GPU p/(P/GPUs), see GPUMajor) and fails
// unless every GPU holds the same number of slots in every layer and every
// layer has the same number of slots; FormatVLLM fails unless the plan has
// one copy of every expert and the same expert-to-GPU map in every layer.
func WriteWith(w io.Writer, p *Plan, format Format, l Layout) error {
	data, err := encode(p, format, l)
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}

// WriteFile writes p to path in format (empty: FormatFromPath) atomically
// through WriteFileAtomic; it is WriteFileWith with the zero Layout.
func WriteFile(path string, p *Plan, format Format) error {
	return WriteFileWith(path, p, format, Layout{})
}

// WriteFileWith writes p to path in format (empty: FormatFromPath) with
// layout l, atomically: it encodes the plan first (see WriteWith) and
// writes nothing when that fails, then writes through WriteFileAtomic, so
// an existing file at path holds either its old content or the new plan.
func WriteFileWith(path string, p *Plan, format Format, l Layout) error {
	if format == "" {
		f, err := FormatFromPath(path)
		if err != nil {
			return err
		}
		format = f
	}
	data, err := encode(p, format, l)
	if err != nil {
		return err
	}
	return WriteFileAtomic(path, data)
}

func encode(p *Plan, format Format, l Layout) ([]byte, error) {
	if err := p.Validate(ValidateOptions{}); err != nil {
		return nil, err
	}
	if err := CheckLayout(format, l); err != nil {
		return nil, err
	}
	if err := checkPlanLayout(p, format, l); err != nil {
		return nil, err
	}
	switch format {
	case FormatJSON:
		return encodeJSON(p), nil
	case FormatYAML:
		return encodeYAML(p)
	case FormatSGLang:
		return encodeSGLang(p, l)
	case FormatSGLangPT:
		return encodeSGLangPT(p, l)
	case FormatEPLB:
		return encodeEPLB(p)
	case FormatVLLM:
		return encodeVLLM(p)
	case FormatVLLMMap:
		return encodeVLLMMap(p)
	case FormatVLLMMapping:
		return encodeVLLMMapping(p)
	case FormatVLLMAscend:
		return encodeAscend(p)
	case FormatTRTLLM:
		return encodeTRTLLM(p, l)
	}
	return nil, unknownFormat(format) // CheckLayout has caught it
}

// Read reads a plan in format from r (empty: detect it from the content)
// and validates it; it is ReadWith with the zero Layout, enough for the
// files that record the GPU count (moetuner, EPLB with num_gpus,
// vllm-ascend, TensorRT-LLM with ep_size). Other files fail with an error
// wrapping ErrNeedGPUs.
func Read(r io.Reader, format Format) (*Plan, error) {
	return ReadWith(r, format, Layout{})
}

// ReadWith reads a plan in format from r (empty: detect it from the
// content, see ReadFileWith) with layout l and validates it against the
// counts l knows. Files that do not record the GPU count take l.GPUs (0:
// an error wrapping ErrNeedGPUs); files that record another than a
// non-zero l.GPUs fail with a *GPUCountError. SGLang maps with a row per
// decoder layer read back to their MoE layers (l.LayerIDs), and the rows
// of dense layers must hold SGLang's trivial map. Input beyond
// MaxFileBytes is an error.
func ReadWith(r io.Reader, format Format, l Layout) (*Plan, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("placement: the input is over %d bytes; no placement file is that large", MaxFileBytes)
	}
	return decode(data, format, l)
}

// ReadFile reads the plan file at path; it is ReadFileWith with the zero
// Layout.
func ReadFile(path string) (*Plan, error) {
	return ReadFileWith(path, Layout{})
}

// ReadFileWith reads the plan file at path with layout l (see ReadWith),
// detecting the format from the content, whatever the name: a zip archive
// is a torch.save file (FormatSGLangPT), a JSON array FormatVLLMMap, a JSON
// object with "schema" moetuner JSON, with "physical_to_logical_map"
// SGLang, with "phy2log" EPLB, with "expert_to_ep_rank" vLLM, with
// "layer_list" vllm-ascend, with "record_type" (JSON lines) vLLM's mapping,
// and YAML with "num_slots" or "initial_global_assignments" TensorRT-LLM,
// other YAML moetuner YAML. Errors name the file.
func ReadFileWith(path string, l Layout) (*Plan, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	defer f.Close()
	p, err := ReadWith(f, "", l)
	if err != nil {
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	return p, nil
}

// detect guesses the format of data from its content (see ReadFileWith).
// A JSON object with none of the known keys is taken as moetuner JSON, so
// that its reader names what is missing; anything that is not JSON is
// YAML.
func detect(data []byte) Format {
	if bytes.HasPrefix(data, []byte("PK\x03\x04")) {
		return FormatSGLangPT
	}
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '[' {
		return FormatVLLMMap
	}
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return detectYAML(data)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		// JSON lines hold one object per line.
		first, _, _ := bytes.Cut(trimmed, []byte("\n"))
		if json.Unmarshal(first, &keys) == nil && keys["record_type"] != nil {
			return FormatVLLMMapping
		}
		if json.Valid(data) {
			return FormatJSON
		}
		return FormatYAML // a YAML flow mapping, or broken JSON
	}
	has := func(names ...string) bool {
		for _, k := range names {
			if _, ok := keys[k]; ok {
				return true
			}
		}
		return false
	}
	switch {
	case has("schema"):
		return FormatJSON
	case has("physical_to_logical_map", "logical_count"):
		return FormatSGLang
	case has("phy2log", "log2phy", "logcnt"):
		return FormatEPLB
	case has("expert_to_ep_rank"):
		return FormatVLLM
	case has("layer_list", "moe_layer_count"):
		return FormatVLLMAscend
	case has("record_type"):
		return FormatVLLMMapping
	}
	return FormatJSON
}

// brokenJSON reports data that detect took for YAML but that begins as a
// JSON object and is neither JSON nor YAML: a JSON file with a syntax
// error, or cut short. It says where, in JSON's terms, rather than
// leaving the YAML parser to describe it.
func brokenJSON(data []byte, format Format) error {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if format != FormatYAML || len(trimmed) == 0 || trimmed[0] != '{' {
		return nil
	}
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) == nil {
		return nil
	}
	var v any
	err := json.Unmarshal(data, &v)
	var se *json.SyntaxError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &se) && se.Offset >= int64(len(data)), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("placement: line %d: the JSON document ends early: the file is cut short (an interrupted write or copy); write or copy it again", lineAt(data, int64(len(data))))
	case errors.As(err, &se):
		return fmt.Errorf("placement: line %d: invalid JSON: %v; fix the document (see the placement package doc for the shape)", lineAt(data, se.Offset), err)
	}
	return fmt.Errorf("placement: invalid JSON: %v; fix the document (see the placement package doc for the shape)", err)
}

// lineAt is the 1-based line of byte offset off in data.
func lineAt(data []byte, off int64) int {
	off = min(max(off, 0), int64(len(data)))
	return 1 + bytes.Count(data[:off], []byte("\n"))
}

// detectYAML tells TensorRT-LLM's load-balancer YAML from moetuner YAML.
func detectYAML(data []byte) Format {
	var keys map[string]yaml.Node
	if yaml.Unmarshal(data, &keys) == nil {
		for _, k := range []string{"num_slots", "initial_global_assignments", "layer_updates_per_iter"} {
			if _, ok := keys[k]; ok {
				return FormatTRTLLM
			}
		}
	}
	return FormatYAML
}

func decode(data []byte, format Format, l Layout) (*Plan, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	if format == "" {
		format = detect(data)
		if err := brokenJSON(data, format); err != nil {
			return nil, err
		}
	}
	var p *Plan
	var err error
	switch format {
	case FormatJSON, FormatYAML:
		p, err = decodeMoetuner(data, format, l)
	case FormatSGLang:
		p, err = decodeSGLang(data, l)
	case FormatSGLangPT:
		p, err = decodeSGLangPT(data, l)
	case FormatEPLB:
		p, err = decodeEPLB(data, l)
	case FormatVLLM:
		p, err = decodeVLLM(data, l)
	case FormatVLLMMap:
		p, err = decodeVLLMMap(data, l)
	case FormatVLLMMapping:
		p, err = decodeVLLMMapping(data, l)
	case FormatVLLMAscend:
		p, err = decodeAscend(data, l)
	case FormatTRTLLM:
		p, err = decodeTRTLLM(data, l)
	default:
		err = unknownFormat(format)
	}
	if err != nil {
		return nil, err
	}
	if l.GPUs != 0 && p.GPUs != l.GPUs {
		// Every reader checks the count where the file records it; this
		// keeps the promise for any that might not.
		return nil, &GPUCountError{Format: format, Field: "gpus", File: p.GPUs, Given: l.GPUs}
	}
	if err := checkPlanLayout(p, format, l); err != nil {
		return nil, err
	}
	return p, nil
}

func unknownFormat(format Format) error {
	names := make([]string, len(Formats))
	for i, f := range Formats {
		names[i] = strconv.Quote(string(f))
	}
	return fmt.Errorf("placement: unknown format %q; use one of %s", format, strings.Join(names, ", "))
}
