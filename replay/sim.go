package replay

import (
	"context"
	"fmt"

	"github.com/moetuner/moetuner/costmodel"
)

// Sim is the simulation backend: a discrete-event replay on the cost model.
// Every GPU's compute is (α·tokens + β·slots)/speed with (α, β) =
// Cluster.Coefficients(Model) and the batch's integer token counts;
// dispatch and combine are costmodel.Evaluate's phase times for the batch.
// Sequential mode adds dispatch, the slowest GPU and combine; overlapped
// mode runs the chunked event simulation (see the package documentation).
// The zero value is ready to use.
type Sim struct{}

// Name returns "sim".
func (Sim) Name() string { return "sim" }

// Run simulates w. It needs opts.Cluster and opts.Model.
func (Sim) Run(ctx context.Context, w *Workload, opts RunOptions) (*Measurement, error) {
	if opts.Cluster.Nodes == 0 {
		return nil, fmt.Errorf("replay: sim needs RunOptions.Cluster and Model")
	}
	m := newMeasurement("sim", w, opts)
	if err := modelComm(m, w, opts); err != nil {
		return nil, err
	}
	terms := costmodel.NewTerms(opts.Cluster, opts.Model, costmodel.Sequential, 0)
	for i := range w.Iterations() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for l := range w.Layers() {
			toks := w.GPUTokens(i, l)
			slots := w.Plan.SlotsPerGPU(l)
			for g := range toks {
				m.GPUTime[i][l][g] = secs(terms.Compute(g, float64(toks[g]), float64(slots[g])))
			}
		}
	}
	m.Compute = Modeled
	m.ComputeNote = fmt.Sprintf("(%.4g s/token·expert × tokens + %.4g s × experts held) / speed, Cluster.Coefficients of %s", terms.PerTokenSec, terms.PerExpertSec, opts.Model.Name)
	m.finish(opts)
	return m, nil
}
