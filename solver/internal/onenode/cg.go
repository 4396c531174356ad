package onenode

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/task"
)

// coverHeuristicStarts is how many randomised starts the heuristic
// pricing makes per round.
const coverHeuristicStarts = 32

// coverCG is the column generation state of one layer.
type coverCG struct {
	c       *Layer
	backend mip.Backend
	cols    [][]int
	ncov    []int
	nload   []int
	keys    map[string]bool
	rng     *rand.Rand
	lastPi  []float64 // the duals of the last master solved
	lp      *coverLP  // nil: HiGHS solves the master
	budget  Budget
}

// Budget holds the bound's time rules; the solver facade fills it from its
// budget table.
type Budget struct {
	// MinLayer is the least time one layer's bound gets.
	MinLayer time.Duration
	// Reserve is the share of a layer's time kept back from the probes for
	// the final proofs.
	Reserve float64
	// Short: a layer with less time stops its search within ShortTol of
	// the plan, since the probes nearest the LP bound cost the most.
	Short    time.Duration
	ShortTol float64
	// CapShare: the load-capped second pass runs only while at least this
	// share of the layer's time is left.
	CapShare float64

	// exhaustivePricing turns the heuristic pricing off, so that every
	// column, and every certificate, comes from the exhaustive search
	// (tests); false prices with coverHeuristicStarts starts.
	exhaustivePricing bool
}

// heuristicStarts is how many randomised starts the heuristic pricing
// makes per round under b.
func (b Budget) heuristicStarts() int {
	if b.exhaustivePricing {
		return 0
	}
	return coverHeuristicStarts
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
	for !task.Expired(ctx, deadline) {
		val, pi, u, err := g.master(ctx, z)
		if err != nil {
			return probeTimeout, 0, err
		}
		g.lastPi = pi
		if val <= float64(c.G)*(1+1e-6) {
			return probeFeasible, u, nil
		}
		starts := g.budget.heuristicStarts()
		cols := g.heuristicColumns(pi, z, starts)
		if len(cols) == 0 && starts > 0 && g.lp != nil {
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
func (c *Layer) newCG(backend mip.Backend, seed uint64, b Budget) *coverCG {
	rng := rand.New(rand.NewPCG(seed, 0x636f766572))
	g := &coverCG{c: c, backend: backend, keys: map[string]bool{}, rng: rng, lp: newCoverLP(c.E, rng), budget: b}
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
	reserve := deadline.Add(-time.Duration(g.budget.Reserve * float64(deadline.Sub(start))))
	// See the package doc for the search; with little time for the layer
	// it stops within ShortTol of the plan: the last steps cost the most.
	tol := 1
	if deadline.Sub(start) < g.budget.Short {
		tol = max(1, int(float64(hi)*g.budget.ShortTol))
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
	for l <= h && !task.Expired(ctx, deadline) {
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

// Corner says that every plan of a layer has busiest routed tokens ≥ L
// and busiest distinct tokens ≥ D, or lies in another corner of the same
// layer: the layer's cost is at least the smallest Cost over its
// corners.
type Corner struct{ L, D float64 }

// Bottleneck certifies, per layer, lower bounds on the busiest GPU's
// distinct tokens over every plan (z+1 for the certified z), working on
// `workers` layers at once until deadline, each layer searching below
// plan's partition. When the bound converges with time left and the plan's
// busiest GPU routes λ > ⌈mean⌉ tokens, the layer is bounded again over the
// plans whose busiest GPU routes at most λ−1 (groups capped at λ−1), giving
// two corners: (⌈mean⌉, z_cap+1) and (λ, z+1). cls are the layers'
// bitsets (Layers). It returns nil when the problem is not one the
// bound covers.
func Bottleneck(ctx context.Context, sc costmodel.Scenario, cls []*Layer, backend mip.Backend, plan *placement.Plan, deadline time.Time, workers int, seed uint64, b Budget) ([][]Corner, error) {
	if _, ok := Cost(sc); !ok || cls == nil {
		return nil, nil
	}
	G := sc.Cluster.GPUs()
	out := make([][]Corner, len(cls))
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
	task.Layers(len(cls), workers, deadline, b.MinLayer, func(i int, limit time.Duration) {
		l := order[i]
		c, part := cls[l], parts[l]
		end := time.Now().Add(limit)
		g := c.newCG(backend, seed+uint64(l), b)
		z, converged, err := g.bottleneck(ctx, part, -1, end)
		if err != nil {
			errs[l] = err
			return
		}
		out[l] = []Corner{{0, float64(z + 1)}}
		total := 0
		for _, x := range c.load {
			total += x
		}
		u0 := (total + G - 1) / G
		lam := 0
		for _, S := range part {
			lam = max(lam, c.groupLoad(S))
		}
		if !converged || lam <= u0 || lam-1 < slices.Max(c.load) || time.Until(end) < time.Duration(b.CapShare*float64(limit)) {
			return
		}
		c.lcap = lam - 1
		zc, _, err := g.bottleneck(ctx, part, z, end)
		c.lcap = 0
		if err != nil {
			errs[l] = err
			return
		}
		out[l] = []Corner{{float64(u0), float64(zc + 1)}, {float64(lam), float64(z + 1)}}
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
