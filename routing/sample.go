package routing

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
)

// DefaultPathError is the target relative standard error of the per-token
// means estimated from Stats.Patterns when StatsOptions.PathError (or
// LoadOptions.PathError) is 0.
const DefaultPathError = 0.01

// maxSampleIDs caps the expert ids a path sample holds (2^27 ids, 256 MiB
// as int16), so that a model with many layers or a large top-k cannot make
// the sample as large as the trace.
const maxSampleIDs = 1 << 27

// pathSeed fixes the token sample: the same trace gives the same sample on
// every run.
const pathSeed = 0x6d6f6574756e6572 // "moetuner"

// PathSample records how Stats.Patterns was built: from every token's path
// (Kept == Tokens, RelStdErr 0) or from a uniform random sample of the
// tokens whose paths carry weight Tokens/Kept each, so that the pattern
// counts still add up to the token count. The zero value means the stats
// have no patterns, or came from a source that does not say (then the
// patterns are taken as exact).
type PathSample struct {
	// Tokens is the number of tokens whose paths were offered.
	Tokens int64
	// Kept is the number of those tokens whose paths are in Patterns.
	Kept int64
	// RelStdErr bounds the relative standard error of the mean over all
	// tokens of any per-token quantity in [1, TopK] (such as the number of
	// GPUs or nodes a token's experts reach at a layer) estimated from the
	// patterns; 0 when every path is kept. See PathSampleSize.
	RelStdErr float64
}

// Sampled reports whether Patterns hold a sample rather than every path.
func (p PathSample) Sampled() bool { return p.Kept < p.Tokens || p.RelStdErr > 0 }

// PathSampleSize returns how many of tokens' paths Stats keeps for a trace
// of the given layers and top-k with target relative standard error
// pathError (0 means DefaultPathError; negative means keep every path),
// and the relative standard error that size achieves (0 when it keeps
// every path).
//
// The cost model's all-to-all masses are sums over tokens of a per-token
// quantity X, such as the number of distinct GPUs or nodes that a token's k
// experts reach at a layer, so X lies in [1, k]. Estimating the mean μ of X
// from a simple random sample of n of the N tokens (drawn without
// replacement) has standard error σ·√((N−n)/(n·(N−1))); Popoviciu's
// inequality bounds σ ≤ (k−1)/2 for any X in [1, k], and μ ≥ 1, so the
// relative standard error is at most
//
//	ε(n) = (k−1)/2 · √((N−n) / (n·(N−1))).
//
// ε(n) ≤ ε holds for n ≥ n₀·N/(N−1+n₀) with n₀ = ((k−1)/(2ε))², the
// finite-population correction of n₀. A trace of at most n₀ tokens is kept
// whole, so small traces keep exact patterns and memory never exceeds n₀
// paths (just above n₀ tokens the correction allows about n₀/2). For k = 1
// every such X is 1, and the bound is taken with k−1 replaced by 1: then ε
// bounds the absolute standard error of any per-token indicator (a token
// changing GPU between layers, say). A quantity in [a, b] with mean at
// least m has relative standard error at most ε·(b−a)/((k−1)·m); a mean
// over a share f of the tokens (one source rank's) has about ε/√f.
//
// The sample never exceeds MaxPatterns tokens nor 2^27 ids (tokens × layers
// × top-k); when the target needs more, the returned error is the one the
// capped size achieves.
func PathSampleSize(tokens int64, layers, topK int, pathError float64) (kept int64, relStdErr float64) {
	if tokens <= 0 {
		return 0, 0
	}
	if pathError < 0 {
		return tokens, 0
	}
	n0, limit := pathBudget(layers, topK, pathError)
	if tokens <= min(n0, limit) {
		return tokens, 0
	}
	N := float64(tokens)
	n := int64(math.Ceil(float64(n0) * N / (N - 1 + float64(n0))))
	n = min(max(n, 1), limit, tokens)
	if n == tokens {
		return n, 0
	}
	return n, pathStdErr(tokens, n, topK)
}

