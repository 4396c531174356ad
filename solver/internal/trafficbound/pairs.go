package trafficbound

import (
	"math"
	"slices"

	"gonum.org/v1/gonum/floats"
	"gonum.org/v1/gonum/mat"
)

// pairProblem is the pair master: bound from above
//
//	W(X) = Σ_{a<b} C_ab ⟨x_a, x_b⟩
//
// over partitions X of the E experts into N nodes (x_a the unit vector of
// a's node) with at most caps[B] experts on node B. W is the token weight
// of pairs on a common node. It also bounds W over the replicated
// placements of even and static dispatch (x_a = a's copy shares), see
// pairBudget.
type pairProblem struct {
	C    []float64 // E×E, symmetric, zero diagonal, ≥ 0
	E, N int
	caps []int
	// noEigenTerm drops the λ(PAP) term of spectralBound: a mutation for
	// the tests, which must catch it. Production leaves it false.
	noEigenTerm bool
}

// pairBound returns min(spectral, star) for p; steps diagonal-shift
// refinement steps (Lanczos) precede the one full eigendecomposition that
// certifies the spectral value.
func pairBound(p *pairProblem, steps int, w *Work) float64 {
	if p.E < 2 || p.N < 2 {
		return 0 // no pair can share a node, or every pair does (N = 1 is not bounded here)
	}
	return min(spectralBound(p, steps, w), starBound(p))
}

// starBound: expert a shares its node with at most capmax−1 others, so
// Σ_b C_ab⟨x_a,x_b⟩ is at most the sum of row a's capmax−1 largest.
func starBound(p *pairProblem) float64 {
	lim := float64(slices.Max(p.caps)) - 1
	s := 0.0
	row := make([]float64, p.E)
	for a := range p.E {
		copy(row, p.C[a*p.E:(a+1)*p.E])
		s += knapsack(row, lim)
	}
	return s / 2
}

// knapsack is the largest Σ_i y_i·xs[i] with y ∈ [0,1], Σ y ≤ lim (xs ≥ 0).
// It sorts xs.
func knapsack(xs []float64, lim float64) float64 {
	slices.Sort(xs)
	s := 0.0
	for i := len(xs) - 1; i >= 0 && lim > 0; i-- {
		s += min(1, lim) * xs[i]
		lim--
	}
	return s
}

// massTerms are the node-mass quantities the spectral bound needs, worst
// case over the node sizes m allowed (exactly caps when Σ caps = E, else
// 0 ≤ m_B ≤ caps[B] with Σ m = E).
type massTerms struct {
	// sizes lists every multiset of node sizes (decreasing) the caps
	// allow, with gammas the nonzero eigenvalues of diag(m) − m·mᵀ/E
	// (raised by a rounding margin); nil when there are more than
	// maxSizeVectors, and the worst-case fields below are used instead.
	sizes, gammas [][]float64
	sumSqMax      float64   // max Σ_B m_B²
	sumSqMin      float64   // min Σ_B m_B² (a lower bound)
	cross         float64   // max √(Σ_B m_B (m_B − E/N)²)
	gamma         []float64 // upper bounds on the N−1 nonzero eigenvalues of RᵀR, decreasing
	invE          float64
}

// maxSizeVectors caps the size multisets spectralBound tries one by one.
const maxSizeVectors = 4096

func newMassTerms(E, N int, caps []int) massTerms {
	fE, fN := float64(E), float64(N)
	mbar := fE / fN
	t := massTerms{invE: 1 / fE}
	t.sizes = sizeVectors(E, caps, maxSizeVectors)
	for _, m := range t.sizes {
		t.gammas = append(t.gammas, sizeGammas(m, E))
	}
	total := 0
	for _, c := range caps {
		total += c
	}
	sorted := slices.Clone(caps)
	slices.Sort(sorted)
	slices.Reverse(sorted)
	if total == E {
		cr := 0.0
		for _, c := range caps {
			fc := float64(c)
			t.sumSqMax += fc * fc
			cr += fc * (fc - mbar) * (fc - mbar)
		}
		t.sumSqMin = t.sumSqMax
		t.cross = math.Sqrt(cr)
		t.gamma = sizeGammas(t.sizes[0], E)
		return t
	}
	left := E // greedy fill of the largest caps maximizes Σ m² (convex)
	for _, c := range sorted {
		m := min(c, left)
		t.sumSqMax += float64(m * m)
		left -= m
	}
	t.sumSqMin = fE * fE / fN // Cauchy–Schwarz
	for _, c := range sorted[:N-1] {
		t.gamma = append(t.gamma, float64(c)) // RᵀR ⪯ diag(m)
	}
	t.cross = math.Sqrt(maxSeparable(E, caps, func(x float64) float64 { return x * (x - mbar) * (x - mbar) }, mbar))
	return t
}

