package replay

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// Defaults of WorkloadOptions.
const (
	// DefaultBatchTokens is the batch size used to expand count-only stats.
	DefaultBatchTokens = 4096
	// DefaultIterations is the number of batches sampled from count-only stats.
	DefaultIterations = 4
	// DefaultSeed seeds the sampler of count-only stats.
	DefaultSeed = 0x6d6f65 // "moe"
)

// Input is the routing data a Workload replays: a per-token Trace, or
// count-only Stats (Fiddler, EPLB/SGLang logical_count, OLMoE). When Trace is
// set, Stats is ignored.
type Input struct {
	Trace *routing.Trace
	Stats *routing.Stats
}

// WorkloadOptions are the optional settings of NewWorkload. The zero value
// replays a whole trace as one batch, or samples DefaultIterations batches of
// DefaultBatchTokens tokens from stats with DefaultSeed.
type WorkloadOptions struct {
	// BatchTokens is the number of tokens per iteration (one forward pass
	// through every MoE layer). For a Trace, 0 makes the whole trace one
	// batch; otherwise the trace is cut into consecutive batches of
	// BatchTokens tokens and a trailing partial batch is dropped (a trace
	// shorter than BatchTokens is one batch). For Stats, 0 means
	// DefaultBatchTokens.
	BatchTokens int
	// Iterations caps the number of batches of a Trace (0: all) and is the
	// number of batches sampled from Stats (0: DefaultIterations).
	Iterations int
	// Seed seeds the PCG generator that samples batches from Stats; 0 means
	// DefaultSeed. Traces are not sampled.
	Seed uint64
	// TopK is the routing top-k for Stats that do not state it
	// (Stats.TopK == 0); ignored otherwise.
	TopK int
	// Dispatch is how tokens pick among an expert's copies. Under
	// placement.DispatchLocal each expert's tokens split over its copies
	// by the shares local dispatch gives when every GPU sources the same
	// number of tokens (placement.LocalFractions), rounded by largest
	// remainders; GPUsPerNode must then be set and the plan must not carry
	// SlotShare.
	// Every other per-source dispatch (SGLang's tables and dynamic
	// dispatch) splits each batch's tokens of an expert by where they come
	// from, as costmodel.NewSplitter says (sources from the batch's
	// SourceLoad, an equal share from every GPU without them); Layout then
	// says where the layers sit among the decoder layers (SGLang's table is
	// dealt over every decoder layer's row).
	// Under placement.DispatchVLLM a trace with source ranks is counted
	// token by token (vLLM's hash of each token's row in its rank's
	// forward pass, costmodel.VLLMHashCounts): each batch is every rank's
	// forward pass, so a token's row is its index among its rank's tokens
	// in the batch, as routing.Trace.TokenOrder numbers them on the batch
	// (restarting at every step of the trace, cut by PassTokens). That
	// needs home flow and every source rank below the plan's GPUs, as
	// costmodel counts the hash (costmodel.HashOrder); count-only stats,
	// a trace without sources, or chain flow take the even split, the
	// hash's expectation (Workload.HashErr says why).
	Dispatch    placement.Dispatch
	GPUsPerNode int
	Layout      placement.Layout
	// PassTokens, under vLLM's dispatch, cuts each rank's tokens of a
	// batch into forward passes of PassTokens tokens (a token's row is
	// taken modulo PassTokens); 0: the batch (or a step of the trace in
	// it) is one pass. Negative is an error.
	PassTokens int
	// Flow is the flow the workload is scored in; vLLM's hash is counted
	// token by token only in costmodel.FlowHome (the zero value), where a
	// token has one source rank.
	Flow costmodel.Flow
}

