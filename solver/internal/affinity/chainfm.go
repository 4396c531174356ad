package affinity

import (
	"context"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// This file is the chain flow's gain-cached refinement: best swap first
// on the exact counters (chainExact), guided by cached node-move gains of
// the cross-node transitions, the way fm.go refines the home flow's node
// cut. A layer's gains are counted once per visit of the layer (a pass
// over its tokens) and then kept up to date through the tokens each
// applied swap changes, so that every step takes the swap the gains rank
// first instead of sampling one; the exact counters then score it (time,
// busiest NIC port, compute tail under its cap, move budget), and only a
// swap that lowers the exact cost is made.

// fmNodeGains fills gain (E·N) with layer l's node-move gains:
// gain[e·N+B] is the NIC copies of phases l and l+1 (as chainExact counts
// them) saved if expert e moved to a GPU of node B that holds none of
// each of its tokens' other layer-l experts (negative: copies added).
func (cx *chainExact) fmNodeGains(l int, gain []float64) {
	clear(gain)
	for t := range cx.cnt {
		cx.fmTokenGains(l, t, 1, gain)
	}
}

// fmTokenGains adds sign × token t's part of layer l's node-move gains to
// gain. A phase from senders S to the nodes R costs Σ_{g∈S} |R \ node(g)|
// = |S|·|R| − Σ_{B∈R} (S's GPUs on B); from a token's home, its one GPU;
// with no home, (N − 1)/N per node reached (homes spread evenly). So node
// B adds |S| − (S's GPUs on B) when it joins R, which prices every target
// node of an expert in one step from its token's other experts' nodes.
func (cx *chainExact) fmTokenGains(l, t int, sign float64, gain []float64) {
	K, N, P := cx.K, cx.N, cx.P
	c := sign * cx.cnt[t]
	if c == 0 {
		return
	}
	// join[B] is what node B adds to the copies when it joins the
	// token's layer-l nodes: into layer l from its senders and, after the
	// last layer, to the combine home; send[B] what a sender on B adds
	// to the next phase (towards the next layer's nodes).
	var join, send [64]float64
	cx.fmJoin(l, t, &join)
	last := l == cx.L-1
	if !last {
		next := cx.nodes(cx.mask[l+1][t])
		n := float64(bits.OnesCount64(next))
		for b := range N {
			send[b] = n - float64(next>>uint(b)&1)
		}
	}
	ex := cx.ex[l][t*K : (t+1)*K]
	gl := cx.gpu[l]
	var onNode [64]int8 // the token's layer-l experts per node
	for _, x := range ex {
		onNode[int(gl[x])/P]++
	}
	for i, e := range ex {
		a := int(gl[e])
		A := a / P
		// old − new with e moved to node B; what the token's other
		// experts cost is common to both. old: e's node A if no other
		// expert is there, and e's GPU as a sender if it is e's alone.
		old := 0.0
		if onNode[A] == 1 {
			old = join[A]
		}
		if !last && !fmShared(ex, gl, i, a) {
			old += send[A]
		}
		row := gain[int(e)*N : int(e)*N+N]
		for B := range row {
			nw := send[B]
			if B == A && onNode[A] == 1 || B != A && onNode[B] == 0 {
				nw += join[B]
			}
			row[B] += c * (old - nw)
		}
	}
}

// fmJoin fills join[B] with what node B adds to token t's copies when it
// joins its layer-l nodes (see fmTokenGains).
func (cx *chainExact) fmJoin(l, t int, join *[64]float64) {
	N, P := cx.N, cx.P
	spread := float64(N-1) / float64(N) // homes spread evenly
	switch S := cx.sendersOf(l, t); {
	case S != 0:
		nS := float64(bits.OnesCount64(S))
		for b, nm := range cx.nodeMask {
			join[b] = nS - float64(bits.OnesCount64(S&nm))
		}
	case cx.home[t] >= 0:
		for b := range N {
			join[b] = 1
		}
		join[int(cx.home[t])/P] = 0
	default:
		for b := range N {
			join[b] = spread
		}
	}
	if l == cx.L-1 {
		h := int(cx.home[t])
		for b := range N {
			switch {
			case h < 0:
				join[b] += spread
			case b != h/P:
				join[b]++
			}
		}
	}
}

// fmShared reports whether another expert of ex than ex[i] is on GPU a
// (gl: the layer's expert GPUs).
func fmShared(ex, gl []int16, i, a int) bool {
	for j, x := range ex {
		if j != i && int(gl[x]) == a {
			return true
		}
	}
	return false
}

// fmApply makes the swap of experts e and f of layer l that trial scored
// into s, keeping gain (layer l's node-move gains) up to date: the tokens
// of e and f are taken out of the gains before and counted back after.
func (cx *chainExact) fmApply(s *swapScratch, l, e, f int, tl, tn float64, gain []float64) {
	cx.fmSwapTokens(l, e, f, -1, gain)
	cx.apply(s, l, e, f, tl, tn)
	cx.fmSwapTokens(l, e, f, 1, gain)
}

// fmSwapTokens adds sign × the gains of every token that uses e or f in
// layer l (once each).
func (cx *chainExact) fmSwapTokens(l, e, f int, sign float64, gain []float64) {
	K := cx.K
	for _, t := range cx.toks[l][cx.off[l][e]:cx.off[l][e+1]] {
		cx.fmTokenGains(l, int(t), sign, gain)
	}
	for _, t := range cx.toks[l][cx.off[l][f]:cx.off[l][f+1]] {
		if !slices.Contains(cx.ex[l][int(t)*K:(int(t)+1)*K], int16(e)) {
			cx.fmTokenGains(l, int(t), sign, gain)
		}
	}
}

// fmState is one goroutine's buffers for refining layers.
type fmState struct {
	s      *swapScratch
	gain   []float64
	locked []bool
	cand   []int
}

// fmTries is how many partners f an expert's best move is scored with
// (exactly, by trial) before the expert is locked for the layer's visit:
// the partners on the target node ranked by their own gain back, the
// first that lowers the exact cost taken. Partners past the first few
// rarely pass where the first ones failed on the compute tail's cap or
// the busiest port: the node's E/N experts are ranked, and a quarter of
// K (the experts a token's move disturbs) bounds the tries.
func (cx *chainExact) fmTries() int { return max(2, cx.K/4+1) }

// fmLayer refines layer l best swap first until no ranked swap lowers the
// exact cost or next (counting one scored swap) says stop. It returns
// the swaps made.
func (cx *chainExact) fmLayer(l int, st *fmState, next func() bool) int {
	N, E := cx.N, cx.E
	cx.fmNodeGains(l, st.gain)
	clear(st.locked)
	gl := cx.gpu[l]
	node := func(x int) int { return int(gl[x]) / cx.P }
	made := 0
	for {
		// The best move of an unlocked expert to another node (moves
		// that add copies too: the swap's partner may save more, and a
		// token of both changes the sum).
		be, bB, bg := -1, -1, math.Inf(-1)
		for e := 0; e < E; e++ {
			if st.locked[e] {
				continue
			}
			A := node(e)
			for B, g := range st.gain[e*N : e*N+N] {
				if B != A && g > bg {
					be, bB, bg = e, B, g
				}
			}
		}
		if be < 0 {
			return made
		}
		A := node(be)
		// Its partners on node B, by their gain back to A.
		st.cand = st.cand[:0]
		for f := 0; f < E; f++ {
			if node(f) == bB {
				st.cand = append(st.cand, f)
			}
		}
		slices.SortFunc(st.cand, func(x, y int) int {
			return cmpDesc(st.gain[x*N+A], st.gain[y*N+A], x, y)
		})
		ok := false
		for _, f := range st.cand[:min(len(st.cand), cx.fmTries())] {
			if !next() {
				return made
			}
			b, dc, allowed := cx.fmBudget(l, be, f)
			if !allowed {
				continue
			}
			d, tl, tn, fits := cx.trial(st.s, l, be, f)
			if b != nil {
				d += b.SlotSec * float64(dc)
			}
			if fits && cx.fmAccept(st.s, l, d, tl, tn, b != nil) {
				cx.fmApply(st.s, l, be, f, tl, tn, st.gain)
				if b != nil {
					b.changed += dc
				}
				made++
				ok = true
				break
			}
		}
		if !ok {
			st.locked[be] = true
		}
	}
}

// fmAccept reports whether a scored swap of layer l (into s, its exact
// cost change d, layers l and l+1 then taking tl and tn) is made: with
// layer time caps (lcap) when neither layer's time rises above its cap
// and the swap lowers the cost or, outside a move budget (whose charged
// cost alone decides), the NIC copies; without, when it lowers the cost.
func (cx *chainExact) fmAccept(s *swapScratch, l int, d, tl, tn float64, budgeted bool) bool {
	if cx.lcap == nil {
		return d < 0
	}
	if tl > cx.lcap[l] || l+1 < cx.L && tn > cx.lcap[l+1] {
		return false
	}
	return d < 0 || !budgeted && s.dCut[0]+s.dCut[1] < 0
}

// cmpDesc orders by a descending, then by index.
func cmpDesc(a, b float64, x, y int) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return x - y
}

