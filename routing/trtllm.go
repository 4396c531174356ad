package routing

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
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
// token_selected_experts_rank{r}.safetensors ([T, k]) under the same keys.

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

// readTRTLLM reads rank{r}.safetensors counts (and the co-occurrence and
// token files when present) into stats: steps are iterations, sources are
// ranks.
func readTRTLLM(name string, meta *trtMeta, files []randomFile, opts LoadOptions) (*Source, error) {
	var counts, cooc, tokens []trtRankFile
	layerSet := map[int]bool{}
	for _, f := range files {
		base := filepath.Base(f.name)
		var list *[]trtRankFile
		var r int
		switch {
		case rankOf(base, "rank", ".safetensors") >= 0:
			list, r = &counts, rankOf(base, "rank", ".safetensors")
		case rankOf(base, "cooccurrence_rank", ".safetensors") >= 0:
			list, r = &cooc, rankOf(base, "cooccurrence_rank", ".safetensors")
		case rankOf(base, "token_selected_experts_rank", ".safetensors") >= 0:
			list, r = &tokens, rankOf(base, "token_selected_experts_rank", ".safetensors")
		case len(files) == 1:
			list, r = &counts, -1
		default:
			continue
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
		*list = append(*list, trtRankFile{f, r, ts})
	}
	if len(counts) == 0 {
		return nil, perr(name, 0, "", "no rank{r}.safetensors count files")
	}
	names := slices.Sorted(func(yield func(int) bool) {
		for l := range layerSet {
			if !yield(l) {
				return
			}
		}
	})
	row := make(map[int]int, len(names))
	for i, l := range names {
		row[l] = i
	}
	E, topK := opts.Experts, opts.TopK
	if meta != nil {
		if E != 0 && E != meta.Experts {
			return nil, perr(name, 0, "num_experts", "meta_info.json says %d experts, but LoadOptions.Experts is %d: set LoadOptions.Experts to the model's experts per layer", meta.Experts, E)
		}
		E = meta.Experts
		if topK == 0 {
			topK = meta.TopK
		}
	}
	var c *countBuilder
	for _, rf := range counts {
		for _, t := range rf.tensors {
			iter, l, _ := iterLayer(t.key)
			if len(t.shape) != 1 || (E != 0 && t.shape[0] != E) {
				return nil, perr(rf.f.name, 0, clip(t.key), "shape %v, want [%d]: one count per logical expert", t.shape, E)
			}
			if E == 0 {
				E = t.shape[0]
			}
			if E == 0 || E > math.MaxInt16+1 {
				return nil, perr(rf.f.name, 0, clip(t.key), "%d experts out of range [1,%d]", E, math.MaxInt16+1)
			}
			if c == nil {
				c = newCountBuilder(len(names), E, 0, names)
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
					c.add(iter, rf.rank, row[l], e, float64(x))
				}
			}
		}
	}
	if c == nil {
		return nil, perr(name, 0, "", "the rank files hold no counts")
	}
	s, err := c.stats(topK, true)
	if err != nil {
		return nil, perr(name, 0, "", "%v", err)
	}
	if len(cooc) > 0 {
		co := newMatrix(len(names), E*E)
		for _, rf := range cooc {
			for _, t := range rf.tensors {
				_, l, _ := iterLayer(t.key)
				if len(t.shape) != 2 || t.shape[0] != E || t.shape[1] != E {
					return nil, perr(rf.f.name, 0, clip(t.key), "shape %v, want [%d, %d]", t.shape, E, E)
				}
				v, err := t.ints(rf.f)
				if err != nil {
					return nil, err
				}
				for i, x := range v {
					if msg := badIntCount(x); msg != "" {
						return nil, perr(rf.f.name, 0, fmt.Sprintf("%s[%d][%d]", clip(t.key), i/E, i%E), "%s", msg)
					}
					if i/E != i%E { // the diagonal repeats the load
						co[row[l]][i] += float64(x)
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
		s.CoActivation = co
	}
	src := &Source{Path: name, Format: FormatTRTLLM}
	if len(tokens) > 0 {
		t, ts, err := trtTokens(tokens, names, E, opts)
		if err != nil {
			return nil, err
		}
		// The paths are used only when they add up to the counts.
		if ts != nil && matricesEqual(ts.Load, s.Load) {
			src.Trace = t
			ts.SourceLoad, ts.StepLoad = s.SourceLoad, s.StepLoad
			ts.LayerNames, ts.ModelLayers = s.LayerNames, s.ModelLayers
			s = ts
		}
	}
	s.Sources = paths(files)
	for _, f := range files {
		fileDone(opts, f.name, f.size, 0)
	}
	return statsSource(name, FormatTRTLLM, s, src)
}

// trtRankFile is one rank's safetensors file.
type trtRankFile struct {
	f       randomFile
	rank    int
	tensors []safeTensor
}

// trtTokens builds a trace from token_selected_experts files ([T, k] per
// "{iter}_{layer}"): per rank and iteration, row t of every layer is one
// token. It returns nil when the rows do not align (an iteration that lacks
// a layer, or layers with different row counts). With LoadOptions.StatsOnly
// the trace is not kept and only its stats are returned.
func trtTokens(files []trtRankFile, names []int, E int, opts LoadOptions) (*Trace, *Stats, error) {
	b := newTokenBuilder(opts, E)
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
		iters := make([]int64, 0, len(byIter))
		for it := range byIter {
			iters = append(iters, it)
		}
		slices.Sort(iters)
		for _, it := range iters {
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

func matricesEqual(a, b [][]float64) bool {
	return slices.EqualFunc(a, b, func(x, y []float64) bool { return slices.Equal(x, y) })
}
