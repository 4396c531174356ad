package solver

import (
	"context"
	"errors"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/moetuner/moetuner/mip"

	"github.com/moetuner/moetuner/placement"
)

// Bottleneck bound on the busiest GPU's token count (one node, home flow).
//
// In the home flow with homes spread evenly, GPU g's dispatch in-port
// carries (G−1)/G · D_g token copies, D_g the number of tokens with at least
// one expert on g, and its combine out-port the same. A lower bound on
// max_g D_g over every partition of the E experts into G groups of at most
// m = E/G therefore bounds the layer's communication time. homeLowerBound's
// counting argument only bounds Σ_g D_g; this file proves
//
//	no partition has max_g D_g ≤ z
//
// for a z as large as it can within a time budget, by column generation on
// the set-partitioning LP whose columns are the groups S with |S| ≤ m and
// N(S) ≤ z (N(S): tokens reaching S):
//
//	min Σ_S x_S  s.t.  Σ_{S∋e} x_S ≥ 1  (every expert),  x ≥ 0.
//
// A partition into G feasible groups is an LP solution of value G. The
// certificate is a weight vector π ≥ 0 (the LP duals, but any π will do)
// with
//
//	π(S) < Σ_e π_e / G  for every group S with |S| ≤ m and N(S) ≤ z,
//
// since then the G groups of any such partition would sum to less than
// Σ_e π_e. That condition is checked in Go by an exhaustive branch and
// bound over groups (coverSearchAll), so the bound does not rest on HiGHS:
// the LP only proposes π.
//
// z is searched between max_e load_e − 1 (always certified: that expert's
// group reaches load_e tokens) and the incumbent plan's busiest GPU (never
// certifiable). At a probe the LP either reaches value G (a fractional
// partition with every group at most z exists, so nothing at or above the
// largest group it uses can be certified), or stays above G while neither
// the heuristic pricing nor the exhaustive search finds an improving
// group: z is certified. The exhaustive search is most of the cost, so
// only two probes run it: the first, 5 % below the plan (on FLAME the LP
// bound lies 3–9 % below a good plan; while the LP stays feasible there,
// 5 % below its largest group again), and the last. The probes between
// them bisect with heuristic pricing only, and a probe where it finds no
// column counts as probably certified; the highest such z is then proved
// (or, when its proof turns up columns that make the LP feasible, the
// bisection goes on below). With under 4 s for the layer the search stops
// within 0.5 % of the plan, since the probes nearest the LP bound cost the
// most. Out of time at a probe, the highest probably certified z is tried
// with its π, and the last π on smaller z by bisection (a smaller z only
// removes groups).
//
// Tokens are unit weights (pattern counts must be integral), so
// max_g D_g > z means max_g D_g ≥ z+1.

// coverLayer is one layer's tokens as bitsets: sets[e] holds the tokens
// that route to expert e.
type coverLayer struct {
	E, G, m, W int
	sets       [][]uint64
	load       []int
	// lcap, when > 0, also limits a group's routed tokens Σ_{e∈S} load_e:
	// the bound then holds for plans whose busiest GPU routes at most lcap.
	lcap int
}

// fits reports whether routed tokens ld respect lcap.
func (c *coverLayer) fits(ld int) bool { return c.lcap <= 0 || ld <= c.lcap }

// groupLoad returns Σ_{e∈S} load_e.
func (c *coverLayer) groupLoad(S []int) int {
	n := 0
	for _, e := range S {
		n += c.load[e]
	}
	return n
}

