package solver

import "github.com/moetuner/moetuner/routing"

// planningStats is what the joint searches plan with: p.Stats, except
// that with Problem.ShrinkSources under a per-source dispatch the
// per-source mix is shrunk towards independence of rank and expert by its
// measured reliability (routing.SourceReliability, ShrinkSources). A rank
// sends all its tokens of an expert to one copy under SGLang's table, so a
// plan fitted to the trace's per-rank counts fits their sampling noise
// too, which the traffic it then serves does not repeat; the shrunk mix is
// the estimate of the mix that repeats. Plans are scored on p.Stats as
// recorded.
func planningStats(p Problem) *routing.Stats {
	if !p.ShrinkSources || !p.Dispatch.PerSource() || p.Stats.SourceLoad == nil {
		return p.Stats
	}
	return routing.ShrinkSources(p.Stats, routing.SourceReliability(p.Stats))
}
