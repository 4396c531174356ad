package stackdispatch

import (
	"fmt"
	"slices"
	"strings"

	"github.com/moetuner/moetuner/internal/pyrand"
)

// SGLangSeed is the seed compute_logical_to_rank_dispatch_physical_map gives
// random.Random; no caller in SGLang passes another.
const SGLangSeed = 42

// SGLangVariant names one upstream tree of SGLang's static dispatch rule
// (compute_logical_to_rank_dispatch_physical_map and _find_nearest_expert in
// python/sglang/srt/eplb/expert_location.py). The zero value names none and is
// refused by SGLangStaticTable.
type SGLangVariant int

const (
	// SGLangStaticPlain ("sglang-static") is the tree before the same-node
	// rule, sgl-project/sglang python/sglang/srt/eplb/expert_location.py@
	// 6270b01498692d05d29267efe96d0eb7d9824545: a rank uses the first of the
	// expert's copies on its own GPU; every other rank is dealt. No shortcut
	// for a single copy: an expert with one copy still deals the epSize-1
	// ranks without it, whose shuffle draws from the stream.
	SGLangStaticPlain SGLangVariant = iota + 1
	// SGLangStaticNode ("sglang-static-node") is the same-node tree of
	// sgl-project/sglang PR #9849 (static) and PR #10874 (candidates
	// narrowed per rank in _compute_logical_to_all_physical_map):
	// _find_nearest_expert returns the only copy when there is one, else the
	// first copy on the rank's GPU, else the first copy on the rank's node,
	// else -1 and the rank is dealt.
	SGLangStaticNode
	// SGLangStaticNodeNarrow ("sglang-static-node-narrow") is the newest
	// tree (sgl-project/sglang python/sglang/srt/eplb/expert_location.py
	// after the elastic-EP scale-up, PR #30164; the text "Prefer same-node
	// experts only when it narrows the candidate set"): as
	// SGLangStaticNode, but a same-node copy is taken only when the node
	// holds some but not all of the copies (0 < same-node < all).
	SGLangStaticNodeNarrow
	// SGLangStaticGPUOnly ("sglang-static-gpu-only") is the newest tree when
	// _prefer_same_node_experts is false (server_args.ep_join_mode ==
	// "scale", or elastic_expanded_world_enabled()): the only copy, else the
	// first on the rank's GPU, else dealt.
	SGLangStaticGPUOnly
)

var sglangVariantNames = [...]string{
	SGLangStaticPlain:      "sglang-static",
	SGLangStaticNode:       "sglang-static-node",
	SGLangStaticNodeNarrow: "sglang-static-node-narrow",
	SGLangStaticGPUOnly:    "sglang-static-gpu-only",
}

// SGLangVariants returns every variant, oldest tree first.
func SGLangVariants() []SGLangVariant {
	return []SGLangVariant{SGLangStaticPlain, SGLangStaticNode, SGLangStaticNodeNarrow, SGLangStaticGPUOnly}
}

// String returns the variant's name as ParseSGLangVariant reads it, or
// "SGLangVariant(n)" for a value that names no variant.
func (v SGLangVariant) String() string {
	if v.valid() {
		return sglangVariantNames[v]
	}
	return fmt.Sprintf("SGLangVariant(%d)", int(v))
}

func (v SGLangVariant) valid() bool {
	return v >= SGLangStaticPlain && v <= SGLangStaticGPUOnly
}

// ParseSGLangVariant reads a variant's name (see String); an unknown name is
// an error that lists the known ones.
func ParseSGLangVariant(s string) (SGLangVariant, error) {
	for _, v := range SGLangVariants() {
		if v.String() == s {
			return v, nil
		}
	}
	names := make([]string, 0, len(sglangVariantNames))
	for _, v := range SGLangVariants() {
		names = append(names, v.String())
	}
	return 0, fmt.Errorf("stackdispatch: unknown SGLang static dispatch %q (known: %s)", s, strings.Join(names, ", "))
}

// SGLangInit says how SGLang built the candidate lists it deals from; it
// matters only for the trees with a same-node rule (not SGLangStaticPlain).
type SGLangInit int

