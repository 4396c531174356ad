package routing

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
)

// maxJSONBytes caps the count formats (one JSON document per file).
const maxJSONBytes = 256 << 20

// maxCountEntries caps the number of counts in one JSON document.
const maxCountEntries = 1 << 26

// OLMoEFile is the OLMoE routing-analysis JSON (see the package
// documentation): per-expert counts at a few layers and rank-aligned
// skip-layer pair counts. The pair counts are not adjacent-layer k×k
// transitions, so Stats leaves them out; they are kept here verbatim.
type OLMoEFile struct {
	Model      string `json:"model"`
	SourceDir  string `json:"source_dir"`
	Domain     string `json:"domain"`
	NumExperts int    `json:"num_experts"`
	TopK       int    `json:"top_k"`
	NumTokens  int64  `json:"num_tokens"`
	// Layers are the 0-based decoder layers of the rows of ExpertCounts.
	Layers []int `json:"layers"`
	// ExpertCounts[i][e] counts tokens with e in their top-k at Layers[i].
	ExpertCounts [][]float64 `json:"expert_counts"`
	// ExpertCountsTop1 counts rank-0 choices only; nil when absent.
	ExpertCountsTop1 [][]float64 `json:"expert_counts_top1"`
	// CrosslayerPairs[p] = [i, j] are the decoder layers of pair matrix p.
	CrosslayerPairs [][2]int `json:"crosslayer_pairs"`
	// CrosslayerCounts[p][a][b] counts (token, rank r) with rank-r expert a
	// at layer i and rank-r expert b at layer j; nil when absent.
	CrosslayerCounts [][][]float64 `json:"crosslayer_counts"`
	// CrosslayerCountsTop1 is the rank-0 → rank-0 variant; nil when absent.
	CrosslayerCountsTop1 [][][]float64 `json:"crosslayer_counts_top1"`
}

// ReadOLMoE reads and checks an OLMoE routing-analysis JSON file. Errors are
// *ParseError.
func ReadOLMoE(r io.Reader) (*OLMoEFile, error) {
	data, err := readCapped(r, "")
	if err != nil {
		return nil, err
	}
	return parseOLMoE(data, "")
}

func parseOLMoE(data []byte, file string) (*OLMoEFile, error) {
	v, err := parseOLMoELines(data, file)
	return v, atLine(data, err)
}

func parseOLMoELines(data []byte, file string) (*OLMoEFile, error) {
	var f OLMoEFile
	if err := decodeJSON(data, file, &f); err != nil {
		return nil, err
	}
	E, K := f.NumExperts, f.TopK
	if E <= 0 || E > math.MaxInt16+1 {
		return nil, perr(file, 1, "num_experts", "%d out of range [1,%d]", E, math.MaxInt16+1)
	}
	if K <= 0 || K > E {
		return nil, perr(file, 1, "top_k", "%d out of range [1,%d]", K, E)
	}
	if f.NumTokens < 0 {
		return nil, perr(file, 1, "num_tokens", "%d is negative", f.NumTokens)
	}
	if len(f.ExpertCounts) == 0 {
		return nil, perr(file, 1, "expert_counts", "missing or empty: want one row of %d counts per listed layer", E)
	}
	if len(f.Layers) != len(f.ExpertCounts) {
		return nil, perr(file, 1, "layers", "%d layers listed for %d rows of expert_counts: list one layer per row", len(f.Layers), len(f.ExpertCounts))
	}
	if err := checkCounts(file, "expert_counts", f.ExpertCounts, E); err != nil {
		return nil, err
	}
	if f.ExpertCountsTop1 != nil {
		if len(f.ExpertCountsTop1) != len(f.Layers) {
			return nil, perr(file, 1, "expert_counts_top1", "%d rows, want %d like expert_counts", len(f.ExpertCountsTop1), len(f.Layers))
		}
		if err := checkCounts(file, "expert_counts_top1", f.ExpertCountsTop1, E); err != nil {
			return nil, err
		}
	}
	for _, c := range []struct {
		name string
		m    [][][]float64
	}{{"crosslayer_counts", f.CrosslayerCounts}, {"crosslayer_counts_top1", f.CrosslayerCountsTop1}} {
		name, m := c.name, c.m
		if m == nil {
			continue
		}
		if len(m) != len(f.CrosslayerPairs) {
			return nil, perr(file, 1, name, "%d matrices for %d crosslayer_pairs: give one E×E matrix per pair", len(m), len(f.CrosslayerPairs))
		}
		for p, mat := range m {
			if len(mat) != E {
				return nil, perr(file, 1, fmt.Sprintf("%s[%d]", name, p), "%d rows, want %d experts", len(mat), E)
			}
			if err := checkCounts(file, fmt.Sprintf("%s[%d]", name, p), mat, E); err != nil {
				return nil, err
			}
		}
	}
	for p, pair := range f.CrosslayerPairs {
		for _, l := range pair {
			if !slices.Contains(f.Layers, l) {
				return nil, perr(file, 1, fmt.Sprintf("crosslayer_pairs[%d]", p), "layer %d is not in layers %v", l, f.Layers)
			}
		}
	}
	return &f, nil
}

