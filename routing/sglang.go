package routing

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/moetuner/moetuner/internal/torchpt"
)

// SGLang's expert-distribution recorder dumps (see the package
// documentation): stat, per_pass and per_token modes.

// maxSGLangTopK is the width of SGLang's per-token id buffer.
const maxSGLangTopK = 64

type sglangMode int

const (
	sglangStat sglangMode = iota + 1
	sglangPerPass
	sglangPerToken
)

func (m sglangMode) String() string {
	return [...]string{"", "stat", "per_pass", "per_token"}[m]
}

// sglangFile is one opened SGLang dump.
type sglangFile struct {
	name string
	pt   *torchpt.File
	root *torchpt.Dict
	mode sglangMode
}

func openSGLang(pt *torchpt.File, name string) (*sglangFile, error) {
	root, ok := pt.Root.(*torchpt.Dict)
	if !ok {
		return nil, perr(name, 0, "", "the saved object is %s, not a dict: not an SGLang expert-distribution dump", ptKind(pt.Root))
	}
	f := &sglangFile{name: name, pt: pt, root: root}
	_, hasCount := root.Get("logical_count")
	recs, hasRecs := root.Get("records")
	_, hasMap := root.Get("last_physical_to_logical_map")
	switch {
	case hasCount:
		f.mode = sglangStat
	case hasRecs && hasMap:
		f.mode = sglangPerPass
		if list, ok := recs.([]any); ok && len(list) > 0 {
			if d, ok := list[0].(*torchpt.Dict); ok {
				if _, ok := d.Get("topk_ids_of_layer"); ok {
					f.mode = sglangPerToken
				}
			}
		}
	default:
		if _, ok := root.Get("physical_to_logical_map"); ok {
			return nil, perr(name, 0, "physical_to_logical_map", "this is a placement file (--init-expert-location), not a routing trace")
		}
		return nil, perr(name, 0, "", "not an SGLang expert-distribution dump: want \"logical_count\" (stat mode) or \"records\" and \"last_physical_to_logical_map\" (per_pass, per_token), got keys %v", clipKeys(root.Keys))
	}
	return f, nil
}

func clipKeys(keys []any) []any {
	if len(keys) > 8 {
		return append(slices.Clip(keys[:8]), "...")
	}
	return keys
}

func ptKind(v any) string {
	switch v.(type) {
	case nil:
		return "None"
	case *torchpt.Tensor:
		return "a tensor"
	case []any:
		return "a list"
	case torchpt.Tuple:
		return "a tuple"
	case *torchpt.Dict:
		return "a dict"
	case int64:
		return "an integer"
	case string:
		return "a string"
	}
	return fmt.Sprintf("a %T", v)
}

// tensorField returns d[key] as an integer tensor of the given rank.
func tensorField(d *torchpt.Dict, key, file, field string, rank int) (*torchpt.Tensor, error) {
	v, ok := d.Get(key)
	if !ok {
		return nil, perr(file, 0, field, "missing")
	}
	t, ok := v.(*torchpt.Tensor)
	if !ok {
		return nil, perr(file, 0, field, "is %s, want a tensor", ptKind(v))
	}
	if !t.DType.IsInteger() {
		return nil, perr(file, 0, field, "dtype %s, want an integer tensor", t.DType)
	}
	if len(t.Shape) != rank {
		return nil, perr(file, 0, field, "shape %v, want %d dimensions", t.Shape, rank)
	}
	return t, nil
}

// intsOf reads an integer tensor's elements in C order without widening
// them all to int64 at once.
type intsOf struct {
	b    []byte
	size int
	dt   torchpt.DType
}

func readInts(t *torchpt.Tensor, file, field string) (intsOf, error) {
	b, err := t.Bytes()
	if err != nil {
		return intsOf{}, perr(file, 0, field, "%v", err)
	}
	return intsOf{b: b, size: t.DType.Size(), dt: t.DType}, nil
}

func (v intsOf) at(i int) int64 {
	switch v.dt {
	case torchpt.Int64:
		return int64(binary.LittleEndian.Uint64(v.b[8*i:]))
	case torchpt.Int32:
		return int64(int32(binary.LittleEndian.Uint32(v.b[4*i:])))
	case torchpt.Int16:
		return int64(int16(binary.LittleEndian.Uint16(v.b[2*i:])))
	case torchpt.Int8:
		return int64(int8(v.b[i]))
	}
	return int64(v.b[i])
}

