package rebalance

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/moetuner/moetuner/routing"
)

// pathWindow keeps one phase's per-token paths, built as steps are
// observed: the histogram of distinct paths (source rank and every layer's
// sorted top-k, as routing.Pattern) over the steps in the window, each
// token weighted as its step is (Decay^age), and the load those paths add
// up to. A step leaving the window subtracts its paths, so Propose reads
// the histogram as it stands instead of recounting the tokens.
//
// Weights are kept in scaled units: a step observed when the scale was u
// adds its tokens with weight u, and the scale grows by 1/Decay each step,
// so that every kept count divided by the current scale is its decayed
// weight. The scale is folded back into the counts before it could
// overflow.
type pathWindow struct {
	layers, experts, topK int
	size                  int // steps kept (the count window's, or pathSteps(Decay))
	maxTokens             int // tokens kept at most (pathTokens)
	decay                 float64
	ring                  []*pathStep // ring[head] the oldest once full; nil: a count-only step
	head                  int
	scale                 float64
	index                 map[string]int // path key → entries index
	entries               []pathEntry
	free                  []int
	load                  [][]float64 // Σ scaled weight over the paths, per layer and expert
	count                 int         // tokens kept (unweighted)
}

// pathEntry is one distinct path with its counts in the window.
type pathEntry struct {
	key     string
	source  int32
	experts []int16 // never written after creation: proposals share it
	n       int     // tokens of the window with this path
	w       float64 // their scaled weight
}

// pathStep is one step's paths: entries[i] has n[i] of its tokens.
type pathStep struct {
	entries []int
	n       []int
	scale   float64
}

// pathDropShare is the share of an unlimited decayed window's total weight
// that its per-token paths may leave out: the oldest steps, weighing
// Decay^A of the total together for the steps of age A and more. It is the
// relative error routing's path sample allows (routing.DefaultPathError),
// so the paths kept describe the window as closely as a sample of it
// would.
const pathDropShare = routing.DefaultPathError

// pathSteps is how many steps an unlimited window with decay d < 1 keeps
// paths for: the least A with d^A ≤ pathDropShare.
func pathSteps(d float64) int {
	return max(1, int(math.Ceil(math.Log(pathDropShare)/math.Log(d))))
}

// scaleLimit is where the scale is folded into the counts: far below
// float64's range, so that a scaled count times its tokens never
// overflows.
const scaleLimit = 1e100

func newPathWindow(layers, experts, topK, size int, decay float64) *pathWindow {
	if size == 0 {
		size = pathSteps(decay)
	}
	return &pathWindow{layers: layers, experts: experts, topK: topK, size: size, decay: decay,
		maxTokens: pathTokens(layers, topK),
		scale:     1, index: map[string]int{}, load: matrix(layers, experts)}
}

// pathTokens bounds the tokens a path window keeps: the most paths
// routing keeps of any trace (routing.PathSampleSize at the default path
// error, ((k−1)/(2·0.01))² = 122,500 for top-8, within its cap on ids).
// Beyond it routing samples, since more paths no longer sharpen the
// per-token means the cost model takes from them; here the newest steps
// are kept whole instead, which bounds the memory (a DeepSeek-V3 path is
// 928 ids) however long the window.
func pathTokens(layers, topK int) int {
	n, _ := routing.PathSampleSize(math.MaxInt64, layers, topK, 0)
	return int(min(n, math.MaxInt32))
}

// pathBatch is one step's tokens grouped by path, built outside the
// rebalancer's lock: path i has key keys[i], source src[i], sorted experts
// paths[i] (owned by the batch) and n[i] tokens.
type pathBatch struct {
	keys  []string
	src   []int32
	paths [][]int16
	n     []int
}

// newPathBatch groups t's tokens (checked) by path, in order of first
// appearance.
func newPathBatch(t *routing.Trace) *pathBatch {
	L, K := t.Layers, t.TopK
	b := &pathBatch{}
	at := map[string]int{}
	path := make([]int16, L*K)
	var key strings.Builder
	for tok := range t.Tokens {
		copy(path, t.IDs[tok*L*K:(tok+1)*L*K])
		for l := range L {
			sortSmall(path[l*K : (l+1)*K])
		}
		src := int32(-1)
		if t.Source != nil {
			src = t.Source[tok]
		}
		key.Reset()
		pathKey(&key, src, path)
		i, ok := at[key.String()]
		if !ok {
			i = len(b.keys)
			at[key.String()] = i
			b.keys = append(b.keys, key.String())
			b.src = append(b.src, src)
			b.paths = append(b.paths, slices.Clone(path))
			b.n = append(b.n, 0)
		}
		b.n[i]++
	}
	return b
}

