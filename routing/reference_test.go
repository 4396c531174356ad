package routing

import "slices"

// referenceStats is Trace.Stats as it was before the streaming counters:
// one token at a time, every path kept in a map. The tests compare the
// streaming counters with it on random traces.
func referenceStats(t *Trace, opts StatsOptions) *Stats {
	L, E, K := t.Layers, t.Experts, t.TopK
	s := &Stats{
		Layers:         L,
		Experts:        E,
		TopK:           K,
		Tokens:         float64(t.Tokens),
		Load:           newMatrix(L, E),
		TransitionMode: opts.Transitions,
		LayerNames:     slices.Clone(t.LayerNames),
		ModelLayers:    t.ModelLayers,
	}
	dense := L*E*E <= maxDenseEntries
	if dense {
		s.Transitions = newMatrix(max(L-1, 0), E*E)
		s.CoActivation = newMatrix(L, E*E)
	}
	var stepIndex map[int32]int
	if t.Step != nil {
		steps := slices.Clone(t.Step)
		slices.Sort(steps)
		steps = slices.Compact(steps)
		stepIndex = make(map[int32]int, len(steps))
		for i, st := range steps {
			stepIndex[st] = i
		}
		s.StepLoad = make([][][]float64, len(steps))
		for i := range s.StepLoad {
			s.StepLoad[i] = newMatrix(L, E)
		}
	}
	var srcLoad [][][]float64
	if t.Source != nil {
		maxSrc := int32(-1)
		for _, r := range t.Source {
			maxSrc = max(maxSrc, r)
		}
		// Ranks are dense small integers; a stray huge id leaves the
		// per-source loads unknown rather than allocating for it.
		if n := int(maxSrc) + 1; n > 0 && n*L*E <= maxDenseEntries {
			srcLoad = make([][][]float64, n)
			for r := range srcLoad {
				srcLoad[r] = newMatrix(L, E)
			}
		}
	}
	s.SourceLoad = srcLoad
	var pats map[string]int
	if !opts.NoPatterns {
		pats = make(map[string]int)
	}
	sorted := make([]int16, L*K)
	for tok := range t.Tokens {
		ids := t.IDs[tok*L*K : (tok+1)*L*K]
		for l := range L {
			set := ids[l*K : (l+1)*K]
			for _, e := range set {
				s.Load[l][e]++
			}
			if s.StepLoad != nil {
				sl := s.StepLoad[stepIndex[t.Step[tok]]][l]
				for _, e := range set {
					sl[e]++
				}
			}
			if srcLoad != nil && t.Source[tok] >= 0 {
				sl := srcLoad[t.Source[tok]][l]
				for _, e := range set {
					sl[e]++
				}
			}
			if !dense {
				continue
			}
			co := s.CoActivation[l]
			for a := range set {
				for b := a + 1; b < len(set); b++ {
					co[int(set[a])*E+int(set[b])]++
					co[int(set[b])*E+int(set[a])]++
				}
			}
			if l+1 < L {
				next := ids[(l+1)*K : (l+2)*K]
				tr := s.Transitions[l]
				if opts.Transitions == TransitionTop1 {
					tr[int(set[0])*E+int(next[0])]++
				} else {
					for _, a := range set {
						for _, b := range next {
							tr[int(a)*E+int(b)]++
						}
					}
				}
			}
		}
		if pats != nil {
			src := int32(-1)
			if t.Source != nil {
				src = t.Source[tok]
			}
			copy(sorted, ids)
			for l := range L {
				slices.Sort(sorted[l*K : (l+1)*K])
			}
			key := patternKey(src, sorted)
			if _, ok := pats[key]; !ok && len(pats) >= MaxPatterns {
				pats = nil
				continue
			}
			pats[key]++
		}
	}
	if pats != nil {
		s.Patterns = make([]Pattern, 0, len(pats))
		for _, key := range sortedKeys(pats) {
			src, ex := decodePatternKey(key)
			s.Patterns = append(s.Patterns, Pattern{Source: src, Experts: ex, Count: float64(pats[key])})
		}
	}
	return s
}
