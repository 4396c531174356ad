package search

import (
	"context"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/solver/internal/onenode"
	"github.com/moetuner/moetuner/solver/internal/task"

	"github.com/moetuner/moetuner/placement"
)

// Annealing on the exact per-layer cost of the home flow on one node.
//
// With homes spread evenly over the G GPUs of one node, single copies and
// equal speeds, a layer's modeled time depends on the plan only through
// two numbers (costmodel's doc, home flow): the busiest GPU's routed token
// count L_max (compute) and the busiest GPU's count of distinct tokens
// D_max (its dispatch in-port carries (G−1)/G·D_max copies, its combine
// out-port the same, and every other port carries less). The layers are
// independent, so each is annealed on its own: moves swap two experts on
// different GPUs, the acceptance test uses a log-sum-exp smoothing of both
// maxima (so moves that lower the second-busiest GPU count), and the best
// plan by the exact pair (L_max, D_max) is kept.

// annealLayer is one layer's state.
type annealLayer struct {
	c    *onenode.Layer
	toks [][]int32 // toks[e]: tokens of expert e
	load []float64 // routed tokens per expert (pattern counts)
	G    int
	a    []int   // GPU of each expert
	cnt  []uint8 // cnt[t*G+g]: experts of token t on g
	D    []int
	L    []float64
	cost func(maxL float64, maxD int) float64
	tauD float64
	tauL float64
	wD   float64 // seconds per unit of D_max
	wL   float64 // seconds per unit of L_max

	expD, expLt []float64 // exp(−k/tauD), exp(−k/tauL) for whole k

	// Per GPU, W words each: tokens with at least one expert there (any)
	// and with exactly one (once), for swapDelta.
	any, once []uint64
}

func newAnnealLayer(c *onenode.Layer, load []float64, cost func(float64, int) float64) *annealLayer {
	s := &annealLayer{c: c, load: load, G: c.GPUs(), cost: cost, toks: make([][]int32, c.Experts())}
	for e := range s.toks {
		for w, x := range c.Sets()[e] {
			for x != 0 {
				s.toks[e] = append(s.toks[e], int32(w*64+bits.TrailingZeros64(x)))
				x &= x - 1
			}
		}
	}
	T := c.Words() * 64
	s.cnt = make([]uint8, T*c.GPUs())
	s.any = make([]uint64, c.GPUs()*c.Words())
	s.once = make([]uint64, c.GPUs()*c.Words())
	s.D = make([]int, c.GPUs())
	s.L = make([]float64, c.GPUs())
	s.a = make([]int, c.Experts())
	total := 0.0
	for _, x := range load {
		total += x
	}
	all := make([]int, c.Experts())
	for e := range all {
		all[e] = e
	}
	meanD := float64(c.Cover(all)) / float64(c.GPUs()) // every token has an expert
	s.tauD = math.Max(1, 0.008*meanD)
	s.tauL = math.Max(1e-9, 0.008*total/float64(c.GPUs()))
	s.expD, s.expLt = newExpTable(s.tauD), newExpTable(s.tauL)
	// Marginal prices of the two maxima from the cost function itself.
	base := cost(total/float64(c.GPUs()), int(meanD))
	s.wD = math.Max(1e-18, cost(total/float64(c.GPUs()), int(meanD)+10)-base) / 10
	s.wL = math.Max(1e-18, cost(total/float64(c.GPUs())*1.01, int(meanD))-base) / (0.01 * total / float64(c.GPUs()))
	return s
}

// set installs partition a.
func (s *annealLayer) set(a []int) {
	copy(s.a, a)
	clear(s.cnt)
	clear(s.D)
	clear(s.L)
	for e, g := range s.a {
		s.L[g] += s.load[e]
		for _, t := range s.toks[e] {
			i := int(t)*s.G + g
			if s.cnt[i] == 0 {
				s.D[g]++
			}
			s.cnt[i]++
		}
	}
	clear(s.any)
	clear(s.once)
	for t := 0; t < len(s.cnt)/s.G; t++ {
		for g := 0; g < s.G; g++ {
			s.mark(t, g)
		}
	}
}

// mark sets token t's any and once bits on GPU g from its count.
func (s *annealLayer) mark(t, g int) {
	w, bit := g*s.c.Words()+t>>6, uint64(1)<<(t&63)
	n := s.cnt[t*s.G+g]
	s.any[w] &^= bit
	s.once[w] &^= bit
	if n > 0 {
		s.any[w] |= bit
	}
	if n == 1 {
		s.once[w] |= bit
	}
}

