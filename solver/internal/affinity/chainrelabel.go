package affinity

import (
	"slices"

	"github.com/moetuner/moetuner/internal/assign"
)

// nodeKinds gives every node a kind: two nodes are of one kind when their
// GPUs, position by position, have the same slots and the same speed, so
// that moving all of one node's copies onto the other's GPUs (the GPU with
// the same local index) changes no GPU's load or slot count.
func nodeKinds(slots []int, speed []float64, N, P int) []int {
	kind := make([]int, N)
	for a := range N {
		kind[a] = a
		for b := range a {
			if kind[b] == b && slices.Equal(slots[a*P:(a+1)*P], slots[b*P:(b+1)*P]) &&
				slices.Equal(speed[a*P:(a+1)*P], speed[b*P:(b+1)*P]) {
				kind[a] = b
				break
			}
		}
	}
	return kind
}

// bestMatch returns the permutation m of the N nodes, m[a] of a's kind,
// with the most Σ_a gain[a][m[a]], and that value less the identity's;
// the identity (and gain 0) unless some permutation is strictly better.
func bestMatch(gain [][]float64, kind []int) ([]int, float64) {
	N := len(gain)
	id, base, scale := make([]int, N), 0.0, 1.0
	for a := range N {
		id[a] = a
		base += gain[a][a]
		for _, v := range gain[a] {
			scale += max(v, -v)
		}
	}
	// Pairs of different kinds cost more than every gain together, so the
	// least assignment (the identity is one) never takes one.
	forbid := 4 * scale
	rowOf, _ := assign.Min(N, N, func(a, b int) float64 {
		if kind[a] != kind[b] {
			return forbid
		}
		return -gain[a][b]
	})
	m := make([]int, N)
	got := 0.0
	for b, a := range rowOf {
		m[a] = b
		got += gain[a][b]
	}
	for a, b := range m {
		if kind[a] != kind[b] {
			return id, 0
		}
	}
	if got-base <= 1e-12*scale {
		return id, 0
	}
	return m, got - base
}

// relabel moves, layer by layer, each node's copies as a whole onto
// another node of its kind (every copy to the GPU with the same local
// index), which keeps every GPU's load and every layer's cut within it,
// and changes only the cut between adjacent layers and the homes' terms.
// Layers are aligned with the layer before them by the matching of their
// nodes with the most weight between them (independent choices: the
// relative labels of adjacent layers are free), then all together with
// the homes of the first layer's dispatch and the last layer's combine.
// It returns the cut it saves (0: nothing changed).
//
// A swap search cannot do this: a run of layers whose nodes line up with
// each other but not with the layers before is cut at its edge, and
// moving the run one copy at a time first cuts it inside.
func (cp *chainProxy) relabel(kind []int) float64 {
	L, N := cp.L, cp.N
	alike := false
	for a, k := range kind {
		alike = alike || k != a
	}
	if !alike || L < 1 {
		return 0
	}
	gain := make([][]float64, N)
	for a := range gain {
		gain[a] = make([]float64, N)
	}
	clear := func() {
		for a := range gain {
			for b := range gain[a] {
				gain[a][b] = 0
			}
		}
	}
	// mu[l][a]: the node of layer l−1 that layer l's node a lines up with.
	mu := make([][]int, L)
	saved := 0.0
	for l := 1; l < L; l++ {
		clear()
		for y := range cp.exp[l] {
			row := gain[cp.node[l][y]]
			for x := range cp.exp[l-1] {
				row[cp.node[l-1][x]] += cp.pw(l, y, l-1, x)
			}
		}
		var s float64
		mu[l], s = bestMatch(gain, kind)
		saved += s
	}
	// m[a]: the node of layer 0 that layer L−1's node a lines up with.
	m := make([]int, N)
	for a := range m {
		m[a] = a
		for l := L - 1; l >= 1; l-- {
			m[a] = mu[l][m[a]]
		}
	}
	// The homes: layer 0's node b goes to lam0[b], and layer L−1's node a
	// to lam0[m[a]].
	clear()
	ends := []int{0}
	if L > 1 {
		ends = append(ends, L-1)
	}
	before := 0.0
	for _, l := range ends {
		for x := range cp.exp[l] {
			b := cp.node[l][x]
			before += cp.tw(l, x, b)
			if l > 0 {
				b = m[b]
			}
			for v := range N {
				gain[b][v] += cp.tw(l, x, v)
			}
		}
	}
	lam, s := bestMatch(gain, kind)
	for b := range N {
		s += gain[b][b]
	}
	saved += s - before
	if saved <= 1e-12*(1+before) {
		return 0
	}
	moved := make([]bool, L)
	for l := 0; l < L; l++ {
		if l > 0 {
			next := make([]int, N)
			for a := range next {
				next[a] = lam[mu[l][a]]
			}
			lam = next
		}
		if !isIdentity(lam) {
			cp.moveNodes(l, lam)
			moved[l] = true
		}
	}
	// A layer's partner counters change with its own nodes and its
	// neighbours'.
	for l := 0; l < L; l++ {
		if moved[l] || l > 0 && moved[l-1] || l+1 < L && moved[l+1] {
			cp.fillC(l)
		}
	}
	return saved
}

func isIdentity(m []int) bool {
	for a, b := range m {
		if a != b {
			return false
		}
	}
	return true
}

// moveNodes puts layer l's copies on node a onto node lam[a], GPU a·P+i
// to lam[a]·P+i, and carries the layer's per-GPU and per-node counters
// along (the partner counters c are for the caller to refill).
func (cp *chainProxy) moveNodes(l int, lam []int) {
	P, G := cp.P, cp.G
	to := func(g int) int { return lam[g/P]*P + g%P }
	for x := range cp.exp[l] {
		cp.node[l][x] = lam[cp.node[l][x]]
		cp.gpu[l][x] = to(cp.gpu[l][x])
	}
	nl := make([]float64, cp.N)
	for a, v := range cp.nload[l] {
		nl[lam[a]] = v
	}
	cp.nload[l] = nl
	perm := func(v []float64) []float64 {
		out := make([]float64, len(v))
		for g, x := range v {
			out[to(g)] = x
		}
		return out
	}
	cp.gload[l] = perm(cp.gload[l])
	if cp.dtok != nil && cp.dtok[l] != nil {
		cp.dtok[l] = perm(cp.dtok[l])
	}
	if cg := cp.cgOf(l); cg != nil {
		out := make([]float64, len(cg))
		for x := range cp.exp[l] {
			for g := range G {
				out[x*G+to(g)] = cg[x*G+g]
			}
		}
		cp.cg[l] = out
	}
}