// sizeVectors lists the decreasing integer vectors m with Σ m = E and
// m_i ≤ i-th largest cap (exactly the multisets of node sizes that fit
// the caps), or nil when there are more than limit.
func sizeVectors(E int, caps []int, limit int) [][]float64 {
	c := slices.Clone(caps)
	slices.SortFunc(c, func(a, b int) int { return b - a })
	N := len(c)
	suffix := make([]int, N+1) // Σ of caps from i on
	for i := N - 1; i >= 0; i-- {
		suffix[i] = suffix[i+1] + c[i]
	}
	var out [][]float64
	m := make([]float64, N)
	var rec func(i, left, hi int) bool
	rec = func(i, left, hi int) bool {
		if i == N {
			if left == 0 {
				if len(out) == limit {
					return false
				}
				out = append(out, slices.Clone(m))
			}
			return true
		}
		for v := min(hi, c[i], left); v >= 0; v-- {
			if v*(N-i) < left || suffix[i+1] < left-v {
				break // the rest cannot make up left
			}
			m[i] = float64(v)
			if !rec(i+1, left-v, v) {
				return false
			}
		}
		return true
	}
	if !rec(0, E, E) {
		return nil
	}
	return out
}

// sizeGammas returns the N−1 largest eigenvalues of diag(m) − m·mᵀ/E
// (= RᵀR for a partition with node sizes m), decreasing, each raised by
// a rounding margin.
func sizeGammas(m []float64, E int) []float64 {
	N := len(m)
	G := mat.NewSymDense(N, nil)
	for B := range N {
		for C := range N {
			v := -m[B] * m[C] / float64(E)
			if B == C {
				v += m[B]
			}
			G.SetSym(B, C, v)
		}
	}
	var es mat.EigenSym
	if !es.Factorize(G, false) {
		return slices.Clone(m[:N-1]) // G ⪯ diag(m)
	}
	g := es.Values(nil)
	slices.SortFunc(g, cmpDesc)
	out := make([]float64, N-1)
	for i := range out {
		out[i] = max(g[i], 0)*(1+1e-12) + 1e-12*float64(E)
	}
	return out
}

// maxSeparable bounds max Σ_B g(m_B) over 0 ≤ m_B ≤ caps[B], Σ m_B = E,
// for the cubic g(x) = x(x−mbar)², by its Lagrangian dual
// λE + Σ_B max_{x∈[0,caps[B]]} (g(x) − λx), each inner maximum exact
// (endpoints and the roots of g′ = λ), minimized over λ by golden
// section (any λ gives a valid bound).
func maxSeparable(E int, caps []int, g func(float64) float64, mbar float64) float64 {
	inner := func(lam, hi float64) float64 {
		best := max(g(0), g(hi)-lam*hi)
		// g′(x) = 3x² − 4·mbar·x + mbar²
		a, b, c := 3.0, -4*mbar, mbar*mbar-lam
		if disc := b*b - 4*a*c; disc >= 0 {
			for _, x := range [2]float64{(-b - math.Sqrt(disc)) / (2 * a), (-b + math.Sqrt(disc)) / (2 * a)} {
				if x > 0 && x < hi {
					best = max(best, g(x)-lam*x)
				}
			}
		}
		return best
	}
	dual := func(lam float64) float64 {
		v := lam * float64(E)
		for _, c := range caps {
			v += inner(lam, float64(c))
		}
		return v
	}
	hi := 0.0
	for _, c := range caps {
		hi = max(hi, float64(c))
	}
	lo, up := -3*hi*hi, 3*hi*hi // |g′| ≤ 3·hi² on [0, hi]
	return max(min(dual(lo), dual(up), goldenMin(dual, lo, up, 200)), 0)
}

// goldenMin searches [lo, hi] for the least f by golden section (f
// convex, or at least unimodal), evaluating f at two points and then at
// one more in each of steps steps, and returns the least value it saw.
func goldenMin(f func(float64) float64, lo, hi float64, steps int) float64 {
	const phi = 0.6180339887498949
	x1, x2 := hi-phi*(hi-lo), lo+phi*(hi-lo)
	f1, f2 := f(x1), f(x2)
	best := min(f1, f2)
	for range steps {
		if f1 < f2 {
			hi, x2, f2 = x2, x1, f1
			x1 = hi - phi*(hi-lo)
			f1 = f(x1)
		} else {
			lo, x1, f1 = x1, x2, f2
			x2 = lo + phi*(hi-lo)
			f2 = f(x2)
		}
		best = min(best, f1, f2)
	}
	return best
}

