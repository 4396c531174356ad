package routing

import (
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"slices"
	"sync"
)

// maxStepEntries bounds steps × Layers × Experts for the StepLoad of a
// per-token trace (2^25 entries, 256 MiB): a trace whose every token is its
// own step would otherwise cost Experts/TopK times its own size.
const maxStepEntries = 1 << 25

// counter accumulates the statistics of a per-token trace chunk by chunk,
// without holding the trace: the exact counts (Load, Transitions,
// CoActivation, StepLoad, SourceLoad) and a path sample. When the number of
// experts is not known in advance the matrices are laid out with a stride
// that grows with the largest id seen and are compacted by stats.
//
// Transitions and co-activation are counted layer by layer over a chunk of
// tokens in uint32, so that one layer's E×E matrices stay in cache while
// the chunk's k×k pairs are added; they are flushed into float64 long
// before a count could overflow.
type counter struct {
	L, K  int
	mode  TransitionMode
	limit int // ids must be below it (Experts, or 2^15)
	fixed bool
	// stride is the expert dimension of every matrix, > every id seen.
	stride int
	maxID  int
	tokens int64

	load      []float64 // L × stride
	dense     bool      // transitions and co-activation are counted
	tooBig    bool      // they were dropped: Layers × Experts² > 2^24
	trans     []uint32  // (L−1) × stride²
	co        []uint32  // L × stride², entry a·stride+b for a < b
	transF    []float64 // flushed counts; nil until the first flush
	coF       []float64
	unflushed int64 // tokens counted in trans and co since the last flush

	steps     map[int32][]float64 // step → L × stride
	stepsGone bool
	src       [][]float64 // rank → L × stride, nil until the rank is seen
	srcGone   bool
	hasSrc    bool

	sampler *pathSampler // nil: no patterns
	lm      []int16      // scratch: a chunk laid out layer by layer
	stepM   [][]float64  // scratch: each token's step matrix
	srcM    [][]float64  // scratch: each token's source matrix
}

// newCounter starts a counter for L layers of top-k ids below limit
// (experts > 0: exactly that many experts; 0: unknown, ids below 2^15).
// capacity is the path sample size (-1: every distinct path, exact; 0: no
// patterns).
func newCounter(L, K, experts int, mode TransitionMode, capacity int) *counter {
	c := &counter{L: L, K: K, mode: mode, limit: math.MaxInt16 + 1, maxID: -1}
	if experts > 0 {
		c.limit, c.fixed = experts, true
		c.setStride(experts)
	}
	if capacity != 0 {
		c.sampler = newPathSampler(L, K, capacity)
	}
	return c
}

// denseFits reports whether L × e² entries are within maxDenseEntries.
func (c *counter) denseFits(e int) bool {
	return uint64(c.L)*uint64(e)*uint64(e) <= maxDenseEntries
}

// setStride allocates or re-lays out every matrix for stride e.
func (c *counter) setStride(e int) {
	old := c.stride
	if e == old {
		return
	}
	L := c.L
	c.load = restride(c.load, L, old, e)
	for st, m := range c.steps {
		c.steps[st] = restride(m, L, old, e)
	}
	for r, m := range c.src {
		if m != nil {
			c.src[r] = restride(m, L, old, e)
		}
	}
	if old == 0 {
		c.dense = c.denseFits(e)
		c.tooBig = !c.dense
	}
	if !c.denseFits(c.maxID + 1) {
		c.dropDense()
	}
	if c.dense {
		c.trans = restride2(c.trans, max(L-1, 0), old, e)
		c.co = restride2(c.co, L, old, e)
		if c.transF != nil {
			c.transF = restride2(c.transF, max(L-1, 0), old, e)
			c.coF = restride2(c.coF, L, old, e)
		}
	}
	c.stride = e
	c.checkSources(e)
	c.checkSteps(e)
}

func (c *counter) dropDense() {
	c.dense, c.tooBig = false, true
	c.trans, c.co, c.transF, c.coF = nil, nil, nil, nil
}