// coverLayers builds the bitsets of every layer from per-token patterns
// with integral counts (a count of c stands for c tokens); ok is false when
// a count is not integral or the tokens are too many to expand.
func coverLayers(p Problem) ([]*coverLayer, bool) {
	s := p.Stats
	G := p.Cluster.GPUs()
	if s.Patterns == nil || s.Experts%G != 0 {
		return nil, false
	}
	T := 0
	for i := range s.Patterns {
		c := s.Patterns[i].Count
		if c < 0 || c != math.Trunc(c) || c > 1<<20 {
			return nil, false
		}
		T += int(c)
		if T > 1<<20 {
			return nil, false
		}
	}
	W := (T + 63) / 64
	// The bitsets take L·E·W words; beyond 256 MiB the bound is skipped.
	// Annealing counts experts per token and GPU in a byte.
	if s.Layers*s.Experts*W > 1<<25 || s.TopK > 255 {
		return nil, false
	}
	out := make([]*coverLayer, s.Layers)
	k := s.TopK
	for l := range out {
		c := &coverLayer{E: s.Experts, G: G, m: s.Experts / G, W: W, sets: make([][]uint64, s.Experts), load: make([]int, s.Experts)}
		words := make([]uint64, s.Experts*W)
		for e := range c.sets {
			c.sets[e] = words[e*W : (e+1)*W]
		}
		t := 0
		for i := range s.Patterns {
			pt := &s.Patterns[i]
			for range int(pt.Count) {
				for _, e := range pt.Experts[l*k : (l+1)*k] {
					c.sets[e][t>>6] |= 1 << (t & 63)
				}
				t++
			}
		}
		for e := range c.sets {
			c.load[e] = popcount(c.sets[e])
		}
		out[l] = c
	}
	return out, true
}

func popcount(w []uint64) int {
	n := 0
	for _, x := range w {
		n += bits.OnesCount64(x)
	}
	return n
}

// cover returns N(S), the tokens with at least one expert in S.
func (c *coverLayer) cover(S []int) int {
	n := 0
	for w := 0; w < c.W; w++ {
		var x uint64
		for _, e := range S {
			x |= c.sets[e][w]
		}
		n += bits.OnesCount64(x)
	}
	return n
}

// marginalUpTo returns |sets[e] \ cov|, stopping early once it exceeds
// limit (the result is then some value > limit).
func (c *coverLayer) marginalUpTo(e int, cov []uint64, limit int) int {
	n := 0
	for w, x := range c.sets[e] {
		n += bits.OnesCount64(x &^ cov[w])
		if n > limit {
			return n
		}
	}
	return n
}

// maxGroupCover returns max over the groups of part of N(S).
func (c *coverLayer) maxGroupCover(part [][]int) int {
	best := 0
	for _, S := range part {
		best = max(best, c.cover(S))
	}
	return best
}

// searchStatus is coverSearch's verdict.
type searchStatus int

const (
	searchNone    searchStatus = iota // no group reaches the threshold (proof)
	searchFound                       // a group reaching it was found
	searchTimeout                     // stopped at the deadline
)

// coverSearchAll looks for groups S, |S| ≤ m, N(S) ≤ z, with π(S) ≥ theta,
// by exhaustive depth-first branch and bound over the experts with π > 0
// in decreasing π (experts with π = 0 cannot raise π(S), and every subset
// of a feasible group is feasible). A branch is cut when even the largest
// remaining weights that still fit (each on its own) cannot reach theta.
// It collects up to limit groups (and stops 2000 nodes after the first).
func (c *coverLayer) coverSearchAll(ctx context.Context, pi []float64, z int, theta float64, limit int, deadline time.Time) ([][]int, searchStatus) {
	order := make([]int, 0, c.E)
	for e := 0; e < c.E; e++ {
		if pi[e] > 0 && c.load[e] <= z && c.fits(c.load[e]) {
			order = append(order, e)
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		if pi[a] != pi[b] {
			if pi[a] > pi[b] {
				return -1
			}
			return 1
		}
		return a - b
	})
	W := c.W
	s := &coverDFS{ctx: ctx, z: z, theta: theta, order: order, deadline: deadline, W: W, m: c.m, lcap: c.lcap,
		cov: make([]uint64, (c.m+1)*W), marg: make([]int, len(order)*(c.m+1)), cand: make([]int, len(order)*(c.m+1)),
		pi: make([]float64, len(order)), load: make([]int, len(order)), sets: make([]uint64, len(order)*W)}
	for j, e := range order {
		s.pi[j], s.load[j] = pi[e], c.load[e]
		copy(s.sets[j*W:], c.sets[e])
	}
	s.limit = limit
	all := make([]int, len(order))
	for j := range all {
		all[j] = j
	}
	s.dfs(0, all, 0, 0, 0)
	if len(s.found) > 0 {
		return s.found, searchFound
	}
	if s.timeout {
		return nil, searchTimeout
	}
	return nil, searchNone
}

