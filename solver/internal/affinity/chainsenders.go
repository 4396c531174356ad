package affinity

import (
	"context"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// This file gathers each token's experts of a layer onto fewer GPUs of
// their node. In the chain flow every GPU that holds a token's layer-l
// experts sends that token's partial result on, one copy to every node
// of its layer-(l+1) experts but its own, so the phase from senders S to
// nodes R costs Σ_{g∈S} |R \ node(g)| NIC copies (chainExact.contrib; the
// last layer's combine goes back to the homes a node at a time, so its
// senders' GPUs do not count). The alignment decides the nodes and does
// not see the GPUs; within a node, which GPU holds which expert still
// decides |S|. A swap within a node changes no layer's nodes and no
// other layer's senders, so the layers are gathered on their own, in
// parallel.
//
// A swap is made only where it sends fewer copies, raises no GPU's
// compute above the layer's busiest and no NIC port of the phase after
// the layer above that phase's busiest: chainExact would take it
// (fmAccept), neither layer's time rising; TestGatherKeepsExactTimes
// holds the two to each other. The exact counters themselves price a
// swap about four times slower (trial also walks the ports of every
// GPU), too slow for the seconds this pass has.

// gatherToken is what a recount reads of a token, kept together.
type gatherToken struct {
	reach uint64  // the nodes of its next-layer experts
	cnt   float64 // its count
	stamp uint32  // marks of the current recount
}

// gatherScratch is one goroutine's buffers for gatherLayer.
type gatherScratch struct {
	gpu    []int32   // [e] the expert's GPU
	gload  []float64 // [g] tokens
	off    []int32   // [e]: its token positions are pos[off[e]:off[e+1]]
	pos    []int32   // t·K+i: token t's i-th expert
	tg     []uint16  // [t·K+i]: the GPU of token t's i-th expert
	tok    []gatherToken
	id     uint32
	gain   []float64 // [e·P+j]: copies saved moving e to its node's GPU j
	on     []int8    // [g] a token's experts on GPU g
	used   []uint64  // [X] a token's GPUs on node X, by local index
	port   []float64 // [0:G] NIC copies out of g, [G:2G] into g
	dA, dB []float64 // [B] change into the swapped GPUs' ports on node B
}

// gatherSenders runs passes of gatherLayer over every layer but the last
// of a.cur, the layers split among a.procs goroutines, while each pass
// swaps something and deadline leaves another pass as long as the last.
// A pass stops taking layers when ctx ends or deadline passes. It
// returns the swaps made; none with more than 64 GPUs a node (a token's
// GPUs on a node are a 64-bit mask) or 65536 GPUs.
func (a *chainAligner) gatherSenders(ctx context.Context, deadline time.Time, passes int) int64 {
	if P := a.p.Cluster.GPUsPerNode; P > 64 || a.p.Cluster.GPUs() > 1<<16 {
		return 0
	}
	var total int64
	scs := make([]*gatherScratch, a.procs)
	for i := range scs {
		scs[i] = &gatherScratch{}
	}
	for range passes {
		t0 := time.Now()
		var next, swaps atomic.Int64
		var wg sync.WaitGroup
		for i := range a.procs {
			wg.Go(func() {
				for {
					l := int(next.Add(1) - 1)
					if l >= len(a.cur)-1 || ctx.Err() != nil || !time.Now().Before(deadline) {
						return
					}
					swaps.Add(int64(a.gatherLayer(l, scs[i])))
				}
			})
		}
		wg.Wait()
		total += swaps.Load()
		if swaps.Load() == 0 || time.Until(deadline) < time.Since(t0) {
			break
		}
	}
	return total
}

// gatherLayer makes one pass over layer l's experts (l not the last),
// swapping experts between GPUs of one node where that lowers the sender
// copies of the phase after the layer (see the file's comment), no GPU's
// compute above the layer's busiest and no NIC port of that phase above
// its busiest. Each expert takes the partner that the single-move gains,
// counted at the start of the pass, rank first among those the compute
// allows; a recount of the two experts' tokens then prices the swap
// exactly and decides. It returns the swaps made.
func (a *chainAligner) gatherLayer(l int, sc *gatherScratch) int {
	N, P := a.N, a.p.Cluster.GPUsPerNode
	E := a.p.Stats.Experts
	load := a.p.Stats.Load[l]
	a.gatherInit(l, sc)
	capG := 0.0
	for g, x := range sc.gload {
		capG = max(capG, a.comp(g, x))
	}
	capG *= 1 + 1e-12
	capPort := 0.0
	for _, x := range sc.port {
		capPort = max(capPort, x)
	}
	capPort *= 1 + 1e-12
	sc.dA, sc.dB = resize(sc.dA, N), resize(sc.dB, N)
	byNode := make([][]int32, N)
	for e := range E {
		X := int(sc.gpu[e]) / P
		byNode[X] = append(byNode[X], int32(e))
	}
	swaps := 0
	for _, list := range byNode {
		for _, e := range list {
			ga := int(sc.gpu[e])
			best, bf := 0.0, int32(-1)
			for _, f := range list {
				gb := int(sc.gpu[f])
				if gb == ga {
					continue
				}
				d := sc.gain[int(e)*P+gb%P] + sc.gain[int(f)*P+ga%P]
				if d <= best {
					continue
				}
				if a.comp(ga, sc.gload[ga]+load[f]-load[e]) <= capG && a.comp(gb, sc.gload[gb]+load[e]-load[f]) <= capG {
					best, bf = d, f
				}
			}
			if bf < 0 {
				continue
			}
			if gb := int(sc.gpu[bf]); a.gatherSwap(sc, e, bf, best, capPort) {
				sc.gload[ga] += load[bf] - load[e]
				sc.gload[gb] += load[e] - load[bf]
				swaps++
			}
		}
	}
	for e, g := range sc.gpu {
		a.cur[l][e][0] = g
	}
	return swaps
}

// gatherInit fills sc for layer l (not the last): the experts' GPUs and
// the GPUs' tokens, every expert's token positions, the tokens' next
// nodes, the single-move gains and the ports of the phase after l.
func (a *chainAligner) gatherInit(l int, sc *gatherScratch) {
	st, c := a.p.Stats, a.p.Cluster
	E, K, P, G := st.Experts, a.K, c.GPUsPerNode, c.GPUs()
	T := len(a.cnt)
	load := st.Load[l]
	ex, nx := a.ex[l], a.node[l+1]
	sc.gpu = resize(sc.gpu, E)
	sc.gload = resize(sc.gload, G)
	clear(sc.gload)
	for e, gs := range a.cur[l] {
		sc.gpu[e] = gs[0]
		sc.gload[gs[0]] += load[e]
	}
	// Every expert's token positions, in token order.
	sc.off = resize(sc.off, E+1)
	clear(sc.off)
	for _, e := range ex {
		sc.off[int(e)+1]++
	}
	for e := range E {
		sc.off[e+1] += sc.off[e]
	}
	sc.pos = resize(sc.pos, len(ex))
	sc.tg = resize(sc.tg, len(ex))
	fill := make([]int32, E)
	copy(fill, sc.off[:E])
	for i, e := range ex {
		sc.pos[fill[e]] = int32(i)
		fill[e]++
		sc.tg[i] = uint16(sc.gpu[e])
	}
	sc.tok = resize(sc.tok, T)
	sc.id = 0
	for t := range T {
		var m uint64
		for _, e := range a.ex[l+1][t*K : (t+1)*K] {
			m |= 1 << uint(nx[e])
		}
		sc.tok[t] = gatherToken{reach: m, cnt: a.cnt[t]}
	}
	sc.gain = resize(sc.gain, E*P)
	sc.port = resize(sc.port, 2*G)
	gatherGains(sc, ex, K, P)
}

// gatherGains fills sc.gain with the single-move gains of the layer whose
// token experts are ex (K a token) and sc.port with the NIC copies out
// of (sc.port[:G]) and into (sc.port[G:]) every GPU in the phase after
// it. gain[e·P+j] is the copies saved if e alone moved to GPU j of its
// node (its own GPU's entry is not meaningful): a token's sender GPU g
// costs w(node(g)) = its count × (|R| − [node(g) ∈ R]); e's move saves
// that when e is the token's only expert on its GPU and adds it when
// GPU j holds none of them.
func gatherGains(sc *gatherScratch, ex []int16, K, P int) {
	G := len(sc.gload)
	sc.on = resize(sc.on, G)
	clear(sc.on)
	sc.used = resize(sc.used, G/P)
	clear(sc.used)
	clear(sc.gain)
	clear(sc.port)
	on, used, out, in := sc.on, sc.used, sc.port[:G], sc.port[G:]
	for t, tk := range sc.tok {
		tg := sc.tg[t*K : (t+1)*K]
		r, ct := tk.reach, tk.cnt
		nr := float64(bits.OnesCount64(r))
		for _, g := range tg {
			on[g]++
			used[int(g)/P] |= 1 << uint(int(g)%P)
		}
		for i, g := range tg {
			X := int(g) / P
			w := ct * (nr - float64(r>>uint(X)&1))
			if w == 0 {
				continue
			}
			alone := 0.0
			if on[g] == 1 {
				alone = w
			}
			if on[g] > 0 {
				// The GPU's copies, once per token.
				out[g] += w
				for m := r &^ (1 << uint(X)); m != 0; m &= m - 1 {
					in[bits.TrailingZeros64(m)*P+int(g)%P] += ct
				}
				on[g] = -on[g]
			}
			u := used[X]
			row := sc.gain[int(ex[t*K+i])*P : int(ex[t*K+i])*P+P]
			for j := range row {
				row[j] += alone - w*float64(^u>>uint(j)&1)
			}
		}
		for _, g := range tg {
			on[g] = 0
			used[int(g)/P] = 0
		}
	}
}

// gatherSwap recounts the tokens of experts e and f (on GPUs ga ≠ gb of
// one node) and makes their swap (sc.gpu, sc.tg, sc.port) if it saves
// copies (more than a 1e-9 part of guess, the gains' estimate) and keeps
// the two GPUs' NIC ports within capPort.
func (a *chainAligner) gatherSwap(sc *gatherScratch, e, f int32, guess, capPort float64) bool {
	K, P := a.K, a.p.Cluster.GPUsPerNode
	G := len(sc.gload)
	ga, gb := uint16(sc.gpu[e]), uint16(sc.gpu[f])
	X, ia, ib := int(ga)/P, int(ga)%P, int(gb)%P
	sc.id += 2
	fTok, both := sc.id, sc.id+1
	pe := sc.pos[sc.off[e]:sc.off[e+1]]
	pf := sc.pos[sc.off[f]:sc.off[f+1]]
	for _, p := range pf {
		sc.tok[int(p)/K].stamp = fTok
	}
	clear(sc.dA)
	clear(sc.dB)
	saved, outA, outB := 0.0, 0.0, 0.0
	// add counts a token whose GPUs ga and gb go from used (ua, ub) to
	// used (va, vb).
	add := func(t int, ua, ub, va, vb bool) {
		da, db := b2f(va)-b2f(ua), b2f(vb)-b2f(ub)
		if da == 0 && db == 0 {
			return
		}
		r, ct := sc.tok[t].reach, sc.tok[t].cnt
		w := ct * float64(bits.OnesCount64(r)-int(r>>uint(X)&1))
		saved -= w * (da + db)
		outA += w * da
		outB += w * db
		for m := r &^ (1 << uint(X)); m != 0; m &= m - 1 {
			B := bits.TrailingZeros64(m)
			sc.dA[B] += ct * da
			sc.dB[B] += ct * db
		}
	}
	for _, p := range pe {
		t := int(p) / K
		hasF := sc.tok[t].stamp == fTok
		sc.tok[t].stamp = both
		onA, onB := sc.onPair(t, K, ga, gb)
		onA-- // without e
		if hasF {
			onB--
		}
		// e moves to gb and f, if the token has it, to ga.
		add(t, true, onB > 0 || hasF, onA > 0 || hasF, true)
	}
	for _, p := range pf {
		t := int(p) / K
		if sc.tok[t].stamp == both {
			continue // counted with e's
		}
		onA, onB := sc.onPair(t, K, ga, gb)
		onB-- // without f
		add(t, onA > 0, true, true, onB > 0)
	}
	if saved <= 1e-9*guess {
		return false
	}
	out, in := sc.port[:G], sc.port[G:]
	if out[ga]+outA > capPort || out[gb]+outB > capPort {
		return false
	}
	for B := range sc.dA {
		if in[B*P+ia]+sc.dA[B] > capPort || in[B*P+ib]+sc.dB[B] > capPort {
			return false
		}
	}
	out[ga] += outA
	out[gb] += outB
	for B := range sc.dA {
		in[B*P+ia] += sc.dA[B]
		in[B*P+ib] += sc.dB[B]
	}
	for _, p := range pe {
		sc.tg[p] = gb
	}
	for _, p := range pf {
		sc.tg[p] = ga
	}
	sc.gpu[e], sc.gpu[f] = int32(gb), int32(ga)
	return true
}

// onPair counts token t's experts (K a token) on GPUs ga and gb.
func (sc *gatherScratch) onPair(t, K int, ga, gb uint16) (onA, onB int) {
	for _, g := range sc.tg[t*K : (t+1)*K] {
		switch g {
		case ga:
			onA++
		case gb:
			onB++
		}
	}
	return onA, onB
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
