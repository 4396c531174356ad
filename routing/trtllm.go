package routing

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// TensorRT-LLM's EXPERT_STATISTIC_PATH: meta_info.json {"num_experts": E,
// "num_experts_per_token": k} and per rank r rank{r}.safetensors with keys
// "{iter}_{layer}" → [E] logical counts; newer versions add
// cooccurrence_rank{r}.safetensors ([E, E]) and
// token_selected_experts_rank{r}.safetensors ([T, k]) under the same keys;
// tensorrt_llm/_torch/expert_statistic.py at NVIDIA/TensorRT-LLM@7ce477f
// writes rank{r}_raw.safetensors ([T, k] int32, the raw
// token_selected_experts; EXPERT_STATISTIC_ITER_RANGE "a-b" records
// iterations a..b, b included), the newest tree (0fccc5b) only
// rank{r}.safetensors (iterations a..b-1).

// maxSafetensorsHeader caps the JSON header (the format's own limit).
const maxSafetensorsHeader = 100 << 20

// safeTensor is one entry of a safetensors header.
type safeTensor struct {
	key        string
	dtype      string
	size       int // bytes per element
	shape      []int
	begin, end int64 // absolute offsets in the file
}

func safetensorsDTypeSize(dt string) int {
	switch dt {
	case "I64", "U64", "F64":
		return 8
	case "I32", "U32", "F32":
		return 4
	case "I16", "U16", "F16", "BF16":
		return 2
	case "I8", "U8", "BOOL":
		return 1
	}
	return 0
}

// readSafetensors parses a safetensors header, checking every entry's
// shape, dtype and byte range against the file before anything is read.
func readSafetensors(f randomFile) ([]safeTensor, error) {
	var lenBuf [8]byte
	if _, err := f.r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, perr(f.name, 0, "", "truncated safetensors file: no header length")
	}
	hlen := binary.LittleEndian.Uint64(lenBuf[:])
	if hlen > maxSafetensorsHeader || hlen > uint64(f.size-8) {
		return nil, perr(f.name, 0, "", "safetensors header of %d bytes in a file of %d: the file is truncated or not safetensors", hlen, f.size)
	}
	hdr := make([]byte, hlen)
	if _, err := f.r.ReadAt(hdr, 8); err != nil {
		return nil, perr(f.name, 0, "", "truncated safetensors header: %v", err)
	}
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(hdr))
	if err := dec.Decode(&raw); err != nil {
		return nil, perr(f.name, 0, "", "malformed safetensors header: %v", jsonMsg(err))
	}
	data := int64(8 + hlen)
	var out []safeTensor
	for key, msg := range raw {
		if key == "__metadata__" {
			continue
		}
		var e struct {
			DType   string  `json:"dtype"`
			Shape   []int   `json:"shape"`
			Offsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, perr(f.name, 0, clip(key), "malformed entry: %v", jsonMsg(err))
		}
		t := safeTensor{key: key, dtype: e.DType, size: safetensorsDTypeSize(e.DType), shape: e.Shape}
		if t.size == 0 {
			return nil, perr(f.name, 0, clip(key), "unknown dtype %q", clip(e.DType))
		}
		if len(e.Offsets) != 2 || e.Offsets[0] < 0 || e.Offsets[1] < e.Offsets[0] || e.Offsets[1] > f.size-data {
			return nil, perr(f.name, 0, clip(key), "data_offsets %v outside the %d data bytes (the file is truncated or corrupt)", e.Offsets, f.size-data)
		}
		n := int64(1)
		for _, d := range e.Shape {
			if d < 0 || (d > 0 && n > (f.size-data)/int64(d)) {
				return nil, perr(f.name, 0, clip(key), "shape %v does not fit in the file", e.Shape)
			}
			n *= int64(d)
		}
		if n*int64(t.size) != e.Offsets[1]-e.Offsets[0] {
			return nil, perr(f.name, 0, clip(key), "shape %v of %s needs %d bytes, data_offsets give %d", e.Shape, e.DType, n*int64(t.size), e.Offsets[1]-e.Offsets[0])
		}
		t.begin, t.end = data+e.Offsets[0], data+e.Offsets[1]
		out = append(out, t)
	}
	// The format lays tensors end to end; overlapping ranges would let a
	// small file present the same bytes many times.
	slices.SortFunc(out, func(a, b safeTensor) int { return cmp.Or(cmp.Compare(a.begin, b.begin), cmp.Compare(a.end, b.end)) })
	for i := 1; i < len(out); i++ {
		if out[i].begin < out[i-1].end {
			return nil, perr(f.name, 0, clip(out[i].key), "data_offsets overlap those of %s: the file is corrupt", clip(out[i-1].key))
		}
	}
	slices.SortFunc(out, func(a, b safeTensor) int { return strings.Compare(a.key, b.key) })
	return out, nil
}