// fmBudget is the move budget's say on swapping e and f of layer l: the
// layer's budget (nil: none), the slots the swap changes and whether it
// stays within the budget.
func (cx *chainExact) fmBudget(l, e, f int) (*chainBudget, int, bool) {
	if cx.bud == nil {
		return nil, 0, true
	}
	b := cx.bud[l]
	dc := b.SwapChanged(int(cx.gpu[l][e]), e, int(cx.gpu[l][f]), f)
	return b, dc, b.Max <= 0 || b.changed+dc <= b.Max
}

// refine runs fmLayer over every layer, in rounds of the even layers and
// then the odd ones (layers two apart touch disjoint phases, so a round's
// layers run at once on procs goroutines and the plan does not depend on
// how many), until a round of both makes no swap or lim ends. By work,
// each layer's visit gets an equal share of what is left of lim.Work at
// the start of its round, in scored swaps. It returns the swaps scored.
func (cx *chainExact) refine(ctx context.Context, lim task.Limit, procs int) int64 {
	L := cx.L
	procs = max(1, min(procs, (L+1)/2))
	sts := make([]*fmState, procs)
	for i := range sts {
		sts[i] = &fmState{s: cx.newScratch(), gain: make([]float64, cx.E*cx.N), locked: make([]bool, cx.E)}
	}
	var total int64
	for {
		madeRound := 0
		for parity := range 2 {
			var layers []int
			for l := parity; l < L; l += 2 {
				layers = append(layers, l)
			}
			left := lim.Work - total
			if lim.ByWork() && left <= 0 || !lim.ByWork() && !time.Now().Before(lim.Deadline) || ctx.Err() != nil {
				return total
			}
			per := max(1, left/int64(len(layers)))
			made, used := make([]int, L), make([]int64, L)
			var wg sync.WaitGroup
			var at atomic.Int64
			for i := range procs {
				wg.Go(func() {
					for {
						k := int(at.Add(1)) - 1
						if k >= len(layers) {
							return
						}
						l := layers[k]
						// By time each layer gets an even share of
						// what is left for the round's layers.
						dl := lim.Deadline
						if !lim.ByWork() {
							rounds := (len(layers) - k + procs - 1) / procs
							dl = time.Now().Add(time.Until(lim.Deadline) / time.Duration(max(rounds, 1)))
						}
						next := func() bool {
							used[l]++
							if lim.ByWork() {
								return used[l] <= per
							}
							return used[l]&7 != 1 || time.Now().Before(dl) && ctx.Err() == nil
						}
						made[l] = cx.fmLayer(l, sts[i], next)
					}
				})
			}
			wg.Wait()
			for _, l := range layers {
				madeRound += made[l]
				u := used[l]
				if lim.ByWork() {
					u = min(u, per)
				}
				total += u
			}
		}
		if madeRound == 0 {
			return total
		}
	}
}

