package affinity

import (
	"math"
	"slices"
)

// balanceNodes balances every node's copies over its GPUs: from the copies'
// own arrangement and from a largest-first packing, it swaps copies
// between the node's busiest GPU and its others while that lowers the
// pair's larger load (tokens over speed), and keeps the arrangement with
// the lower peak, so no node ends busier than it came in. Copies keep
// their node, and no GPU gets two copies of one expert.
func balanceNodes(copies [][]int32, load []float64, slots []int, speed []float64, P int) [][]int32 {
	G := len(slots)
	N := G / P
	type cpy struct {
		e, g int
		x    float64
	}
	byNode := make([][]cpy, N)
	for e, gs := range copies {
		for _, g := range gs {
			byNode[int(g)/P] = append(byNode[int(g)/P], cpy{e, int(g), load[e] / float64(len(gs))})
		}
	}
	out := make([][]int32, len(copies))
	for b, list := range byNode {
		slices.SortStableFunc(list, func(u, v cpy) int {
			switch {
			case u.x > v.x:
				return -1
			case u.x < v.x:
				return 1
			}
			return u.e - v.e
		})
		has := func(held []int, e, except int) bool {
			return slices.ContainsFunc(held, func(q int) bool { return q != except && list[q].e == e })
		}
		// improve swaps copies between the busiest GPU and the others
		// and returns the peak.
		improve := func(held [][]int, gl []float64) float64 {
			for iter := 0; iter < len(list)*P; iter++ {
				top := 0
				for j := range gl {
					if gl[j]/speed[b*P+j] > gl[top]/speed[b*P+top] {
						top = j
					}
				}
				peak := gl[top] / speed[b*P+top]
				bi, bj, bo, bk := -1, -1, -1, -1
				best := peak
				for ii, i := range held[top] {
					for j := range held {
						if j == top {
							continue
						}
						for kk, k := range held[j] {
							ci, ck := list[i], list[k]
							if ci.e == ck.e || has(held[j], ci.e, k) || has(held[top], ck.e, i) {
								continue
							}
							m := math.Max((gl[top]-ci.x+ck.x)/speed[b*P+top], (gl[j]-ck.x+ci.x)/speed[b*P+j])
							if m < best*(1-1e-12) {
								best, bi, bj, bo, bk = m, ii, j, i, kk
							}
						}
					}
				}
				if bi < 0 {
					break
				}
				k := held[bj][bk]
				held[top][bi], held[bj][bk] = k, bo
				gl[top] += list[k].x - list[bo].x
				gl[bj] += list[bo].x - list[k].x
			}
			peak := 0.0
			for j := range gl {
				peak = max(peak, gl[j]/speed[b*P+j])
			}
			return peak
		}
		// The copies' own arrangement.
		own := make([][]int, P)
		ownLoad := make([]float64, P)
		for i, c := range list {
			own[c.g-b*P] = append(own[c.g-b*P], i)
			ownLoad[c.g-b*P] += c.x
		}
		bestHeld, bestPeak := own, improve(own, ownLoad)
		// Largest first.
		held := make([][]int, P)
		gl := make([]float64, P)
		ok := true
		for i, c := range list {
			best := -1
			for j := 0; j < P; j++ {
				g := b*P + j
				if len(held[j]) >= slots[g] || has(held[j], c.e, -1) {
					continue
				}
				if best < 0 || gl[j]/speed[g] < gl[best]/speed[b*P+best] {
					best = j
				}
			}
			if best < 0 {
				ok = false
				break
			}
			held[best] = append(held[best], i)
			gl[best] += c.x
		}
		if ok {
			if pk := improve(held, gl); pk < bestPeak {
				bestHeld = held
			}
		}
		for j, idx := range bestHeld {
			for _, i := range idx {
				out[list[i].e] = append(out[list[i].e], int32(b*P+j))
			}
		}
	}
	for e := range out {
		slices.Sort(out[e])
	}
	return out
}
