package costmodel

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/moetuner/moetuner/internal/stackdispatch"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// hashSplit is vLLM's replica choice counted token by token: a token on
// rank h in row r of its rank's forward pass goes to copy
// stackdispatch.VLLMReplica(r, n) of the expert's n slots
// (_eplb_map_and_record_i32_kernel in vllm-project/vllm
// vllm/distributed/eplb/cuda_platform_backend.py@
// 645f77552e82d2bc7c3ffc8f3bfaedb511ed95f3: token_idx = offs // top_k, the
// token's row in this rank's topk_ids; hashed = (token_idx × 2654435769) &
// 0xFFFFFFFF; replica_idx = hashed mod replica_count; physical id =
// logical_to_physical_map[expert][replica_idx]). The copies of a row of
// logical_to_physical_map are taken in ascending physical id, GPU-major
// (placement.Plan.EPLBMaps), as vLLM fills the row from a
// physical_to_logical map it is given (EplbState.build in
// vllm/distributed/eplb/eplb_state.py@
// 0014ec6c58e1b74e660a1e6d059b5689716183ff: for i in
// range(num_physical_experts), i goes to its logical expert's next
// replica index), so copy j sits on the GPU whose slots of the expert
// cover j in ascending GPU order. (A map vLLM's own rebalance computes
// lists an expert's copies in EPLB's replica order instead; that order is
// not modelled.) The rows come from the statistics'
// token order (routing.TokenOrder), which must count exactly the
// per-source loads (usableOrder); tokens of unknown source have no row and
// take the hash's expectation, an even share of every slot, counted 1/G
// from every rank as costmodel counts such tokens.
type hashSplit struct {
	order *routing.TokenOrder
	load  [][]float64
	G, E  int
	// last is, per (layer, expert), the copies last split and their
	// fractions: a move re-splits every expert of its layer, and all but
	// the moved ones are as they were. mu[l] guards layer l's entries:
	// the searches and the evaluator split each layer on a goroutine of
	// its own, so one lock per layer is never contended there, where one
	// lock for all would serialise every layer's counting.
	mu   []sync.Mutex // [l]
	last []hashEntry  // [l·E+e]
}

// hashEntry is one split: the copies' GPUs and slots, and frac.
type hashEntry struct {
	gpus, slots []int32
	frac        []float64
}

func newHashSplit(st *routing.Stats, G int) *hashSplit {
	return &hashSplit{order: st.Order, load: st.Load, G: G, E: st.Experts, mu: make([]sync.Mutex, st.Layers), last: make([]hashEntry, st.Layers*st.Experts)}
}

// Split fills frac with the share of each source's tokens that every copy
// GPU receives under the hash; it is exact for any copies.
func (s *hashSplit) Split(l, e int, gpus, slots []int32, frac []float64) bool {
	n := len(gpus)
	s.mu[l].Lock()
	defer s.mu[l].Unlock()
	c := &s.last[l*s.E+e]
	if slices.Equal(c.gpus, gpus) && slices.Equal(c.slots, slots) {
		copy(frac[:s.G*n], c.frac)
		return true
	}
	s.count(l, e, gpus, slots, frac)
	c.gpus = append(c.gpus[:0], gpus...)
	c.slots = append(c.slots[:0], slots...)
	c.frac = append(c.frac[:0], frac[:s.G*n]...)
	return true
}

// count is Split without the cache.
func (s *hashSplit) count(l, e int, gpus, slots []int32, frac []float64) {
	n := len(gpus)
	clear(frac[:s.G*n])
	if n == 0 {
		return
	}
	var buf [64]int32
	owner := copyOwners(gpus, slots, buf[:0])
	total := len(owner)
	known := 0
	for h := range s.G {
		row := frac[h*n : (h+1)*n]
		rows := s.order.Of(l, e, h)
		for _, r := range rows {
			row[owner[stackdispatch.VLLMReplica(int64(r), total)]]++
		}
		known += len(rows)
	}
	u := max(0, s.load[l][e]-float64(known)) / float64(s.G)
	for h := range s.G {
		row := frac[h*n : (h+1)*n]
		c := float64(s.order.Count(l, e, h)) + u
		if c == 0 {
			fillEven(gpus, slots, row)
			continue
		}
		for i := range row {
			row[i] = (row[i] + u*float64(slots[i])/float64(total)) / c
		}
	}
}

