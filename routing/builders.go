package routing

import (
	"fmt"
	"math"
	"slices"
)

// tokenBuilder assembles a per-token Trace from batches of tokens (an
// SGLang forward pass, a Megatron step, a TRT-LLM iteration), possibly from
// several per-rank files. The first batch fixes the MoE layers and top-k;
// later batches must agree.
type tokenBuilder struct {
	names       []int // decoder-layer ids of the MoE layers
	modelLayers int   // num_hidden_layers, 0 when unknown
	topK        int
	experts     int // LoadOptions.Experts, or 0 to use max id + 1
	maxID       int
	ids         []int16
	source      []int32
	step        []int32
	hasStep     bool
	tokens      int
	// where names the first batch, for messages about disagreements.
	where string

	// With stream set (LoadOptions.StatsOnly) the tokens go to the
	// counters in chunks as they come: ids, source and step then hold
	// only the tokens not yet sent.
	stream bool
	opts   StatsOptions
	sb     *statsBuilder
	sent   int
	done   bool
}

// newTokenBuilder returns a builder for experts experts (0: max id + 1)
// that streams into the counters when opts.StatsOnly is set. Call close
// when done with it.
func newTokenBuilder(opts LoadOptions, experts int) *tokenBuilder {
	return &tokenBuilder{experts: experts, stream: opts.StatsOnly, opts: opts.statsOptions()}
}

// close stops the counters of a streaming builder whose stats were not
// taken (after an error).
func (b *tokenBuilder) close() {
	if b.sb != nil && !b.done {
		b.sb.abort()
		b.done = true
	}
}

// send passes the tokens not yet sent to the counters: all of them with
// force, else only once they fill a chunk.
func (b *tokenBuilder) send(force bool) {
	L, K := len(b.names), b.topK
	n := b.tokens - b.sent
	if !b.stream || n == 0 || (!force && n < b.opts.chunkTokens(L, K)) {
		return
	}
	if b.sb == nil {
		b.sb = newStatsBuilder(L, K, b.experts, 0, 0, b.opts)
	}
	ch := chunk{ids: b.ids, n: n, src: b.source, tok0: int64(b.sent), maxID: b.maxID}
	if b.hasStep {
		ch.step = b.step
	}
	b.sb.add(ch)
	// The counters may still read the slices sent: start new ones.
	b.ids, b.source, b.step, b.sent = nil, nil, nil, b.tokens
}

// stats returns the statistics of a streaming builder; nil when no token
// was added.
func (b *tokenBuilder) stats() *Stats {
	if b.tokens == 0 {
		return nil
	}
	b.send(true)
	b.done = true
	E := b.experts
	if E == 0 {
		E = b.maxID + 1
	}
	s := b.sb.stats(E)
	s.LayerNames = slices.Clone(b.names)
	s.ModelLayers = b.modelLayers
	if s.ModelLayers != 0 && s.ModelLayers <= slices.Max(s.LayerNames) {
		s.ModelLayers = 0
	}
	return s
}

// start fixes the layers and top-k on the first call and checks later
// calls against them. where says where the batch comes from ("x.pt:
// records[3]") and is used in the error.
func (b *tokenBuilder) start(names []int, modelLayers, topK int, where string) error {
	if b.names == nil {
		if len(names) == 0 {
			return fmt.Errorf("no MoE layers: every layer is dense (all ids -1 or 0)")
		}
		if topK <= 0 {
			return fmt.Errorf("top-k %d: every token needs at least one expert", topK)
		}
		b.names, b.modelLayers, b.topK, b.where = slices.Clone(names), modelLayers, topK, where
		return nil
	}
	if !slices.Equal(names, b.names) {
		return fmt.Errorf("MoE layers %v, but %s has %v: every file and record must route the same layers", names, b.where, b.names)
	}
	if modelLayers != 0 && b.modelLayers != 0 && modelLayers != b.modelLayers {
		return fmt.Errorf("a model of %d layers, but %s has %d", modelLayers, b.where, b.modelLayers)
	}
	if topK != b.topK {
		return fmt.Errorf("top-k %d, but %s has top-k %d: every file and record must route the same top-k", topK, b.where, b.topK)
	}
	b.modelLayers = max(b.modelLayers, modelLayers)
	return nil
}

// add appends T tokens; id(l, t, j) is the j-th expert of token t at MoE
// layer l (index into names) and must be in [0, 32768). It reports the
// first bad id or repeated expert through the returned error, whose text
// uses field(l, t) to say where.
func (b *tokenBuilder) add(T int, src, step int32, hasStep bool, id func(l, t, j int) int, field func(l, t int) string) error {
	L, K := len(b.names), b.topK
	if b.tokens > 0 && hasStep != b.hasStep {
		return fmt.Errorf("some batches have step ids and others not")
	}
	b.hasStep = hasStep
	maxIDs := uint64(maxTraceIDs)
	if b.stream {
		maxIDs = maxStreamIDs
	}
	if uint64(b.tokens+T)*uint64(L)*uint64(K) > maxIDs {
		return fmt.Errorf("trace larger than %d ids: split it into several files", maxIDs)
	}
	limit := math.MaxInt16 + 1
	if b.experts > 0 {
		limit = b.experts
	}
	base := len(b.ids)
	b.ids = slices.Grow(b.ids, T*L*K)[:base+T*L*K]
	for t := range T {
		for l := range L {
			row := b.ids[base+(t*L+l)*K : base+(t*L+l+1)*K]
			for j := range K {
				e := id(l, t, j)
				if e < 0 || e >= limit {
					b.ids = b.ids[:base]
					if b.experts > 0 {
						return fmt.Errorf("%s: expert %d out of range [0,%d): fix the id, or set LoadOptions.Experts to the model's experts per layer", field(l, t), e, limit)
					}
					return fmt.Errorf("%s: expert %d out of range [0,%d): ids must be non-negative int16", field(l, t), e, limit)
				}
				if slices.Contains(row[:j], int16(e)) {
					b.ids = b.ids[:base]
					return fmt.Errorf("%s: expert %d appears twice in the token's top-k", field(l, t), e)
				}
				row[j] = int16(e)
				b.maxID = max(b.maxID, e)
			}
		}
		b.source = append(b.source, src)
		b.step = append(b.step, step)
	}
	b.tokens += T
	b.send(false)
	return nil
}

