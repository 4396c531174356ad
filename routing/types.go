package routing

import "fmt"

// Layer indexes a MoE layer, 0-based, in the order of the trace (not the
// model's decoder-layer number; see Stats.LayerNames for that).
type Layer int

// Expert is a logical expert id within one layer, in [0, Experts).
type Expert int

// TransitionMode says how a token with top-k experts at layer l and at layer
// l+1 contributes to the transition counts R[l][e1][e2].
type TransitionMode int

const (
	// TransitionAllPairs counts all k×k pairs (e1 in the layer-l top-k, e2 in
	// the layer-(l+1) top-k), each with weight 1. A token adds k² to the
	// matrix total. Scaling by 1/k or 1/k² would not change any argmin.
	TransitionAllPairs TransitionMode = iota
	// TransitionTop1 counts only the rank-0 (highest gate) expert of each
	// layer: one pair per token.
	TransitionTop1
)

// String returns "all-pairs" or "top1".
func (m TransitionMode) String() string {
	switch m {
	case TransitionAllPairs:
		return "all-pairs"
	case TransitionTop1:
		return "top1"
	}
	return fmt.Sprintf("TransitionMode(%d)", int(m))
}

// Trace is a per-token routing trace: for every token and every MoE layer the
// ids of its top-k experts. It is stored flat to keep large traces compact:
// the expert of token t, layer l, rank j is IDs[(t*Layers+l)*TopK+j]. Rank 0
// is the highest-gate choice when the source records an order.
type Trace struct {
	Tokens  int // T
	Layers  int // L
	TopK    int // k
	Experts int // E, experts per layer

	IDs []int16 // len T*L*k; each in [0, Experts)
	// Weights are the gate weights in the layout of IDs; nil when unknown.
	Weights []float32
	// Source is the source (home) rank of each token, -1 where unknown; nil
	// when unknown for all tokens.
	Source []int32
	// Step is the step (forward pass) id of each token; nil when unknown.
	Step []int32
	// LayerNames are the model's layer numbers for layers 0..L-1 (FLAME's
	// MoE layers 2..9, for example); nil means 0..L-1.
	LayerNames []int
	// ModelLayers is the model's number of decoder layers, dense ones
	// included (num_hidden_layers), when the source records it; 0 when
	// unknown.
	ModelLayers int
}

// Pattern is one distinct token path with its multiplicity: the token's
// source rank (-1 when unknown) and its sorted top-k set at every layer,
// flattened as Experts[l*TopK+j]. Patterns let the cost model count
// "one copy per distinct GPU" exactly without keeping every token.
type Pattern struct {
	Source  int32
	Experts []int16
	Count   float64
}

// Stats are aggregated routing statistics. All counts are float64 so that
// stats from many files add up without overflow and may be scaled. The zero
// value is empty; use Merge to add stats of the same shape.
type Stats struct {
	Layers  int // L
	Experts int // E
	TopK    int // k (0 when the source does not say)

	// Tokens is the number of tokens per layer that the counts describe.
	Tokens float64
	// Load[l][e] is the number of tokens routed to expert e at layer l
	// (each token adds 1 to each of its k experts).
	Load [][]float64
	// Transitions[l][e1*E+e2] counts tokens with e1 at layer l and e2 at
	// layer l+1 under TransitionMode; len L-1. Nil when the source has no
	// per-token paths.
	Transitions    [][]float64
	TransitionMode TransitionMode
	// CoActivation[l][a*E+b] (a != b, symmetric) counts tokens that have
	// both a and b in their top-k at layer l. Nil when unknown.
	CoActivation [][]float64
	// StepLoad[s][l][e] is Load per step; nil when steps are unknown.
	StepLoad [][][]float64
	// StepsUnordered reports that StepLoad holds the right steps but not
	// in time order: an SGLang stat dump whose circular buffer may have
	// wrapped around does not record which row is the oldest. Sums and
	// per-step workloads taken as a set (--across) are unaffected; a
	// replay of the steps in order (backtest) is not possible.
	StepsUnordered bool
	// SourceLoad[r][l][e] is Load restricted to the tokens whose source
	// (home) rank is r, for r in [0, len(SourceLoad)); nil when sources are
	// unknown. Tokens of unknown source count in Load only, so
	// Σ_r SourceLoad[r] ≤ Load element by element (equal when every source
	// is known).
	SourceLoad [][][]float64
	// Patterns is the histogram of distinct token paths (sorted by key), nil
	// when unknown or when there were more than MaxPatterns distinct paths.
	// Above a size set by StatsOptions.PathError it holds a uniform random
	// sample of the tokens, each weighted Tokens/Kept, so the counts still
	// add up to Tokens; PathSample says which.
	Patterns []Pattern
	// PathSample says how many tokens' paths Patterns holds and the
	// relative standard error that implies; the zero value when Patterns
	// is nil or its origin does not say.
	PathSample PathSample
	// Notes say, one sentence each, which statistics were dropped or
	// estimated because they grew too large, and what that costs (chain
	// flow then needs per-token paths, for example); nil when nothing was.
	Notes []string
	// LayerNames are the model's layer numbers for layers 0..L-1; nil means
	// 0..L-1.
	LayerNames []int
	// ModelLayers is the model's number of decoder layers, dense ones
	// included (num_hidden_layers, SGLang's L_all), when the source records
	// it; 0 when unknown. It is at least 1 + the largest layer name.
	ModelLayers int
	// Sources lists the files the stats came from, in the order merged.
	Sources []string
	// Order is each routed token's row in its rank's forward pass, per
	// layer, expert and source rank (Trace.TokenOrder), for dispatch rules
	// that pick a copy from it (vLLM's replica hash); nil when unknown.
	// Nothing builds it by itself: attach it from the trace the stats
	// count. Merge and Scale drop it (the rows of several traces or of
	// scaled counts are not one batch's).
	Order *TokenOrder
}

// MaxPatterns bounds the number of distinct token paths kept in Stats: the
// path sample never exceeds it, Merge thins a union that does, and exact
// mode (StatsOptions.PathError < 0) drops patterns past it with a note.
const MaxPatterns = 1 << 20
