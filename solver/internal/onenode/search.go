package onenode

import (
	"context"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/moetuner/moetuner/solver/internal/task"
)

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
func (c *Layer) coverSearchAll(ctx context.Context, pi []float64, z int, theta float64, limit int, deadline time.Time) ([][]int, searchStatus) {
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
	if s.nodes&1023 == 0 && task.Expired(s.ctx, s.deadline) {
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
func (c *Layer) heuristicColumns(pi []float64, z int, starts int, rng *rand.Rand) [][]int {
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
		S = c.swapGroup(S, in, kx, pi, z)
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

// swapGroup improves heuristicColumns's group S (in its members) by
// swaps: a member replaced by a heavier outsider that still fits (checked
// against the cover of the other members, kx, its scratch), and an
// outsider added while S has room; it returns S.
func (c *Layer) swapGroup(S []int, in []bool, kx []uint64, pi []float64, z int) []int {
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
	return S
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