// Workload is the work every GPU does in every layer of every iteration
// under one plan: how many tokens reach each physical slot (expert copy).
type Workload struct {
	// Plan is the placement replayed; Workload does not modify it.
	Plan *placement.Plan
	// TopK is the routing top-k.
	TopK int
	// Sampled reports whether the batches were sampled from count-only stats
	// (true) or cut from a per-token trace (false).
	Sampled bool
	// Tokens[i] is the number of tokens in iteration i.
	Tokens []int
	// SlotTokens[i][l][s] is the number of tokens routed to slot s of layer l
	// in iteration i. Tokens of an expert with c copies follow the plan's
	// SlotShare when set, the dispatch's shares (WorkloadOptions.Dispatch)
	// or vLLM's hash token by token (CountsHash), else are split evenly over
	// its slots in slot order; the first (n mod c) slots get one more.
	SlotTokens [][][]int
	// CountsHash reports that SlotTokens count vLLM's hash token by token
	// (WorkloadOptions.Dispatch vllm on a trace with source ranks); tokens
	// of unknown source then take the even split of their expert's slots,
	// and Stats carry each batch's token order (routing.Stats.Order), so
	// that the modeled communication counts the hash too.
	CountsHash bool
	// HashErr, under vLLM's dispatch without CountsHash, says why each
	// copy takes the even split, the hash's expectation; nil otherwise.
	HashErr error
	// Stats[i] are the routing statistics of iteration i's batch, which the
	// backends pass to costmodel.Evaluate to model communication.
	Stats []*routing.Stats

	// shares[l], under local dispatch, is the plan's layer l with SlotShare
	// set to the local-dispatch shares; nil otherwise.
	shares []placement.LayerPlan
	// split, under the other per-source dispatches, is the dispatch bound
	// to the plan; nil otherwise.
	split costmodel.Splitter
}

// newWorkload starts an empty workload, preparing local-dispatch shares.
func newWorkload(plan *placement.Plan, k int, sampled bool, opts WorkloadOptions) (*Workload, error) {
	w := &Workload{Plan: plan, TopK: k, Sampled: sampled}
	switch {
	case !opts.Dispatch.Valid():
		return nil, fmt.Errorf("replay: unknown dispatch %v", opts.Dispatch)
	case !opts.Dispatch.PerSource():
		return w, nil
	case opts.Dispatch != placement.DispatchLocal:
		for l, lp := range plan.Layers {
			if lp.SlotShare != nil {
				return nil, fmt.Errorf("replay: plan layer %d carries slot shares, but %s dispatch decides the split; use dispatch even", l, opts.Dispatch)
			}
		}
		sp, err := costmodel.NewSplitter(opts.Dispatch, plan, plan.GPUs, opts.GPUsPerNode, opts.Layout)
		if err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		w.split = sp
		return w, nil
	}
	for l, lp := range plan.Layers {
		if lp.SlotShare != nil {
			return nil, fmt.Errorf("replay: plan layer %d carries slot shares, but local dispatch decides the split; use dispatch even", l)
		}
		frac, err := placement.LocalFractions(lp, plan.Experts, plan.GPUs, opts.GPUsPerNode)
		if err != nil {
			return nil, fmt.Errorf("replay: local dispatch, layer %d: %w", l, err)
		}
		S := len(lp.SlotExpert)
		sh := make([]float64, S)
		for h := 0; h < plan.GPUs; h++ {
			for s := range sh {
				sh[s] += frac[h*S+s] / float64(plan.GPUs)
			}
		}
		q := lp
		q.SlotShare = sh
		w.shares = append(w.shares, q)
	}
	return w, nil
}

// NewWorkload builds the workload of plan under src. It checks that the plan
// fits the routing data (same layer and expert counts, a valid placement)
// and returns an error naming the mismatch otherwise.
func NewWorkload(plan *placement.Plan, src Input, opts WorkloadOptions) (*Workload, error) {
	if plan == nil {
		return nil, errors.New("replay: nil plan")
	}
	if opts.BatchTokens < 0 || opts.Iterations < 0 {
		return nil, fmt.Errorf("replay: negative batch size %d or iteration count %d", opts.BatchTokens, opts.Iterations)
	}
	if opts.PassTokens < 0 {
		return nil, fmt.Errorf("replay: pass tokens %d, want ≥ 0 (0: a batch is one forward pass)", opts.PassTokens)
	}
	switch {
	case src.Trace != nil:
		return fromTrace(plan, src.Trace, opts)
	case src.Stats != nil:
		return fromStats(plan, src.Stats, opts)
	}
	return nil, errors.New("replay: input has neither a trace nor stats")
}

