package routing

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// StatsFromLoad returns count-only stats for a load matrix load[l][e] (token
// routings to expert e at layer l), as EPLB and SGLang record it. The matrix
// is copied. TopK is topK (0 when unknown); Tokens is the mean row sum
// divided by topK, or 0 when topK is 0. Transitions, CoActivation, StepLoad
// and Patterns are nil. Ragged rows are kept as given (Experts is the longest
// row) and make Validate fail.
func StatsFromLoad(load [][]float64, topK int) *Stats {
	s := &Stats{Layers: len(load), TopK: topK, Load: make([][]float64, len(load))}
	var total float64
	for l, row := range load {
		s.Load[l] = slices.Clone(row)
		s.Experts = max(s.Experts, len(row))
		for _, v := range row {
			total += v
		}
	}
	if topK > 0 && len(load) > 0 {
		s.Tokens = total / float64(len(load)) / float64(topK)
	}
	return s
}

// Validate checks that s is internally consistent: Load is Layers×Experts,
// Transitions (when set) is (Layers-1)×Experts², CoActivation (when set) is
// Layers×Experts² symmetric with a zero diagonal, every StepLoad step is
// Layers×Experts, patterns have Layers×TopK ids in range and are sorted by
// key with counts that add up to Tokens, PathSample has 0 ≤ Kept ≤ Tokens,
// LayerNames is nil or has Layers distinct entries, SourceLoad (when set)
// has Layers×Experts matrices that sum to at most Load, and every count is
// finite and non-negative. It returns nil when s is valid.
func (s *Stats) Validate() error {
	if s == nil {
		return errors.New("routing: nil stats")
	}
	L, E := s.Layers, s.Experts
	if L <= 0 || E <= 0 {
		return fmt.Errorf("routing: stats shape %d layers × %d experts: both must be positive", L, E)
	}
	if s.TopK < 0 || s.TopK > E {
		return fmt.Errorf("routing: top-k %d out of range [0,%d]", s.TopK, E)
	}
	if !finiteNonNeg(s.Tokens) {
		return fmt.Errorf("routing: tokens %v must be finite and non-negative", s.Tokens)
	}
	if err := checkMatrix("Load", s.Load, L, E); err != nil {
		return err
	}
	if s.Transitions != nil {
		if err := checkMatrix("Transitions", s.Transitions, max(L-1, 0), E*E); err != nil {
			return err
		}
	}
	if s.CoActivation != nil {
		if err := checkMatrix("CoActivation", s.CoActivation, L, E*E); err != nil {
			return err
		}
		for l, m := range s.CoActivation {
			for a := range E {
				if m[a*E+a] != 0 {
					return fmt.Errorf("routing: CoActivation[%d][%d,%d] = %v, want 0 on the diagonal", l, a, a, m[a*E+a])
				}
				for b := a + 1; b < E; b++ {
					if m[a*E+b] != m[b*E+a] {
						return fmt.Errorf("routing: CoActivation[%d] not symmetric at (%d,%d)", l, a, b)
					}
				}
			}
		}
	}
	for st, m := range s.StepLoad {
		if err := checkMatrix(fmt.Sprintf("StepLoad[%d]", st), m, L, E); err != nil {
			return err
		}
	}
	if s.SourceLoad != nil {
		sum := newMatrix(L, E)
		for r, m := range s.SourceLoad {
			if err := checkMatrix(fmt.Sprintf("SourceLoad[%d]", r), m, L, E); err != nil {
				return err
			}
			addMatrix(sum, m)
		}
		for l := range L {
			for e := range E {
				if sum[l][e] > s.Load[l][e]*(1+1e-9)+1e-9 {
					return fmt.Errorf("routing: SourceLoad summed over sources is %v at layer %d expert %d, more than Load %v", sum[l][e], l, e, s.Load[l][e])
				}
			}
		}
	}
	if s.LayerNames != nil && len(s.LayerNames) != L {
		return fmt.Errorf("routing: len(LayerNames) = %d, want %d layers or nil", len(s.LayerNames), L)
	}
	for i, n := range s.LayerNames {
		if j := slices.Index(s.LayerNames[:i], n); j >= 0 {
			return fmt.Errorf("routing: LayerNames[%d] = %d repeats LayerNames[%d]", i, n, j)
		}
	}
	if s.ModelLayers != 0 {
		top := L - 1
		if s.LayerNames != nil {
			top = slices.Max(s.LayerNames)
		}
		if s.ModelLayers <= top {
			return fmt.Errorf("routing: ModelLayers = %d, but the stats have layer %d; want 0 (unknown) or more than every layer name", s.ModelLayers, top)
		}
	}
	ps := s.PathSample
	if ps.Tokens < 0 || ps.Kept < 0 || ps.Kept > ps.Tokens || !finiteNonNeg(ps.RelStdErr) {
		return fmt.Errorf("routing: PathSample %+v: want 0 ≤ Kept ≤ Tokens and a finite non-negative RelStdErr", ps)
	}
	var prev string
	var sum float64
	for i, p := range s.Patterns {
		sum += p.Count
		if len(p.Experts) != L*s.TopK {
			return fmt.Errorf("routing: Patterns[%d] has %d ids, want layers×top-k = %d", i, len(p.Experts), L*s.TopK)
		}
		for _, e := range p.Experts {
			if int(e) < 0 || int(e) >= E {
				return fmt.Errorf("routing: Patterns[%d]: expert %d out of range [0,%d)", i, e, E)
			}
		}
		if p.Source < -1 {
			return fmt.Errorf("routing: Patterns[%d]: source %d, want ≥ -1", i, p.Source)
		}
		if !finiteNonNeg(p.Count) {
			return fmt.Errorf("routing: Patterns[%d]: count %v must be finite and non-negative", i, p.Count)
		}
		key := patternKey(p.Source, p.Experts)
		if i > 0 && key <= prev {
			return fmt.Errorf("routing: Patterns[%d] is not after Patterns[%d] in key order (or repeats it)", i, i-1)
		}
		prev = key
	}
	// Sampled patterns are weighted so that they still describe every token.
	if s.Patterns != nil && math.Abs(sum-s.Tokens) > 1e-6*max(s.Tokens, 1) {
		return fmt.Errorf("routing: pattern counts add up to %v, want Tokens = %v (every token has one path)", sum, s.Tokens)
	}
	if s.Order != nil {
		return s.Order.Validate(L, E)
	}
	return nil
}

