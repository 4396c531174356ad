package costmodel

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// DefaultChunks is the number of pipeline chunks Options.Chunks defaults to.
const DefaultChunks = 4

// Options are the optional settings of Evaluate; the zero value is home
// flow, sequential mode, DefaultChunks.
type Options struct {
	// Flow is the token flow (default FlowHome).
	Flow Flow
	// Mode selects Time: Sequential (default) or Overlapped.
	Mode Mode
	// Chunks is the number of pipeline chunks in overlapped execution; the
	// first dispatch and last combine chunk, CommTime/Chunks, stay exposed.
	// 0 means DefaultChunks; negative is an error.
	Chunks int
	// Dispatch is how sources choose among an expert's copies (default
	// placement.DispatchEven). DispatchLocal is modeled in the home flow
	// only and ignores no plan field: plans with SlotShare are rejected.
	Dispatch placement.Dispatch
}

// LayerReport is the modeled cost of one MoE layer. Byte matrices are
// indexed [src][dst] by GPU.
type LayerReport struct {
	Layer int
	// Tokens is the token-expert load per GPU, Σ_e Load[l][e]·w[e][g].
	Tokens                []float64
	MaxTokens, MeanTokens float64
	// Balance is the layer's busiest GPU per unit of speed over the mean
	// (the package function Balance of Tokens and the cluster's speeds; 1
	// when empty): MaxTokens/MeanTokens when every GPU has speed 1.
	Balance float64
	// Compute is the expert compute time per GPU; ComputeTail its maximum.
	Compute     []time.Duration
	ComputeTail time.Duration
	// Dispatch and Combine are the bytes sent per GPU pair in the phase.
	Dispatch, Combine                   [][]float64
	DispatchTime, CombineTime, CommTime time.Duration
	// CrossNodeBytes is the NIC traffic of both phases.
	CrossNodeBytes float64
	// RemoteCopies is the token copies that cross a NIC in the dispatch
	// (home flow: the remote nodes the layer's tokens reach; chain flow
	// from the second layer on: the partial results sent from the previous
	// layer's GPUs to other nodes), and BusiestNIC the copies through the
	// busiest NIC port (in or out) in that phase.
	RemoteCopies, BusiestNIC      float64
	Sequential, Ideal, Overlapped time.Duration
	Time                          time.Duration // Sequential or Overlapped per Options.Mode
	TimeSec                       float64       // Time in float64 seconds, unrounded
}

// Report is the modeled cost of a plan; durations are sums over layers.
type Report struct {
	Flow   Flow
	Mode   Mode
	Sigma  float64
	Layers []LayerReport

	ComputeTail, CommTime, Sequential, Ideal, Overlapped, Time time.Duration
	// TimeSec is the sum of the layers' TimeSec.
	TimeSec        float64
	CrossNodeBytes float64
	// RemoteCopies and BusiestNIC are the layers' added up; divided by
	// Tokens·layers (Tokens/GPUs·layers for BusiestNIC) they are per
	// token and layer.
	RemoteCopies, BusiestNIC float64
	// Tokens is the statistics' token count.
	Tokens float64
	// MeanBalance and MaxBalance summarize the layers' Balance.
	MeanBalance, MaxBalance float64
	// MaxTokensSum is Σ_l MaxTokens, the paper's token-processing tail.
	MaxTokensSum float64
	// Dispatch and Combine are the layers' byte matrices [src][dst] added
	// up: the whole model's traffic per GPU pair.
	Dispatch, Combine [][]float64
}