func checkPlan(plan *placement.Plan, layers, experts int) error {
	if plan.Experts != experts || len(plan.Layers) != layers {
		return fmt.Errorf("replay: plan has %d layers × %d experts but the routing data has %d × %d; use a plan made for this model", len(plan.Layers), plan.Experts, layers, experts)
	}
	if err := plan.Validate(placement.ValidateOptions{Experts: experts, Layers: layers}); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	return nil
}

func fromTrace(plan *placement.Plan, t *routing.Trace, opts WorkloadOptions) (*Workload, error) {
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if t.Tokens == 0 {
		return nil, errors.New("replay: the trace has no tokens")
	}
	if err := checkPlan(plan, t.Layers, t.Experts); err != nil {
		return nil, err
	}
	b := opts.BatchTokens
	if b == 0 || b > t.Tokens {
		b = t.Tokens
	}
	n := t.Tokens / b
	if opts.Iterations > 0 && opts.Iterations < n {
		n = opts.Iterations
	}
	w, err := newWorkload(plan, t.TopK, false, opts)
	if err != nil {
		return nil, err
	}
	batches := make([]*routing.Trace, n)
	sts := make([]*routing.Stats, n)
	for i := range n {
		batches[i] = t.Slice(i*b, (i+1)*b)
		sts[i] = batches[i].Stats(routing.StatsOptions{})
	}
	if opts.Dispatch == placement.DispatchVLLM {
		w.HashErr = hashOrders(batches, sts, plan.GPUs, opts)
		w.CountsHash = w.HashErr == nil
	}
	for l, lp := range plan.Layers {
		if w.CountsHash && lp.SlotShare != nil {
			return nil, fmt.Errorf("replay: plan layer %d carries slot shares, but vllm dispatch decides the split; use dispatch even", l)
		}
	}
	for _, st := range sts {
		w.add(b, st.Load, st)
	}
	return w, nil
}

// hashOrders attaches to every batch's statistics sts[i] the token order of
// batches[i] (rows cut by opts.PassTokens) when vLLM's hash can be counted
// on all of them for G GPUs (costmodel.HashOrder), and otherwise attaches
// none and says why.
func hashOrders(batches []*routing.Trace, sts []*routing.Stats, G int, opts WorkloadOptions) error {
	if opts.Flow != costmodel.FlowHome {
		return errors.New("in chain flow a token has no single source rank")
	}
	for i, bt := range batches {
		o, err := bt.TokenOrder(opts.PassTokens)
		if err == nil {
			sts[i].Order = o
			err = costmodel.HashOrder(sts[i], G)
		}
		if err != nil {
			for _, st := range sts {
				st.Order = nil
			}
			return fmt.Errorf("batch %d: %w", i, err)
		}
	}
	return nil
}

