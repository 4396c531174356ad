package routing

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// maxDenseEntries bounds L×E×E for the dense Transitions and CoActivation
// matrices that Trace.Stats builds; above it they are left nil (unknown)
// rather than exhausting memory (2^24 entries, 128 MiB per matrix).
const maxDenseEntries = 1 << 24

// Validate checks the shape and contents of t: non-negative dimensions,
// len(IDs) = Tokens×Layers×TopK, every id in [0, Experts), no expert twice
// in one token's top-k at one layer, finite weights, sources ≥ -1, and
// Weights, Source, Step and LayerNames either nil or of the right length.
// It returns nil for a valid trace and an error naming the first problem.
func (t *Trace) Validate() error {
	if t == nil {
		return errors.New("routing: nil trace")
	}
	if t.Tokens < 0 || t.Layers < 0 || t.TopK < 0 || t.Experts < 0 {
		return fmt.Errorf("routing: negative dimension (tokens %d, layers %d, top-k %d, experts %d)",
			t.Tokens, t.Layers, t.TopK, t.Experts)
	}
	if t.Layers == 0 || t.TopK == 0 || t.Experts == 0 {
		return fmt.Errorf("routing: empty trace shape (layers %d, top-k %d, experts %d): all must be positive",
			t.Layers, t.TopK, t.Experts)
	}
	if t.Experts > math.MaxInt16+1 {
		return fmt.Errorf("routing: %d experts exceed the int16 id range", t.Experts)
	}
	if t.TopK > t.Experts {
		return fmt.Errorf("routing: top-k %d exceeds %d experts", t.TopK, t.Experts)
	}
	n := t.Tokens * t.Layers * t.TopK
	if n/t.Layers/t.TopK != t.Tokens {
		return errors.New("routing: trace dimensions overflow")
	}
	if len(t.IDs) != n {
		return fmt.Errorf("routing: len(IDs) = %d, want tokens×layers×top-k = %d", len(t.IDs), n)
	}
	if t.Weights != nil && len(t.Weights) != n {
		return fmt.Errorf("routing: len(Weights) = %d, want %d (same layout as IDs) or nil", len(t.Weights), n)
	}
	if t.Source != nil && len(t.Source) != t.Tokens {
		return fmt.Errorf("routing: len(Source) = %d, want %d tokens or nil", len(t.Source), t.Tokens)
	}
	if t.Step != nil && len(t.Step) != t.Tokens {
		return fmt.Errorf("routing: len(Step) = %d, want %d tokens or nil", len(t.Step), t.Tokens)
	}
	if t.LayerNames != nil && len(t.LayerNames) != t.Layers {
		return fmt.Errorf("routing: len(LayerNames) = %d, want %d layers or nil", len(t.LayerNames), t.Layers)
	}
	for i, id := range t.IDs {
		if int(id) < 0 || int(id) >= t.Experts {
			tok, l, j := t.index(i)
			return fmt.Errorf("routing: token %d layer %d rank %d: expert %d out of range [0,%d)", tok, l, j, id, t.Experts)
		}
	}
	for i := 0; i < n; i += t.TopK {
		set := t.IDs[i : i+t.TopK]
		for a := 1; a < len(set); a++ {
			if slices.Contains(set[:a], set[a]) {
				tok, l, _ := t.index(i)
				return fmt.Errorf("routing: token %d layer %d: expert %d appears twice in the top-k", tok, l, set[a])
			}
		}
	}
	for i, w := range t.Weights {
		if math.IsNaN(float64(w)) || math.IsInf(float64(w), 0) {
			tok, l, j := t.index(i)
			return fmt.Errorf("routing: token %d layer %d rank %d: weight %v is not finite", tok, l, j, w)
		}
	}
	for i, s := range t.Source {
		if s < -1 {
			return fmt.Errorf("routing: token %d: source %d, want ≥ 0 or -1 for unknown", i, s)
		}
	}
	return nil
}

// index splits a flat IDs index into token, layer and rank.
func (t *Trace) index(i int) (tok, layer, rank int) {
	return i / (t.Layers * t.TopK), i / t.TopK % t.Layers, i % t.TopK
}

// At returns the rank-th expert of token tok at layer layer. It panics when
// an index is out of range, like a slice index.
func (t *Trace) At(tok, layer, rank int) Expert {
	if tok < 0 || tok >= t.Tokens || layer < 0 || layer >= t.Layers || rank < 0 || rank >= t.TopK {
		panic(fmt.Sprintf("routing: Trace.At(%d, %d, %d) out of range [%d, %d, %d]", tok, layer, rank, t.Tokens, t.Layers, t.TopK))
	}
	return Expert(t.IDs[(tok*t.Layers+layer)*t.TopK+rank])
}