// coverDFS is coverSearchAll's state. Experts are addressed by their
// position j in order (decreasing π), with π, load and token bitset
// copied there so that the inner loop reads contiguous memory.
type coverDFS struct {
	z        int
	theta    float64
	order    []int
	deadline time.Time
	ctx      context.Context
	W, m     int
	lcap     int       // 0: none
	pi       []float64 // by position
	load     []int     // by position
	sets     []uint64  // by position, W words each
	cov      []uint64  // one bitset per depth
	marg     []int     // candidate marginals per depth
	cand     []int     // candidate positions per depth
	cur      []int
	nodes    int
	timeout  bool
	limit    int
	found    [][]int
	stopAt   int
}

// dfs extends cur (depth d, covering n tokens, routing ld, weight val)
// with the experts at positions in (increasing, each after the last one
// chosen), recording groups that reach theta; true when limit groups are
// found.
func (s *coverDFS) dfs(d int, in []int, n, ld int, val float64) bool {
	if val >= s.theta {
		s.found = append(s.found, slices.Clone(s.cur))
		if len(s.found) == 1 {
			// More groups are welcome, but only for a little more search.
			s.stopAt = s.nodes + 2000
		}
		if len(s.found) >= s.limit {
			return true
		}
	}
	if s.stopAt > 0 && s.nodes >= s.stopAt {
		return true
	}
	need := s.m - d
	if need == 0 {
		return false
	}
	s.nodes++
	if s.nodes&1023 == 0 && expired(s.ctx, s.deadline) {
		s.timeout = true
		return false
	}
	W := s.W
	cov := s.cov[d*W : (d+1)*W]
	room := s.z - n
	base := d * len(s.order)
	cands := s.cand[base:base]
	margs := s.marg[base:base]
	// Only the parent's candidates can still fit: N(S ∪ {j}) only grows
	// down the tree. They come in decreasing π, and j can complete a group
	// only with need−1 others that fit, whose π is at most that of the
	// heaviest fitting ones found so far (f of them, summing fsum) or of j
	// itself: once even that falls short of theta, so does every later j.
	fsum, f := 0.0, 0
	for _, j := range in {
		pj := s.pi[j]
		if val+pj+fsum+float64(max(0, need-1-f))*pj < s.theta {
			break
		}
		if s.lcap > 0 && ld+s.load[j] > s.lcap {
			continue
		}
		set := s.sets[j*W : (j+1)*W]
		m := 0
		for w := 0; w < W; w += 4 {
			for k := w; k < min(w+4, W); k++ {
				m += bits.OnesCount64(set[k] &^ cov[k])
			}
			if m > room {
				break
			}
		}
		if m <= room {
			cands = append(cands, j)
			margs = append(margs, m)
			if f < need-1 {
				fsum += pj
			}
			f++
		}
	}
	next := s.cov[(d+1)*W : (d+2)*W]
	for ci, j := range cands {
		b := val
		for k := ci; k < len(cands) && k < ci+need; k++ {
			b += s.pi[cands[k]]
		}
		if b < s.theta {
			return false
		}
		set := s.sets[j*W : (j+1)*W]
		for w := range next {
			next[w] = cov[w] | set[w]
		}
		s.cur = append(s.cur, s.order[j])
		if s.dfs(d+1, cands[ci+1:], n+margs[ci], ld+s.load[j], val+s.pi[j]) {
			return true
		}
		s.cur = s.cur[:len(s.cur)-1]
		if s.timeout {
			return false
		}
	}
	return false
}