func fromStats(plan *placement.Plan, s *routing.Stats, opts WorkloadOptions) (*Workload, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if err := checkPlan(plan, s.Layers, s.Experts); err != nil {
		return nil, err
	}
	k := s.TopK
	if k == 0 {
		k = opts.TopK
	}
	if k <= 0 || k > s.Experts {
		return nil, fmt.Errorf("replay: top-k %d: the stats do not state a usable top-k; set WorkloadOptions.TopK (1..%d)", k, s.Experts)
	}
	b, iters, seed := opts.BatchTokens, opts.Iterations, opts.Seed
	if b == 0 {
		b = DefaultBatchTokens
	}
	if iters == 0 {
		iters = DefaultIterations
	}
	if seed == 0 {
		seed = DefaultSeed
	}
	// Cumulative expert shares per layer.
	cum := make([][]float64, s.Layers)
	for l := range s.Layers {
		cum[l] = make([]float64, s.Experts)
		var acc float64
		for e, v := range s.Load[l] {
			acc += v
			cum[l][e] = acc
		}
		if acc <= 0 {
			return nil, fmt.Errorf("replay: layer %d has no load to sample from", l)
		}
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	w, err := newWorkload(plan, k, true, opts)
	if err != nil {
		return nil, err
	}
	for range iters {
		load := make([][]float64, s.Layers)
		for l := range s.Layers {
			load[l] = make([]float64, s.Experts)
			c := cum[l]
			total := c[len(c)-1]
			for range b * k {
				u := rng.Float64() * total
				e := sort.Search(len(c), func(j int) bool { return c[j] > u })
				if e == len(c) {
					e--
				}
				load[l][e]++
			}
		}
		st := routing.StatsFromLoad(load, k)
		st.LayerNames = s.LayerNames
		if s.Transitions != nil && s.Tokens > 0 {
			// Chain flow needs transitions; scale the source's to the batch.
			f := float64(b) / s.Tokens
			st.Transitions = make([][]float64, len(s.Transitions))
			for l, row := range s.Transitions {
				st.Transitions[l] = make([]float64, len(row))
				for j, v := range row {
					st.Transitions[l][j] = v * f
				}
			}
			st.TransitionMode = s.TransitionMode
		}
		w.add(b, load, st)
	}
	return w, nil
}

// add appends one iteration with per-expert loads load[l][e].
func (w *Workload) add(tokens int, load [][]float64, st *routing.Stats) {
	slots := make([][]int, len(w.Plan.Layers))
	for l, lp := range w.Plan.Layers {
		switch {
		case w.shares != nil:
			lp = w.shares[l]
		case w.split != nil:
			lp = w.sourceShares(l, lp, load[l], st)
		case w.CountsHash:
			o := st.Order
			slots[l] = hashSlots(lp, load[l], func(e, r int) []int32 { return o.Of(l, e, r) }, o.Ranks)
			continue
		}
		slots[l] = splitSlots(lp, load[l])
	}
	w.Tokens = append(w.Tokens, tokens)
	w.SlotTokens = append(w.SlotTokens, slots)
	w.Stats = append(w.Stats, st)
}

// sourceShares is layer l of the plan with SlotShare set to the shares
// w.split gives this batch's tokens: every slot of expert e on GPU g takes
// Σ_h (share of e's tokens from source h) · w_h[e][g] / (e's slots on g).
func (w *Workload) sourceShares(l int, lp placement.LayerPlan, load []float64, st *routing.Stats) placement.LayerPlan {
	G, E := w.Plan.GPUs, w.Plan.Experts
	bySlot := make([][]int, E)
	for s, e := range lp.SlotExpert {
		bySlot[e] = append(bySlot[e], s)
	}
	out := lp
	out.SlotShare = make([]float64, len(lp.SlotExpert))
	var gpus, cnt []int32
	for e, ss := range bySlot {
		gpus, cnt = slotGPUs(lp, ss, gpus[:0], cnt[:0])
		n := len(gpus)
		frac := make([]float64, G*n)
		w.split.Split(l, e, gpus, cnt, frac)
		perGPU := make([]float64, n)
		known := 0.0
		if st != nil {
			for h, sl := range st.SourceLoad {
				if h >= G || l >= len(sl) || load[e] <= 0 {
					break
				}
				x := sl[l][e] / load[e]
				known += x
				for i := range n {
					perGPU[i] += x * frac[h*n+i]
				}
			}
		}
		rest := max(0, 1-known) / float64(G)
		for h := 0; h < G; h++ {
			for i := range n {
				perGPU[i] += rest * frac[h*n+i]
			}
		}
		for _, s := range ss {
			i := slices.Index(gpus, int32(lp.SlotGPU[s]))
			out.SlotShare[s] = perGPU[i] / float64(cnt[i])
		}
	}
	return out
}

// hashSlots counts, slot by slot, the tokens of every expert that vLLM's
// hash sends there (costmodel.VLLMHashCounts): rows(e, r) are the rows of
// the batch's tokens of expert e from rank r < ranks (the layer's
// routing.TokenOrder). An expert's copies on a GPU are its slots there in slot order,
// which is their order by physical id (placement.Plan.GPUMajor keeps it).
// Tokens of unknown source (load[e] beyond the rows) are split evenly, in
// slot order, the remainder going to the lower slots.
func hashSlots(lp placement.LayerPlan, load []float64, rows func(e, r int) []int32, ranks int) []int {
	out := make([]int, len(lp.SlotExpert))
	bySlot := make([][]int, len(load))
	for s, e := range lp.SlotExpert {
		bySlot[e] = append(bySlot[e], s)
	}
	var gpus, cnt []int32
	for e, ss := range bySlot {
		if len(ss) == 0 {
			continue
		}
		gpus, cnt = slotGPUs(lp, ss, gpus[:0], cnt[:0])
		counts := make([]int, len(ss))
		for r := range ranks {
			costmodel.VLLMHashCounts(gpus, cnt, rows(e, r), counts)
		}
		// counts lists GPU gpus[i]'s copies from entry cnt[0]+…+cnt[i-1].
		at := make([]int, len(gpus))
		for i := 1; i < len(gpus); i++ {
			at[i] = at[i-1] + int(cnt[i-1])
		}
		known := 0
		for _, s := range ss {
			i := slices.Index(gpus, int32(lp.SlotGPU[s]))
			out[s] = counts[at[i]]
			known += counts[at[i]]
			at[i]++
		}
		u := max(0, int(load[e]+0.5)-known)
		for k, s := range ss {
			out[s] += u / len(ss)
			if k < u%len(ss) {
				out[s]++
			}
		}
	}
	return out
}

// splitSlots splits every expert's tokens over its slots: by the plan's
// SlotShare when it has one (largest remainders get the leftover tokens,
// ties to lower slots), else evenly in slot order, the remainder going to
// the lower slots.
func splitSlots(lp placement.LayerPlan, load []float64) []int {
	out := make([]int, len(lp.SlotExpert))
	if lp.SlotShare != nil {
		given := make([]int, len(load))
		type rem struct {
			s int
			r float64
		}
		rems := make([][]rem, len(load))
		for s, e := range lp.SlotExpert {
			x := lp.SlotShare[s] * float64(int(load[e]+0.5))
			out[s] = int(x)
			given[e] += out[s]
			rems[e] = append(rems[e], rem{s, x - float64(out[s])})
		}
		for e, rs := range rems {
			left := int(load[e]+0.5) - given[e]
			sort.SliceStable(rs, func(i, j int) bool { return rs[i].r > rs[j].r })
			for k := 0; k < left && k < len(rs); k++ {
				out[rs[k].s]++
			}
		}
		return out
	}
	copies := make([]int, len(load))
	for _, e := range lp.SlotExpert {
		copies[e]++
	}
	seen := make([]int, len(load))
	for s, e := range lp.SlotExpert {
		n := int(load[e] + 0.5)
		c := copies[e]
		out[s] = n / c
		if seen[e] < n%c {
			out[s]++
		}
		seen[e]++
	}
	return out
}

// Iterations returns the number of iterations (batches).
func (w *Workload) Iterations() int { return len(w.SlotTokens) }

// Layers returns the number of MoE layers.
func (w *Workload) Layers() int { return len(w.Plan.Layers) }

// GPUs returns the number of GPUs of the plan.
func (w *Workload) GPUs() int { return w.Plan.GPUs }

// GPUTokens returns the tokens every GPU processes in layer l of iteration
// i (summed over its slots).
func (w *Workload) GPUTokens(i, l int) []int {
	out := make([]int, w.Plan.GPUs)
	for s, g := range w.Plan.Layers[l].SlotGPU {
		out[g] += w.SlotTokens[i][l][s]
	}
	return out
}

// GPUSlots returns, for every GPU, the slots of layer l it holds, in
// ascending slot order.
func (w *Workload) GPUSlots(l int) [][]int {
	out := make([][]int, w.Plan.GPUs)
	for s, g := range w.Plan.Layers[l].SlotGPU {
		out[g] = append(out[g], s)
	}
	return out
}

// maxSlotTokens returns the largest token count of any slot.
func (w *Workload) maxSlotTokens() int {
	m := 0
	for _, it := range w.SlotTokens {
		for _, ly := range it {
			for _, n := range ly {
				m = max(m, n)
			}
		}
	}
	return m
}

// slotGPUs appends to gpus the distinct GPUs of slots ss of lp, in first
// appearance, and to cnt how many of ss each holds.
func slotGPUs(lp placement.LayerPlan, ss []int, gpus, cnt []int32) ([]int32, []int32) {
	for _, s := range ss {
		g := int32(lp.SlotGPU[s])
		if i := slices.Index(gpus, g); i >= 0 {
			cnt[i]++
		} else {
			gpus, cnt = append(gpus, g), append(cnt, 1)
		}
	}
	return gpus, cnt
}