// restride copies rows × old entries of m into rows × e (e ≥ old).
func restride[T uint32 | float64](m []T, rows, old, e int) []T {
	if m == nil && old != 0 {
		return nil
	}
	out := make([]T, rows*e)
	for r := 0; r < rows && old > 0; r++ {
		copy(out[r*e:r*e+old], m[r*old:(r+1)*old])
	}
	return out
}

// restride2 re-lays out rows square matrices from old × old to e × e.
func restride2[T uint32 | float64](m []T, rows, old, e int) []T {
	if m == nil && old != 0 {
		return nil
	}
	out := make([]T, rows*e*e)
	for r := 0; r < rows && old > 0; r++ {
		for a := range old {
			copy(out[r*e*e+a*e:r*e*e+a*e+old], m[r*old*old+a*old:r*old*old+(a+1)*old])
		}
	}
	return out
}

// grow makes room for ids up to maxID: the next power of two, or the
// largest stride whose dense matrices fit when that is in between.
func (c *counter) grow(maxID int) {
	c.maxID = max(c.maxID, maxID)
	if maxID < c.stride {
		if c.dense && !c.denseFits(c.maxID+1) {
			c.dropDense()
		}
		return
	}
	e := 1 << bits.Len(uint(maxID))
	e = max(min(e, c.limit), maxID+1)
	if (c.dense || c.stride == 0) && !c.denseFits(e) && c.denseFits(maxID+1) {
		e = max(min(int(math.Sqrt(maxDenseEntries/float64(c.L))), c.limit), maxID+1)
		for !c.denseFits(e) {
			e--
		}
	}
	c.setStride(e)
}

// checkSources drops the per-source loads when ranks × L × e would exceed
// maxDenseEntries.
func (c *counter) checkSources(e int) {
	if !c.srcGone && uint64(len(c.src))*uint64(c.L)*uint64(e) > maxDenseEntries {
		c.srcGone, c.src = true, nil
	}
}

func (c *counter) checkSteps(e int) {
	if !c.stepsGone && uint64(len(c.steps))*uint64(c.L)*uint64(e) > maxStepEntries {
		c.stepsGone, c.steps = true, nil
	}
}

// add counts n tokens: ids holds n × L × K valid ids (each below the
// stride after grow), src their source ranks (nil: unknown, -1 unknown),
// step their steps (nil: none), tok0 the index in the trace of the first.
func (c *counter) add(ids []int16, n int, src, step []int32, tok0 int64) {
	if n == 0 {
		return
	}
	L, K, E := c.L, c.K, c.stride
	// The per-step and per-source matrix of each token, nil where none.
	var stepM, srcM [][]float64
	if step != nil && !c.stepsGone {
		if c.steps == nil {
			c.steps = map[int32][]float64{}
		}
		stepM = c.rows(&c.stepM, n)
		for t := range n {
			m := c.steps[step[t]]
			if m == nil {
				if uint64(len(c.steps)+1)*uint64(L)*uint64(E) > maxStepEntries {
					c.stepsGone, c.steps, stepM = true, nil, nil
					break
				}
				m = make([]float64, L*E)
				c.steps[step[t]] = m
			}
			stepM[t] = m
		}
	}
	if src != nil {
		srcM = c.rows(&c.srcM, n)
		for t := range n {
			r := src[t]
			if r < 0 {
				continue
			}
			c.hasSrc = true
			if c.srcGone {
				srcM = nil
				break
			}
			if int(r) >= len(c.src) {
				if uint64(r+1)*uint64(L)*uint64(E) > maxDenseEntries {
					c.srcGone, c.src, srcM = true, nil, nil
					break
				}
				c.src = append(c.src, make([][]float64, int(r)+1-len(c.src))...)
			}
			if c.src[r] == nil {
				c.src[r] = make([]float64, L*E)
			}
			srcM[t] = c.src[r]
		}
	}
	lm := c.transpose(ids, n)
	if c.dense {
		if c.unflushed+int64(n) > math.MaxUint32 {
			c.flush()
		}
		c.unflushed += int64(n)
		c.countDense(lm, n)
	} else {
		for l := range L {
			countLoad(c.load[l*E:(l+1)*E], lm[l*n*K:(l+1)*n*K])
		}
	}
	for _, ms := range [][][]float64{stepM, srcM} {
		if ms == nil {
			continue
		}
		// Layer by layer, as above: one layer's rows of every matrix
		// are few enough to stay in cache.
		for l := range L {
			sets := lm[l*n*K : (l+1)*n*K]
			for t, m := range ms {
				if m != nil {
					countLoad(m[l*E:(l+1)*E], sets[t*K:(t+1)*K])
				}
			}
		}
	}
	if c.sampler != nil {
		LK := L * K
		for t := range n {
			s := int32(-1)
			if src != nil {
				s = src[t]
			}
			c.sampler.offer(tok0+int64(t), s, ids[t*LK:(t+1)*LK])
		}
	}
	c.tokens += int64(n)
}

