package replay

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
)

// Backend replays a workload and reports its per-GPU times.
type Backend interface {
	// Name is the backend's short name: "sim", "cpu" or "gpu".
	Name() string
	// Run replays w and returns its measurement; it stops early with
	// ctx.Err() when ctx is done.
	Run(ctx context.Context, w *Workload, opts RunOptions) (*Measurement, error)
}

// DefaultRepeats is the number of timed repeats RunOptions.Repeats defaults to.
const DefaultRepeats = 3

// RunOptions are the settings Backend.Run shares across backends. Cluster
// and Model model the communication (and, for sim, the compute): with a zero
// Cluster (Nodes == 0) the cpu and gpu backends leave communication at zero
// and label it "none"; sim needs them.
type RunOptions struct {
	// Cluster is the hardware the communication is modeled on; its GPU count
	// must equal the plan's.
	Cluster costmodel.Cluster
	// Model is the model shape the communication (bytes per token) and sim's
	// compute coefficients are taken from.
	Model costmodel.Model
	// Flow is the token flow of the communication model (default home).
	Flow costmodel.Flow
	// Mode is how a layer's phases combine: Sequential (default) or
	// Overlapped (chunked, compute slowed by the cluster's σ while
	// communication runs).
	Mode costmodel.Mode
	// Chunks is the number of pipeline chunks in overlapped mode; 0 means
	// costmodel.DefaultChunks.
	Chunks int
	// Dispatch is the dispatch the communication is modeled with; it
	// should match the workloads' (WorkloadOptions.Dispatch).
	Dispatch placement.Dispatch
	// Repeats is the number of timed repeats of every GPU's share of a layer
	// (cpu, gpu); the median is kept. 0 means DefaultRepeats. sim ignores it.
	Repeats int
	// Warmup is the number of untimed passes before timing (cpu, gpu); 0
	// means 1, negative means none.
	Warmup int
}

func (o RunOptions) repeats() int {
	if o.Repeats <= 0 {
		return DefaultRepeats
	}
	return o.Repeats
}

func (o RunOptions) warmup() int {
	switch {
	case o.Warmup < 0:
		return 0
	case o.Warmup == 0:
		return 1
	}
	return o.Warmup
}

func (o RunOptions) chunks() int {
	if o.Chunks <= 0 {
		return costmodel.DefaultChunks
	}
	return o.Chunks
}

// Provenance says where a number comes from.
type Provenance string

// The provenances of a Measurement's parts.
const (
	Measured Provenance = "measured" // timed on hardware
	Modeled  Provenance = "modeled"  // computed by the cost model
	None     Provenance = "none"     // not accounted (zero)
)

// Measurement is what a backend reports for one workload. Times are
// indexed [iteration][layer][gpu] or [iteration][layer]; the summaries follow
// the MoETuner paper: a layer's tail is its slowest GPU, averaged over
// iterations; its mean is the average over GPUs, then over iterations.
type Measurement struct {
	Backend string `json:"backend"`
	// Plan is the plan's Strategy.
	Plan string `json:"plan"`
	Mode string `json:"mode"`
	// Compute and Communication say which parts were measured and which
	// modeled; the notes say how.
	Compute           Provenance `json:"compute"`
	ComputeNote       string     `json:"compute_note"`
	Communication     Provenance `json:"communication"`
	CommunicationNote string     `json:"communication_note"`

	// GPUTime[i][l][g] is GPU g's expert compute time in layer l of
	// iteration i (the median over repeats where measured).
	GPUTime [][][]time.Duration `json:"gpu_time_ns"`
	// Dispatch and Combine are the all-to-all phase times [i][l].
	Dispatch [][]time.Duration `json:"dispatch_ns"`
	Combine  [][]time.Duration `json:"combine_ns"`
	// LayerTime[i][l] is the layer's time: dispatch + slowest GPU + combine
	// in sequential mode, the chunked overlap simulation in overlapped mode.
	LayerTime [][]time.Duration `json:"layer_time_ns"`

	// Layers summarises every layer over the iterations.
	Layers []LayerResult `json:"layers"`
	// Tail, Mean and Comm are the sums over layers of the layer summaries;
	// E2E is Σ_l LayerTime averaged over iterations.
	Tail time.Duration `json:"tail_ns"`
	Mean time.Duration `json:"mean_ns"`
	Comm time.Duration `json:"comm_ns"`
	E2E  time.Duration `json:"e2e_ns"`
}