// move moves expert e to GPU to.
func (s *annealLayer) move(e, to int) {
	from := s.a[e]
	G := s.G
	for _, t := range s.toks[e] {
		i := int(t) * G
		s.cnt[i+from]--
		if s.cnt[i+from] == 0 {
			s.D[from]--
		}
		if s.cnt[i+to] == 0 {
			s.D[to]++
		}
		s.cnt[i+to]++
		s.mark(int(t), from)
		s.mark(int(t), to)
	}
	s.L[from] -= s.load[e]
	s.L[to] += s.load[e]
	s.a[e] = to
}

func (s *annealLayer) maxima() (float64, int) {
	mL, mD := 0.0, 0
	for g := 0; g < s.G; g++ {
		mL = math.Max(mL, s.L[g])
		mD = max(mD, s.D[g])
	}
	return mL, mD
}

// smooth is the log-sum-exp surrogate of wL·L_max + wD·D_max.
func (s *annealLayer) smooth() float64 {
	mL, mD := s.maxima()
	sl, sd := 0.0, 0.0
	for g := 0; g < s.G; g++ {
		sl += s.expL(mL - s.L[g])
		sd += expTable(s.expD, mD-s.D[g], s.tauD)
	}
	return s.wL*(mL+s.tauL*math.Log(sl)) + s.wD*(float64(mD)+s.tauD*math.Log(sd))
}

// expL returns exp(−d/tauL), from the table when d is a whole number.
func (s *annealLayer) expL(d float64) float64 {
	if k := int(d); float64(k) == d {
		return expTable(s.expLt, k, s.tauL)
	}
	return math.Exp(-d / s.tauL)
}

// expTable returns exp(−k/tau) for k ≥ 0 from tab (tab[k] holds exactly
// that value; past its end the term is below 1e-17 of the sum's leading 1
// and counts 0), or computes it when there is no table.
func expTable(tab []float64, k int, tau float64) float64 {
	switch {
	case tab == nil:
		return math.Exp(float64(-k) / tau)
	case k < len(tab):
		return tab[k]
	}
	return 0
}

// newExpTable tabulates exp(−k/tau) up to exp(−40); nil when that would
// take more than 64 Ki entries.
func newExpTable(tau float64) []float64 {
	if 40*tau >= 1<<16 {
		return nil
	}
	tab := make([]float64, int(40*tau)+1)
	for k := range tab {
		tab[k] = math.Exp(float64(-k) / tau)
	}
	return tab
}

// anneal runs iters swap moves from partition start and returns the best
// partition found with its exact cost.
//
// With byWork the clock plays no part: the temperature follows the moves
// made alone and only iters ends the run, so the result depends on the
// inputs and the seed only.
func (s *annealLayer) anneal(ctx context.Context, start []int, iters int, rng *rand.Rand, deadline time.Time, byWork bool) ([]int, float64) {
	s.set(start)
	best := slices.Clone(s.a)
	bestCost := s.cost(s.maxima())
	cur := s.smooth()
	E := len(s.a)
	temp0 := 2 * s.wD
	begin := time.Now()
	span := deadline.Sub(begin)
	progress := 0.0
	for it := 0; it < iters; it++ {
		if it&255 == 0 {
			if ctx.Err() != nil {
				break
			}
			progress = float64(it) / float64(iters)
			if !byWork {
				now := time.Now()
				if !now.Before(deadline) {
					break
				}
				progress = math.Max(progress, float64(now.Sub(begin))/float64(span))
			}
		}
		temp := temp0 * (1 - progress)
		e1, e2 := rng.IntN(E), rng.IntN(E)
		if rng.IntN(2) == 0 {
			// Half the moves take e1 from the GPU with the most distinct
			// tokens: only moves there can lower the maximum.
			gm := 0
			for g := 1; g < s.G; g++ {
				if s.D[g] > s.D[gm] {
					gm = g
				}
			}
			for s.a[e1] != gm {
				e1 = rng.IntN(E)
			}
		}
		g1, g2 := s.a[e1], s.a[e2]
		if g1 == g2 {
			continue
		}
		// Score the swap from its change to the two GPUs' counts, and
		// apply it only when accepted.
		d1, d2 := s.swapDelta(e1, e2)
		dl := s.load[e2] - s.load[e1]
		s.D[g1] += d1
		s.D[g2] += d2
		s.L[g1] += dl
		s.L[g2] -= dl
		nv := s.smooth()
		s.D[g1] -= d1
		s.D[g2] -= d2
		s.L[g1] -= dl
		s.L[g2] += dl
		if nv <= cur || (temp > 0 && rng.Float64() < math.Exp((cur-nv)/temp)) {
			s.move(e1, g2)
			s.move(e2, g1)
			cur = nv
			if c := s.cost(s.maxima()); c < bestCost {
				bestCost = c
				copy(best, s.a)
			}
		}
	}
	return best, bestCost
}