const (
	// SGLangInitByMapping (the zero value) is ExpertLocationMetadata
	// .init_by_mapping with moe_ep_rank, what SGLang does at startup for a
	// --init-expert-location file holding physical_to_logical_map (and for
	// init_trivial). _compute_logical_to_all_physical_map then replaces, for
	// this rank, every candidate list that has a nearest copy by that copy
	// alone, and compute_logical_to_rank_dispatch_physical_map deals from
	// those lists: each rank's row of the table comes from its own pass, in
	// which the random stream advances only at the (layer, expert) where that
	// rank itself is dealt.
	SGLangInitByMapping SGLangInit = iota
	// SGLangInitByEPLB is init_by_eplb (a logical_count file, or a rebalance
	// at run time): the candidate lists are EPLB's log2phy rows, shared by
	// every rank, and one stream advances at every (layer, expert) where any
	// rank is dealt. (expert_location.py@01fec5c2e61f9568c41a6e1d4fd5ac46c88504f1:
	// init_by_eplb hands eplb_algorithms.rebalance_experts' second output to
	// _init_raw unchanged, without _compute_logical_to_all_physical_map;
	// baseline's EPLB ports record that order as placement.Plan.StackEPLB.) It also models the tree between PR #9849 and PR #10874,
	// whose init_by_mapping did not narrow the lists.
	SGLangInitByEPLB
)

// String returns "init_by_mapping" or "init_by_eplb".
func (i SGLangInit) String() string {
	switch i {
	case SGLangInitByMapping:
		return "init_by_mapping"
	case SGLangInitByEPLB:
		return "init_by_eplb"
	}
	return fmt.Sprintf("SGLangInit(%d)", int(i))
}

// SGLangNearest returns the physical id that _find_nearest_expert gives rank
// for an expert whose copies are cands, or -1 when the rank is dealt. For
// SGLangStaticPlain it is the first copy on the rank's GPU (the plain tree
// has no single-copy shortcut). gpusPerNode is read only by the node
// variants. An unknown variant returns -1.
func SGLangNearest(cands []int32, rank, slotsPerGPU, gpusPerNode int, v SGLangVariant) int32 {
	if len(cands) == 1 && v != SGLangStaticPlain && v.valid() {
		return cands[0]
	}
	if !v.valid() || slotsPerGPU <= 0 {
		return -1
	}
	for _, p := range cands {
		if int(p)/slotsPerGPU == rank {
			return p
		}
	}
	if (v != SGLangStaticNode && v != SGLangStaticNodeNarrow) || gpusPerNode <= 0 {
		return -1
	}
	perNode := slotsPerGPU * gpusPerNode
	node := rank / gpusPerNode
	first, same := int32(-1), 0
	for _, p := range cands {
		if int(p)/perNode == node {
			if same == 0 {
				first = p
			}
			same++
		}
	}
	if v == SGLangStaticNodeNarrow && same == len(cands) {
		return -1
	}
	return first
}

// SGLangDealtRanks appends to dst, in rank order, the ranks in [0, epSize)
// for which SGLangNearest is -1 (the ranks compute_logical_to_rank_dispatch_
// physical_map deals over all of cands), and returns the extended slice.
func SGLangDealtRanks(cands []int32, epSize, slotsPerGPU, gpusPerNode int, v SGLangVariant, dst []int32) []int32 {
	for r := 0; r < epSize; r++ {
		if SGLangNearest(cands, r, slotsPerGPU, gpusPerNode, v) == -1 {
			dst = append(dst, int32(r))
		}
	}
	return dst
}

// FairChoices appends to out what SGLang's _fair_choices(arr, k, r) returns,
// as positions into arr (n = len(arr)): every position k/n times, then
// r.sample(arr, k mod n), the whole shuffled by r.shuffle; the i-th dealt rank
// (in rank order) gets arr[out[i]]. What it draws from r depends only on r's
// state and on (n, k): sample(n, k mod n) then shuffle of k items. It draws
// nothing and appends nothing when k <= 0 or n <= 0 (SGLang never calls it
// with n == 0, which would raise ZeroDivisionError).
func FairChoices(r *pyrand.Random, n, k int, out []int32) []int32 {
	if k <= 0 || n <= 0 {
		return out
	}
	start := len(out)
	for q := 0; q < k/n; q++ {
		for i := 0; i < n; i++ {
			out = append(out, int32(i))
		}
	}
	out, _ = r.Sample(n, k%n, out) // k%n < n, so never refused
	pyrand.Shuffle(r, out[start:])
	return out
}