// sortSmall sorts a top-k set in place by insertion, which for the few ids
// of a top-k beats the general sort's setup (half of Observe's time on
// DeepSeek-V3's top-8 with slices.Sort).
func sortSmall(v []int16) {
	for i := 1; i < len(v); i++ {
		for j := i; j > 0 && v[j] < v[j-1]; j-- {
			v[j], v[j-1] = v[j-1], v[j]
		}
	}
}

// add records one step: its tokens' paths, or none for a count-only step
// (b nil or empty), which still ages the paths before it.
func (w *pathWindow) add(b *pathBatch) {
	if len(w.ring) == w.size {
		w.evict(w.ring[w.head])
	}
	if w.decay < 1 {
		w.scale /= w.decay
		if w.scale > scaleLimit {
			w.rescale()
		}
	}
	var st *pathStep
	if b != nil && len(b.keys) > 0 {
		st = w.count1(b)
	}
	if len(w.ring) < w.size {
		w.ring = append(w.ring, st)
	} else {
		w.ring[w.head] = st
		w.head = (w.head + 1) % w.size
	}
	w.trim()
}

// trim drops the oldest steps' paths while the window holds more than
// maxTokens tokens, the newest step with tokens always kept; their slots
// stay in the ring, without paths, so that the steps keep their ages.
func (w *pathWindow) trim() {
	n := len(w.ring)
	for i := 0; i < n && w.count > w.maxTokens; i++ {
		j := (w.head + i) % n // oldest first (head is 0 until the ring is full)
		st := w.ring[j]
		if st == nil {
			continue
		}
		tokens := 0
		for _, k := range st.n {
			tokens += k
		}
		if tokens == w.count {
			return // the only step left with tokens
		}
		w.evict(st)
		w.ring[j] = nil
	}
}

// count1 adds b's tokens at the current scale and returns the step.
func (w *pathWindow) count1(b *pathBatch) *pathStep {
	K := w.topK
	st := &pathStep{scale: w.scale, entries: make([]int, len(b.keys)), n: b.n}
	for i, key := range b.keys {
		e, ok := w.index[key]
		if !ok {
			e = w.newEntry(key, b.src[i], b.paths[i])
		}
		st.entries[i] = e
		en := &w.entries[e]
		n := b.n[i]
		en.n += n
		en.w += float64(n) * st.scale
		for j, x := range en.experts {
			w.load[j/K][x] += float64(n) * st.scale
		}
		w.count += n
	}
	return st
}

// newEntry adds a path to the window; path is kept (not copied).
func (w *pathWindow) newEntry(key string, src int32, path []int16) int {
	en := pathEntry{key: key, source: src, experts: path}
	var e int
	if n := len(w.free); n > 0 {
		e, w.free = w.free[n-1], w.free[:n-1]
		w.entries[e] = en
	} else {
		e = len(w.entries)
		w.entries = append(w.entries, en)
	}
	w.index[key] = e
	return e
}

// evict subtracts a step leaving the window.
func (w *pathWindow) evict(st *pathStep) {
	if st == nil {
		return
	}
	K := w.topK
	for i, e := range st.entries {
		en := &w.entries[e]
		n := st.n[i]
		en.n -= n
		en.w -= float64(n) * st.scale
		for j, x := range en.experts {
			w.load[j/K][x] -= float64(n) * st.scale
		}
		w.count -= n
		if en.n == 0 {
			delete(w.index, en.key)
			w.entries[e] = pathEntry{}
			w.free = append(w.free, e)
		}
	}
	if w.count == 0 {
		// Nothing left: start the sums afresh rather than keep the
		// rounding of the subtractions.
		for _, row := range w.load {
			clear(row)
		}
	}
}

// rescale folds the scale into every count so that it starts again at 1.
func (w *pathWindow) rescale() {
	f := 1 / w.scale
	for i := range w.entries {
		w.entries[i].w *= f
	}
	for _, row := range w.load {
		for e := range row {
			row[e] *= f
		}
	}
	for _, st := range w.ring {
		if st != nil {
			st.scale *= f
		}
	}
	w.scale = 1
}

// steps is the number of kept steps that carried tokens.
func (w *pathWindow) steps() int {
	n := 0
	for _, st := range w.ring {
		if st != nil {
			n++
		}
	}
	return n
}