// spectralBound is a projected eigenvalue bound (after Donath–Hoffman and
// Rendl–Wolkowicz) with a diagonal shift u. Write A = C + diag(u) and
// each column x_B = (m_B/E)·1 + r_B with r_B ⊥ 1 (m_B the node size);
// the r_B sum to 0, so RᵀR = diag(m) − m·mᵀ/E has rank ≤ N−1, and
// Σ_B (m_B/E)·r_B = R·(m − m̄)/E has norm at most √(Σ m_B(m_B−m̄)²)/E.
// With x_a binary, ‖x_a‖² = 1, so
//
//	2W = tr(XᵀAX) − Σ_a u_a
//	   ≤ (Σ m²/E²)·1ᵀA1 + 2‖P·A1‖·cross/E + Σ_{i<N} λ_i(PAP)⁺·γ_i − Σ_a u_a,
//
// P the projector orthogonal to 1, cross and γ_i the worst cases of
// massTerms (von Neumann's trace inequality for the third term). The shift is refined by
// a subgradient method on Lanczos estimates; the returned value is
// recomputed from a full eigendecomposition at the best shift, plus a
// rounding margin.
func spectralBound(p *pairProblem, steps int, w *Work) float64 {
	E, N := p.E, p.N
	if N < 2 {
		return 0
	}
	mt := newMassTerms(E, N, p.caps)
	rs := make([]float64, E)
	for a := range E {
		s := 0.0
		for _, x := range p.C[a*E : (a+1)*E] {
			s += x
		}
		rs[a] = s
	}
	mean := 0.0
	for _, x := range rs {
		mean += x / float64(E)
	}
	ev := &shiftEval{p: p, mt: mt, rs: rs, w: w}
	u := make([]float64, E)
	best, bestU := math.Inf(1), make([]float64, E)
	for _, f := range [...]float64{0, 0.05, 0.1, 0.15, 0.2} {
		for a := range u {
			u[a] = f * (mean - rs[a])
		}
		if v, _ := ev.value(u, estimate); v < best {
			best = v
			copy(bestU, u)
		}
	}
	copy(u, bestU)
	for it := range steps {
		v, g := ev.value(u, estimateGrad)
		if v < best {
			best = v
			copy(bestU, u)
		}
		nrm := 0.0
		for _, x := range g {
			nrm += x * x
		}
		if nrm == 0 || math.IsNaN(nrm) {
			break
		}
		step := 0.05 * math.Abs(v) / nrm / math.Sqrt(float64(1+it))
		for a := range u {
			u[a] -= step * g[a]
		}
	}
	v, _ := ev.value(bestU, certified)
	return v
}

// shiftEval evaluates the spectral bound at a shift.
type shiftEval struct {
	p         *pairProblem
	mt        massTerms
	rs        []float64
	w         *Work
	lastGamma []float64
}

// evalMode is how shiftEval.value computes the eigenvalues.
type evalMode int

const (
	// estimate: Lanczos eigenvalues only (choosing among shifts).
	estimate evalMode = iota
	// estimateGrad: Lanczos eigenvalues and vectors, for the subgradient.
	estimateGrad
	// certified: the full eigendecomposition that certifies the value.
	certified
)

// value returns the bound on W at shift u and, under estimateGrad, a
// subgradient in u (nil otherwise).
func (s *shiftEval) value(u []float64, mode evalMode) (float64, []float64) {
	mt := s.mt
	E := s.p.E
	var lam []float64
	var vec [][]float64
	if mode == certified || mode == estimate && 2*lanczosSteps(E, s.p.N) >= E {
		// Values only, and Lanczos would take at least half as many
		// steps as there are experts: its k·E² products and k²·E of
		// reorthogonalization then reach the full eigendecomposition's
		// ~E³. Measured on 256 experts (the chain bound of 58 layers,
		// whose GPU-level pair master has N = 32 or 64 parts): at k = 93
		// Lanczos was faster (4.1 s against 4.5 s), at k = 189 the full
		// one (7.9 s against 10.3 s).
		lam = s.fullTop(u)
	} else {
		lam, vec = s.lanczosTop(u, mode == estimateGrad)
	}
	if s.p.noEigenTerm {
		clear(lam)
	}
	S, su := 0.0, 0.0
	r := make([]float64, E) // A·1
	for a := range E {
		r[a] = s.rs[a] + u[a]
		S += r[a]
		su += u[a]
	}
	g := make([]float64, E)
	var val float64
	if mt.sizes != nil {
		val = s.bySizes(r, S, lam, g)
	} else {
		val = s.worstCase(r, S, lam, g)
	}
	val = (val - su) / 2
	if mode != estimateGrad {
		return val, nil
	}
	for a := range g {
		g[a] -= 1
	}
	gam := mt.gamma
	if mt.sizes != nil {
		gam = s.lastGamma
	}
	for i, l := range lam {
		if l > 0 {
			for a, x := range vec[i] {
				g[a] += gam[i] * x * x
			}
		}
	}
	for a := range g {
		g[a] /= 2
	}
	return val, g
}