// ints reads an integer tensor's elements.
func (t safeTensor) ints(f randomFile) ([]int64, error) {
	if !strings.HasPrefix(t.dtype, "I") && !strings.HasPrefix(t.dtype, "U") {
		return nil, perr(f.name, 0, clip(t.key), "dtype %s, want an integer type (I64 or I32)", t.dtype)
	}
	b := make([]byte, t.end-t.begin)
	if _, err := f.r.ReadAt(b, t.begin); err != nil && err != io.EOF {
		return nil, perr(f.name, 0, clip(t.key), "read: %v", err)
	}
	out := make([]int64, len(b)/t.size)
	for i := range out {
		switch t.size {
		case 8:
			out[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
		case 4:
			if t.dtype == "U32" {
				out[i] = int64(binary.LittleEndian.Uint32(b[4*i:]))
			} else {
				out[i] = int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
			}
		case 2:
			if t.dtype == "U16" {
				out[i] = int64(binary.LittleEndian.Uint16(b[2*i:]))
			} else {
				out[i] = int64(int16(binary.LittleEndian.Uint16(b[2*i:])))
			}
		case 1:
			if t.dtype == "I8" {
				out[i] = int64(int8(b[i]))
			} else {
				out[i] = int64(b[i])
			}
		}
	}
	return out, nil
}

// iterLayer splits a key "{iter}_{layer}".
func iterLayer(key string) (iter int64, layer int, ok bool) {
	a, b, found := strings.Cut(key, "_")
	if !found {
		return 0, 0, false
	}
	it, err1 := strconv.ParseInt(a, 10, 32)
	l, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || it < 0 || l < 0 || l > 1<<20 {
		return 0, 0, false
	}
	return it, l, true
}

type trtMeta struct {
	Experts int `json:"num_experts"`
	TopK    int `json:"num_experts_per_token"`
}

func readTRTMeta(path string) (*trtMeta, error) {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, &ParseError{File: path, Err: err}
	}
	var m trtMeta
	if err := decodeJSON(data, path, &m); err != nil {
		return nil, err
	}
	if m.Experts <= 0 || m.Experts > math.MaxInt16+1 {
		return nil, perr(path, 1, "num_experts", "%d out of range [1,%d]", m.Experts, math.MaxInt16+1)
	}
	if m.TopK <= 0 || m.TopK > m.Experts {
		return nil, perr(path, 1, "num_experts_per_token", "%d out of range [1,%d]", m.TopK, m.Experts)
	}
	return &m, nil
}

func loadTRTLLMDir(dir string, opts LoadOptions) (*Source, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil {
		return nil, &ParseError{File: dir, Err: err}
	}
	return loadTRTLLMFiles(dir, dir, files, opts)
}

func loadTRTLLMFiles(name, dir string, paths []string, opts LoadOptions) (*Source, error) {
	meta, err := readTRTMeta(filepath.Join(dir, "meta_info.json"))
	if err != nil {
		return nil, err
	}
	files, done, err := openRandom(paths)
	if err != nil {
		return nil, err
	}
	defer done()
	return readTRTLLM(name, meta, files, opts)
}

// trtKind says which of TensorRT-LLM's files a .safetensors name is.
type trtKind int

const (
	trtCounts trtKind = iota // rank{r}.safetensors: [E] counts
	trtCooc                  // cooccurrence_rank{r}.safetensors: [E, E]
	trtTokens                // token_selected_experts_rank{r} or rank{r}_raw: [T, k] ids
	trtOther
)