// SGLangStaticTable returns the table SGLang's --ep-dispatch-algorithm static
// builds, [rank][layer][expert] -> physical id, for the candidate lists cands
// ([layer][expert] -> the expert's physical ids, in the order SGLang holds
// them: see CandidatesFromPhy2Log), epSize ranks, slotsPerGPU physical slots
// per GPU and gpusPerNode GPUs per node (server_args.ep_size //
// server_args.nnodes; read only by the node variants). It reproduces
// compute_logical_to_rank_dispatch_physical_map of the tree v names, fed as
// init says, bit for bit: the deal at (layer, expert) is
// FairChoices(stream, n = len(cands), k = len(dealt ranks)).
//
// Stream consumption (what a search may rely on). A deal draws from the
// stream an amount fixed by the stream's state and (n, k) alone, so the
// positions dealt at any (layer, expert) depend only on the sequence of (n, k)
// of the deals the stream went through before it. Where copies sit changes
// nothing else; it changes only the (layer, expert) itself, through which
// ranks are dealt and which physical id each position names.
//   - Shared stream (SGLangStaticPlain with either init; the others with
//     SGLangInitByEPLB): one stream goes through every (layer, expert) in
//     order, with k = the number of dealt ranks. SGLangStaticPlain: k =
//     epSize minus the number of distinct GPUs holding a copy (an expert with
//     one copy has k = epSize-1 and its shuffle draws). SGLangStaticNode: k =
//     0 for one copy, else the ranks of the nodes holding no copy.
//     SGLangStaticNodeNarrow: 0 for one copy, else the ranks without an own
//     copy on nodes holding none or all of the copies. SGLangStaticGPUOnly:
//     0 for one copy, else epSize minus the GPUs holding a copy.
//   - One stream per rank (the node and GPU-only variants with
//     SGLangInitByMapping): rank r's stream goes only through the (layer,
//     expert) where r is dealt, each with the same (n, k) as above; at the
//     others r's entry is SGLangNearest.
//
// A changed (n, k) moves the stream for the deals after it, but not for long
// as a rule: randbelow rejects and redraws, so a shifted reader of the same
// Mersenne Twister words often falls back in step with the unshifted one
// within a few deals, after which every later deal is again the same
// (CPython itself: after shuffles of 14 versus sample(2, 1) plus a shuffle of
// 15 from one seed, 69 % of 1000 seeds share the state after five further
// shuffles of 15). A search may count on locality that often but not always.
//
// It fails, naming the field, when a size is not positive, when epSize is not
// a multiple of gpusPerNode (node variants), when a layer's expert count
// differs from the first's, or when a candidate list is empty or names a
// physical id outside [0, epSize*slotsPerGPU).
func SGLangStaticTable(cands [][][]int32, epSize, slotsPerGPU, gpusPerNode int, v SGLangVariant, init SGLangInit) ([][][]int32, error) {
	if err := checkSGLang(cands, epSize, slotsPerGPU, gpusPerNode, v, init); err != nil {
		return nil, err
	}
	layers := len(cands)
	experts := 0
	if layers > 0 {
		experts = len(cands[0])
	}
	flat := make([]int32, epSize*layers*experts)
	table := make([][][]int32, epSize)
	for r := range table {
		table[r] = make([][]int32, layers)
		for l := range table[r] {
			off := (r*layers + l) * experts
			table[r][l] = flat[off : off+experts : off+experts]
		}
	}
	d, err := NewDealer(sglangTape, epSize, slotsPerGPU, gpusPerNode, v, init)
	if err != nil {
		return nil, err
	}
	pos := d.Start()
	rows := make([][]int32, epSize)
	for l := 0; l < layers; l++ {
		for r := range rows {
			rows[r] = table[r][l]
		}
		d.DealLayer(cands[l], pos, rows)
	}
	return table, nil
}

// sglangTape is random.Random(SGLangSeed)'s stream, shared by every deal.
var sglangTape = pyrand.NewTape(SGLangSeed)