// pathBudget returns n₀ (the sample size without the finite-population
// correction) and the cap on any sample for the shape.
func pathBudget(layers, topK int, pathError float64) (n0, limit int64) {
	if pathError == 0 {
		pathError = DefaultPathError
	}
	w := float64(max(topK-1, 1))
	f := math.Ceil(w * w / (4 * pathError * pathError))
	n0 = math.MaxInt64
	if f < 1<<62 {
		n0 = int64(f)
	}
	limit = int64(MaxPatterns)
	if lk := int64(max(layers, 1)) * int64(max(topK, 1)); maxSampleIDs/lk < limit {
		limit = max(maxSampleIDs/lk, 1)
	}
	return n0, limit
}

// pathStdErr is ε(n) of PathSampleSize.
func pathStdErr(tokens, kept int64, topK int) float64 {
	if kept >= tokens || kept <= 0 {
		return 0
	}
	w := float64(max(topK-1, 1))
	N, n := float64(tokens), float64(kept)
	return w / 2 * math.Sqrt((N-n)/(n*(N-1)))
}

// notePathsSampled starts the note that says patterns are a sample; Merge
// rewrites it from the merged PathSample.
const notePathsSampled = "per-token paths sampled: "

// sampleNote is the note for a sampled PathSample.
func sampleNote(p PathSample) string {
	return fmt.Sprintf("%s%d of %d tokens kept, each weighted %.4g (relative standard error ≤ %.2g of per-token means); the all-to-all traffic modeled from them is an estimate (a lower path error keeps more paths)",
		notePathsSampled, p.Kept, p.Tokens, float64(p.Tokens)/float64(p.Kept), p.RelStdErr)
}