// bySizes is max over the size multisets m of
//
//	−(Σ m²/E²)·S + 2·max_X Σ_B (m_B/E)·(A1)ᵀx_B + Σ_{i<N} λ_i⁺·γ_i(m)
//
// (writing X = (1/E)·1·mᵀ + Y, the cross term tr((1/E)m1ᵀAY) is linear in
// X, maximized exactly by giving the largest (A1)_a to the largest m_B),
// with r = A·1 and S = 1ᵀA1; g receives the gradient in u of the maximizer
// but the −1 and eigenvalue parts, and s.lastGamma its γ.
func (s *shiftEval) bySizes(r []float64, S float64, lam, g []float64) float64 {
	E := s.p.E
	order := make([]int, E)
	for a := range order {
		order[a] = a
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmpDesc(r[a], r[b]) })
	prefix := make([]float64, E+1)
	for i, a := range order {
		prefix[i+1] = prefix[i] + r[a]
	}
	best, bi := math.Inf(-1), 0
	for k, m := range s.mt.sizes {
		v, sq, at := 0.0, 0.0, 0
		for _, mb := range m {
			n := int(mb)
			v += 2 * mb / float64(E) * (prefix[at+n] - prefix[at])
			at += n
			sq += mb * mb
		}
		v -= sq / float64(E*E) * S
		for i, l := range lam {
			v += max(l, 0) * s.mt.gammas[k][i]
		}
		if v > best {
			best, bi = v, k
		}
	}
	m := s.mt.sizes[bi]
	s.lastGamma = s.mt.gammas[bi]
	sq := 0.0
	for _, mb := range m {
		sq += mb * mb
	}
	at := 0
	for _, mb := range m {
		for _, a := range order[at : at+int(mb)] {
			g[a] = 2*mb/float64(E) - sq/float64(E*E)
		}
		at += int(mb)
	}
	return best
}

// worstCase is the bound with each size-dependent term at its own worst
// case (for caps with too many size multisets to try):
//
//	(Σ m²/E²)·S + 2‖P·A1‖·cross/E + Σ_{i<N} λ_i⁺·γ_i.
func (s *shiftEval) worstCase(r []float64, S float64, lam, g []float64) float64 {
	mt, E := s.mt, s.p.E
	mean := S / float64(E)
	wv := make([]float64, E)
	wn := 0.0
	for a := range E {
		wv[a] = r[a] - mean
		wn += wv[a] * wv[a]
	}
	wn = math.Sqrt(wn)
	sq := mt.sumSqMax
	if S < 0 {
		sq = mt.sumSqMin
	}
	v := S*sq*mt.invE*mt.invE + 2*wn*mt.invE*mt.cross
	for i, l := range lam {
		v += max(l, 0) * mt.gamma[i]
	}
	for a := range E {
		g[a] = sq * mt.invE * mt.invE
		if wn > 0 {
			g[a] += 2 * mt.invE * mt.cross * wv[a] / wn
		}
	}
	return v
}

// apply sets y = P(C + diag u)P·x.
func (s *shiftEval) apply(u, x, y []float64) {
	E := s.p.E
	m := 0.0
	for _, v := range x {
		m += v
	}
	m /= float64(E)
	px := make([]float64, E)
	for a := range x {
		px[a] = x[a] - m
	}
	ym := 0.0
	for a := range E {
		v := u[a]*px[a] + floats.Dot(s.p.C[a*E:(a+1)*E], px)
		y[a] = v
		ym += v
	}
	ym /= float64(E)
	for a := range y {
		y[a] -= ym
	}
	s.w.MatVecs++
}

// lanczosSteps is lanczosTop's Krylov dimension for E experts and N
// parts: three per eigenvalue wanted, at least 40, below E.
func lanczosSteps(E, N int) int { return min(E-1, max(40, 3*(N-1))) }