// heuristicColumns looks for groups with π(S) > 1 by randomised greedy
// construction (weight per newly covered token, with random smoothing)
// followed by swaps that raise π(S) within N(S) ≤ z. It returns distinct
// groups, best first.
func (c *coverLayer) heuristicColumns(pi []float64, z int, starts int, rng *rand.Rand) [][]int {
	type col struct {
		S   []int
		val float64
	}
	var found []col
	seen := map[string]bool{}
	cov := make([]uint64, c.W)
	kx := make([]uint64, c.W)
	in := make([]bool, c.E)
	for st := range starts {
		// Half the starts weigh experts by π per newly covered token,
		// half by π alone (jittered), as the exhaustive search does.
		byWeight := st%2 == 1
		clear(cov)
		clear(in)
		S := make([]int, 0, c.m)
		n, ld := 0, 0 // tokens reached and routed by S
		smooth := 1 + rng.Float64()*float64(c.load[0]+1)
		for len(S) < c.m {
			best, bestScore, bestM := -1, 0.0, 0
			for e := 0; e < c.E; e++ {
				if in[e] || pi[e] <= 0 {
					continue
				}
				if !c.fits(ld + c.load[e]) {
					continue
				}
				m := c.marginalUpTo(e, cov, z-n)
				if n+m > z {
					continue
				}
				score := pi[e] / (float64(m) + smooth)
				if byWeight {
					score = pi[e] * (0.75 + 0.5*rng.Float64())
				}
				if best < 0 || score > bestScore {
					best, bestScore, bestM = e, score, m
				}
			}
			if best < 0 {
				break
			}
			S = append(S, best)
			in[best] = true
			n += bestM
			ld += c.load[best]
			for w := range cov {
				cov[w] |= c.sets[best][w]
			}
		}
		// Swaps: replace one member by a heavier outsider that still fits
		// (checked against the cover of the other members, kx).
		for improved := true; improved; {
			improved = false
			for i := range S {
				out := S[i]
				clear(kx)
				for _, e := range S {
					if e != out {
						for w, x := range c.sets[e] {
							kx[w] |= x
						}
					}
				}
				base, ldx := popcount(kx), c.groupLoad(S)-c.load[out]
				bestE, bestGain := -1, 1e-12
				for e := 0; e < c.E; e++ {
					if in[e] || pi[e]-pi[out] <= bestGain {
						continue
					}
					if c.fits(ldx+c.load[e]) && base+c.marginalUpTo(e, kx, z-base) <= z {
						bestE, bestGain = e, pi[e]-pi[out]
					}
				}
				if bestE >= 0 {
					in[out], in[bestE] = false, true
					S[i] = bestE
					improved = true
				}
			}
			if len(S) < c.m {
				clear(kx)
				for _, e := range S {
					for w, x := range c.sets[e] {
						kx[w] |= x
					}
				}
				base, ld := popcount(kx), c.groupLoad(S)
				for e := 0; e < c.E; e++ {
					if !in[e] && pi[e] > 0 && c.fits(ld+c.load[e]) && base+c.marginalUpTo(e, kx, z-base) <= z {
						S = append(S, e)
						in[e] = true
						improved = true
						break
					}
				}
			}
		}
		val := 0.0
		for _, e := range S {
			val += pi[e]
		}
		if val <= 1+1e-9 {
			continue
		}
		k := groupKey(S)
		if !seen[k] {
			seen[k] = true
			found = append(found, col{slices.Clone(S), val})
		}
	}
	slices.SortFunc(found, func(a, b col) int {
		if a.val > b.val {
			return -1
		}
		if a.val < b.val {
			return 1
		}
		return 0
	})
	out := make([][]int, len(found))
	for i, f := range found {
		out[i] = f.S
	}
	return out
}

func groupKey(S []int) string {
	s := slices.Clone(S)
	slices.Sort(s)
	var b strings.Builder
	for _, e := range s {
		b.WriteByte(byte(e >> 8))
		b.WriteByte(byte(e))
	}
	return b.String()
}

// coverHeuristicStarts is how many randomised starts the heuristic
// pricing makes per round (tests set 0 so that the exhaustive search finds
// every column).
var coverHeuristicStarts = 32

// coverCG is the column generation state of one layer.
type coverCG struct {
	c       *coverLayer
	backend mip.Backend
	cols    [][]int
	ncov    []int
	nload   []int
	keys    map[string]bool
	rng     *rand.Rand
	lastPi  []float64 // the duals of the last master solved
	lp      *coverLP  // nil: HiGHS solves the master
}

// addCol adds group S (if new).
func (g *coverCG) addCol(S []int) {
	k := groupKey(S)
	if g.keys[k] {
		return
	}
	g.keys[k] = true
	g.cols = append(g.cols, slices.Clone(S))
	g.ncov = append(g.ncov, g.c.cover(S))
	g.nload = append(g.nload, g.c.groupLoad(S))
	if g.lp != nil {
		g.lp.add(g.cols[len(g.cols)-1])
	}
}