// trtFileKind classifies a file name; r is its rank (-1 for trtOther).
// rank{r}_raw.safetensors is what tensorrt_llm/_torch/expert_statistic.py
// writes next to rank{r}.safetensors at NVIDIA/TensorRT-LLM@7ce477f
// (self._records, the raw token_selected_experts of each "{iter}_{layer}").
func trtFileKind(base string) (trtKind, int) {
	for _, k := range []struct {
		prefix, suffix string
		kind           trtKind
	}{
		{"rank", ".safetensors", trtCounts},
		{"rank", "_raw.safetensors", trtTokens},
		{"cooccurrence_rank", ".safetensors", trtCooc},
		{"token_selected_experts_rank", ".safetensors", trtTokens},
	} {
		if r := rankOf(base, k.prefix, k.suffix); r >= 0 {
			return k.kind, r
		}
	}
	return trtOther, -1
}

// readTRTLLM reads rank{r}.safetensors counts (and the co-occurrence and
// token files when present) into stats: steps are iterations, sources are
// ranks. With LoadOptions.SlotExperts, files that count the load
// balancer's physical slots are folded back to logical experts.
func readTRTLLM(name string, meta *trtMeta, files []randomFile, opts LoadOptions) (*Source, error) {
	var lists [trtOther][]trtRankFile
	var notes []string
	layerSet := map[int]bool{}
	for _, f := range files {
		base := filepath.Base(f.name)
		kind, r := trtFileKind(base)
		if kind == trtOther {
			if len(files) != 1 {
				notes = append(notes, fmt.Sprintf("%s skipped: not one of TensorRT-LLM's statistics files (rank{r}.safetensors, rank{r}_raw.safetensors, cooccurrence_rank{r}.safetensors, token_selected_experts_rank{r}.safetensors)", f.name))
				continue
			}
			kind = trtCounts // a lone file named otherwise
		}
		ts, err := readSafetensors(f)
		if err != nil {
			return nil, err
		}
		for _, t := range ts {
			if _, l, ok := iterLayer(t.key); ok {
				layerSet[l] = true
			} else {
				return nil, perr(f.name, 0, clip(t.key), "key is not \"{iteration}_{layer}\"")
			}
		}
		lists[kind] = append(lists[kind], trtRankFile{f, r, ts})
	}
	counts, cooc, tokens := lists[trtCounts], lists[trtCooc], lists[trtTokens]
	if len(counts) == 0 && len(tokens) == 0 {
		return nil, perr(name, 0, "", "no rank{r}.safetensors count files and no rank{r}_raw.safetensors token files")
	}
	names := slices.Sorted(maps.Keys(layerSet))
	row := make(map[int]int, len(names))
	for i, l := range names {
		row[l] = i
	}
	ids, err := trtIDSpace(name, meta, counts, tokens, names, opts)
	if err != nil {
		return nil, err
	}
	E, topK := ids.experts, opts.TopK
	if meta != nil && topK == 0 {
		topK = meta.TopK
	}
	// Without attention DP every rank routes the same tokens
	// (NVIDIA/TensorRT-LLM#18626): the rank files are then copies.
	if same, err := sameOnEveryRank(counts, tokens); err != nil {
		return nil, err
	} else if same {
		notes = append(notes, fmt.Sprintf("%s: every rank recorded the same routing, as TensorRT-LLM does without enable_attention_dp (every rank routes every token): each token is counted once, not once per rank, and its source rank is unknown", name))
		counts, cooc, tokens = firstRank(counts), firstRank(cooc), firstRank(tokens)
	}
	src := &Source{Path: name, Format: FormatTRTLLM, Slots: ids.slots}
	var s *Stats
	if len(counts) > 0 {
		c := newCountBuilder(len(names), E, 0, names)
		for _, rf := range counts {
			for _, t := range rf.tensors {
				iter, l, _ := iterLayer(t.key)
				if len(t.shape) != 1 || t.shape[0] != ids.width {
					return nil, perr(rf.f.name, 0, clip(t.key), "shape %v, want [%d]: one count per %s", t.shape, ids.width, ids.unit())
				}
				v, err := t.ints(rf.f)
				if err != nil {
					return nil, err
				}
				for e, x := range v {
					if msg := badIntCount(x); msg != "" {
						return nil, perr(rf.f.name, 0, fmt.Sprintf("%s[%d]", clip(t.key), e), "%s", msg)
					}
					if x != 0 {
						c.add(iter, rf.rank, row[l], ids.logical(row[l], e), float64(x))
					}
				}
			}
		}
		if s, err = c.stats(topK, true); err != nil {
			return nil, perr(name, 0, "", "%v", err)
		}
		if len(cooc) > 0 {
			if s.CoActivation, err = trtCoActivation(name, cooc, names, row, ids); err != nil {
				return nil, err
			}
		}
	}
	if len(tokens) > 0 {
		t, ts, err := trtTokenTrace(tokens, names, ids, opts)
		if err != nil {
			return nil, err
		}
		switch {
		case ts == nil && s == nil:
			return nil, perr(name, 0, "", "the per-token files do not line up (an iteration lacks a layer, or layers have different row counts) and there are no rank{r}.safetensors count files")
		case ts == nil:
			notes = append(notes, fmt.Sprintf("%s: the per-token files do not line up (an iteration lacks a layer, or layers have different row counts): per-token paths left out", name))
		case s == nil:
			src.Trace, s = t, ts
		case matricesEqual(ts.Load, s.Load):
			// The paths are used only when they add up to the counts.
			src.Trace = t
			ts.SourceLoad, ts.StepLoad = s.SourceLoad, s.StepLoad
			ts.LayerNames, ts.ModelLayers = s.LayerNames, s.ModelLayers
			if ts.CoActivation == nil {
				ts.CoActivation = s.CoActivation
			}
			s = ts
		default:
			// expert_statistic.py@7ce477f keeps the last call of a layer
			// in an iteration in rank{r}_raw but adds every call to the
			// counts.
			notes = append(notes, fmt.Sprintf("%s: the per-token ids do not add up to the counts (TensorRT-LLM keeps only a layer's last call of an iteration in rank{r}_raw.safetensors): per-token paths left out, the counts used", name))
		}
	}
	s.Sources = paths(files)
	s.Notes = append(s.Notes, notes...)
	for _, f := range files {
		fileDone(opts, f.name, f.size, 0)
	}
	return statsSource(name, FormatTRTLLM, s, src)
}

