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
type vllmRecord struct {
	RecordType string      `json:"record_type"`
	Version    *int        `json:"version"`
	Step       *int64      `json:"step"`
	Load       [][]float64 `json:"expert_load"`
	P2L        [][]int     `json:"p2l_map"`
}

func readVLLMLoadStats(r io.Reader, file string, opts LoadOptions) (*Stats, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var c *countBuilder
	var L, P int
	E := opts.Experts
	seen := map[int64]int{}
	for lineNo := 1; ; lineNo++ {
		line, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			if errors.Is(err, bufio.ErrBufferFull) {
				return nil, perr(file, lineNo, "", "line longer than %d bytes", maxLineBytes)
			}
			return nil, perr(file, lineNo, "", "read: %v", err)
		}
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
			var rec vllmRecord
			if derr := json.Unmarshal(trimmed, &rec); derr != nil {
				return nil, lineJSONError(file, lineNo, trimmed, derr, "each line must be one record")
			}
			if rec.RecordType == "eplb_load_stats" {
				if rec.Version != nil && *rec.Version != 1 {
					return nil, perr(file, lineNo, "version", "%d: this reader knows version 1", *rec.Version)
				}
				if rec.Step == nil {
					return nil, perr(file, lineNo, "step", "missing")
				}
				if prev, dup := seen[*rec.Step]; dup {
					return nil, perr(file, lineNo, "step", "step %d already recorded on line %d", *rec.Step, prev)
				}
				seen[*rec.Step] = lineNo
				if len(rec.Load) == 0 || len(rec.Load[0]) == 0 {
					return nil, perr(file, lineNo, "expert_load", "missing or empty: want [layers][slots]")
				}
				if c == nil {
					L, P = len(rec.Load), len(rec.Load[0])
					if L*P > maxCountEntries {
						return nil, perr(file, lineNo, "expert_load", "%d × %d loads: too many", L, P)
					}
				}
				if len(rec.Load) != L || len(rec.P2L) != L {
					return nil, perr(file, lineNo, "", "%d layers of expert_load and %d of p2l_map, want %d like the first record", len(rec.Load), len(rec.P2L), L)
				}
				maxID := -1
				for l := range L {
					if len(rec.Load[l]) != P || len(rec.P2L[l]) != P {
						return nil, perr(file, lineNo, fmt.Sprintf("expert_load[%d]", l), "%d loads and %d p2l entries, want %d slots", len(rec.Load[l]), len(rec.P2L[l]), P)
					}
					for p, e := range rec.P2L[l] {
						if limit := cmp.Or(opts.Experts, math.MaxInt16+1); e < 0 || e >= limit {
							return nil, perr(file, lineNo, fmt.Sprintf("p2l_map[%d][%d]", l, p), "logical expert %d out of range [0,%d): fix the id, or set LoadOptions.Experts to the model's experts per layer", e, limit)
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
					return nil, perr(file, lineNo, "p2l_map", "maps to %d logical experts, earlier records to %d: set LoadOptions.Experts to the model's experts per layer", maxID+1, E)
				}
				for l := range L {
					for p, v := range rec.Load[l] {
						if msg := badCount(v); msg != "" {
							return nil, perr(file, lineNo, fmt.Sprintf("expert_load[%d][%d]", l, p), "%s", msg)
						}
						if v != math.Trunc(v) {
							return nil, perr(file, lineNo, fmt.Sprintf("expert_load[%d][%d]", l, p), "%v is not an integer count", v)
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
		return nil, perr(file, 0, "", "no \"eplb_load_stats\" records")
	}
	s, err := c.stats(opts.TopK, true)
	if err != nil {
		return nil, perr(file, 0, "", "%v", err)
	}
	return s, nil
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