// pathHash is a token's sample priority: the splitmix64 finalizer of its
// index, a bijection, so no two tokens tie and the sample depends on the
// token indices only, not on the order in which they are counted.
func pathHash(tok int64) uint64 {
	x := uint64(tok) ^ pathSeed
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// sampleEntry is one held path: its priority and its slot in the arena.
type sampleEntry struct {
	hash uint64
	slot int32
}

// pathSampler keeps the paths of the tokens with the smallest pathHash (a
// bottom-c sketch): a uniform random sample of c tokens that any chunking
// or merging order reproduces. With capacity < 0 it keeps every distinct
// path in a map instead (exact, bounded by MaxPatterns).
type pathSampler struct {
	lk, k    int
	capacity int
	heap     []sampleEntry // max-heap by hash
	arena    []int16       // capacity × lk ids, each layer sorted
	source   []int32       // per slot
	exact    map[string]float64
	overflow bool // exact mode: more than MaxPatterns distinct paths
	keyBuf   []int16
	// cutoff, when set, is the largest hash that the sample of a trace
	// of known length will hold (see presize): larger ones are skipped
	// without touching the heap.
	cutoff    uint64
	hasCutoff bool
}

// presize tells a sampler of capacity n that the trace has tokens tokens:
// it finds the n-th smallest pathHash among them (a heap of n hashes, no
// paths), so that offer keeps exactly the final sample and never evicts.
func (p *pathSampler) presize(tokens int64) {
	if p.exact != nil || p.capacity <= 0 || tokens <= int64(p.capacity) {
		return
	}
	h := make([]uint64, 0, p.capacity)
	for tok := range tokens {
		x := pathHash(tok)
		switch {
		case len(h) < p.capacity:
			h = append(h, x)
			for i := len(h) - 1; i > 0 && h[(i-1)/2] < h[i]; i = (i - 1) / 2 {
				h[(i-1)/2], h[i] = h[i], h[(i-1)/2]
			}
		case x < h[0]:
			h[0] = x
			for i := 0; ; {
				l, big := 2*i+1, i
				if l < len(h) && h[l] > h[big] {
					big = l
				}
				if l+1 < len(h) && h[l+1] > h[big] {
					big = l + 1
				}
				if big == i {
					break
				}
				h[i], h[big] = h[big], h[i]
				i = big
			}
		}
	}
	p.cutoff, p.hasCutoff = h[0], true
}

func newPathSampler(layers, topK, capacity int) *pathSampler {
	p := &pathSampler{lk: layers * topK, k: topK, capacity: capacity}
	if capacity < 0 {
		p.exact = map[string]float64{}
		p.keyBuf = make([]int16, p.lk)
	}
	return p
}

// wants reports whether a token of hash h would enter the sample.
func (p *pathSampler) wants(h uint64) bool {
	if p.hasCutoff && h > p.cutoff {
		return false
	}
	return p.exact != nil || len(p.heap) < p.capacity || (len(p.heap) > 0 && h < p.heap[0].hash)
}

// offer adds token tok (its ids in trace layout, unsorted) with source src.
func (p *pathSampler) offer(tok int64, src int32, ids []int16) {
	if p.exact != nil {
		if p.overflow {
			return
		}
		copy(p.keyBuf, ids)
		sortLayers(p.keyBuf, p.k)
		key := patternKey(src, p.keyBuf)
		if _, ok := p.exact[key]; !ok && len(p.exact) >= MaxPatterns {
			p.overflow, p.exact = true, map[string]float64{}
			return
		}
		p.exact[key]++
		return
	}
	h := pathHash(tok)
	if !p.wants(h) {
		return
	}
	p.put(h, src, ids, false)
}

// put stores a path with priority h; sorted says its layers are sorted.
func (p *pathSampler) put(h uint64, src int32, ids []int16, sorted bool) {
	var slot int32
	if len(p.heap) < p.capacity {
		slot = int32(len(p.heap))
		if need := (len(p.heap) + 1) * p.lk; len(p.arena) < need {
			// Grow with the tokens seen, not with the capacity, so a
			// short trace holds only its own paths.
			grown := min(max(2*len(p.arena), need, 64*p.lk), p.capacity*p.lk)
			p.arena = append(p.arena, make([]int16, grown-len(p.arena))...)
			p.source = append(p.source, make([]int32, grown/p.lk-len(p.source))...)
		}
		p.heap = append(p.heap, sampleEntry{h, slot})
		p.up(len(p.heap) - 1)
	} else {
		slot = p.heap[0].slot
		p.heap[0].hash = h
		p.down(0)
	}
	dst := p.arena[int(slot)*p.lk : int(slot+1)*p.lk]
	copy(dst, ids)
	if !sorted {
		sortLayers(dst, p.k)
	}
	p.source[slot] = src
}

func (p *pathSampler) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if p.heap[parent].hash >= p.heap[i].hash {
			return
		}
		p.heap[parent], p.heap[i] = p.heap[i], p.heap[parent]
		i = parent
	}
}

func (p *pathSampler) down(i int) {
	n := len(p.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		big := l
		if r := l + 1; r < n && p.heap[r].hash > p.heap[l].hash {
			big = r
		}
		if p.heap[i].hash >= p.heap[big].hash {
			return
		}
		p.heap[i], p.heap[big] = p.heap[big], p.heap[i]
		i = big
	}
}

// merge adds o's held paths into p; both must have the same shape and mode.
func (p *pathSampler) merge(o *pathSampler) {
	if p.exact != nil {
		if o.overflow {
			p.overflow, p.exact = true, map[string]float64{}
		}
		if p.overflow {
			return
		}
		for key, c := range o.exact {
			if _, ok := p.exact[key]; !ok && len(p.exact) >= MaxPatterns {
				p.overflow, p.exact = true, map[string]float64{}
				return
			}
			p.exact[key] += c
		}
		return
	}
	for _, e := range o.heap {
		if p.wants(e.hash) {
			p.put(e.hash, o.source[e.slot], o.arena[int(e.slot)*o.lk:int(e.slot+1)*o.lk], true)
		}
	}
}

