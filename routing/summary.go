package routing

import (
	"math"
	"slices"
)

// SummaryReport condenses Stats for the command line's stats command. It is
// a pure function of the stats, so equal stats give equal reports.
type SummaryReport struct {
	Tokens         float64
	Layers         int
	Experts        int
	TopK           int // 0 when unknown
	TransitionMode string
	// HasTransitions says whether the per-layer transition fields are set.
	HasTransitions bool
	PerLayer       []LayerSummary
}

// LayerSummary describes the load and, when known, the transitions of one
// layer.
type LayerSummary struct {
	Layer Layer
	Name  int // the model's layer number (LayerNames), or Layer
	Total float64
	Max   float64
	Mean  float64
	// Skew is Max/Mean, 0 for an empty layer.
	Skew float64
	// CV is the coefficient of variation (population standard deviation /
	// mean) of the expert loads, 0 for an empty layer.
	CV float64
	// TopPairShare is the share of the transition mass l→l+1 that falls in
	// the Experts heaviest (e1, e2) pairs: 1/Experts for uniform routing, 1
	// when every expert feeds a single successor. 0 for the last layer or
	// without transitions.
	TopPairShare float64
	// RowMaxShare is the mean over experts e1 with outgoing mass of
	// max_e2 R[e1][e2] / Σ_e2 R[e1][e2]: how predictable the next layer's
	// expert is from this layer's. 0 for the last layer or without
	// transitions.
	RowMaxShare float64
}

// Summary computes the SummaryReport of s. s must be valid (see Validate).
func Summary(s *Stats) SummaryReport {
	r := SummaryReport{
		Tokens:         s.Tokens,
		Layers:         s.Layers,
		Experts:        s.Experts,
		TopK:           s.TopK,
		HasTransitions: s.Transitions != nil,
	}
	if r.HasTransitions {
		r.TransitionMode = s.TransitionMode.String()
	}
	E := s.Experts
	for l := range s.Layers {
		ls := LayerSummary{Layer: Layer(l), Name: l}
		if s.LayerNames != nil {
			ls.Name = s.LayerNames[l]
		}
		for _, v := range s.Load[l] {
			ls.Total += v
			ls.Max = max(ls.Max, v)
		}
		if E > 0 && ls.Total > 0 {
			ls.Mean = ls.Total / float64(E)
			ls.Skew = ls.Max / ls.Mean
			var ss float64
			for _, v := range s.Load[l] {
				ss += (v - ls.Mean) * (v - ls.Mean)
			}
			ls.CV = math.Sqrt(ss/float64(E)) / ls.Mean
		}
		if s.Transitions != nil && l < len(s.Transitions) {
			m := s.Transitions[l]
			var total float64
			for _, v := range m {
				total += v
			}
			if total > 0 {
				sorted := slices.Clone(m)
				slices.Sort(sorted)
				var top float64
				for _, v := range sorted[max(len(sorted)-E, 0):] {
					top += v
				}
				ls.TopPairShare = top / total
				var sum float64
				rows := 0
				for e1 := range E {
					row := m[e1*E : (e1+1)*E]
					var rs, rm float64
					for _, v := range row {
						rs += v
						rm = max(rm, v)
					}
					if rs > 0 {
						sum += rm / rs
						rows++
					}
				}
				if rows > 0 {
					ls.RowMaxShare = sum / float64(rows)
				}
			}
		}
		r.PerLayer = append(r.PerLayer, ls)
	}
	return r
}