func checkMatrix(name string, m [][]float64, rows, cols int) error {
	if len(m) != rows {
		return fmt.Errorf("routing: %s has %d rows, want %d", name, len(m), rows)
	}
	for i, row := range m {
		if len(row) != cols {
			return fmt.Errorf("routing: %s[%d] has %d entries, want %d", name, i, len(row), cols)
		}
		for j, v := range row {
			if !finiteNonNeg(v) {
				return fmt.Errorf("routing: %s[%d][%d] = %v, want a finite non-negative count", name, i, j, v)
			}
		}
	}
	return nil
}

func finiteNonNeg(v float64) bool { return v >= 0 && !math.IsInf(v, 1) }

// isZero reports whether s is the empty zero value.
func (s *Stats) isZero() bool {
	return s.Layers == 0 && s.Experts == 0 && s.Load == nil && s.Tokens == 0
}

// Merge adds o into s. An empty (zero-value) s becomes a copy of o. Layers
// and Experts must match, as must TopK, LayerNames and ModelLayers when both
// sides state them, and TransitionMode when both have transitions; the error names the
// mismatch and s is left unchanged. Load, Tokens, Transitions, CoActivation
// and pattern counts add up (patterns by key). A matrix or histogram that one
// side lacks (nil) is dropped from the result, as the sum would be
// incomplete. StepLoad concatenates: o's steps follow s's. SourceLoad adds
// rank by rank (a rank only one side has is kept as it is). Sources are
// appended.
func (s *Stats) Merge(o *Stats) error {
	if o == nil {
		return errors.New("routing: merge: nil stats")
	}
	if s.isZero() {
		*s = *o.Clone()
		return nil
	}
	if o.isZero() {
		return nil
	}
	s.Order = nil
	if s.Layers != o.Layers {
		return fmt.Errorf("routing: merge: %d layers vs %d layers", s.Layers, o.Layers)
	}
	if s.Experts != o.Experts {
		return fmt.Errorf("routing: merge: %d experts vs %d experts", s.Experts, o.Experts)
	}
	if s.TopK != 0 && o.TopK != 0 && s.TopK != o.TopK {
		return fmt.Errorf("routing: merge: top-k %d vs top-k %d", s.TopK, o.TopK)
	}
	if s.LayerNames != nil && o.LayerNames != nil && !slices.Equal(s.LayerNames, o.LayerNames) {
		return fmt.Errorf("routing: merge: layer names %v vs %v", s.LayerNames, o.LayerNames)
	}
	if s.ModelLayers != 0 && o.ModelLayers != 0 && s.ModelLayers != o.ModelLayers {
		return fmt.Errorf("routing: merge: a model of %d decoder layers vs one of %d", s.ModelLayers, o.ModelLayers)
	}
	if s.Transitions != nil && o.Transitions != nil && s.TransitionMode != o.TransitionMode {
		return fmt.Errorf("routing: merge: transition mode %v vs %v", s.TransitionMode, o.TransitionMode)
	}
	for _, c := range []struct {
		name string
		a, b [][]float64
	}{{"Load", s.Load, o.Load}, {"Transitions", s.Transitions, o.Transitions}, {"CoActivation", s.CoActivation, o.CoActivation}} {
		if c.a == nil || c.b == nil {
			continue
		}
		if len(c.a) != len(c.b) {
			return fmt.Errorf("routing: merge: %s has %d rows vs %d", c.name, len(c.a), len(c.b))
		}
		for i := range c.a {
			if len(c.a[i]) != len(c.b[i]) {
				return fmt.Errorf("routing: merge: %s[%d] has %d entries vs %d", c.name, i, len(c.a[i]), len(c.b[i]))
			}
		}
	}
	if s.TopK == 0 {
		s.TopK = o.TopK
	}
	if s.LayerNames == nil {
		s.LayerNames = slices.Clone(o.LayerNames)
	}
	if s.ModelLayers == 0 {
		s.ModelLayers = o.ModelLayers
	}
	ps := mergePathSample(s, o)
	s.Tokens += o.Tokens
	addMatrix(s.Load, o.Load)
	if s.Transitions != nil && o.Transitions != nil {
		addMatrix(s.Transitions, o.Transitions)
	} else {
		s.Transitions = nil
	}
	if s.CoActivation != nil && o.CoActivation != nil {
		addMatrix(s.CoActivation, o.CoActivation)
	} else {
		s.CoActivation = nil
	}
	if s.StepLoad != nil && o.StepLoad != nil {
		for _, m := range o.StepLoad {
			s.StepLoad = append(s.StepLoad, cloneMatrix(m))
		}
		s.StepsUnordered = s.StepsUnordered || o.StepsUnordered
	} else {
		s.StepLoad, s.StepsUnordered = nil, false
	}
	if s.SourceLoad != nil && o.SourceLoad != nil {
		for len(s.SourceLoad) < len(o.SourceLoad) {
			s.SourceLoad = append(s.SourceLoad, newMatrix(s.Layers, s.Experts))
		}
		for r, m := range o.SourceLoad {
			addMatrix(s.SourceLoad[r], m)
		}
	} else {
		s.SourceLoad = nil
	}
	notes := mergeNotes(s.Notes, o.Notes)
	if s.Patterns != nil && o.Patterns != nil {
		s.PathSample = ps
		s.Patterns = mergePatterns(s.Patterns, o.Patterns)
		s.Notes = notes
		// Past MaxPatterns distinct paths the union is thinned to a
		// weighted sample rather than dropped.
		*s = *thinStats(s, MaxPatterns)
		notes = s.Notes
		if s.PathSample.Sampled() && !slices.ContainsFunc(notes, func(n string) bool { return strings.HasPrefix(n, notePathsSampled) }) {
			notes = append(notes, sampleNote(s.PathSample))
		}
	} else {
		s.Patterns, s.PathSample = nil, PathSample{}
	}
	s.Notes = notes
	s.Sources = append(s.Sources, o.Sources...)
	return nil
}