func intField(d *torchpt.Dict, key string) (int64, bool) {
	v, ok := d.Get(key)
	if !ok {
		return 0, false
	}
	n, ok := v.(int64)
	return n, ok
}

// p2lMap reads last_physical_to_logical_map [L_all, P] and checks its ids.
func (f *sglangFile) p2lMap(experts int) (m []int, L, P, E int, err error) {
	t, err := tensorField(f.root, "last_physical_to_logical_map", f.name, "last_physical_to_logical_map", 2)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	L, P = t.Shape[0], t.Shape[1]
	if L == 0 || P == 0 {
		return nil, 0, 0, 0, perr(f.name, 0, "last_physical_to_logical_map", "shape %v has no layers or no slots", t.Shape)
	}
	v, err := readInts(t, f.name, "last_physical_to_logical_map")
	if err != nil {
		return nil, 0, 0, 0, err
	}
	limit := int64(math.MaxInt16 + 1)
	if experts > 0 {
		limit = int64(experts)
	}
	m = make([]int, L*P)
	for i := range m {
		x := v.at(i)
		if x < 0 || x >= limit {
			return nil, 0, 0, 0, perr(f.name, 0, fmt.Sprintf("last_physical_to_logical_map[%d][%d]", i/P, i%P), "logical expert %d out of range [0,%d)", x, limit)
		}
		m[i] = int(x)
		E = max(E, int(x)+1)
	}
	if experts > 0 {
		E = experts
	}
	return m, L, P, E, nil
}

// readStat adds a stat-mode dump: logical_count [B, L_all, E], one row per
// forward pass, the unfilled rows of the circular buffer all zeros.
func (f *sglangFile) readStat(opts LoadOptions) (*Stats, error) {
	t, err := tensorField(f.root, "logical_count", f.name, "logical_count", 3)
	if err != nil {
		if t2, err2 := tensorField(f.root, "logical_count", f.name, "logical_count", 2); err2 == nil {
			t, err = t2, nil
		} else {
			return nil, err
		}
	}
	shape := t.Shape
	if len(shape) == 2 {
		shape = []int{1, shape[0], shape[1]}
	}
	B, L, E := shape[0], shape[1], shape[2]
	if L == 0 || E == 0 {
		return nil, perr(f.name, 0, "logical_count", "shape %v has no layers or no experts", t.Shape)
	}
	if E > math.MaxInt16+1 {
		return nil, perr(f.name, 0, "logical_count", "%d experts exceed the int16 id range", E)
	}
	if opts.Experts > 0 && opts.Experts != E {
		return nil, perr(f.name, 0, "logical_count", "%d experts, but LoadOptions.Experts is %d: set LoadOptions.Experts to the model's experts per layer", E, opts.Experts)
	}
	v, err := readInts(t, f.name, "logical_count")
	if err != nil {
		return nil, err
	}
	filled := make([]bool, B)
	for b := range B {
		for i := range L * E {
			x := v.at(b*L*E + i)
			if msg := badIntCount(x); msg != "" {
				return nil, perr(f.name, 0, fmt.Sprintf("logical_count[%d][%d][%d]", b, i/E, i%E), "%s", msg)
			}
			filled[b] = filled[b] || x != 0
		}
	}
	order, known := statTimeOrder(filled)
	c := newCountBuilder(L, E, L, nil)
	c.sources = nil // summed over ranks by the recorder
	for step, b := range order {
		for i := range L * E {
			if x := v.at(b*L*E + i); x != 0 {
				c.add(int64(step), -1, i/E, i%E, float64(x))
			}
		}
	}
	s, err := c.stats(opts.TopK, opts.KeepZeroLayers)
	if err != nil {
		return nil, perr(f.name, 0, "logical_count", "%v", err)
	}
	if !known && s.StepLoad != nil {
		s.StepsUnordered = true
		s.Notes = append(s.Notes, fmt.Sprintf("%s: the passes' time order is unknown: SGLang's stat recorder keeps them in a circular buffer of %d rows and dumps it in buffer order without its write index, and %s; the steps are kept in buffer order for sums and --across, but backtest cannot replay them (record with --expert-distribution-recorder-buffer-size -1, or larger than the passes recorded)", f.name, B, unorderedWhy(filled)))
	}
	return s, nil
}