// Evaluate models the cost of plan on cluster c for model m under the
// routing stats (see the package doc for every formula); it is
// Scenario.Evaluate with the scenario spelled out. It returns an error,
// never panics, when the inputs disagree.
func Evaluate(plan *placement.Plan, stats *routing.Stats, c Cluster, m Model, opts Options) (*Report, error) {
	ev, err := newEngine(stats, c, m, opts)
	if err != nil {
		return nil, err
	}
	sh, err := ev.planShares(plan)
	if err != nil {
		return nil, err
	}
	rep := &Report{Flow: opts.Flow, Mode: opts.Mode, Sigma: ev.terms.Sigma, Layers: make([]LayerReport, ev.l), Tokens: stats.Tokens}
	times := ev.layerReports(sh, rep.Layers, ev.workers())
	var tail, comm, seq, ideal, over, tm float64
	for l := range sh {
		lr, r := &rep.Layers[l], times[l]
		tail += r.tail
		comm += r.disp + r.comb
		seq += r.seq
		ideal += r.ideal
		over += r.over
		tm += r.time
		rep.CrossNodeBytes += lr.CrossNodeBytes
		rep.RemoteCopies += lr.RemoteCopies
		rep.BusiestNIC += lr.BusiestNIC
		rep.MeanBalance += lr.Balance
		rep.MaxBalance = math.Max(rep.MaxBalance, lr.Balance)
		rep.MaxTokensSum += lr.MaxTokens
		rep.Dispatch = addMatrix(rep.Dispatch, lr.Dispatch)
		rep.Combine = addMatrix(rep.Combine, lr.Combine)
	}
	rep.MeanBalance /= float64(ev.l)
	rep.ComputeTail, rep.CommTime = dur(tail), dur(comm)
	rep.Sequential, rep.Ideal, rep.Overlapped, rep.Time = dur(seq), dur(ideal), dur(over), dur(tm)
	rep.TimeSec = tm
	return rep, nil
}

// parallelWork is the least work (layers × token paths, or layers ×
// experts without paths) an evaluation spreads over the cores: below it
// an evaluation takes well under a millisecond and starting the workers
// would cost a visible share of it.
const parallelWork = 1 << 16

// layerReports costs every layer under shares sh into out and returns its
// times. Layers are independent given the shares (the chain flow's
// transition into layer l reads layer l−1's shares, not its result), so
// large evaluations cost them on every core, each worker with its own
// scratch; every layer's sums run in the same order as on one core, so the
// report is the same bit for bit.
func (ev *engine) layerReports(sh []shares, out []LayerReport, workers int) []layerTimes {
	times := make([]layerTimes, len(sh))
	forLayers(len(sh), workers, func() func(l int) {
		w := ev
		if workers > 1 {
			w = ev.scratchCopy()
		}
		var st layerState
		st.init(ev.g, ev.n)
		return func(l int) {
			var prev *shares
			if l > 0 {
				prev = &sh[l-1]
			}
			w.layerMasses(l, &sh[l], prev, &st)
			times[l] = w.finish(l, &sh[l], &st, &out[l])
		}
	})
	return times
}

// workers is how many goroutines an evaluation of ev's statistics uses:
// every core once the work reaches parallelWork, else one.
func (ev *engine) workers() int {
	work := ev.e
	if ev.usePatterns {
		work = len(ev.stats.Patterns)
	}
	return workersFor(work * ev.l)
}

// workersFor is every core for work of at least parallelWork, else one.
func workersFor(work int) int {
	if work < parallelWork {
		return 1
	}
	return runtime.GOMAXPROCS(0)
}

// forLayers runs every layer l < L on up to workers goroutines (one: on
// this one); each goroutine calls worker once for its own function (its
// scratch), which it then calls for the layers it takes.
func forLayers(L, workers int, worker func() func(l int)) {
	workers = min(workers, L)
	if workers < 2 {
		fn := worker()
		for l := range L {
			fn(l)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		fn := worker()
		wg.Go(func() {
			for {
				l := int(next.Add(1)) - 1
				if l >= L {
					return
				}
				fn(l)
			}
		})
	}
	wg.Wait()
}

// addMatrix returns sum + m, allocating sum on first use.
func addMatrix(sum, m [][]float64) [][]float64 {
	if sum == nil {
		sum = make([][]float64, len(m))
		for i := range m {
			sum[i] = make([]float64, len(m[i]))
		}
	}
	for i, row := range m {
		for j, v := range row {
			sum[i][j] += v
		}
	}
	return sum
}

func dur(sec float64) time.Duration { return time.Duration(math.Round(sec * 1e9)) }