// rows returns (*buf)[:n] cleared, growing *buf when needed.
func (c *counter) rows(buf *[][]float64, n int) [][]float64 {
	if cap(*buf) < n {
		*buf = make([][]float64, n)
	}
	r := (*buf)[:n]
	clear(r)
	return r
}

// countLoad adds every id of sets to row.
func countLoad(row []float64, sets []int16) {
	for _, e := range sets {
		row[e]++
	}
}

// transpose lays n tokens' ids out layer by layer, [L][n][K], in a
// scratch buffer, so that counting one layer reads contiguous memory.
func (c *counter) transpose(ids []int16, n int) []int16 {
	L, K := c.L, c.K
	if need := n * L * K; len(c.lm) < need {
		c.lm = make([]int16, need)
	}
	lm := c.lm[:n*L*K]
	if K == 8 {
		// DeepSeek's and Qwen's top-8: whole-set moves, not memmove
		// calls for 16 bytes.
		for t := range n {
			row := ids[t*L*K : (t+1)*L*K]
			for l := range L {
				*(*[8]int16)(lm[(l*n+t)*8:]) = [8]int16(row[l*8:])
			}
		}
		return lm
	}
	for t := range n {
		row := ids[t*L*K : (t+1)*L*K]
		for l := range L {
			dst, src := lm[(l*n+t)*K:(l*n+t+1)*K], row[l*K:(l+1)*K]
			for j := range dst {
				dst[j] = src[j]
			}
		}
	}
	return lm
}

// countDense adds n tokens, laid out [L][n][K], to Load, CoActivation and
// Transitions, one layer at a time so that the layer's matrices stay in
// cache while all n tokens' pairs are added.
func (c *counter) countDense(lm []int16, n int) {
	L, K := c.L, c.K
	// Every layer counts into its own rows: blocks of layers count on
	// goroutines of their own when the chunk is worth it (integer counts,
	// so the result is the same in any order).
	w := min(runtime.GOMAXPROCS(0), L)
	if w < 2 || n*K*L < parallelCount {
		c.countLayers(lm, n, 0, L)
		return
	}
	var wg sync.WaitGroup
	for i := range w {
		wg.Go(func() { c.countLayers(lm, n, i*L/w, (i+1)*L/w) })
	}
	wg.Wait()
}

// parallelCount is the fewest ids in a chunk (tokens × k × layers) that
// countDense splits over goroutines: a chunk of a few thousand tokens of a
// production model, where a goroutine's start is a small part of a layer's
// counting.
const parallelCount = 1 << 16