// Stats returns the count-only stats of f: Layers = len(f.Layers),
// LayerNames = f.Layers, Load = ExpertCounts, Tokens = NumTokens. The
// skip-layer pair counts are not transitions, so Transitions stays nil.
func (f *OLMoEFile) Stats() *Stats {
	s := StatsFromLoad(f.ExpertCounts, f.TopK)
	s.Experts = f.NumExperts
	s.Tokens = float64(f.NumTokens)
	s.LayerNames = slices.Clone(f.Layers)
	return s
}

// ReadFiddler reads a Fiddler expert-popularity JSON file
// ({"expert_popularity": [L][E] counts, "total_input_tokens": n}) as
// count-only stats. topK is the routing top-k (2 for Mixtral when 0);
// Tokens = mean row sum / topK. total_input_tokens counts words, not
// tokens, and is ignored.
func ReadFiddler(r io.Reader, topK int) (*Stats, error) {
	data, err := readCapped(r, "")
	if err != nil {
		return nil, err
	}
	return parseFiddler(data, "", topK)
}

func parseFiddler(data []byte, file string, topK int) (*Stats, error) {
	v, err := parseFiddlerLines(data, file, topK)
	return v, atLine(data, err)
}

func parseFiddlerLines(data []byte, file string, topK int) (*Stats, error) {
	var f struct {
		Popularity [][]float64 `json:"expert_popularity"`
	}
	if err := decodeJSON(data, file, &f); err != nil {
		return nil, err
	}
	if len(f.Popularity) == 0 || len(f.Popularity[0]) == 0 {
		return nil, perr(file, 1, "expert_popularity", "missing or empty: want [layers][experts] counts")
	}
	if err := checkCounts(file, "expert_popularity", f.Popularity, len(f.Popularity[0])); err != nil {
		return nil, err
	}
	if topK == 0 {
		topK = 2
	}
	if topK > len(f.Popularity[0]) {
		return nil, perr(file, 1, "expert_popularity", "top-k %d exceeds %d experts: set LoadOptions.TopK", topK, len(f.Popularity[0]))
	}
	return StatsFromLoad(f.Popularity, topK), nil
}

// ReadLogicalCount reads EPLB/SGLang expert-distribution counts: a JSON
// object {"logical_count": counts} or a bare JSON array counts, where counts
// is [L][E] or [S][L][E] (then StepLoad holds the steps and Load their sum).
// Values must be integers in [0, 2^53] written as numbers (123.0 is fine).
// Layers that are zero in every step (dense layers) are dropped unless
// opts.KeepZeroLayers, and LayerNames keeps the original row indices.
// opts.TopK sets TopK and Tokens (0 = unknown); other options are ignored.
func ReadLogicalCount(r io.Reader, opts LoadOptions) (*Stats, error) {
	data, err := readCapped(r, "")
	if err != nil {
		return nil, err
	}
	return parseLogicalCount(data, "", opts.TopK, opts.KeepZeroLayers)
}