// master solves the restricted LP over the columns with N(S) ≤ z and
// returns its value, the duals π (clamped at 0) and the largest N(S) among
// columns with x_S > 0.
func (g *coverCG) master(ctx context.Context, z int) (float64, []float64, int, error) {
	c := g.c
	if g.lp != nil {
		for j, n := range g.ncov {
			g.lp.allow[j] = n <= z && c.fits(g.nload[j])
		}
		if val, y, ok := g.lp.solve(20 * c.E * c.E); ok {
			pi := make([]float64, c.E)
			for e, v := range y {
				pi[e] = math.Max(0, v)
			}
			used := 0
			for j := range g.lp.primal() {
				used = max(used, g.ncov[j])
			}
			return val, pi, used, nil
		}
		if g.backend == nil {
			return 0, nil, 0, errNoDuals
		}
	}
	var use []int
	for i, n := range g.ncov {
		if n <= z && c.fits(g.nload[i]) {
			use = append(use, i)
		}
	}
	m := &mip.Model{Cost: make([]float64, len(use)), Lower: make([]float64, len(use)), Upper: make([]float64, len(use)), Integer: make([]bool, len(use))}
	for j := range use {
		m.Cost[j] = 1
		m.Upper[j] = math.Inf(1)
	}
	rows := make([][]int, c.E)
	for j, i := range use {
		for _, e := range g.cols[i] {
			rows[e] = append(rows[e], j)
		}
	}
	m.RowStart = make([]int, 0, c.E+1)
	m.RowStart = append(m.RowStart, 0)
	for e := 0; e < c.E; e++ {
		for _, j := range rows[e] {
			m.RowIndex = append(m.RowIndex, j)
			m.RowValue = append(m.RowValue, 1)
		}
		m.RowLower = append(m.RowLower, 1)
		m.RowUpper = append(m.RowUpper, math.Inf(1))
		m.RowStart = append(m.RowStart, len(m.RowIndex))
	}
	sol, err := g.backend.Solve(ctx, m, mip.Options{NoPresolve: true})
	if err != nil {
		return 0, nil, 0, err
	}
	if sol.Status != mip.Optimal || len(sol.RowDual) != c.E {
		return 0, nil, 0, errNoDuals
	}
	pi := make([]float64, c.E)
	for e, y := range sol.RowDual {
		pi[e] = math.Max(0, math.Abs(y))
	}
	used := 0
	for j, i := range use {
		if sol.X[j] > 1e-9 {
			used = max(used, g.ncov[i])
		}
	}
	return sol.Objective, pi, used, nil
}

type coverError string

func (e coverError) Error() string { return string(e) }

const errNoDuals = coverError("solver: the LP backend returned no row duals")

// probeResult is the outcome of column generation at one threshold z.
type probeResult int

const (
	probeCertified probeResult = iota // max_g D_g > z for every partition
	probeFeasible                     // a fractional partition with groups ≤ z exists
	probeStalled                      // the heuristics found no column (no proof tried)
	probeTimeout                      // out of time
)

// certify runs column generation at threshold z until it certifies that
// max_g D_g > z, finds a fractional partition whose largest group reaches
// used ≤ z (feasible), or reaches the deadline. Pricing tries the
// randomised greedy groups, then climbs from the LP's support columns
// (coverswap.go), and runs the exhaustive search only when both find
// nothing: that search either proves z or returns a column they missed.
func (g *coverCG) certify(ctx context.Context, z int, deadline time.Time, prove bool) (res probeResult, used int, err error) {
	c := g.c
	for !expired(ctx, deadline) {
		val, pi, u, err := g.master(ctx, z)
		if err != nil {
			return probeTimeout, 0, err
		}
		g.lastPi = pi
		if val <= float64(c.G)*(1+1e-6) {
			return probeFeasible, u, nil
		}
		cols := g.heuristicColumns(pi, z, coverHeuristicStarts)
		if len(cols) == 0 && coverHeuristicStarts > 0 && g.lp != nil {
			seeds := make([][]int, 0, c.E)
			for j := range g.lp.primal() {
				seeds = append(seeds, g.cols[j])
			}
			slices.SortFunc(seeds, slices.Compare)
			cols = c.swapColumns(pi, z, seeds, 8)
		}
		if len(cols) > 0 {
			for _, S := range cols[:min(len(cols), 24)] {
				g.addCol(S)
			}
			continue
		}
		if !prove {
			return probeStalled, 0, nil
		}
		ok, S, st := g.proves(ctx, pi, z, deadline)
		if ok {
			return probeCertified, 0, nil
		}
		if st == searchTimeout {
			return probeTimeout, 0, nil
		}
		g.addCol(S)
	}
	return probeTimeout, 0, nil
}