// trtIDs is the id space of a TensorRT-LLM dump: the files count width ids
// per layer, logical experts, or, under the load balancer, physical slots
// that slotExpert folds back to experts logical experts.
type trtIDs struct {
	width, experts int
	slots          int        // width when the ids are slots, else 0
	slotExpert     [][]Expert // [layer row][slot]; nil for logical ids
}

func (d trtIDs) unit() string {
	if d.slotExpert != nil {
		return "physical slot (TensorRT-LLM's load balancer)"
	}
	return "logical expert"
}

// logical maps id i of layer row l to its logical expert.
func (d trtIDs) logical(l, i int) int {
	if d.slotExpert == nil {
		return i
	}
	return int(d.slotExpert[l][i])
}

// trtIDSpace decides whether the files count logical experts or slots.
// Under a load_balancer config, TensorRT-LLM's fused MoE records
// token_selected_slots with expert_count = num_slots
// (tensorrt_llm/_torch/modules/fused_moe: "If load balancer is enabled,
// the statistics are collected from expert slot IDs"), so meta_info.json's
// num_experts is the slot count and nothing in the dump maps slots to
// experts: only the placement that was serving does.
func trtIDSpace(name string, meta *trtMeta, counts, tokens []trtRankFile, names []int, opts LoadOptions) (trtIDs, error) {
	width, what := 0, "meta_info.json says"
	switch {
	case meta != nil:
		width = meta.Experts
	case len(counts) > 0 && len(counts[0].tensors) > 0:
		t := counts[0].tensors[0]
		if len(t.shape) != 1 {
			return trtIDs{}, perr(counts[0].f.name, 0, clip(t.key), "shape %v, want [experts]: one count per expert", t.shape)
		}
		width, what = t.shape[0], "the count files have"
	}
	if width == 0 && len(counts) == 0 {
		// Token files alone, without meta_info.json: ids up to the
		// model's experts, or the largest seen.
		return trtIDs{width: opts.Experts, experts: opts.Experts}, nil
	}
	if width == 0 && meta == nil {
		return trtIDs{}, perr(name, 0, "", "the rank files hold no counts")
	}
	if width <= 0 || width > math.MaxInt16+1 {
		return trtIDs{}, perr(name, 0, "", "%d experts per layer out of range [1,%d]", width, math.MaxInt16+1)
	}
	plan := opts.SlotExperts
	if plan == nil {
		if opts.Experts != 0 && width != opts.Experts {
			hint := "set LoadOptions.Experts to the model's experts per layer"
			if width > opts.Experts {
				hint = "TensorRT-LLM's load balancer records physical slots, and num_experts is then its num_slots: set LoadOptions.SlotExperts to the placement it was serving, or set LoadOptions.Experts to the model's experts per layer"
			}
			return trtIDs{}, perr(name, 0, "num_experts", "%s %d experts, but LoadOptions.Experts is %d: %s", what, width, opts.Experts, hint)
		}
		return trtIDs{width: width, experts: width}, nil
	}
	logical := opts.Experts
	for _, row := range plan {
		for _, e := range row {
			logical = max(logical, int(e)+1)
		}
	}
	if opts.Experts != 0 {
		logical = opts.Experts
	}
	P := len(plan[0])
	if width != P {
		if width == logical {
			return trtIDs{width: width, experts: width}, nil // logical ids: recorded without the load balancer
		}
		return trtIDs{}, perr(name, 0, "num_experts", "%s %d ids per layer, but the placement in LoadOptions.SlotExperts has %d slots of %d experts: give the placement the statistics were recorded under", what, width, P, logical)
	}
	if len(plan) != len(names) {
		return trtIDs{}, perr(name, 0, "", "the files count physical slots of %d MoE layers (%v), but the placement in LoadOptions.SlotExperts has %d layers: give the placement the statistics were recorded under", len(names), names, len(plan))
	}
	for l, row := range plan {
		if len(row) != P {
			return trtIDs{}, perr(name, 0, "", "LoadOptions.SlotExperts layer %d has %d slots, layer 0 has %d", l, len(row), P)
		}
		for s, e := range row {
			if e < 0 || int(e) >= logical {
				return trtIDs{}, perr(name, 0, "", "LoadOptions.SlotExperts[%d][%d] is expert %d, out of range [0,%d)", l, s, e, logical)
			}
		}
	}
	return trtIDs{width: P, experts: logical, slots: P, slotExpert: plan}, nil
}