func parseLogicalCount(data []byte, file string, topK int, keepZero bool) (*Stats, error) {
	v, err := parseLogicalCountLines(data, file, topK, keepZero)
	return v, atLine(data, err)
}

func parseLogicalCountLines(data []byte, file string, topK int, keepZero bool) (*Stats, error) {
	raw := bytes.TrimSpace(data)
	field := ""
	if len(raw) > 0 && raw[0] == '{' {
		var obj struct {
			LogicalCount json.RawMessage `json:"logical_count"`
		}
		if err := decodeJSON(data, file, &obj); err != nil {
			return nil, err
		}
		if obj.LogicalCount == nil {
			return nil, perr(file, 1, "logical_count", "missing: want {\"logical_count\": [layers][experts]}")
		}
		raw, field = obj.LogicalCount, "logical_count"
	}
	var steps [][][]float64
	var m2 [][]float64
	flat := true
	if err := json.Unmarshal(raw, &m2); err == nil {
		steps = [][][]float64{m2}
	} else {
		flat = false
		var m3 [][][]float64
		if err3 := json.Unmarshal(raw, &m3); err3 != nil {
			if len(raw) == 0 {
				return nil, perr(file, 0, "", "empty file: want {\"logical_count\": [layers][experts]}")
			}
			if at, num, ok := hugeNumber(raw); ok {
				return nil, perr(file, 1, field+at, "count %s does not fit a float64: the file is corrupt or does not hold token counts", num)
			}
			return nil, perr(file, 1, field, "want a [layers][experts] or [steps][layers][experts] array of numbers: %v", jsonMsg(err3))
		}
		steps = m3
	}
	if len(steps) == 0 || len(steps[0]) == 0 || len(steps[0][0]) == 0 {
		return nil, perr(file, 1, field, "empty counts: want [layers][experts]")
	}
	L, E := len(steps[0]), len(steps[0][0])
	if E > math.MaxInt16+1 {
		return nil, perr(file, 1, field, "%d experts exceed the int16 id range", E)
	}
	for s, m := range steps {
		name := field
		if !flat {
			name = fmt.Sprintf("%s[%d]", field, s)
		}
		if len(m) != L {
			return nil, perr(file, 1, name, "%d layers, want %d like step 0", len(m), L)
		}
		if err := checkCounts(file, name, m, E); err != nil {
			return nil, err
		}
		for l, row := range m {
			for e, v := range row {
				if v != math.Trunc(v) {
					return nil, perr(file, 1, fmt.Sprintf("%s[%d][%d]", name, l, e), "%v is not an integer count", v)
				}
			}
		}
	}
	load := newMatrix(L, E)
	for _, m := range steps {
		addMatrix(load, m)
	}
	keep := make([]int, 0, L)
	for l, row := range load {
		if keepZero || slices.ContainsFunc(row, func(v float64) bool { return v != 0 }) {
			keep = append(keep, l)
		}
	}
	if len(keep) == 0 {
		return nil, perr(file, 1, field, "every layer is all zeros: set LoadOptions.KeepZeroLayers to keep them")
	}
	pick := func(m [][]float64) [][]float64 {
		out := make([][]float64, len(keep))
		for i, l := range keep {
			out[i] = m[l]
		}
		return out
	}
	s := StatsFromLoad(pick(load), topK)
	s.Experts = E
	// SGLang's logical_count has a row for every decoder layer, dense ones
	// included.
	s.ModelLayers = L
	if len(keep) != L {
		s.LayerNames = keep
	}
	if !flat {
		s.StepLoad = make([][][]float64, len(steps))
		for i, m := range steps {
			s.StepLoad[i] = cloneMatrix(pick(m))
		}
	}
	return s, nil
}