func (g *coverCG) heuristicColumns(pi []float64, z int, starts int) [][]int {
	return g.c.heuristicColumns(pi, z, starts, g.rng)
}

// proves checks the certificate for π at z: true when no group S with
// |S| ≤ m and N(S) ≤ z has π(S) ≥ Σπ/G (up to a relative 1e-9 on the safe
// side); otherwise it returns the group found or the timeout.
func (g *coverCG) proves(ctx context.Context, pi []float64, z int, deadline time.Time) (bool, []int, searchStatus) {
	sum := 0.0
	for _, x := range pi {
		sum += x
	}
	theta := sum / float64(g.c.G) * (1 - 1e-9)
	if theta <= 0 {
		return false, nil, searchFound
	}
	found, st := g.c.coverSearchAll(ctx, pi, z, theta, 16, deadline)
	for _, S := range found[min(1, len(found)):] {
		g.addCol(S)
	}
	var S []int
	if len(found) > 0 {
		S = found[0]
	}
	return st == searchNone, S, st
}

// newCG starts column generation on layer c with one column per expert.
func (c *coverLayer) newCG(backend mip.Backend, seed uint64) *coverCG {
	rng := rand.New(rand.NewPCG(seed, 0x636f766572))
	g := &coverCG{c: c, backend: backend, keys: map[string]bool{}, rng: rng, lp: newCoverLP(c.E, rng)}
	for e := 0; e < c.E; e++ {
		g.addCol([]int{e})
	}
	return g
}

// bottleneck returns the largest z it certifies (max_g D_g > z for every
// partition) by the search described above, between the largest expert
// (or floor, certified by the caller) and the incumbent partition part,
// and whether the search closed the interval. It keeps g's columns: a
// second pass with a load cap (c.lcap) reuses those within the cap.
func (g *coverCG) bottleneck(ctx context.Context, part [][]int, floor int, deadline time.Time) (z int, converged bool, err error) {
	c := g.c
	g.lastPi = nil
	maxLoad := slices.Max(c.load)
	for _, S := range part {
		g.addCol(S)
	}
	// Every partition has a group reaching max_e load_e tokens, so lo is
	// certified from the start (as is floor, certified by the caller); the
	// plan reaches hi, so hi is not, unless the plan breaks lcap.
	lo, hi := max(maxLoad-1, floor), c.maxGroupCover(part)
	planLoad := 0
	for _, S := range part {
		planLoad = max(planLoad, c.groupLoad(S))
	}
	if !c.fits(planLoad) {
		hi = max(hi, lo+1) + (hi-lo)/2
	}
	if hi-lo <= 1 {
		return lo, true, nil
	}
	start := time.Now()
	reserve := deadline.Add(-time.Duration(0.15 * float64(deadline.Sub(start))))
	// See the file comment for the search; with under 4 s for the layer it
	// stops within 0.5 % of the plan: the last steps cost the most.
	tol := 1
	if deadline.Sub(start) < 4*time.Second {
		tol = max(1, hi/200)
	}
	trivial := lo // nothing above it certified yet
	step := max(1, hi*5/100)
	// tent is the highest z where the heuristic pricing stalled (tentPi its
	// duals): probably, not provably, below the LP bound.
	tent, lastZ := lo, -1
	var tentPi []float64
	for hi-lo > tol && lastZ < 0 {
		base := max(lo, tent)
		z, prove := (base+hi)/2, false
		switch {
		case lo == trivial && tent == lo:
			z, prove = max(lo+1, hi-step), true
		case hi-base <= tol:
			z, prove = tent, true
		}
		r, used, err := g.certify(ctx, z, reserve, prove)
		if err != nil {
			return -1, false, err
		}
		switch r {
		case probeCertified:
			lo, tent = z, max(tent, z)
		case probeFeasible:
			if hi = min(hi, used); tent >= hi {
				tent = lo
			}
		case probeStalled:
			tent, tentPi = z, g.lastPi
		default:
			lastZ = z
		}
	}
	if lastZ < 0 {
		return lo, true, nil
	}
	// Out of time at lastZ: try the stalled z with its duals, then bisect
	// below lastZ with the last ones.
	if tent > lo && tentPi != nil {
		if ok, _, _ := g.proves(ctx, tentPi, tent, deadline); ok {
			lo = tent
		}
	}
	if g.lastPi == nil {
		return lo, false, nil
	}
	l, h := lo+1, min(lastZ, hi-1)
	for l <= h && !expired(ctx, deadline) {
		mid := (l + h) / 2
		ok, _, st := g.proves(ctx, g.lastPi, mid, deadline)
		if st == searchTimeout {
			break
		}
		if ok {
			lo = mid
			l = mid + 1
		} else {
			h = mid - 1
		}
	}
	return lo, false, nil
}

