package rebalance

// The public rebalancing harness (the LauzHack × Huawei MoE load-balancing
// competition) scores a rebalancer that is called every so many steps on a
// window of per-step expert hotness with one runtime model:
//
//	score = 60 s × mean PAR + transit × bytes per expert / 900 GB/s + calls × 0.08 s
//
// where PAR is the busiest GPU's load over the mean GPU load of a step and
// layer (copies splitting an expert's load evenly), averaged over the
// steps and layers scored, transit the slots changed over the run, and the
// planner's own time is charged at a fixed 0.08 s per call. Its baseline is
// DeepSeek's EPLB re-planned over a 1024-step window.

// Harness constants that the public harness fixes.
const (
	// HarnessPARSec is what one unit of mean PAR costs in the score.
	HarnessPARSec = 60.0
	// HarnessLinkBytesPerSec is the link the score moves changed slots
	// over (900 GB/s).
	HarnessLinkBytesPerSec = 900e9
	// DefaultHarnessBytes is Harness.BytesPerExpert's default: the public
	// harness's 88,080,384 bytes per expert (DeepSeek-V3's expert in bf16,
	// 3 × 7168 × 2048 × 2).
	DefaultHarnessBytes int64 = 88080384
	// DefaultHarnessCallSec is Harness.CallSec's default: the public
	// harness's 0.08 s per planner call.
	DefaultHarnessCallSec = 0.08
)

// Harness holds the two parameters of the harness score that a user may
// want to change. The zero value is the public harness.
type Harness struct {
	// BytesPerExpert is what one changed slot moves in the score
	// (default DefaultHarnessBytes, whatever the model).
	BytesPerExpert int64
	// CallSec is the planner time charged per call (default
	// DefaultHarnessCallSec); a negative value charges nothing.
	CallSec float64
}

func (h Harness) withDefaults() Harness {
	if h.BytesPerExpert <= 0 {
		h.BytesPerExpert = DefaultHarnessBytes
	}
	if h.CallSec == 0 {
		h.CallSec = DefaultHarnessCallSec
	}
	if h.CallSec < 0 {
		h.CallSec = 0
	}
	return h
}

// HarnessScore is the harness score of a run and its three terms, in
// seconds.
type HarnessScore struct {
	PARSec, TransitSec, PlannerSec, TotalSec float64
}

// Score returns the harness score of a run with mean PAR meanPAR, transit
// changed slots and calls planner calls.
func (h Harness) Score(meanPAR float64, transit, calls int) HarnessScore {
	h = h.withDefaults()
	s := HarnessScore{
		PARSec:     HarnessPARSec * meanPAR,
		TransitSec: float64(transit) * float64(h.BytesPerExpert) / HarnessLinkBytesPerSec,
		PlannerSec: float64(calls) * h.CallSec,
	}
	s.TotalSec = s.PARSec + s.TransitSec + s.PlannerSec
	return s
}