// sameOnEveryRank reports whether two or more ranks wrote identical
// tensors under identical keys (the count files, else the token files).
// It stops at the first tensor that differs, so dumps of distinct ranks
// cost one tensor read.
func sameOnEveryRank(counts, tokens []trtRankFile) (bool, error) {
	files := counts
	if len(files) == 0 {
		files = tokens
	}
	if len(files) < 2 {
		return false, nil
	}
	first := files[0]
	for _, rf := range files[1:] {
		if len(rf.tensors) != len(first.tensors) {
			return false, nil
		}
		for i, t := range rf.tensors {
			if t.key != first.tensors[i].key || !slices.Equal(t.shape, first.tensors[i].shape) {
				return false, nil
			}
		}
	}
	nonzero := false
	for i, t0 := range first.tensors {
		a, err := t0.ints(first.f)
		if err != nil {
			return false, err
		}
		nonzero = nonzero || slices.ContainsFunc(a, func(v int64) bool { return v != 0 })
		for _, rf := range files[1:] {
			b, err := rf.tensors[i].ints(rf.f)
			if err != nil {
				return false, err
			}
			if !slices.Equal(a, b) {
				return false, nil
			}
		}
	}
	return nonzero, nil
}

// firstRank keeps the lowest rank's file with its source unknown.
func firstRank(files []trtRankFile) []trtRankFile {
	if len(files) == 0 {
		return nil
	}
	f := slices.MinFunc(files, func(a, b trtRankFile) int { return cmp.Compare(a.rank, b.rank) })
	f.rank = -1
	return []trtRankFile{f}
}

