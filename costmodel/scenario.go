package costmodel

import (
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// Scenario is everything a plan is scored against: the routing statistics,
// the hardware, the model, how tokens move between layers (Flow), how the
// layer's phases combine (Mode, Chunks) and how a source picks among an
// expert's copies (Dispatch). The zero value of every field but Stats,
// Cluster and Model is the default: home flow, sequential mode,
// DefaultChunks, even dispatch.
type Scenario struct {
	Stats    *routing.Stats
	Cluster  Cluster
	Model    Model
	Flow     Flow
	Mode     Mode
	Dispatch placement.Dispatch
	// Chunks is the number of pipeline chunks in overlapped mode; 0 means
	// DefaultChunks.
	Chunks int
}

// Options returns the flow, mode, chunks and dispatch of s.
func (s Scenario) Options() Options {
	return Options{Flow: s.Flow, Mode: s.Mode, Chunks: s.Chunks, Dispatch: s.Dispatch}
}

// Evaluate models the cost of plan under s (see the package doc for every
// formula). It returns an error, never panics, when the inputs disagree.
func (s Scenario) Evaluate(plan *placement.Plan) (*Report, error) {
	return Evaluate(plan, s.Stats, s.Cluster, s.Model, s.Options())
}