// mergePathSample combines the path samples of two stats with patterns:
// tokens and kept paths add up, and the relative standard error of the
// merged mean, a stratified sample with strata weighted by their Tokens,
// is √(Σ (Tᵢ·εᵢ)²) / Σ Tᵢ. Stats whose PathSample is zero count as exact.
func mergePathSample(a, b *Stats) PathSample {
	get := func(s *Stats) PathSample {
		if s.PathSample == (PathSample{}) {
			n := int64(math.Round(s.Tokens))
			return PathSample{Tokens: n, Kept: n}
		}
		return s.PathSample
	}
	pa, pb := get(a), get(b)
	out := PathSample{Tokens: pa.Tokens + pb.Tokens, Kept: pa.Kept + pb.Kept}
	if t := a.Tokens + b.Tokens; t > 0 {
		out.RelStdErr = math.Hypot(a.Tokens*pa.RelStdErr, b.Tokens*pb.RelStdErr) / t
	}
	return out
}

// mergePatterns merges two key-sorted histograms.
func mergePatterns(a, b []Pattern) []Pattern {
	out := make([]Pattern, 0, max(len(a), len(b)))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		var c int
		switch {
		case i == len(a):
			c = 1
		case j == len(b):
			c = -1
		default:
			c = comparePatterns(a[i], b[j])
		}
		switch c {
		case -1:
			out = append(out, clonePattern(a[i]))
			i++
		case 1:
			out = append(out, clonePattern(b[j]))
			j++
		default:
			p := clonePattern(a[i])
			p.Count += b[j].Count
			out = append(out, p)
			i++
			j++
		}
	}
	return out
}

// comparePatterns orders patterns as their keys do: by Source, then by
// Experts compared numerically.
func comparePatterns(a, b Pattern) int {
	if c := cmp.Compare(a.Source, b.Source); c != 0 {
		return c
	}
	return slices.Compare(a.Experts, b.Experts)
}