// swapDelta returns how swapping e1 (on g1) and e2 (on g2) would change
// D[g1] and D[g2], without changing anything: g1 loses the tokens that e1
// alone brings there, unless e2 (arriving) has them too, and gains e2's
// tokens not there yet; likewise for g2. Counted on bitsets, a few dozen
// words per swap.
func (s *annealLayer) swapDelta(e1, e2 int) (d1, d2 int) {
	W := s.c.Words()
	g1, g2 := s.a[e1], s.a[e2]
	t1, t2 := s.c.Sets()[e1], s.c.Sets()[e2]
	any1, once1 := s.any[g1*W:(g1+1)*W], s.once[g1*W:(g1+1)*W]
	any2, once2 := s.any[g2*W:(g2+1)*W], s.once[g2*W:(g2+1)*W]
	for w := 0; w < W; w++ {
		a, b := t1[w], t2[w]
		d1 += bits.OnesCount64(b&^any1[w]) - bits.OnesCount64(a&once1[w]&^b)
		d2 += bits.OnesCount64(a&^any2[w]) - bits.OnesCount64(b&once2[w]&^a)
	}
	return d1, d2
}

// HomeAnneal improves a single-copy plan layer by layer on the exact home
// flow cost (onenode.Cost), with `threads` goroutines, until deadline or iters
// moves per restart; each layer anneals from the plan's own partition and,
// with restarts > 1, from random balanced partitions too. cls are the
// layers' bitsets (onenode.Layers). It returns the new plan (the old one
// where nothing improved) and whether the problem is one homeCost covers.
//
// Under a work limit each layer's restarts together make lim.Work/L moves
// (iters is then ignored) and the clock plays no part.
func HomeAnneal(ctx context.Context, sc costmodel.Scenario, cls []*onenode.Layer, plan *placement.Plan, iters, restarts, threads int, lim task.Limit, minLayer time.Duration, seed uint64) (*placement.Plan, bool) {
	cost, ok := onenode.Cost(sc)
	if !ok || cls == nil {
		return plan, false
	}
	G, E, L := sc.Cluster.GPUs(), sc.Stats.Experts, sc.Stats.Layers
	deadline := lim.Deadline
	if lim.ByWork() {
		iters = int(max(1, lim.Work/int64(L*max(1, restarts))))
		deadline = time.Now().Add(24 * time.Hour)
	}
	assign := make([][]placement.GPU, L)
	task.Layers(L, max(1, threads), deadline, minLayer, func(l int, limit time.Duration) {
		lay := newAnnealLayer(cls[l], sc.Stats.Load[l], func(mL float64, mD int) float64 { return cost(mL, float64(mD)) })
		rng := rand.New(rand.NewPCG(seed, uint64(l)))
		start := make([]int, E)
		for s, e := range plan.Layers[l].SlotExpert {
			start[e] = int(plan.Layers[l].SlotGPU[s])
		}
		lay.set(start)
		mL, mD := lay.maxima()
		best, bestCost := slices.Clone(start), cost(mL, float64(mD))
		// Each restart gets an equal share of the layer's time.
		now := time.Now()
		share := limit / time.Duration(max(1, restarts))
		for r := range max(1, restarts) {
			from := start
			if r > 0 {
				from = make([]int, E)
				for i, e := range rng.Perm(E) {
					from[e] = i / (E / G)
				}
			}
			a, c := lay.anneal(ctx, from, iters, rng, now.Add(share*time.Duration(r+1)), lim.ByWork())
			if c < bestCost {
				best, bestCost = a, c
			}
		}
		assign[l] = make([]placement.GPU, E)
		for e, g := range best {
			assign[l][e] = placement.GPU(g)
		}
	})
	out := placement.FromAssignment(G, assign, plan.Strategy)
	out.Meta = plan.Meta
	return out, true
}
