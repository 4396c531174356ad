package replay

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"time"

	"gonum.org/v1/gonum/mat"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
)

// Observation is one measured GPU share of one layer: Tokens routed tokens
// over Experts expert copies took Time.
type Observation struct {
	Iteration, Layer, GPU int
	Tokens                float64
	Experts               int
	Time                  time.Duration
}

// Observations lists the per-GPU observations of a measurement of w, in
// iteration, layer, GPU order. tokens maps a slot's routed tokens to the
// tokens the backend actually ran (CPU.ScaledTokens for a scaled cpu run);
// nil keeps them.
func Observations(w *Workload, m *Measurement, tokens func(int) int) []Observation {
	var obs []Observation
	for i := range m.GPUTime {
		for l := range m.GPUTime[i] {
			slots := w.GPUSlots(l)
			for g, d := range m.GPUTime[i][l] {
				var n float64
				for _, s := range slots[g] {
					t := w.SlotTokens[i][l][s]
					if tokens != nil {
						t = tokens(t)
					}
					n += float64(t)
				}
				obs = append(obs, Observation{Iteration: i, Layer: l, GPU: g, Tokens: n, Experts: len(slots[g]), Time: d})
			}
		}
	}
	return obs
}

// Fit is the result of Calibrate: the cost model's compute coefficients and
// how far the fitted model is from the measurements.
type Fit struct {
	// PerTokenSec is the time per routed token per expert, PerExpertSec the
	// fixed time per expert held, both in seconds.
	PerTokenSec, PerExpertSec float64
	// Accuracy is the fitted model against the observations it was fitted on.
	Accuracy
}

// Accuracy compares modeled with measured compute times.
type Accuracy struct {
	// MeanAbsPct and MaxAbsPct are the mean and largest |model − measured| /
	// measured, in percent, over the GPU-layer shares.
	MeanAbsPct float64 `json:"mean_abs_pct"`
	MaxAbsPct  float64 `json:"max_abs_pct"`
	// TailMeanAbsPct and TailMaxAbsPct are the same for the per-layer tail
	// (slowest GPU of each iteration and layer, model against measurement).
	TailMeanAbsPct float64 `json:"tail_mean_abs_pct"`
	TailMaxAbsPct  float64 `json:"tail_max_abs_pct"`
	// N is the number of GPU-layer shares compared.
	N int `json:"n"`
}

// Calibrate fits time = PerToken·tokens + PerExpert·experts to the
// observations by least squares on the relative error (every row divided by
// its measured time, so long and short shares count alike), solved with
// gonum's QR. A negative coefficient is set to 0 and the other refitted.
// It fails with fewer than two observations with positive time or when the
// token counts cannot separate the two coefficients and no experts vary.
func Calibrate(obs []Observation) (Fit, error) {
	var rows []Observation
	for _, o := range obs {
		if o.Time > 0 {
			rows = append(rows, o)
		}
	}
	if len(rows) < 2 {
		return Fit{}, errors.New("replay: calibrate needs at least two observations with a positive time")
	}
	solve := func(cols []int) ([]float64, error) {
		a := mat.NewDense(len(rows), len(cols), nil)
		b := mat.NewVecDense(len(rows), nil)
		for i, o := range rows {
			t := o.Time.Seconds()
			x := [2]float64{o.Tokens, float64(o.Experts)}
			for j, c := range cols {
				a.Set(i, j, x[c]/t)
			}
			b.SetVec(i, 1)
		}
		var qr mat.QR
		qr.Factorize(a)
		var sol mat.Dense
		if err := qr.SolveTo(&sol, false, b); err != nil {
			return nil, fmt.Errorf("replay: calibrate: %w", err)
		}
		out := make([]float64, 2)
		for j, c := range cols {
			out[c] = sol.At(j, 0)
		}
		return out, nil
	}
	coef, err := solve([]int{0, 1})
	if err != nil || coef[0] < 0 || coef[1] < 0 || math.IsNaN(coef[0]) || math.IsNaN(coef[1]) {
		// Fall back to one coefficient: per token, else per expert.
		c0, err0 := solve([]int{0})
		c1, err1 := solve([]int{1})
		switch {
		case err0 == nil && c0[0] > 0 && (err1 != nil || sqErr(rows, c0) <= sqErr(rows, c1)):
			coef = c0
		case err1 == nil && c1[1] > 0:
			coef = c1
		default:
			return Fit{}, errors.New("replay: calibrate: no non-negative fit")
		}
	}
	f := Fit{PerTokenSec: coef[0], PerExpertSec: coef[1]}
	pred := make([]float64, len(rows))
	for i, o := range rows {
		pred[i] = f.PerTokenSec*o.Tokens + f.PerExpertSec*float64(o.Experts)
	}
	f.Accuracy = accuracy(rows, pred)
	return f, nil
}