// copyOwners appends to out, for every copy j of an expert in vLLM's
// replica order (ascending physical id: ascending GPU, slots[i] copies on
// gpus[i]), the index into gpus of the GPU that holds it.
func copyOwners(gpus, slots []int32, out []int32) []int32 {
	var ibuf [32]int32
	idx := ibuf[:0]
	for i := range gpus {
		idx = append(idx, int32(i))
	}
	slices.SortFunc(idx, func(a, b int32) int { return int(gpus[a]) - int(gpus[b]) })
	for _, i := range idx {
		for range slots[i] {
			out = append(out, i)
		}
	}
	return out
}

// HashOrder reports whether st's token order (Stats.Order) lets vLLM's
// dispatch be counted token by token on G GPUs, and if not, why: it needs
// the order and the per-source loads it must count exactly (a TokenOrder
// built from the trace the statistics count, every rank below G).
func HashOrder(st *routing.Stats, G int) error {
	o := st.Order
	switch {
	case o == nil:
		return errors.New("the statistics have no token order (a per-token trace with source ranks, read whole)")
	case len(st.SourceLoad) == 0:
		return errors.New("the statistics have no per-source loads")
	case len(st.SourceLoad) > G || o.Ranks > len(st.SourceLoad):
		return fmt.Errorf("the trace has %d source ranks (order %d) for %d GPUs", len(st.SourceLoad), o.Ranks, G)
	}
	if err := o.Validate(st.Layers, st.Experts); err != nil {
		return err
	}
	for r, sl := range st.SourceLoad {
		for l, row := range sl {
			for e, x := range row {
				if float64(o.Count(l, e, r)) != x {
					return fmt.Errorf("the token order counts %d tokens of layer %d expert %d from rank %d, the per-source loads %v: it is not these statistics' order", o.Count(l, e, r), l, e, r, x)
				}
			}
		}
	}
	return nil
}

// newSplitter binds the engine's dispatch to plan (Scenario.Splitter),
// once for the models that do not depend on the plan.
func (ev *engine) newSplitter(plan *placement.Plan) (Splitter, error) {
	if ev.fixed != nil {
		return ev.fixed, nil
	}
	return ev.sc.Splitter(plan)
}

// VLLMHashCounts adds to counts the tokens at rows (each one's row in its
// rank's forward pass, as routing.TokenOrder gives them) that vLLM's hash
// sends to each copy of an expert whose slots[i] copies sit on GPU gpus[i]
// (distinct GPUs, in any order): copy k of gpus[i], counting that GPU's
// copies in ascending physical id, is counts[slots[0]+…+slots[i-1]+k].
// The copies are taken in vLLM's replica order as hashSplit says (ascending
// physical id, GPU-major). counts needs one entry per copy; an expert
// without copies counts nothing.
func VLLMHashCounts(gpus, slots []int32, rows []int32, counts []int) {
	var buf [64]int32
	owner := copyOwners(gpus, slots, buf[:0])
	total := len(owner)
	if total == 0 {
		return
	}
	// at[j] is copy j's entry of counts: GPU owner[j]'s first entry plus
	// the copies of that GPU already placed (they come in ascending
	// physical id).
	var obuf [32]int32
	next := obuf[:0]
	off := int32(0)
	for _, s := range slots {
		next = append(next, off)
		off += s
	}
	var abuf [64]int32
	at := abuf[:0]
	for _, i := range owner {
		at = append(at, next[i])
		next[i]++
	}
	for _, r := range rows {
		counts[at[stackdispatch.VLLMReplica(int64(r), total)]]++
	}
}
