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
	// GroupsTouched is the mean number of expert groups a token touches
	// per layer (GroupsTouched), filled by the caller that knows the
	// model's groups; nil otherwise.
	GroupsTouched []float64 `json:"groups_touched,omitempty"`
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

// GroupsTouched returns, for group-limited routing with groups expert
// groups (group g holds experts [g·E/groups, (g+1)·E/groups), as
// DeepSeek-V3's gate numbers them), the mean number of groups a token's
// experts touch in each layer and the most any token touches in any
// layer, from the per-token paths (a weighted sample of them on long
// traces). ok is false without paths or when groups does not divide the
// experts.
func GroupsTouched(s *Stats, groups int) (perLayer []float64, most int, ok bool) {
	if s == nil || len(s.Patterns) == 0 || groups < 1 || s.Experts%groups != 0 || s.TopK < 1 {
		return nil, 0, false
	}
	size := s.Experts / groups
	perLayer = make([]float64, s.Layers)
	seen := make([]int, groups)
	stamp := 0
	tot := 0.0
	for _, pt := range s.Patterns {
		tot += pt.Count
		for l := range s.Layers {
			stamp++
			n := 0
			for _, e := range pt.Experts[l*s.TopK : (l+1)*s.TopK] {
				if g := int(e) / size; seen[g] != stamp {
					seen[g] = stamp
					n++
				}
			}
			perLayer[l] += pt.Count * float64(n)
			most = max(most, n)
		}
	}
	if tot <= 0 {
		return nil, 0, false
	}
	for l := range perLayer {
		perLayer[l] /= tot
	}
	return perLayer, most, true
}