// sortLayers sorts each run of k ids (one layer's top-k) ascending.
func sortLayers(ids []int16, k int) {
	if k == 8 {
		for i := 0; i+8 <= len(ids); i += 8 {
			sort8((*[8]int16)(ids[i : i+8]))
		}
		return
	}
	for i := 0; i+k <= len(ids); i += k {
		s := ids[i : i+k]
		for a := 1; a < len(s); a++ {
			v := s[a]
			b := a
			for b > 0 && s[b-1] > v {
				s[b] = s[b-1]
				b--
			}
			s[b] = v
		}
	}
}

// patterns returns the histogram of the held paths for a trace of tokens
// tokens, key-sorted, and the PathSample; nil patterns with a note when
// exact mode overflowed. pathError is the target of PathSampleSize.
func (p *pathSampler) patterns(tokens int64, layers, topK int, pathError float64) ([]Pattern, PathSample, []string) {
	if p.exact != nil {
		if p.overflow {
			return nil, PathSample{}, []string{fmt.Sprintf("patterns dropped: more than %d distinct per-token paths; the cost model then counts each (token, expert) pair on its own (an upper bound on all-to-all traffic), and chain flow needs the transition counts (keep the default path error to sample the paths instead)", MaxPatterns)}
		}
		out := make([]Pattern, 0, len(p.exact))
		for _, key := range sortedKeys(p.exact) {
			src, ex := decodePatternKey(key)
			out = append(out, Pattern{Source: src, Experts: ex, Count: p.exact[key]})
		}
		return out, PathSample{Tokens: tokens, Kept: tokens}, nil
	}
	n, relErr := PathSampleSize(tokens, layers, topK, pathError)
	held := slices.Clone(p.heap)
	slices.SortFunc(held, func(a, b sampleEntry) int { return cmp.Compare(a.hash, b.hash) })
	n = min(n, int64(len(held)))
	if n < tokens {
		relErr = pathStdErr(tokens, n, topK)
	}
	held = held[:n]
	lk := p.lk
	path := func(e sampleEntry) []int16 { return p.arena[int(e.slot)*lk : int(e.slot+1)*lk] }
	compare := func(a, b sampleEntry) int {
		if c := cmp.Compare(p.source[a.slot], p.source[b.slot]); c != 0 {
			return c
		}
		return slices.Compare(path(a), path(b))
	}
	slices.SortFunc(held, compare)
	distinct := 0
	for i := range held {
		if i == 0 || compare(held[i-1], held[i]) != 0 {
			distinct++
		}
	}
	flat := make([]int16, distinct*lk)
	out := make([]Pattern, 0, distinct)
	w := float64(tokens) / float64(max(n, 1))
	for i := 0; i < len(held); {
		j := i + 1
		for j < len(held) && compare(held[i], held[j]) == 0 {
			j++
		}
		ex := flat[len(out)*lk : (len(out)+1)*lk : (len(out)+1)*lk]
		copy(ex, path(held[i]))
		c := float64(j - i)
		if n < tokens {
			c *= w
		}
		out = append(out, Pattern{Source: p.source[held[i].slot], Experts: ex, Count: c})
		i = j
	}
	ps := PathSample{Tokens: tokens, Kept: n, RelStdErr: relErr}
	var notes []string
	if ps.Sampled() {
		notes = append(notes, sampleNote(ps))
	}
	return out, ps, notes
}

