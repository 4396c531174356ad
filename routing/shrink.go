package routing

import "math"

// SourceReliability returns, per layer, how much of the per-source
// expert mix in s is signal rather than sampling noise: the split-half
// reliability of the per-source loads' departures from independence
// (rank total × expert total / tokens), stepped up to the whole sample
// (Spearman–Brown). The halves are the patterns split by a fixed hash of
// their index (patterns are sorted, so neighbours alike). It is
// 0 for a layer whose halves do not agree at all, near 1 where the mix is
// measured well, and nil when s has no patterns with sources.
func SourceReliability(s *Stats) []float64 {
	if s == nil || !s.HasSources() || s.TopK < 1 {
		return nil
	}
	_, top := s.MaxSource()
	R, E, K := top+1, s.Experts, s.TopK
	out := make([]float64, s.Layers)
	half := [2][]float64{make([]float64, R*E), make([]float64, R*E)}
	for l := range s.Layers {
		clear(half[0])
		clear(half[1])
		i := 0
		for _, pt := range s.Patterns {
			if pt.Source < 0 {
				continue
			}
			h := half[splitmix(uint64(i))&1]
			i++
			for _, e := range pt.Experts[l*K : (l+1)*K] {
				h[int(pt.Source)*E+int(e)] += pt.Count
			}
		}
		a, b := departures(half[0], R, E), departures(half[1], R, E)
		var ab, aa, bb float64
		for j := range a {
			ab += a[j] * b[j]
			aa += a[j] * a[j]
			bb += b[j] * b[j]
		}
		rho := 0.0
		if aa > 0 && bb > 0 {
			rho = max(0, ab/math.Sqrt(aa*bb))
		}
		out[l] = 2 * rho / (1 + rho)
	}
	return out
}

// departures is x[r·E+e] minus its expectation under independence of
// rank and expert.
func departures(x []float64, R, E int) []float64 {
	rt, et := make([]float64, R), make([]float64, E)
	tot := 0.0
	for r := range R {
		for e := range E {
			v := x[r*E+e]
			rt[r] += v
			et[e] += v
			tot += v
		}
	}
	d := make([]float64, len(x))
	if tot == 0 {
		return d
	}
	for r := range R {
		for e := range E {
			d[r*E+e] = x[r*E+e] - rt[r]*et[e]/tot
		}
	}
	return d
}

// ShrinkSources returns a copy of s whose SourceLoad departs from
// independence of rank and expert by only reliability[l] of what s
// records in layer l (Kelley's estimate of the true mix: the measured
// departure times its reliability). Load, the patterns and everything
// else are shared with s. It returns s itself when s has no SourceLoad
// or reliability does not have a value per layer.
func ShrinkSources(s *Stats, reliability []float64) *Stats {
	if s == nil || s.SourceLoad == nil || len(reliability) != s.Layers {
		return s
	}
	c := *s
	R, E := len(s.SourceLoad), s.Experts
	c.SourceLoad = make([][][]float64, R)
	for r := range R {
		c.SourceLoad[r] = make([][]float64, s.Layers)
	}
	x := make([]float64, R*E)
	for l := range s.Layers {
		for r := range R {
			copy(x[r*E:(r+1)*E], s.SourceLoad[r][l])
		}
		d := departures(x, R, E)
		a := min(max(reliability[l], 0), 1)
		for r := range R {
			row := make([]float64, E)
			for e := range E {
				row[e] = x[r*E+e] - (1-a)*d[r*E+e]
			}
			c.SourceLoad[r][l] = row
		}
	}
	return &c
}

// splitmix is SplitMix64's output function: a fixed, well-mixed hash.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