// LayerResult summarises one layer over the iterations.
type LayerResult struct {
	Layer int `json:"layer"`
	// Tail is the slowest GPU's compute time, averaged over iterations.
	Tail time.Duration `json:"tail_ns"`
	// Mean is the compute time averaged over GPUs, then over iterations.
	Mean time.Duration `json:"mean_ns"`
	// Comm is dispatch + combine, averaged over iterations.
	Comm time.Duration `json:"comm_ns"`
	// Time is the layer time, averaged over iterations.
	Time time.Duration `json:"time_ns"`
}

// MeanLayerTail returns the per-layer tail averaged over layers.
func (m *Measurement) MeanLayerTail() time.Duration {
	if len(m.Layers) == 0 {
		return 0
	}
	return m.Tail / time.Duration(len(m.Layers))
}

func newMeasurement(backend string, w *Workload, opts RunOptions) *Measurement {
	m := &Measurement{Backend: backend, Plan: w.Plan.Strategy, Mode: opts.Mode.String()}
	n, L, G := w.Iterations(), w.Layers(), w.GPUs()
	m.GPUTime = make([][][]time.Duration, n)
	m.Dispatch = make([][]time.Duration, n)
	m.Combine = make([][]time.Duration, n)
	for i := range n {
		m.GPUTime[i] = make([][]time.Duration, L)
		for l := range L {
			m.GPUTime[i][l] = make([]time.Duration, G)
		}
		m.Dispatch[i] = make([]time.Duration, L)
		m.Combine[i] = make([]time.Duration, L)
	}
	return m
}

// modelComm fills Dispatch and Combine from costmodel.Evaluate on every
// iteration's batch, or leaves them zero without a cluster.
func modelComm(m *Measurement, w *Workload, opts RunOptions) error {
	if opts.Cluster.Nodes == 0 {
		m.Communication, m.CommunicationNote = None, "no cluster given: communication not accounted"
		return nil
	}
	if g := opts.Cluster.GPUs(); g != w.GPUs() {
		return fmt.Errorf("replay: cluster has %d GPUs but the plan %d", g, w.GPUs())
	}
	for i, st := range w.Stats {
		rep, err := costmodel.Evaluate(w.Plan, st, opts.Cluster, opts.Model, costmodel.Options{Flow: opts.Flow, Mode: opts.Mode, Chunks: opts.Chunks, Dispatch: opts.Dispatch})
		if err != nil {
			return fmt.Errorf("replay: iteration %d: %w", i, err)
		}
		for l, lr := range rep.Layers {
			m.Dispatch[i][l] = lr.DispatchTime
			m.Combine[i][l] = lr.CombineTime
		}
	}
	m.Communication = Modeled
	m.CommunicationNote = fmt.Sprintf("costmodel.Evaluate per batch: %s flow on %s (%d nodes × %d GPUs), model %s (%.0f B/token); bottleneck port time plus latency per phase",
		opts.Flow, opts.Cluster.Name, opts.Cluster.Nodes, opts.Cluster.GPUsPerNode, opts.Model.Name, opts.Model.TokenBytes())
	return nil
}

