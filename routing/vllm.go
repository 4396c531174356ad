package routing

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// vLLM #41141's stats JSONL: one record per line, those with
// "record_type": "eplb_load_stats" carrying "step", "expert_load" [L][P]
// physical loads and "p2l_map" [L][P]; other record types are skipped.
// The PR's newer files open with one "eplb_load_meta" record
// ({"model", "num_ranks", "num_groups", "num_nodes", "num_layers",
// "num_redundant_experts"}); its loader
// (vllm/distributed/eplb/stats_loader.py parse_stats_jsonl) refuses a
// stats record before it and a second one.
type vllmRecord struct {
	RecordType string      `json:"record_type"`
	Version    *int        `json:"version"`
	Step       *int64      `json:"step"`
	Load       [][]float64 `json:"expert_load"`
	P2L        [][]int     `json:"p2l_map"`

	// eplb_load_meta
	Model            string `json:"model"`
	Ranks            *int   `json:"num_ranks"`
	Groups           *int   `json:"num_groups"`
	Nodes            *int   `json:"num_nodes"`
	Layers           *int   `json:"num_layers"`
	RedundantExperts *int   `json:"num_redundant_experts"`
}

// Deployment is what a dump records about the deployment it was recorded
// on (vLLM #41141's eplb_load_meta record): a plan for that deployment
// uses the same ranks, nodes, expert groups and redundant slots.
type Deployment struct {
	// File and Line name the record.
	File string
	Line int
	// Model is the model name the stack recorded ("" when unknown).
	Model string
	// Ranks is the expert-parallel size (num_ranks), at least 1.
	Ranks int
	// Nodes is the number of nodes (num_nodes), dividing Ranks.
	Nodes int
	// Groups is the number of expert groups (num_groups); 1 means the
	// model routes freely.
	Groups int
	// RedundantExperts is the number of slots per layer beyond one per
	// logical expert (num_redundant_experts).
	RedundantExperts int
}

// vllmMeta checks an eplb_load_meta record's fields.
func vllmMeta(rec *vllmRecord, file string, line int) (*Deployment, error) {
	d := &Deployment{File: file, Line: line, Model: rec.Model}
	for _, f := range []struct {
		name string
		v    *int
		min  int
		dst  *int
	}{
		{"num_ranks", rec.Ranks, 1, &d.Ranks},
		{"num_nodes", rec.Nodes, 1, &d.Nodes},
		{"num_groups", rec.Groups, 1, &d.Groups},
		{"num_layers", rec.Layers, 1, nil},
		{"num_redundant_experts", rec.RedundantExperts, 0, &d.RedundantExperts},
	} {
		switch {
		case f.v == nil:
			return nil, perr(file, line, f.name, "missing from the eplb_load_meta record")
		case *f.v < f.min || *f.v > 1<<20:
			return nil, perr(file, line, f.name, "%d out of range [%d,%d]", *f.v, f.min, 1<<20)
		case f.dst != nil:
			*f.dst = *f.v
		}
	}
	if d.Ranks%d.Nodes != 0 {
		return nil, perr(file, line, "num_nodes", "%d nodes do not divide %d ranks evenly", d.Nodes, d.Ranks)
	}
	return d, nil
}