// statTimeOrder returns the filled rows of an SGLang stat dump in time
// order, and whether that order is known. The dump is
// _StatAccumulator.dump of _CircularBuffer.get_all (sgl-project/sglang
// python/sglang/srt/eplb/expert_distribution.py@02295fe): the whole buffer
// in buffer order; append writes row _curr_index and advances it modulo
// the size, and reset (at every start_record and dump) zeroes the rows but
// keeps _curr_index. A pass always routes tokens, so a row is unfilled
// exactly when it is all zeros. With one cyclic run of unfilled rows the
// oldest filled row is the one after that run; with none (the buffer
// full: it may have wrapped) or several (which cannot come from one
// recording) the write index is not in the file and the order is unknown:
// the filled rows are then returned in buffer order.
func statTimeOrder(filled []bool) ([]int, bool) {
	B := len(filled)
	var inBuffer []int
	runs, start := 0, -1
	for b := range B {
		if filled[b] {
			inBuffer = append(inBuffer, b)
			continue
		}
		if filled[(b+1)%B] {
			runs++
			start = (b + 1) % B
		}
	}
	switch {
	case len(inBuffer) <= 1:
		return inBuffer, true
	case runs != 1:
		return inBuffer, false
	}
	order := make([]int, 0, len(inBuffer))
	for i := range B {
		if b := (start + i) % B; filled[b] {
			order = append(order, b)
		}
	}
	return order, true
}

// unorderedWhy says why statTimeOrder could not order the rows.
func unorderedWhy(filled []bool) string {
	if !slices.Contains(filled, false) {
		return fmt.Sprintf("all %d rows are filled (the buffer may have wrapped around)", len(filled))
	}
	return "its unfilled rows are not one run (not one recording)"
}

// addPerPass adds a per_pass dump's physical counts, mapped to logical
// experts, into c (created on the first file).
func (f *sglangFile) addPerPass(c **countBuilder, opts LoadOptions) error {
	m, L, P, E, err := f.p2lMap(opts.Experts)
	if err != nil {
		return err
	}
	if *c == nil {
		*c = newCountBuilder(L, E, L, nil)
	} else if len((*c).total) != L || (*c).experts != E {
		return perr(f.name, 0, "last_physical_to_logical_map", "%d layers × %d experts, but the files before have %d × %d", L, E, len((*c).total), (*c).experts)
	}
	recs, err := f.records()
	if err != nil {
		return err
	}
	for i, rec := range recs {
		field := fmt.Sprintf("records[%d].global_physical_count", i)
		t, err := tensorField(rec, "global_physical_count", f.name, field, 2)
		if err != nil {
			return err
		}
		if t.Shape[0] != L || t.Shape[1] != P {
			return perr(f.name, 0, field, "shape %v, want [%d, %d] like last_physical_to_logical_map", t.Shape, L, P)
		}
		pass, _ := intField(rec, "forward_pass_id")
		rank, ok := intField(rec, "rank")
		if !ok || rank < 0 || rank > math.MaxInt32 {
			rank = -1
		}
		v, err := readInts(t, f.name, field)
		if err != nil {
			return err
		}
		for l := range L {
			for p := range P {
				x := v.at(l*P + p)
				if msg := badIntCount(x); msg != "" {
					return perr(f.name, 0, fmt.Sprintf("%s[%d][%d]", field, l, p), "%s", msg)
				}
				if x != 0 {
					(*c).add(pass, int(rank), l, m[l*P+p], float64(x))
				}
			}
		}
	}
	return nil
}

func (f *sglangFile) records() ([]*torchpt.Dict, error) {
	v, _ := f.root.Get("records")
	list, ok := v.([]any)
	if !ok {
		return nil, perr(f.name, 0, "records", "is %s, want a list of dicts", ptKind(v))
	}
	out := make([]*torchpt.Dict, len(list))
	for i, r := range list {
		d, ok := r.(*torchpt.Dict)
		if !ok {
			return nil, perr(f.name, 0, fmt.Sprintf("records[%d]", i), "is %s, want a dict", ptKind(r))
		}
		out[i] = d
	}
	return out, nil
}