// finish computes LayerTime and the summaries from GPUTime, Dispatch and
// Combine.
func (m *Measurement) finish(opts RunOptions) {
	sigma := 0.0
	if opts.Mode == costmodel.Overlapped {
		sigma = opts.Cluster.SigmaValue()
	}
	n := len(m.GPUTime)
	if n == 0 {
		return
	}
	L := len(m.GPUTime[0])
	m.LayerTime = make([][]time.Duration, n)
	m.Layers = make([]LayerResult, L)
	m.Tail, m.Mean, m.Comm, m.E2E = 0, 0, 0, 0
	sums := make([][4]float64, L)
	for i := range n {
		m.LayerTime[i] = make([]time.Duration, L)
		for l := range L {
			gt := m.GPUTime[i][l]
			comp := make([]float64, len(gt))
			var tail, mean float64
			for g, d := range gt {
				comp[g] = d.Seconds()
				tail = max(tail, comp[g])
				mean += comp[g]
			}
			if len(gt) > 0 {
				mean /= float64(len(gt))
			}
			disp, comb := m.Dispatch[i][l].Seconds(), m.Combine[i][l].Seconds()
			var t float64
			if opts.Mode == costmodel.Overlapped {
				t = overlapLayer(disp, comb, comp, sigma, opts.chunks())
			} else {
				t = disp + tail + comb
			}
			m.LayerTime[i][l] = secs(t)
			sums[l][0] += tail
			sums[l][1] += mean
			sums[l][2] += disp + comb
			sums[l][3] += t
		}
	}
	for l := range L {
		r := LayerResult{Layer: l, Tail: secs(sums[l][0] / float64(n)), Mean: secs(sums[l][1] / float64(n)),
			Comm: secs(sums[l][2] / float64(n)), Time: secs(sums[l][3] / float64(n))}
		m.Layers[l] = r
		m.Tail += r.Tail
		m.Mean += r.Mean
		m.Comm += r.Comm
	}
	var e2e float64
	for i := range n {
		for l := range L {
			e2e += m.LayerTime[i][l].Seconds()
		}
	}
	m.E2E = secs(e2e / float64(n))
}

func secs(s float64) time.Duration { return time.Duration(s*1e9 + 0.5) }

// overlapLayer simulates one layer whose batch is cut into chunks pieces:
// the link sends dispatch chunks in order, every GPU computes chunk k once
// dispatch chunk k has arrived and chunk k−1 is done, and combine chunk k
// follows once every GPU has finished chunk k. The link serves one phase
// chunk at a time (first come, first served). Compute runs at 1/(1+σ) of its
// speed while the link is busy. It returns when the last combine chunk
// ends (or the last compute when there is nothing to combine).
func overlapLayer(dispatch, combine float64, compute []float64, sigma float64, chunks int) float64 {
	const eps = 1e-15
	n := chunks
	G := len(compute)
	dChunk, cChunk := dispatch/float64(n), combine/float64(n)
	// Link queue: task k < n is dispatch k, task n+k is combine k.
	var queue []int
	for k := range n {
		queue = append(queue, k)
	}
	linkTask, linkLeft := -1, 0.0
	dispatched := 0            // dispatch chunks that have arrived
	gpuChunk := make([]int, G) // chunk each GPU works on (n when done)
	gpuLeft := make([]float64, G)
	gpuBusy := make([]bool, G)
	doneCount := make([]int, n) // GPUs done with chunk k
	combined := 0
	t := 0.0
	startLink := func() {
		if linkTask < 0 && len(queue) > 0 {
			linkTask, queue = queue[0], queue[1:]
			if linkTask < n {
				linkLeft = dChunk
			} else {
				linkLeft = cChunk
			}
		}
	}
	startGPUs := func() {
		for g := range G {
			if !gpuBusy[g] && gpuChunk[g] < n && gpuChunk[g] < dispatched {
				gpuBusy[g], gpuLeft[g] = true, compute[g]/float64(n)
			}
		}
	}
	for iter := 0; combined < n && iter < 100*n*(G+2)+100; iter++ {
		startLink()
		startGPUs()
		rate := 1.0
		if linkTask >= 0 {
			rate = 1 / (1 + sigma)
		}
		dt := -1.0
		if linkTask >= 0 {
			dt = linkLeft
		}
		for g := range G {
			if gpuBusy[g] {
				if d := gpuLeft[g] / rate; dt < 0 || d < dt {
					dt = d
				}
			}
		}
		if dt < 0 {
			break // nothing runs: cannot happen with a consistent state
		}
		t += dt
		if linkTask >= 0 {
			linkLeft -= dt
			if linkLeft <= eps {
				if linkTask < n {
					dispatched++
				} else {
					combined++
				}
				linkTask = -1
			}
		}
		for g := range G {
			if !gpuBusy[g] {
				continue
			}
			gpuLeft[g] -= dt * rate
			if gpuLeft[g] <= eps {
				k := gpuChunk[g]
				gpuBusy[g] = false
				gpuChunk[g]++
				doneCount[k]++
				if doneCount[k] == G {
					queue = append(queue, n+k)
				}
			}
		}
	}
	return t
}

// median returns the median of ds (the mean of the two middle values for an
// even count), 0 for none.
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