// addTo adds the window's paths and load (decayed weights) to the
// accumulators, and the weights of its steps with tokens to *weight;
// patterns are appended unsorted and share their expert ids.
func (w *pathWindow) addTo(pats *[]keyedPattern, load [][]float64, weight *float64) {
	if w.count == 0 {
		return
	}
	f := 1 / w.scale
	for _, st := range w.ring {
		if st != nil {
			*weight += st.scale * f
		}
	}
	for _, en := range w.entries {
		if en.n > 0 {
			*pats = append(*pats, keyedPattern{key: en.key, p: routing.Pattern{Source: en.source, Experts: en.experts, Count: max(en.w*f, 0)}})
		}
	}
	for l, row := range w.load {
		for e, v := range row {
			load[l][e] += max(v*f, 0)
		}
	}
}

// keyedPattern is a pattern with its sort key.
type keyedPattern struct {
	key string
	p   routing.Pattern
}

// pathKey writes the key of a path: byte order is the order of (source,
// experts) compared numerically, as routing.Stats sorts its patterns.
func pathKey(b *strings.Builder, src int32, experts []int16) {
	u := uint32(src) ^ 1<<31
	b.WriteByte(byte(u >> 24))
	b.WriteByte(byte(u >> 16))
	b.WriteByte(byte(u >> 8))
	b.WriteByte(byte(u))
	for _, e := range experts {
		v := uint16(e) ^ 1<<15
		b.WriteByte(byte(v >> 8))
		b.WriteByte(byte(v))
	}
}

// pathStats is the per-token statistics of every path window in ws:
// routing.Stats with Load, Tokens and Patterns (the window's weighted
// paths, sorted by key, their counts adding up to Tokens), which the
// solver's affinity search and the cost model read, and the summed weight
// of the steps that carried them. Merging windows adds the counts of a
// path kept by several. nil when they hold no tokens.
func pathStats(ws []*pathWindow) (*routing.Stats, float64) {
	L, E, K := ws[0].layers, ws[0].experts, ws[0].topK
	var pats []keyedPattern
	load := matrix(L, E)
	weight := 0.0
	for _, w := range ws {
		w.addTo(&pats, load, &weight)
	}
	if len(pats) == 0 {
		return nil, 0
	}
	slices.SortFunc(pats, func(a, b keyedPattern) int { return cmp.Compare(a.key, b.key) })
	out := make([]routing.Pattern, 0, len(pats))
	sum := 0.0
	for i, kp := range pats {
		sum += kp.p.Count
		if i > 0 && kp.key == pats[i-1].key {
			out[len(out)-1].Count += kp.p.Count
			continue
		}
		out = append(out, kp.p)
	}
	// The patterns' counts are the tokens: the running sums' rounding
	// stays with the sums.
	return &routing.Stats{Layers: L, Experts: E, TopK: K, Tokens: sum, Load: load, Patterns: out}, weight
}

// checkTokens validates a step's per-token routing against the model and
// the cluster's GPUs, naming the field.
func checkTokens(t *routing.Trace, layers, experts, topK, gpus, step int) error {
	if t.Layers != layers || t.TopK != topK {
		return fmt.Errorf("rebalance: step %d: Step.Tokens has %d layers of top-%d, the model %d layers of top-%d; give every token's experts at every MoE layer", step, t.Layers, t.TopK, layers, topK)
	}
	if t.Experts != experts {
		return fmt.Errorf("rebalance: step %d: Step.Tokens.Experts = %d, the model has %d experts per layer", step, t.Experts, experts)
	}
	if err := t.Validate(); err != nil {
		return fmt.Errorf("rebalance: step %d: Step.Tokens: %w", step, err)
	}
	for i, s := range t.Source {
		if s >= int32(gpus) {
			return fmt.Errorf("rebalance: step %d: Step.Tokens.Source[%d] = %d, out of range: a source is the rank (GPU) the token lives on, in [0,%d), or -1 when unknown", step, i, s, gpus)
		}
	}
	return nil
}

// tokenLoad is Load[l][e] of t's tokens.
func tokenLoad(t *routing.Trace) [][]float64 {
	out := matrix(t.Layers, t.Experts)
	K := t.TopK
	for i, x := range t.IDs {
		out[i/K%t.Layers][x]++
	}
	return out
}

// sameLoad checks that a step's Load (already of the model's shape) is its
// tokens' counts.
func sameLoad(load, counted [][]float64, step int) error {
	for l, row := range load {
		for e, v := range row {
			if v != counted[l][e] {
				return fmt.Errorf("rebalance: step %d: Step.Load[%d][%d] = %v but Step.Tokens route %v tokens there; leave Load nil (the tokens are counted) or give their counts", step, l, e, v, counted[l][e])
			}
		}
	}
	return nil
}