// Slice returns the tokens [from, to) of t as a new trace that shares no
// memory with t, for train/test splits. Bounds are clamped to [0, Tokens];
// from ≥ to gives a trace with no tokens.
func (t *Trace) Slice(from, to int) *Trace {
	from = min(max(from, 0), t.Tokens)
	to = min(max(to, from), t.Tokens)
	per := t.Layers * t.TopK
	s := &Trace{
		Tokens:      to - from,
		Layers:      t.Layers,
		TopK:        t.TopK,
		Experts:     t.Experts,
		IDs:         slices.Clone(t.IDs[from*per : to*per]),
		LayerNames:  slices.Clone(t.LayerNames),
		ModelLayers: t.ModelLayers,
	}
	if s.IDs == nil {
		s.IDs = []int16{}
	}
	if t.Weights != nil {
		s.Weights = slices.Clone(t.Weights[from*per : to*per])
	}
	if t.Source != nil {
		s.Source = slices.Clone(t.Source[from:to])
	}
	if t.Step != nil {
		s.Step = slices.Clone(t.Step[from:to])
	}
	return s
}

// StatsOptions select what Trace.Stats computes. The zero value counts
// all-pairs transitions and keeps the paths of up to the number of tokens
// that DefaultPathError needs.
type StatsOptions struct {
	// Transitions is the transition convention; default TransitionAllPairs.
	Transitions TransitionMode
	// NoPatterns skips the pattern histogram (Stats.Patterns stays nil),
	// which saves memory on long traces; default false (patterns kept).
	NoPatterns bool
	// PathError is the target relative standard error of per-token means
	// estimated from the patterns (see PathSampleSize): traces with more
	// tokens than it needs keep a uniform random sample of their tokens'
	// paths. 0 means DefaultPathError (0.01); a negative value keeps every
	// path (exact, but as large as the trace, and dropped past MaxPatterns
	// distinct paths).
	PathError float64

	// chunkIDs is the size of a counting chunk in ids; 0 means
	// defaultChunkIDs. Tests lower it to count in many chunks; the result
	// does not depend on it.
	chunkIDs int
}

// Stats aggregates t. It assumes t is valid (see Validate); ids out of range
// panic. Transitions and CoActivation are left nil when Layers×Experts²
// exceeds 2^24 entries; Patterns is nil when NoPatterns is set, a weighted
// sample of the tokens' paths when t has more tokens than opts.PathError
// needs (PathSample says so); StepLoad is nil when Step is nil or steps ×
// Layers × Experts exceeds 2^25; SourceLoad is nil when Source is nil or
// names a rank so large that ranks×Layers×Experts exceeds 2^24. Stats.Notes
// records what was dropped or sampled. The result depends on t only, not on
// GOMAXPROCS.
func (t *Trace) Stats(opts StatsOptions) *Stats {
	L, K := t.Layers, t.TopK
	per := opts.chunkTokens(L, K)
	b := newStatsBuilder(L, K, t.Experts, int64(t.Tokens), (t.Tokens+per-1)/per, opts)
	LK := L * K
	for tok := 0; tok < t.Tokens; tok += per {
		n := min(per, t.Tokens-tok)
		ch := chunk{ids: t.IDs[tok*LK : (tok+n)*LK], n: n, tok0: int64(tok), maxID: t.Experts - 1}
		if t.Source != nil {
			ch.src = t.Source[tok : tok+n]
		}
		if t.Step != nil {
			ch.step = t.Step[tok : tok+n]
		}
		b.add(ch)
	}
	s := b.stats(t.Experts)
	s.LayerNames = slices.Clone(t.LayerNames)
	s.ModelLayers = t.ModelLayers
	return s
}

// sampleCapacity is the path sampler's capacity for a trace of tokens
// tokens (0 when unknown): the sample size PathSampleSize gives, or for an
// unknown length the most it can give. -1 keeps every path, 0 none.
func sampleCapacity(tokens int64, L, K int, opts StatsOptions) int {
	switch {
	case opts.NoPatterns:
		return 0
	case opts.PathError < 0:
		return -1
	case tokens > 0:
		n, _ := PathSampleSize(tokens, L, K, opts.PathError)
		return int(max(n, 1))
	}
	n0, limit := pathBudget(L, K, opts.PathError)
	return int(max(min(n0, limit), 1))
}

// chunkTokens is the number of tokens counted at a time: about
// defaultChunkIDs ids (o.chunkIDs when set), so that each layer's E×E
// matrices, visited once per chunk, take many counts per visit.
func (o StatsOptions) chunkTokens(L, K int) int {
	ids := o.chunkIDs
	if ids <= 0 {
		ids = defaultChunkIDs
	}
	return max(1, ids/(L*K))
}

// defaultChunkIDs is the size of a counting chunk in ids, chosen by
// benchmark.
const defaultChunkIDs = 1 << 24

// patternKey encodes a pattern so that byte order equals the order by
// (Source, Experts...) with numeric comparison.
func patternKey(src int32, experts []int16) string {
	var b strings.Builder
	b.Grow(4 + 2*len(experts))
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
	return b.String()
}

func decodePatternKey(key string) (int32, []int16) {
	src := int32((uint32(key[0])<<24 | uint32(key[1])<<16 | uint32(key[2])<<8 | uint32(key[3])) ^ 1<<31)
	ex := make([]int16, (len(key)-4)/2)
	for i := range ex {
		ex[i] = int16((uint16(key[4+2*i])<<8 | uint16(key[5+2*i])) ^ 1<<15)
	}
	return src, ex
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func newMatrix(rows, cols int) [][]float64 {
	m := make([][]float64, rows)
	for i := range m {
		m[i] = make([]float64, cols)
	}
	return m
}