// trtCoActivation sums the [W, W] co-occurrence files into CoActivation
// over logical experts (the diagonal repeats the load and is skipped).
func trtCoActivation(name string, cooc []trtRankFile, names []int, row map[int]int, ids trtIDs) ([][]float64, error) {
	W, E := ids.width, ids.experts
	co := newMatrix(len(names), E*E)
	for _, rf := range cooc {
		for _, t := range rf.tensors {
			_, l, _ := iterLayer(t.key)
			if len(t.shape) != 2 || t.shape[0] != W || t.shape[1] != W {
				return nil, perr(rf.f.name, 0, clip(t.key), "shape %v, want [%d, %d]", t.shape, W, W)
			}
			v, err := t.ints(rf.f)
			if err != nil {
				return nil, err
			}
			for i, x := range v {
				if msg := badIntCount(x); msg != "" {
					return nil, perr(rf.f.name, 0, fmt.Sprintf("%s[%d][%d]", clip(t.key), i/W, i%W), "%s", msg)
				}
				a, b := ids.logical(row[l], i/W), ids.logical(row[l], i%W)
				if a != b {
					co[row[l]][a*E+b] += float64(x)
				}
			}
		}
	}
	for l, m := range co {
		for a := range E {
			for b := a + 1; b < E; b++ {
				if m[a*E+b] != m[b*E+a] {
					return nil, perr(name, 0, "cooccurrence", "layer %d: pair (%d,%d) counted %v times one way and %v the other", names[l], a, b, m[a*E+b], m[b*E+a])
				}
			}
		}
	}
	return co, nil
}

// trtTokenTrace builds a trace from the [T, k] id files
// (token_selected_experts_rank{r}, rank{r}_raw) under "{iter}_{layer}":
// per rank and iteration, row t of every layer is one token. It returns
// nil stats when the rows do not align (an iteration that lacks a layer,
// or layers with different row counts). With LoadOptions.StatsOnly the
// trace is not kept and only its stats are returned.
func trtTokenTrace(files []trtRankFile, names []int, ids trtIDs, opts LoadOptions) (*Trace, *Stats, error) {
	b := newTokenBuilder(opts, ids.experts)
	defer b.close()
	for _, rf := range files {
		byIter := map[int64]map[int]safeTensor{}
		for _, t := range rf.tensors {
			iter, l, _ := iterLayer(t.key)
			if byIter[iter] == nil {
				byIter[iter] = map[int]safeTensor{}
			}
			byIter[iter][l] = t
		}
		for _, it := range slices.Sorted(maps.Keys(byIter)) {
			layers := byIter[it]
			if len(layers) != len(names) {
				return nil, nil, nil
			}
			rows := make([][]int64, len(names))
			T, k := -1, 0
			for i, l := range names {
				t, ok := layers[l]
				if !ok || len(t.shape) != 2 || (T >= 0 && (t.shape[0] != T || t.shape[1] != k)) {
					return nil, nil, nil
				}
				T, k = t.shape[0], t.shape[1]
				v, err := t.ints(rf.f)
				if err != nil {
					return nil, nil, err
				}
				if ids.slotExpert != nil {
					for j, x := range v {
						if x < 0 || x >= int64(ids.width) {
							return nil, nil, perr(rf.f.name, 0, fmt.Sprintf("%s[%d][%d]", clip(t.key), j/max(k, 1), j%max(k, 1)), "slot %d out of range [0,%d) (the load balancer's num_slots)", x, ids.width)
						}
						v[j] = int64(ids.slotExpert[i][x])
					}
				}
				rows[i] = v
			}
			if T == 0 {
				continue
			}
			if err := b.start(names, 0, k, fmt.Sprintf("%s iteration %d", rf.f.name, it)); err != nil {
				return nil, nil, perr(rf.f.name, 0, "", "iteration %d: %v", it, err)
			}
			err := b.add(T, int32(rf.rank), int32(it), true,
				func(l, t, j int) int { return int(max(min(rows[l][t*k+j], math.MaxInt32), math.MinInt32)) },
				func(l, t int) string { return fmt.Sprintf("%d_%d[%d]", it, names[l], t) })
			if err != nil {
				return nil, nil, perr(rf.f.name, 0, "", "%v", err)
			}
		}
	}
	if b.stream {
		return nil, b.stats(), nil
	}
	t := b.trace()
	if t == nil {
		return nil, nil, nil
	}
	return t, t.Stats(opts.statsOptions()), nil
}

// trtRankFile is one rank's safetensors file.
type trtRankFile struct {
	f       randomFile
	rank    int
	tensors []safeTensor
}

func matricesEqual(a, b [][]float64) bool {
	return slices.EqualFunc(a, b, func(x, y []float64) bool { return slices.Equal(x, y) })
}