// countLayers is countDense for layers [from, to).
func (c *counter) countLayers(lm []int16, n, from, to int) {
	L, K, E := c.L, c.K, c.stride
	EE, nK := E*E, n*K
	for l := from; l < to; l++ {
		load := c.load[l*E : (l+1)*E]
		co := c.co[l*EE : (l+1)*EE]
		cur := lm[l*nK : (l+1)*nK]
		countCo(load, co, cur, K, E)
		if l+1 == L {
			continue
		}
		tr := c.trans[l*EE : (l+1)*EE]
		nxt := lm[(l+1)*nK : (l+2)*nK]
		if c.mode == TransitionTop1 {
			for i := 0; i < nK; i += K {
				tr[int(cur[i])*E+int(nxt[i])]++
			}
		} else {
			countTrans(tr, cur, nxt, K, E)
		}
	}
}

// countCo adds one layer's tokens (sets of k ids, back to back) to its
// load and co-activation matrix. It is a function
// of its own so that the compiler keeps its few variables in registers.
func countCo(load []float64, co []uint32, sets []int16, K, E int) {
	for i := 0; i+K <= len(sets); i += K {
		s := sets[i : i+K : i+K]
		for a, xv := range s {
			x := int(xv)
			load[x]++
			// Both halves: a comparison to pick one would be a branch
			// mispredicted half the time, slower than the second count.
			row := co[x*E:]
			row = row[:E]
			for _, yv := range s[a+1:] {
				y := int(yv)
				row[y]++
				co[y*E+x]++
			}
		}
	}
}

// countTrans adds the k×k pairs of each token's sets at two adjacent
// layers to the transition matrix.
func countTrans(tr []uint32, cur, nxt []int16, K, E int) {
	for i := 0; i+K <= len(cur) && i+K <= len(nxt); i += K {
		b := nxt[i : i+K : i+K]
		for _, xv := range cur[i : i+K : i+K] {
			row := tr[int(xv)*E:]
			row = row[:E]
			for _, yv := range b {
				row[yv]++
			}
		}
	}
}

// flush moves the uint32 counts into float64.
func (c *counter) flush() {
	if c.transF == nil {
		c.transF = make([]float64, len(c.trans))
		c.coF = make([]float64, len(c.co))
	}
	for i, v := range c.trans {
		c.transF[i] += float64(v)
	}
	for i, v := range c.co {
		c.coF[i] += float64(v)
	}
	clear(c.trans)
	clear(c.co)
	c.unflushed = 0
}

// merge adds o (counted over other tokens of the same trace, with the
// same shape and options) into c; o is not usable afterwards.
func (c *counter) merge(o *counter) {
	if o.tokens == 0 {
		return
	}
	c.grow(o.maxID)
	e := max(c.stride, o.stride)
	c.setStride(e)
	o.setStride(e)
	if c.dense != o.dense {
		c.dropDense()
		o.dropDense()
	}
	c.tooBig = c.tooBig || o.tooBig
	for i, v := range o.load {
		c.load[i] += v
	}
	switch {
	case !c.dense:
	case o.transF == nil && c.unflushed+o.unflushed <= math.MaxUint32:
		// Add the uint32 counts directly: no float64 copy per worker.
		for i, v := range o.trans {
			c.trans[i] += v
		}
		for i, v := range o.co {
			c.co[i] += v
		}
		c.unflushed += o.unflushed
	default:
		c.flush()
		o.flush()
		for i, v := range o.transF {
			c.transF[i] += v
		}
		for i, v := range o.coF {
			c.coF[i] += v
		}
	}
	c.hasSrc = c.hasSrc || o.hasSrc
	if o.srcGone {
		c.srcGone, c.src = true, nil
	}
	if !c.srcGone {
		if len(o.src) > len(c.src) {
			c.src = append(c.src, make([][]float64, len(o.src)-len(c.src))...)
		}
		for r, m := range o.src {
			switch {
			case m == nil:
			case c.src[r] == nil:
				c.src[r] = m
			default:
				for i, v := range m {
					c.src[r][i] += v
				}
			}
		}
		c.checkSources(c.stride)
	}
	if o.stepsGone {
		c.stepsGone, c.steps = true, nil
	}
	if !c.stepsGone && o.steps != nil {
		if c.steps == nil {
			c.steps = map[int32][]float64{}
		}
		for st, m := range o.steps {
			if cm := c.steps[st]; cm != nil {
				for i, v := range m {
					cm[i] += v
				}
			} else {
				c.steps[st] = m
			}
		}
		c.checkSteps(c.stride)
	}
	if c.sampler != nil && o.sampler != nil {
		c.sampler.merge(o.sampler)
	}
	c.tokens += o.tokens
}