// mergeNotes appends the notes of b to a that a lacks, keeping order, and
// drops any earlier note that says the paths are sampled (the caller adds
// the merged one).
func mergeNotes(a, b []string) []string {
	var out []string
	for _, n := range slices.Concat(a, b) {
		if !strings.HasPrefix(n, notePathsSampled) && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// thinPatterns returns a weighted sample of at most n of the paths that
// pats (counts adding up to tokens) describe, and the relative standard
// error the thinning adds for top-k: systematic sampling with probability
// proportional to Count over the patterns in a pseudo-random order, so every
// kept path gets the same weight tokens/n and the counts still add up to
// tokens. It is a second-phase sample of the (possibly already sampled)
// patterns: its error, (k−1)/(2√n) by Popoviciu's bound without the
// finite-population correction, adds in quadrature to the first phase's.
// The result is key-sorted; the same input gives the same output.
func thinPatterns(pats []Pattern, tokens float64, n int, topK int) ([]Pattern, float64) {
	order := make([]int, len(pats))
	prio := make([]uint64, len(pats))
	for i := range order {
		order[i] = i
		prio[i] = pathHash(int64(patternHash(pats[i])))
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(prio[a], prio[b]) })
	step := tokens / float64(n)
	// A fixed offset in [0, step): the same input gives the same sample.
	at := step * (float64(pathHash(int64(len(pats)))>>11) / (1 << 53))
	picks := make([]int, len(pats))
	var cum float64
	taken := 0
	for _, i := range order {
		cum += pats[i].Count
		for taken < n && at < cum {
			picks[i]++
			taken++
			at += step
		}
	}
	// Rounding can leave the last point just past the end.
	if taken < n && len(order) > 0 {
		picks[order[len(order)-1]] += n - taken
	}
	var out []Pattern
	for i, p := range pats {
		if picks[i] > 0 {
			out = append(out, Pattern{Source: p.Source, Experts: p.Experts, Count: float64(picks[i]) * step})
		}
	}
	w := float64(max(topK-1, 1))
	return out, w / (2 * math.Sqrt(float64(n)))
}

// patternHash is FNV-1a over a pattern's source and ids.
func patternHash(p Pattern) uint64 {
	h := uint64(14695981039346656037)
	mixIn := func(v uint32) {
		for range 4 {
			h ^= uint64(v & 0xff)
			h *= 1099511628211
			v >>= 8
		}
	}
	mixIn(uint32(p.Source))
	for _, e := range p.Experts {
		mixIn(uint32(uint16(e)))
	}
	return h
}

// thinStats returns a copy of s whose patterns are thinned to at most n
// paths (see thinPatterns), with PathSample and Notes updated; s itself
// when it has no more than n patterns.
func thinStats(s *Stats, n int) *Stats {
	if len(s.Patterns) <= n {
		return s
	}
	c := *s
	var added float64
	c.Patterns, added = thinPatterns(s.Patterns, s.Tokens, n, s.TopK)
	ps := s.PathSample
	if ps == (PathSample{}) {
		t := int64(math.Round(s.Tokens))
		ps = PathSample{Tokens: t, Kept: t}
	}
	ps.Kept = min(int64(n), ps.Kept)
	ps.RelStdErr = math.Hypot(ps.RelStdErr, added)
	c.PathSample = ps
	c.Notes = append(mergeNotes(s.Notes, nil), sampleNote(ps))
	return &c
}

// sort8 sorts 8 ids with the 19-comparator sorting network, whose
// compare-exchanges are min and max (no branches to mispredict on ids
// in random order).
func sort8(v *[8]int16) {
	cx := func(i, j int) { v[i], v[j] = min(v[i], v[j]), max(v[i], v[j]) }
	cx(0, 2)
	cx(1, 3)
	cx(4, 6)
	cx(5, 7)
	cx(0, 4)
	cx(1, 5)
	cx(2, 6)
	cx(3, 7)
	cx(0, 1)
	cx(2, 3)
	cx(4, 5)
	cx(6, 7)
	cx(2, 4)
	cx(3, 5)
	cx(1, 4)
	cx(3, 6)
	cx(1, 2)
	cx(3, 4)
	cx(5, 6)
}