// hugeNumber finds a number in raw, a [L][E] or [S][L][E] array, too large
// for a float64 (json.Unmarshal refuses those), and returns its indices
// ("[1][2]") and text.
func hugeNumber(raw []byte) (string, string, bool) {
	huge := func(n json.Number) bool {
		_, err := strconv.ParseFloat(string(n), 64)
		return err != nil
	}
	var m2 [][]json.Number
	if json.Unmarshal(raw, &m2) == nil {
		for l, row := range m2 {
			for e, n := range row {
				if huge(n) {
					return fmt.Sprintf("[%d][%d]", l, e), string(n), true
				}
			}
		}
	}
	var m3 [][][]json.Number
	if json.Unmarshal(raw, &m3) == nil {
		for st, m := range m3 {
			for l, row := range m {
				for e, n := range row {
					if huge(n) {
						return fmt.Sprintf("[%d][%d][%d]", st, l, e), string(n), true
					}
				}
			}
		}
	}
	return "", "", false
}

// checkCounts checks that m has rows of E finite non-negative counts.
func checkCounts(file, name string, m [][]float64, E int) error {
	if len(m)*E > maxCountEntries {
		return perr(file, 1, name, "more than %d counts: the file is too large", maxCountEntries)
	}
	for i, row := range m {
		if len(row) != E {
			return perr(file, 1, fmt.Sprintf("%s[%d]", name, i), "%d entries, want %d experts like the first row", len(row), E)
		}
		for j, v := range row {
			if msg := badCount(v); msg != "" {
				return perr(file, 1, fmt.Sprintf("%s[%d][%d]", name, i, j), "%s", msg)
			}
		}
	}
	return nil
}

// maxCount bounds a single count: 2^53, the largest integer up to which
// float64 holds every integer exactly. A larger count is no token count
// (2^53 tokens at a million tokens a second take 285 years); it comes from a
// corrupt file, and would make sums and ratios meaningless or infinite.
const maxCount = 1 << 53

// badCount says what is wrong with count v (negative, not finite, or above
// maxCount), or returns "" for a good count. Fractions are the caller's to
// judge.
func badCount(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return fmt.Sprintf("count %v is not a finite number: counts are token tallies ≥ 0", v)
	case v < 0:
		return fmt.Sprintf("count %v is negative: counts must be ≥ 0", v)
	case v > maxCount:
		return fmt.Sprintf("count %v exceeds 2^53 = %d, the largest exact count: the file is corrupt or does not hold token counts", v, int64(maxCount))
	}
	return ""
}

// badIntCount is badCount for the integer counts of tensors.
func badIntCount(x int64) string {
	if x < 0 || x > maxCount {
		return badCount(float64(x))
	}
	return ""
}

// readCapped reads all of r, refusing more than maxJSONBytes.
func readCapped(r io.Reader, file string) ([]byte, error) {
	return readCappedAt(r, file, maxJSONBytes)
}

func readCappedAt(r io.Reader, file string, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, perr(file, 0, "", "read: %v", err)
	}
	if int64(len(data)) > limit {
		return nil, perr(file, 0, "", "larger than %d bytes: not a counts file, or split it", limit)
	}
	return data, nil
}

// decodeJSON unmarshals one JSON document, reporting the line of syntax
// and type errors.
func decodeJSON(data []byte, file string, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return perr(file, 0, "", "empty file: want a JSON document")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		line := 0
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			line = lineAt(data, se.Offset)
		case errors.As(err, &te):
			line = lineAt(data, te.Offset)
		case errors.Is(err, io.ErrUnexpectedEOF):
			return perr(file, lineAt(data, int64(len(data))), "", "truncated JSON: %s", cutShort)
		}
		return perr(file, line, jsonField(err), "malformed JSON: %s", jsonMsgIn(data, err))
	}
	if dec.More() {
		return perr(file, 0, "", "more than one JSON value: a counts file holds one object")
	}
	return nil
}

func lineAt(data []byte, off int64) int {
	off = min(max(off, 0), int64(len(data)))
	return 1 + bytes.Count(data[:off], []byte("\n"))
}