// stats returns the statistics for experts experts (0: the largest id +
// 1), with the notes for what was dropped. pathError is the target of
// PathSampleSize.
func (c *counter) stats(experts int, pathError float64) *Stats {
	E := experts
	if E == 0 {
		E = c.maxID + 1
	}
	if E > c.stride {
		c.setStride(E)
	}
	L, S := c.L, c.stride
	s := &Stats{Layers: L, Experts: E, TopK: c.K, Tokens: float64(c.tokens), TransitionMode: c.mode}
	s.Load = compact(c.load, L, S, E)
	if c.dense && !c.denseFits(E) {
		c.dropDense()
	}
	if c.dense {
		s.Transitions = make([][]float64, max(L-1, 0))
		for l := range s.Transitions {
			s.Transitions[l] = c.square(c.trans, c.transF, l, E)
		}
		s.CoActivation = make([][]float64, L)
		for l := range s.CoActivation {
			s.CoActivation[l] = c.square(c.co, c.coF, l, E)
		}
	}
	if c.tooBig {
		s.Notes = append(s.Notes, fmt.Sprintf("transitions and co-activation dropped: %d layers × %d² experts exceed %d entries; chain flow then needs per-token paths (patterns), and stats shows no transition shares", L, E, maxDenseEntries))
	}
	c.checkSteps(E)
	if c.stepsGone {
		s.Notes = append(s.Notes, fmt.Sprintf("per-step loads dropped: steps × %d layers × %d experts exceed %d entries; backtest and --across then cannot use this trace's steps (record fewer, longer steps)", L, E, maxStepEntries))
	} else if c.steps != nil {
		keys := make([]int32, 0, len(c.steps))
		for st := range c.steps {
			keys = append(keys, st)
		}
		slices.Sort(keys)
		s.StepLoad = make([][][]float64, len(keys))
		for i, st := range keys {
			s.StepLoad[i] = compact(c.steps[st], L, S, E)
		}
	}
	c.checkSources(E)
	switch {
	case c.srcGone:
		s.Notes = append(s.Notes, fmt.Sprintf("per-source loads dropped: source ranks × %d layers × %d experts exceed %d entries; dispatches that follow the source (static, local) then take tokens as spread evenly over the ranks (check the source ranks: they must be small integers)", L, E, maxDenseEntries))
	case c.hasSrc:
		s.SourceLoad = make([][][]float64, len(c.src))
		for r, m := range c.src {
			if m == nil {
				s.SourceLoad[r] = newMatrix(L, E)
			} else {
				s.SourceLoad[r] = compact(m, L, S, E)
			}
		}
	}
	if c.sampler != nil {
		var notes []string
		s.Patterns, s.PathSample, notes = c.sampler.patterns(c.tokens, L, c.K, pathError)
		s.Notes = append(s.Notes, notes...)
	}
	return s
}

// compact copies an L × stride matrix into [L][E].
func compact(m []float64, L, stride, E int) [][]float64 {
	out := newMatrix(L, E)
	for l := range out {
		copy(out[l], m[l*stride:l*stride+E])
	}
	return out
}

// square returns layer l's E × E matrix of the counts in u plus the
// flushed ones in f (nil when never flushed), compacted from the stride.
func (c *counter) square(u []uint32, f []float64, l, E int) []float64 {
	S := c.stride
	out := make([]float64, E*E)
	for a := range E {
		row := out[a*E : (a+1)*E]
		base := l*S*S + a*S
		for b, v := range u[base : base+E] {
			row[b] = float64(v)
		}
		if f != nil {
			for b, v := range f[base : base+E] {
				row[b] += v
			}
		}
	}
	return out
}
