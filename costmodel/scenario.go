package costmodel

import (
	"slices"

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

// Layout returns where s's layers sit among the model's decoder layers, as
// far as s knows: the statistics' own layer ids and decoder count, else the
// model's (when it has the statistics' layers), for files indexed by
// decoder layer and for dispatches dealt over every decoder layer (SGLang's
// table). Fields it cannot tell are zero.
func (s Scenario) Layout() placement.Layout {
	st, m := s.Stats, s.Model
	if st == nil {
		return placement.Layout{}
	}
	l := placement.Layout{GPUs: s.Cluster.GPUs(), Experts: st.Experts, Layers: st.Layers}
	ids, total := st.LayerNames, st.ModelLayers
	if ids == nil && !(total > 0 && total == st.Layers) {
		// The statistics say nothing about their layers (or only the
		// decoder count); a model of their shape may.
		if pre := m.MoELayers(); pre != nil && m.Layers == st.Layers && (total == 0 || total == m.DecoderLayers) {
			ids, total = pre, m.DecoderLayers
		}
	}
	if total == 0 && m.DecoderLayers > 0 {
		top := st.Layers - 1
		if ids != nil {
			top = slices.Max(ids)
		}
		if m.DecoderLayers > top {
			total = m.DecoderLayers
		}
	}
	known := l
	known.LayerIDs, known.ModelLayers = ids, total
	if placement.CheckLayout(placement.FormatJSON, known) != nil {
		return l // the layer ids do not fit together: unknown
	}
	return known
}

// Splitter binds s's dispatch to plan as Evaluate and the incremental
// Evaluator count it, for searches that split per source themselves:
// vLLM's hash counted token by token where s can count it (Dispatch vllm,
// home flow, HashOrder(Stats, GPUs) nil), else NewSplitter(s.Dispatch,
// plan, GPUs, GPUsPerNode, s.Layout()). The counted hash does not depend
// on plan and is safe for concurrent use by searches that split each
// layer on its own goroutine.
func (s Scenario) Splitter(plan *placement.Plan) (Splitter, error) {
	if s.countsHash() {
		return newHashSplit(s.Stats, s.Cluster.GPUs()), nil
	}
	return NewSplitter(s.Dispatch, plan, s.Cluster.GPUs(), s.Cluster.GPUsPerNode, s.Layout())
}

// SequentialDeal starts the sequential deal of plan (NewSequentialDeal)
// under s's dispatch, cluster and layout; it fails unless s's dispatch
// deals plan per rank (DealtPerRank).
func (s Scenario) SequentialDeal(plan *placement.Plan) (*SequentialDeal, error) {
	return NewSequentialDeal(s.Dispatch, plan, s.Cluster.GPUs(), s.Cluster.GPUsPerNode, s.Layout())
}

// PerSource reports whether a source's split over an expert's copies
// depends on where the source is under s (Splitter): under a dispatch that
// does (placement.Dispatch.PerSource), and under vLLM's hash where s counts
// it token by token, whose split differs from rank to rank with the rows
// the rank's tokens sit in. A search that splits per source then needs the
// share of each expert's tokens every source sends (LayerSourceShares).
func (s Scenario) PerSource() bool {
	return s.Dispatch.PerSource() || s.countsHash()
}

// countsHash reports whether s counts vLLM's dispatch token by token.
func (s Scenario) countsHash() bool {
	return s.Dispatch == placement.DispatchVLLM && s.Flow == FlowHome && s.Stats != nil && HashOrder(s.Stats, s.Cluster.GPUs()) == nil
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