// trace returns the assembled trace; nil when no token was added.
func (b *tokenBuilder) trace() *Trace {
	if b.tokens == 0 {
		return nil
	}
	t := &Trace{
		Tokens:      b.tokens,
		Layers:      len(b.names),
		TopK:        b.topK,
		Experts:     b.experts,
		IDs:         b.ids,
		Source:      b.source,
		LayerNames:  b.names,
		ModelLayers: b.modelLayers,
	}
	if t.Experts == 0 {
		t.Experts = b.maxID + 1
	}
	if b.hasStep {
		t.Step = b.step
	}
	if !slices.ContainsFunc(t.Source, func(r int32) bool { return r >= 0 }) {
		t.Source = nil
	}
	if t.ModelLayers != 0 && t.ModelLayers <= slices.Max(t.LayerNames) {
		t.ModelLayers = 0
	}
	return t
}

// countBuilder adds per-step, per-source count matrices whose rows are
// decoder layers, for the count-only dumps (SGLang stat and per_pass,
// TRT-LLM, vLLM).
type countBuilder struct {
	experts     int
	modelLayers int   // rows are decoder layers 0..modelLayers-1 when > 0
	rowNames    []int // otherwise the decoder id of each row
	steps       map[int64][][]float64
	sources     map[int][][]float64
	total       [][]float64
	noSteps     bool
}

func newCountBuilder(rows, experts, modelLayers int, rowNames []int) *countBuilder {
	return &countBuilder{
		experts: experts, modelLayers: modelLayers, rowNames: rowNames,
		steps: map[int64][][]float64{}, sources: map[int][][]float64{},
		total: newMatrix(rows, experts),
	}
}

// add adds v to (row, e) in the given step and source (src < 0: unknown).
func (c *countBuilder) add(step int64, src, row, e int, v float64) {
	c.total[row][e] += v
	if !c.noSteps {
		m, ok := c.steps[step]
		if !ok {
			m = newMatrix(len(c.total), c.experts)
			c.steps[step] = m
		}
		m[row][e] += v
	}
	if src >= 0 && c.sources != nil {
		m, ok := c.sources[src]
		if !ok {
			if (len(c.sources)+1)*len(c.total)*c.experts > maxDenseEntries {
				c.sources = nil // too many ranks to keep per-source loads
				return
			}
			m = newMatrix(len(c.total), c.experts)
			c.sources[src] = m
		}
		m[row][e] += v
	}
}

// stats drops the rows that are zero in total (dense layers) unless
// keepZero, and returns the stats; topK sets TopK and Tokens.
func (c *countBuilder) stats(topK int, keepZero bool) (*Stats, error) {
	var keep []int
	for r, row := range c.total {
		if keepZero || slices.ContainsFunc(row, func(v float64) bool { return v != 0 }) {
			keep = append(keep, r)
		}
	}
	if len(keep) == 0 {
		return nil, fmt.Errorf("every layer is all zeros: no token was recorded (set LoadOptions.KeepZeroLayers to keep them)")
	}
	pick := func(m [][]float64) [][]float64 {
		out := make([][]float64, len(keep))
		for i, r := range keep {
			out[i] = m[r]
		}
		return out
	}
	s := StatsFromLoad(pick(c.total), topK)
	s.Experts = c.experts
	s.ModelLayers = c.modelLayers
	names := make([]int, len(keep))
	for i, r := range keep {
		names[i] = r
		if c.rowNames != nil {
			names[i] = c.rowNames[r]
		}
	}
	if c.rowNames != nil || len(keep) != len(c.total) {
		s.LayerNames = names
	}
	if !c.noSteps && len(c.steps) > 0 {
		ids := make([]int64, 0, len(c.steps))
		for id := range c.steps {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			s.StepLoad = append(s.StepLoad, pick(c.steps[id]))
		}
	}
	if len(c.sources) > 0 {
		n := 0
		for r := range c.sources {
			n = max(n, r+1)
		}
		if n*len(keep)*c.experts <= maxDenseEntries {
			s.SourceLoad = make([][][]float64, n)
			for r := range n {
				if m, ok := c.sources[r]; ok {
					s.SourceLoad[r] = pick(m)
				} else {
					s.SourceLoad[r] = newMatrix(len(keep), c.experts)
				}
			}
		}
	}
	return s, nil
}