// expired reports whether the solve was cancelled or deadline passed.
func expired(ctx context.Context, deadline time.Time) bool {
	return ctx.Err() != nil || !time.Now().Before(deadline)
}

// planGroups returns layer l's partition of a single-copy plan: the experts
// on each GPU.
func planGroups(plan *placement.Plan, l, G int) [][]int {
	part := make([][]int, G)
	lp := plan.Layers[l]
	for s, e := range lp.SlotExpert {
		g := int(lp.SlotGPU[s])
		part[g] = append(part[g], int(e))
	}
	return part
}

// homeCorner says that every plan of a layer has busiest routed tokens ≥ L
// and busiest distinct tokens ≥ D, or lies in another corner of the same
// layer: the layer's cost is at least the smallest homeCost over its
// corners.
type homeCorner struct{ L, D float64 }

// homeBottleneck certifies, per layer, lower bounds on the busiest GPU's
// distinct tokens over every plan (z+1 for the certified z), working on
// `workers` layers at once until deadline, each layer searching below
// plan's partition. When the bound converges with time left and the plan's
// busiest GPU routes λ > ⌈mean⌉ tokens, the layer is bounded again over the
// plans whose busiest GPU routes at most λ−1 (groups capped at λ−1), giving
// two corners: (⌈mean⌉, z_cap+1) and (λ, z+1). cls are the layers'
// bitsets (coverLayers). It returns nil when the problem is not one the
// bound covers.
func homeBottleneck(ctx context.Context, p Problem, cls []*coverLayer, backend mip.Backend, plan *placement.Plan, deadline time.Time, workers int, seed uint64) ([][]homeCorner, error) {
	if _, ok := homeCost(p); !ok || cls == nil {
		return nil, nil
	}
	G := p.Cluster.GPUs()
	out := make([][]homeCorner, len(cls))
	errs := make([]error, len(cls))
	// Layers whose plan reaches the most tokens take longest to bound; they
	// go last, so that the time the others leave goes to them.
	order := make([]int, len(cls))
	reach := make([]int, len(cls))
	parts := make([][][]int, len(cls))
	for l, c := range cls {
		parts[l] = planGroups(plan, l, G)
		order[l], reach[l] = l, c.maxGroupCover(parts[l])
	}
	slices.SortStableFunc(order, func(a, b int) int { return reach[a] - reach[b] })
	parallelLayers(len(cls), workers, deadline, func(i int, limit time.Duration) {
		l := order[i]
		c, part := cls[l], parts[l]
		end := time.Now().Add(limit)
		g := c.newCG(backend, seed+uint64(l))
		z, converged, err := g.bottleneck(ctx, part, -1, end)
		if err != nil {
			errs[l] = err
			return
		}
		out[l] = []homeCorner{{0, float64(z + 1)}}
		total := 0
		for _, x := range c.load {
			total += x
		}
		u0 := (total + G - 1) / G
		lam := 0
		for _, S := range part {
			lam = max(lam, c.groupLoad(S))
		}
		if !converged || lam <= u0 || lam-1 < slices.Max(c.load) || time.Until(end) < limit/10 {
			return
		}
		c.lcap = lam - 1
		zc, _, err := g.bottleneck(ctx, part, z, end)
		c.lcap = 0
		if err != nil {
			errs[l] = err
			return
		}
		out[l] = []homeCorner{{float64(u0), float64(zc + 1)}, {float64(lam), float64(z + 1)}}
	})
	for _, err := range errs {
		if errors.Is(err, errNoDuals) || ctx.Err() != nil {
			// A backend without LP duals, or a cancelled solve: no bound.
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