// lanczosTop estimates the N−1 largest eigenvalues of P(C+diag u)P and,
// when vectors is set, their vectors, by Lanczos with full
// reorthogonalization from a fixed start (deterministic).
func (s *shiftEval) lanczosTop(u []float64, vectors bool) ([]float64, [][]float64) {
	E, N := s.p.E, s.p.N
	k := lanczosSteps(E, N)
	V := make([][]float64, 0, k+1)
	v := make([]float64, E)
	for a := range v {
		v[a] = math.Sin(float64(a+1)*1.618033988749895) + 0.1
	}
	orthoNorm(v, nil)
	V = append(V, v)
	alpha, beta := make([]float64, 0, k), make([]float64, 0, k)
	y := make([]float64, E)
	for j := 0; j < k; j++ {
		s.apply(u, V[j], y)
		a := dot(y, V[j])
		alpha = append(alpha, a)
		next := slices.Clone(y)
		orthoNorm(next, V) // full reorthogonalization against V (and 1)
		b := norm(next)
		if b < 1e-9*(math.Abs(a)+1) || j == k-1 {
			break
		}
		// recompute β as ⟨A v_j, v_{j+1}⟩ for a symmetric tridiagonal
		for i := range next {
			next[i] /= b
		}
		beta = append(beta, dot(y, next))
		V = append(V, next)
	}
	m := len(alpha)
	T := mat.NewSymDense(m, nil)
	for i := range m {
		T.SetSym(i, i, alpha[i])
		if i+1 < m {
			T.SetSym(i, i+1, beta[i])
		}
	}
	var es mat.EigenSym
	if !es.Factorize(T, vectors) {
		return make([]float64, N-1), make([][]float64, N-1)
	}
	vals := es.Values(nil)
	if !vectors {
		slices.SortFunc(vals, cmpDesc)
		lam := make([]float64, N-1)
		copy(lam, vals)
		return lam, nil
	}
	var Z mat.Dense
	es.VectorsTo(&Z)
	order := make([]int, m)
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(i, j int) int { return cmpDesc(vals[i], vals[j]) })
	lam := make([]float64, N-1)
	vec := make([][]float64, N-1)
	for r := 0; r < N-1; r++ {
		vec[r] = make([]float64, E)
		if r >= m {
			continue
		}
		i := order[r]
		lam[r] = vals[i]
		for j := range m {
			z := Z.At(j, i)
			for a := range E {
				vec[r][a] += z * V[j][a]
			}
		}
	}
	return lam, vec
}

// fullTop returns upper bounds on the N−1 largest eigenvalues of
// P(C+diag u)P from a full symmetric eigendecomposition, each raised by
// a rounding margin of 1e-12·E·‖·‖_F (LAPACK's dsyev is backward stable
// with error well below it).
func (s *shiftEval) fullTop(u []float64) []float64 {
	E, N := s.p.E, s.p.N
	rsA := make([]float64, E)
	tot := 0.0
	for a := range E {
		rsA[a] = s.rs[a] + u[a]
		tot += rsA[a]
	}
	fE := float64(E)
	M := mat.NewSymDense(E, nil)
	fro := 0.0
	for a := range E {
		for b := a; b < E; b++ {
			c := s.p.C[a*E+b]
			if a == b {
				c += u[a]
			}
			v := c - rsA[a]/fE - rsA[b]/fE + tot/(fE*fE)
			M.SetSym(a, b, v)
			fro += v * v
			if a != b {
				fro += v * v
			}
		}
	}
	s.w.Eigen++
	var es mat.EigenSym
	if !es.Factorize(M, false) {
		return slices.Repeat([]float64{math.Sqrt(fro)}, N-1) // λ ≤ ‖M‖_F
	}
	vals := es.Values(nil)
	slices.SortFunc(vals, cmpDesc)
	margin := 1e-12 * fE * math.Sqrt(fro)
	out := make([]float64, N-1)
	for i := range out {
		out[i] = vals[i] + margin
	}
	return out
}

func cmpDesc(a, b float64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

func dot(a, b []float64) float64 { return floats.Dot(a, b) }

func norm(a []float64) float64 { return math.Sqrt(dot(a, a)) }

// orthoNorm makes v orthogonal to 1 and to the unit vectors in basis
// (twice, for stability) and normalizes it when basis is nil.
func orthoNorm(v []float64, basis [][]float64) {
	for range 2 {
		m := 0.0
		for _, x := range v {
			m += x
		}
		m /= float64(len(v))
		for i := range v {
			v[i] -= m
		}
		for _, b := range basis {
			d := dot(v, b)
			for i := range v {
				v[i] -= d * b[i]
			}
		}
	}
	if basis == nil {
		n := norm(v)
		for i := range v {
			v[i] /= n
		}
	}
}