// addPerToken adds a per_token dump's tokens to b: physical ids
// topk_ids_of_layer [L_all, T, W] (W = 8, -1 padded) mapped to logical ids;
// the record's rank is the tokens' source, forward_pass_id their step.
func (f *sglangFile) addPerToken(b *tokenBuilder, opts LoadOptions) error {
	m, L, P, E, err := f.p2lMap(opts.Experts)
	if err != nil {
		return err
	}
	if b.experts == 0 {
		b.experts = E
	} else if b.experts != E {
		return perr(f.name, 0, "last_physical_to_logical_map", "maps to %d logical experts, but the files before map to %d: give all files of one run, or set LoadOptions.Experts to the model's experts per layer", E, b.experts)
	}
	recs, err := f.records()
	if err != nil {
		return err
	}
	seen := map[string]int{}
	for i, rec := range recs {
		field := fmt.Sprintf("records[%d].topk_ids_of_layer", i)
		t, err := tensorField(rec, "topk_ids_of_layer", f.name, field, 3)
		if err != nil {
			return err
		}
		if t.Shape[0] != L {
			return perr(f.name, 0, field, "%d layers, want %d like last_physical_to_logical_map", t.Shape[0], L)
		}
		T, W := t.Shape[1], t.Shape[2]
		if T == 0 {
			continue
		}
		if W == 0 || W > maxSGLangTopK {
			return perr(f.name, 0, field, "%d ids per token, want 1 to %d", W, maxSGLangTopK)
		}
		if j, dup := seen[t.StorageKey()]; dup {
			return perr(f.name, 0, field, "shares its data with records[%d]: each pass records its own tokens", j)
		}
		seen[t.StorageKey()] = i
		v, err := readInts(t, f.name, field)
		if err != nil {
			return err
		}
		// A dense layer is -1 everywhere; in a MoE layer every token has
		// the same number k of ids ≠ -1.
		var names []int
		k := -1
		for l := range L {
			valid := 0
			for x := range T * W {
				if v.at(l*T*W+x) != -1 {
					valid++
				}
			}
			if valid == 0 {
				continue
			}
			names = append(names, l)
			if valid%T != 0 || (k >= 0 && valid/T != k) {
				return perr(f.name, 0, field, "layer %d has %d ids for %d tokens: every token of a MoE layer needs the same top-k (-1 only as padding)", l, valid, T)
			}
			k = valid / T
		}
		where := fmt.Sprintf("%s: %s", f.name, field)
		if err := b.start(names, L, k, where); err != nil {
			return perr(f.name, 0, field, "%v", err)
		}
		pass, _ := intField(rec, "forward_pass_id")
		rank, ok := intField(rec, "rank")
		if !ok || rank < 0 || rank > math.MaxInt32 {
			rank = -1
		}
		if pass < math.MinInt32 || pass > math.MaxInt32 {
			return perr(f.name, 0, fmt.Sprintf("records[%d].forward_pass_id", i), "%d out of int32 range", pass)
		}
		var bad error
		id := func(li, tok, j int) int {
			l := names[li]
			// The j-th valid id of the token, skipping -1 padding.
			row := (l*T + tok) * W
			n := 0
			for x := range W {
				p := v.at(row + x)
				if p == -1 {
					continue
				}
				if n == j {
					if p < 0 || p >= int64(P) {
						if bad == nil {
							bad = perr(f.name, 0, fmt.Sprintf("%s[%d][%d][%d]", field, l, tok, x), "physical slot %d out of range [0,%d) (with fused shared experts SGLang's ids are wrong: record without them)", p, P)
						}
						return 0
					}
					return m[l*P+int(p)]
				}
				n++
			}
			if bad == nil {
				bad = perr(f.name, 0, fmt.Sprintf("%s[%d][%d]", field, l, tok), "%d ids, want top-k %d", n, b.topK)
			}
			return 0
		}
		err = b.add(T, int32(rank), int32(pass), true, id, func(li, tok int) string {
			return fmt.Sprintf("%s[%d][%d] (mapped to logical ids)", field, names[li], tok)
		})
		if bad != nil {
			return bad
		}
		if err != nil {
			return perr(f.name, 0, "", "%v", err)
		}
	}
	return nil
}