func sqErr(rows []Observation, c []float64) float64 {
	var s float64
	for _, o := range rows {
		t := o.Time.Seconds()
		d := (c[0]*o.Tokens + c[1]*float64(o.Experts) - t) / t
		s += d * d
	}
	return s
}

// Predict returns the fitted time of tokens over experts.
func (f Fit) Predict(tokens float64, experts int) time.Duration {
	return secs(f.PerTokenSec*tokens + f.PerExpertSec*float64(experts))
}

// accuracy compares pred[i] with rows[i].Time.
func accuracy(rows []Observation, pred []float64) Accuracy {
	type key struct{ i, l int }
	type pair struct{ pred, meas float64 }
	tails := map[key]pair{}
	var order []key
	var a Accuracy
	for r, o := range rows {
		meas := o.Time.Seconds()
		if meas <= 0 {
			continue
		}
		e := 100 * math.Abs(pred[r]-meas) / meas
		a.MeanAbsPct += e
		a.MaxAbsPct = max(a.MaxAbsPct, e)
		a.N++
		k := key{o.Iteration, o.Layer}
		p, ok := tails[k]
		if !ok {
			order = append(order, k)
		}
		tails[k] = pair{max(p.pred, pred[r]), max(p.meas, meas)}
	}
	if a.N == 0 {
		return a
	}
	a.MeanAbsPct /= float64(a.N)
	for _, k := range order {
		p := tails[k]
		e := 100 * math.Abs(p.pred-p.meas) / p.meas
		a.TailMeanAbsPct += e
		a.TailMaxAbsPct = max(a.TailMaxAbsPct, e)
	}
	a.TailMeanAbsPct /= float64(len(order))
	return a
}

// CheckModel compares the cost model's per-GPU compute time with a
// measurement m of w: costmodel.Evaluate on every iteration's batch, with
// cluster c and model (give the model at the size the backend ran, for the
// cpu backend its scaled Hidden and FFN, so that like is compared with like).
// tokenScale is the backend's token scale (CPU.TokenScale; 0 means 1): the
// batch's counts are scaled by it before evaluating.
func CheckModel(w *Workload, m *Measurement, c costmodel.Cluster, model costmodel.Model, tokenScale float64) (Accuracy, error) {
	if tokenScale <= 0 {
		tokenScale = 1
	}
	var rows []Observation
	var pred []float64
	for i, st := range w.Stats {
		if tokenScale != 1 {
			st = st.Clone()
			st.Scale(tokenScale)
		}
		rep, err := costmodel.Evaluate(w.Plan, st, c, model, costmodel.Options{})
		if err != nil {
			return Accuracy{}, fmt.Errorf("replay: iteration %d: %w", i, err)
		}
		for l, lr := range rep.Layers {
			for g, d := range lr.Compute {
				rows = append(rows, Observation{Iteration: i, Layer: l, GPU: g, Time: m.GPUTime[i][l][g]})
				pred = append(pred, d.Seconds())
			}
		}
	}
	return accuracy(rows, pred), nil
}

// Apply returns c with TokenCost and ExpertCost set to the fitted
// coefficients (rounded to the nanosecond, at least 1 ns when positive), so
// that c.Coefficients returns them for any model. Speed is left as it is:
// the coefficients are at speed 1, as measured.
func (f Fit) Apply(c costmodel.Cluster) costmodel.Cluster {
	c.TokenCost = durAtLeast1(f.PerTokenSec)
	c.ExpertCost = durAtLeast1(f.PerExpertSec)
	return c
}

func durAtLeast1(s float64) time.Duration {
	d := secs(s)
	if d == 0 && s > 0 {
		d = 1
	}
	return d
}

// WriteCluster writes c as YAML (costmodel.WriteClusterYAML) to path
// atomically: a temporary file in the same directory, synced, renamed over
// path. On failure an existing file is left as it was.
func WriteCluster(path string, c costmodel.Cluster) error {
	var buf bytes.Buffer
	if err := costmodel.WriteClusterYAML(&buf, c); err != nil {
		return err
	}
	return placement.WriteFileAtomic(path, buf.Bytes())
}