// Dealer deals SGLang's static table one layer at a time, from each rank's
// position on the stream (the number of words its random.Random(42) has
// drawn): what SGLangStaticTable does for every layer, for a caller that
// wants to deal one layer again for other copies, or to know where the
// streams stand after it. Positions are ints, so the streams before a
// layer are kept and compared for nothing: two ranks whose positions are
// equal are in the same state. A Dealer is not safe for concurrent use;
// make one per goroutine.
type Dealer struct {
	tape                             *pyrand.Tape
	epSize, slotsPerGPU, gpusPerNode int
	v                                SGLangVariant
	perRank                          bool
	rd                               *pyrand.Random
	dealt, choice                    []int32
	at, seen                         []int
	// memo keeps what FairChoices drew at a position for (n, k): a deal
	// depends on nothing else, and a layer dealt again for other copies
	// draws again at most of the positions it drew at before.
	memo map[memoKey]memoDeal
}

type memoKey struct{ pos, n, k int }

type memoDeal struct {
	choice []int32
	end    int
}

// memoLimit bounds the memo's entries (each at most epSize positions);
// it is emptied when full.
const memoLimit = 1 << 15

// fairChoices is FairChoices(stream at pos, n, k) and the position after
// it, from the memo when it holds them.
func (d *Dealer) fairChoices(pos, n, k int) ([]int32, int) {
	key := memoKey{pos, n, k}
	if m, ok := d.memo[key]; ok {
		return m.choice, m.end
	}
	if d.memo == nil || len(d.memo) >= memoLimit {
		d.memo = make(map[memoKey]memoDeal)
	}
	d.rd.Seek(pos)
	m := memoDeal{choice: FairChoices(d.rd, n, k, nil), end: d.rd.Pos()}
	d.memo[key] = m
	return m.choice, m.end
}

// NewDealer returns a dealer for SGLang's static table of the tree v names,
// fed as init says, on epSize ranks, slotsPerGPU physical slots per GPU and
// gpusPerNode GPUs per node, reading tape (nil: random.Random(42)'s, what
// SGLang seeds). It fails, naming the field, where SGLangStaticTable does.
func NewDealer(tape *pyrand.Tape, epSize, slotsPerGPU, gpusPerNode int, v SGLangVariant, init SGLangInit) (*Dealer, error) {
	if err := checkSGLang(nil, epSize, slotsPerGPU, gpusPerNode, v, init); err != nil {
		return nil, err
	}
	if tape == nil {
		tape = sglangTape
	}
	return &Dealer{tape: tape, epSize: epSize, slotsPerGPU: slotsPerGPU, gpusPerNode: gpusPerNode, v: v,
		perRank: v != SGLangStaticPlain && init == SGLangInitByMapping, rd: tape.Reader(0)}, nil
}

// Start returns every rank's position before the first layer: 0.
func (d *Dealer) Start() []int { return make([]int, d.epSize) }

// DealLayer sets rows[r][e], for every rank r and expert e of one layer
// whose candidate lists are cands (as SGLangStaticTable takes them; the
// caller checks them), to the physical id rank r sends expert e's tokens
// to, and moves pos (every rank's position before the layer, len epSize)
// to the positions after it. With a shared stream every rank holds the
// same position. Ranks that share a position draw the same words: each
// deal draws once per distinct position among the ranks it deals.
func (d *Dealer) DealLayer(cands [][]int32, pos []int, rows [][]int32) {
	for e, c := range cands {
		d.dealOne(c, e, pos, rows)
	}
}

// dealOne deals expert e (candidates c) of a layer: every rank's nearest
// copy, then the deal of the others, drawn at pos (which it moves on).
func (d *Dealer) dealOne(c []int32, e int, pos []int, rows [][]int32) {
	d.dealt = SGLangDealtRanks(c, d.epSize, d.slotsPerGPU, d.gpusPerNode, d.v, d.dealt[:0])
	for r := 0; r < d.epSize; r++ {
		rows[r][e] = SGLangNearest(c, r, d.slotsPerGPU, d.gpusPerNode, d.v)
	}
	if len(d.dealt) == 0 {
		return
	}
	if !d.perRank {
		d.rd.Seek(pos[0])
		d.choice = FairChoices(d.rd, len(c), len(d.dealt), d.choice[:0])
		for i, r := range d.dealt {
			rows[r][e] = c[d.choice[i]]
		}
		for r := range pos {
			pos[r] = d.rd.Pos()
		}
		return
	}
	d.dealRanks(c, e, pos, rows)
}