// readVLLMLoadStats reads the eplb_load_stats records into logical loads
// per step (sources unknown) and returns the eplb_load_meta record, nil
// when the file has none (the PR's first files).
func readVLLMLoadStats(r io.Reader, file string, opts LoadOptions) (*Stats, *Deployment, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var c *countBuilder
	var L, P int
	E := opts.Experts
	seen := map[int64]int{}
	var meta *Deployment
	metaLayers, firstStats := 0, 0
	for lineNo := 1; ; lineNo++ {
		line, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			if errors.Is(err, bufio.ErrBufferFull) {
				return nil, nil, perr(file, lineNo, "", "line longer than %d bytes", maxLineBytes)
			}
			return nil, nil, perr(file, lineNo, "", "read: %v", err)
		}
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
			var rec vllmRecord
			if derr := json.Unmarshal(trimmed, &rec); derr != nil {
				return nil, nil, lineJSONError(file, lineNo, trimmed, derr, "each line must be one record")
			}
			if rec.RecordType == "eplb_load_meta" {
				switch {
				case meta != nil:
					return nil, nil, perr(file, lineNo, "record_type", "a second eplb_load_meta record (the first is on line %d): keep one server's stats per file", meta.Line)
				case firstStats != 0:
					return nil, nil, perr(file, lineNo, "record_type", "eplb_load_meta after the eplb_load_stats record on line %d: vLLM writes it first", firstStats)
				}
				m, merr := vllmMeta(&rec, file, lineNo)
				if merr != nil {
					return nil, nil, merr
				}
				meta = m
				metaLayers = *rec.Layers
			}
			if rec.RecordType == "eplb_load_stats" {
				if firstStats == 0 {
					firstStats = lineNo
				}
				if rec.Version != nil && *rec.Version != 1 {
					return nil, nil, perr(file, lineNo, "version", "%d: this reader knows version 1", *rec.Version)
				}
				if rec.Step == nil {
					return nil, nil, perr(file, lineNo, "step", "missing")
				}
				if prev, dup := seen[*rec.Step]; dup {
					return nil, nil, perr(file, lineNo, "step", "step %d already recorded on line %d", *rec.Step, prev)
				}
				seen[*rec.Step] = lineNo
				if len(rec.Load) == 0 || len(rec.Load[0]) == 0 {
					return nil, nil, perr(file, lineNo, "expert_load", "missing or empty: want [layers][slots]")
				}
				if c == nil {
					L, P = len(rec.Load), len(rec.Load[0])
					if L*P > maxCountEntries {
						return nil, nil, perr(file, lineNo, "expert_load", "%d × %d loads: too many", L, P)
					}
				}
				if len(rec.Load) != L || len(rec.P2L) != L {
					return nil, nil, perr(file, lineNo, "", "%d layers of expert_load and %d of p2l_map, want %d like the first record", len(rec.Load), len(rec.P2L), L)
				}
				maxID := -1
				for l := range L {
					if len(rec.Load[l]) != P || len(rec.P2L[l]) != P {
						return nil, nil, perr(file, lineNo, fmt.Sprintf("expert_load[%d]", l), "%d loads and %d p2l entries, want %d slots", len(rec.Load[l]), len(rec.P2L[l]), P)
					}
					for p, e := range rec.P2L[l] {
						if limit := cmp.Or(opts.Experts, math.MaxInt16+1); e < 0 || e >= limit {
							return nil, nil, perr(file, lineNo, fmt.Sprintf("p2l_map[%d][%d]", l, p), "logical expert %d out of range [0,%d): fix the id, or set LoadOptions.Experts to the model's experts per layer", e, limit)
						}
						maxID = max(maxID, e)
					}
				}
				if c == nil {
					if E == 0 {
						E = maxID + 1
					}
					c = newCountBuilder(L, E, 0, nil)
					c.sources = nil
				} else if opts.Experts == 0 && maxID+1 != E {
					return nil, nil, perr(file, lineNo, "p2l_map", "maps to %d logical experts, earlier records to %d: set LoadOptions.Experts to the model's experts per layer", maxID+1, E)
				}
				for l := range L {
					for p, v := range rec.Load[l] {
						if msg := badCount(v); msg != "" {
							return nil, nil, perr(file, lineNo, fmt.Sprintf("expert_load[%d][%d]", l, p), "%s", msg)
						}
						if v != math.Trunc(v) {
							return nil, nil, perr(file, lineNo, fmt.Sprintf("expert_load[%d][%d]", l, p), "%v is not an integer count", v)
						}
						if v != 0 {
							c.add(*rec.Step, -1, l, rec.P2L[l][p], v)
						}
					}
				}
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	if c == nil {
		return nil, nil, perr(file, 0, "", "no \"eplb_load_stats\" records")
	}
	if err := checkVLLMMeta(file, meta, metaLayers, L, P, E); err != nil {
		return nil, nil, err
	}
	s, err := c.stats(opts.TopK, true)
	if err != nil {
		return nil, nil, perr(file, 0, "", "%v", err)
	}
	return s, meta, nil
}

// checkVLLMMeta checks the eplb_load_meta record, if any, against the
// shape of the eplb_load_stats records: L layers of P physical slots
// holding E logical experts.
func checkVLLMMeta(file string, meta *Deployment, metaLayers, L, P, E int) error {
	if meta == nil {
		return nil
	}
	switch {
	case metaLayers != L:
		return perr(file, meta.Line, "num_layers", "%d, but the eplb_load_stats records have %d layers", metaLayers, L)
	case P%meta.Ranks != 0:
		return perr(file, meta.Line, "num_ranks", "%d ranks do not divide the %d physical slots of expert_load", meta.Ranks, P)
	case P-meta.RedundantExperts != E:
		return perr(file, meta.Line, "num_redundant_experts", "%d, but expert_load has %d slots for %d logical experts (p2l_map): %d redundant", meta.RedundantExperts, P, E, P-E)
	case E%meta.Groups != 0:
		return perr(file, meta.Line, "num_groups", "%d groups do not divide %d logical experts", meta.Groups, E)
	}
	return nil
}

// SGLang's return_routed_experts: meta_info["routed_experts"] is base64 of
// int32 [positions, num_hidden_layers, k], row-major, logical ids; dense
// layers hold no routing (all 0 or all -1).

// maxRoutedBytes caps one decoded payload.
const maxRoutedBytes = 1 << 30

type routedResponse struct {
	MetaInfo struct {
		RoutedExperts    *string `json:"routed_experts"`
		PromptTokens     int     `json:"prompt_tokens"`
		CompletionTokens int     `json:"completion_tokens"`
	} `json:"meta_info"`
	RoutedExperts *string `json:"routed_experts"`
}

// parseRoutedExperts reads one response object, a JSON array of them or
// one per line. TopK must be given (LoadOptions.TopK); the layer count is
// LoadOptions.ModelLayers or inferred from prompt_tokens+completion_tokens.
func parseRoutedExperts(data []byte, file string, opts LoadOptions, b *tokenBuilder) error {
	var resps []routedResponse
	trimmed := bytes.TrimSpace(data)
	switch {
	case len(trimmed) > 0 && trimmed[0] == '[':
		if err := decodeJSON(data, file, &resps); err != nil {
			return err
		}
	default:
		dec := json.NewDecoder(bytes.NewReader(data))
		for dec.More() {
			var r routedResponse
			if err := dec.Decode(&r); err != nil {
				return perr(file, lineAt(data, dec.InputOffset()), "", "malformed JSON: %s", jsonMsg(err))
			}
			resps = append(resps, r)
		}
	}
	k := opts.TopK
	if k <= 0 {
		return perr(file, 0, "", "routed_experts does not say its top-k: set LoadOptions.TopK to the model's num_experts_per_tok")
	}
	for i, r := range resps {
		field := fmt.Sprintf("[%d].meta_info.routed_experts", i)
		enc := r.MetaInfo.RoutedExperts
		if enc == nil {
			enc = r.RoutedExperts
		}
		if enc == nil {
			return perr(file, 0, fmt.Sprintf("[%d]", i), "no meta_info.routed_experts: send the request with return_routed_experts=true")
		}
		if base64.StdEncoding.DecodedLen(len(*enc)) > maxRoutedBytes {
			return perr(file, 0, field, "payload larger than %d bytes", maxRoutedBytes)
		}
		raw, err := base64.StdEncoding.DecodeString(*enc)
		if err != nil {
			return perr(file, 0, field, "not base64: %v", err)
		}
		if len(raw)%4 != 0 {
			return perr(file, 0, field, "%d bytes, not a whole number of int32 ids", len(raw))
		}
		n := len(raw) / 4
		if n == 0 {
			continue
		}
		L := opts.ModelLayers
		var T int
		if L > 0 {
			if n%(L*k) != 0 {
				return perr(file, 0, field, "%d ids do not split into positions × %d layers × top-%d", n, L, k)
			}
			T = n / (L * k)
		} else {
			for _, pos := range []int{r.MetaInfo.PromptTokens + r.MetaInfo.CompletionTokens - 1, r.MetaInfo.PromptTokens + r.MetaInfo.CompletionTokens} {
				if pos > 0 && n%(pos*k) == 0 {
					T, L = pos, n/(pos*k)
					break
				}
			}
			if L == 0 {
				return perr(file, 0, field, "%d ids: cannot tell positions from layers; set LoadOptions.ModelLayers (the model's num_hidden_layers)", n)
			}
		}
		at := func(t, l, j int) int64 {
			return int64(int32(binary.LittleEndian.Uint32(raw[4*((t*L+l)*k+j):])))
		}
		var names []int
		for l := range L {
			dense := true
			for t := 0; t < T && dense; t++ {
				first := at(t, l, 0)
				for j := range k {
					v := at(t, l, j)
					dense = dense && (v == -1 || (k > 1 && v == 0 && first == 0))
				}
			}
			if !dense {
				names = append(names, l)
			}
		}
		if err := b.start(names, L, k, fmt.Sprintf("%s%s", file, field)); err != nil {
			return perr(file, 0, field, "%v", err)
		}
		err = b.add(T, -1, 0, false,
			func(li, t, j int) int { return int(max(min(at(t, names[li], j), math.MaxInt32), math.MinInt32)) },
			func(li, t int) string { return fmt.Sprintf("%s position %d layer %d", field, t, names[li]) })
		if err != nil {
			return perr(file, 0, "", "%v", err)
		}
	}
	if b.tokens == 0 {
		return perr(file, 0, "", "no routed experts in the responses")
	}
	return nil
}