// fmChain refines copies (one GPU per expert per layer, in place) with the
// gain-cached refinement on the exact counters, every layer's compute
// tail held to the start's (start, its report) or, where it is above, to
// where it is now, within lim. It returns the swaps scored, 0 where the
// exact counters do not apply.
func fmChain(ctx context.Context, p Problem, opts Options, copies [][][]int32, start []float64, lim task.Limit) int64 {
	L := len(copies)
	gc := make([][][]placement.GPU, L)
	for l := range gc {
		gc[l] = make([][]placement.GPU, len(copies[l]))
		for e, gs := range copies[l] {
			for _, g := range gs {
				gc[l][e] = append(gc[l][e], placement.GPU(g))
			}
		}
	}
	tcap := make([]float64, L)
	cx := newChainExact(p, gc, tcap)
	if cx == nil || len(start) != L {
		return 0
	}
	cx.bud = newChainBudgets(p, gc)
	for l := range tcap {
		tcap[l] = max(start[l]+1e-9, cx.tail(l, -1, -1, 0)) * (1 + 1e-12)
	}
	cx.lcap = make([]float64, L)
	for l := range cx.lcap {
		cx.lcap[l] = cx.ltime[l] * (1 + 1e-12)
	}
	n := cx.refine(ctx, lim, opts.Parallel)
	for l := range copies {
		for e, g := range cx.gpu[l] {
			copies[l][e][0] = int32(g)
		}
	}
	return n
}