// dealRanks deals expert e to the ranks of d.dealt on their own streams:
// one draw per distinct position among them; the ranks not dealt keep
// theirs.
func (d *Dealer) dealRanks(c []int32, e int, pos []int, rows [][]int32) {
	d.seen = d.seen[:0]
	d.at = d.at[:0]
	for _, r := range d.dealt {
		d.at = append(d.at, pos[r])
	}
	for i, p := range d.at {
		if slices.Contains(d.seen, p) {
			continue
		}
		d.seen = append(d.seen, p)
		choice, end := d.fairChoices(p, len(c), len(d.dealt))
		for j := i; j < len(d.dealt); j++ {
			if rr := d.dealt[j]; d.at[j] == p {
				rows[rr][e] = c[choice[j]]
				pos[rr] = end
			}
		}
	}
}

func checkSGLang(cands [][][]int32, epSize, slotsPerGPU, gpusPerNode int, v SGLangVariant, init SGLangInit) error {
	if !v.valid() {
		return fmt.Errorf("stackdispatch: unknown SGLang static dispatch %v", v)
	}
	if init != SGLangInitByMapping && init != SGLangInitByEPLB {
		return fmt.Errorf("stackdispatch: unknown SGLang init %v", init)
	}
	if epSize <= 0 {
		return fmt.Errorf("stackdispatch: ep_size %d must be positive", epSize)
	}
	if slotsPerGPU <= 0 {
		return fmt.Errorf("stackdispatch: physical slots per GPU %d must be positive", slotsPerGPU)
	}
	if v == SGLangStaticNode || v == SGLangStaticNodeNarrow {
		if gpusPerNode <= 0 || epSize%gpusPerNode != 0 {
			return fmt.Errorf("stackdispatch: gpus per node %d must be positive and divide ep_size %d", gpusPerNode, epSize)
		}
	}
	slots := epSize * slotsPerGPU
	for l := range cands {
		if len(cands[l]) != len(cands[0]) {
			return fmt.Errorf("stackdispatch: layer %d has %d experts, layer 0 has %d", l, len(cands[l]), len(cands[0]))
		}
		for e, c := range cands[l] {
			if len(c) == 0 {
				return fmt.Errorf("stackdispatch: layer %d expert %d has no physical copy", l, e)
			}
			for _, p := range c {
				if p < 0 || int(p) >= slots {
					return fmt.Errorf("stackdispatch: layer %d expert %d: physical id %d outside [0,%d) (ep_size %d x %d slots per GPU)", l, e, p, slots, epSize, slotsPerGPU)
				}
			}
		}
	}
	return nil
}

// CandidatesFromPhy2Log returns, for a physical_to_logical_map ([layer]
// [physical id] -> logical expert, what SGLang's init_by_mapping reads), the
// candidate lists SGLang builds from it: [layer][expert] -> the physical ids
// holding that expert, ascending. It fails, naming layer and slot, on a
// logical id outside [0, experts), on layers of different lengths, and on an
// expert with no copy in a layer.
func CandidatesFromPhy2Log(phy2log [][]int32, experts int) ([][][]int32, error) {
	if experts <= 0 {
		return nil, fmt.Errorf("stackdispatch: logical expert count %d must be positive", experts)
	}
	out := make([][][]int32, len(phy2log))
	for l, row := range phy2log {
		if len(row) != len(phy2log[0]) {
			return nil, fmt.Errorf("stackdispatch: physical_to_logical_map layer %d has %d slots, layer 0 has %d", l, len(row), len(phy2log[0]))
		}
		out[l] = make([][]int32, experts)
		for p, e := range row {
			if e < 0 || int(e) >= experts {
				return nil, fmt.Errorf("stackdispatch: physical_to_logical_map layer %d slot %d: logical expert %d outside [0,%d)", l, p, e, experts)
			}
			out[l][e] = append(out[l][e], int32(p))
		}
		for e, c := range out[l] {
			if len(c) == 0 {
				return nil, fmt.Errorf("stackdispatch: physical_to_logical_map layer %d holds no copy of logical expert %d", l, e)
			}
		}
	}
	return out, nil
}