func clonePattern(p Pattern) Pattern {
	return Pattern{Source: p.Source, Experts: slices.Clone(p.Experts), Count: p.Count}
}

func addMatrix(dst, src [][]float64) {
	for i := range dst {
		for j := range dst[i] {
			dst[i][j] += src[i][j]
		}
	}
}

func cloneMatrix(m [][]float64) [][]float64 {
	if m == nil {
		return nil
	}
	out := make([][]float64, len(m))
	for i := range m {
		out[i] = slices.Clone(m[i])
	}
	return out
}

func cloneMatrices(ms [][][]float64) [][][]float64 {
	if ms == nil {
		return nil
	}
	out := make([][][]float64, len(ms))
	for i, m := range ms {
		out[i] = cloneMatrix(m)
	}
	return out
}

// Clone returns a deep copy of s; nil for nil.
func (s *Stats) Clone() *Stats {
	if s == nil {
		return nil
	}
	c := *s
	c.Load = cloneMatrix(s.Load)
	c.Transitions = cloneMatrix(s.Transitions)
	c.CoActivation = cloneMatrix(s.CoActivation)
	c.StepLoad = cloneMatrices(s.StepLoad)
	c.SourceLoad = cloneMatrices(s.SourceLoad)
	if s.Patterns != nil {
		c.Patterns = make([]Pattern, len(s.Patterns))
		for i, p := range s.Patterns {
			c.Patterns[i] = clonePattern(p)
		}
	}
	c.LayerNames = slices.Clone(s.LayerNames)
	c.Sources = slices.Clone(s.Sources)
	c.Notes = slices.Clone(s.Notes)
	return &c
}

// Scale multiplies every count in s (Tokens, Load, Transitions,
// CoActivation, StepLoad, SourceLoad and pattern counts) by f, for example
// to weight one workload against another before Merge. PathSample, which
// counts the tokens actually seen, is left as it is; Order, which holds
// tokens, is dropped unless f is 1.
func (s *Stats) Scale(f float64) {
	if f != 1 {
		s.Order = nil
	}
	s.Tokens *= f
	scaleMatrix(s.Load, f)
	scaleMatrix(s.Transitions, f)
	scaleMatrix(s.CoActivation, f)
	for _, m := range s.StepLoad {
		scaleMatrix(m, f)
	}
	for _, m := range s.SourceLoad {
		scaleMatrix(m, f)
	}
	for i := range s.Patterns {
		s.Patterns[i].Count *= f
	}
}

func scaleMatrix(m [][]float64, f float64) {
	for _, row := range m {
		for j := range row {
			row[j] *= f
		}
	}
}

// Transition returns R[l][e1][e2], the transition count from expert e1 at
// layer l to expert e2 at layer l+1, or 0 when transitions are unknown
// (Transitions nil). It panics on out-of-range indices.
func (s *Stats) Transition(l Layer, e1, e2 Expert) float64 {
	if s.Transitions == nil {
		return 0
	}
	if int(e1) < 0 || int(e1) >= s.Experts || int(e2) < 0 || int(e2) >= s.Experts {
		panic(fmt.Sprintf("routing: Stats.Transition: expert (%d,%d) out of range [0,%d)", e1, e2, s.Experts))
	}
	return s.Transitions[l][int(e1)*s.Experts+int(e2)]
}

// LayerTotal returns the sum of Load[l]: the number of token routings at
// layer l (Tokens×TopK when every token picks TopK experts).
func (s *Stats) LayerTotal(l Layer) float64 {
	var t float64
	for _, v := range s.Load[l] {
		t += v
	}
	return t
}

// AssumeTopK gives count-only stats that do not record their top-k (such
// as logical_count files) the model's k: TopK becomes k and Tokens the
// first layer's routings over k. Stats that record a top-k, or k ≤ 0, are
// left unchanged.
func (s *Stats) AssumeTopK(k int) {
	if s.TopK != 0 || k <= 0 {
		return
	}
	s.TopK = k
	if len(s.Load) > 0 {
		s.Tokens = s.LayerTotal(0) / float64(k)
	}
}

// HasSources reports whether some pattern records its source rank (the
// EP rank the token started on).
func (s *Stats) HasSources() bool {
	_, r := s.MaxSource()
	return r >= 0
}

// MaxSource returns the index and source rank of the pattern with the
// highest source rank, or -1, -1 when no pattern has a source.
func (s *Stats) MaxSource() (pattern, rank int) {
	pattern, rank = -1, -1
	for i, pt := range s.Patterns {
		if int(pt.Source) > rank {
			pattern, rank = i, int(pt.Source)
		}
	}
	return pattern, rank
}
