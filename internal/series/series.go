// Package series builds the time series of per-step expert loads that
// moetuner's rebalancing benchmarks replay: a traffic mix that shifts
// between recorded workloads, each step a multinomial draw of a few
// thousand tokens from the mix of that moment, and per-token traces cut
// into steps. Everything is a function of its inputs and seed.
package series

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// MixOptions shape a shifting mix. Steps and TokensPerStep are required.
type MixOptions struct {
	// Steps is the series length.
	Steps int
	// TokensPerStep is the tokens of one step; each routes to TopK experts
	// per layer (TopK 0: the workloads' top-k).
	TokensPerStep int
	TopK          int
	// Period is the steps of one full turn of the mix through the
	// workloads (default Steps/2: two turns).
	Period int
	// Sharpness κ sets how much the workload in focus dominates (default
	// 2: about half of the traffic with 8 workloads).
	Sharpness float64
	// Seed seeds the draws.
	Seed uint64
}

// Mix returns steps[s][l][e] for workloads of one shape (n of them, in the
// order given, each normalised per layer to a distribution q_i,l over the
// experts): at step s workload i has weight w_i(s) ∝ exp(κ·cos(2π(s/Period
// − i/n))), a spotlight that turns through the workloads in order, and
// every layer's TokensPerStep·TopK routings are a multinomial draw from
// Σ_i w_i(s)·q_i,l. (A token's k experts are drawn as k independent
// routings: the counts, not the token sets, are what a load series keeps.)
func Mix(workloads []*routing.Stats, opts MixOptions) ([][][]float64, error) {
	if len(workloads) == 0 {
		return nil, errors.New("series: no workloads")
	}
	L, E := workloads[0].Layers, workloads[0].Experts
	for i, w := range workloads {
		if w.Layers != L || w.Experts != E || len(w.Load) != L {
			return nil, fmt.Errorf("series: workload %d is %d layers × %d experts, workload 0 %d × %d", i, w.Layers, w.Experts, L, E)
		}
	}
	k := opts.TopK
	if k == 0 {
		k = workloads[0].TopK
	}
	switch {
	case opts.Steps < 1 || opts.TokensPerStep < 1:
		return nil, fmt.Errorf("series: %d steps of %d tokens: both must be positive", opts.Steps, opts.TokensPerStep)
	case k < 1 || k > E:
		return nil, fmt.Errorf("series: top-k %d out of [1,%d]: set MixOptions.TopK", k, E)
	}
	period := opts.Period
	if period <= 0 {
		period = max(1, opts.Steps/2)
	}
	kappa := opts.Sharpness
	if kappa == 0 {
		kappa = 2
	}
	// q[i][l][e]: workload i's distribution over the experts of layer l.
	n := len(workloads)
	q := make([][][]float64, n)
	for i, w := range workloads {
		q[i] = make([][]float64, L)
		for l, row := range w.Load {
			tot := 0.0
			for _, v := range row {
				tot += v
			}
			if tot <= 0 {
				return nil, fmt.Errorf("series: workload %d has no load at layer %d", i, l)
			}
			q[i][l] = make([]float64, E)
			for e, v := range row {
				q[i][l][e] = v / tot
			}
		}
	}
	src := rand.NewPCG(opts.Seed, 0x5e7e5)
	routings := float64(opts.TokensPerStep * k)
	out := make([][][]float64, opts.Steps)
	wt := make([]float64, n)
	p := make([]float64, E)
	for s := range out {
		sum := 0.0
		for i := range wt {
			wt[i] = math.Exp(kappa * math.Cos(2*math.Pi*(float64(s)/float64(period)-float64(i)/float64(n))))
			sum += wt[i]
		}
		out[s] = make([][]float64, L)
		back := make([]float64, L*E)
		for l := range L {
			for e := range p {
				p[e] = 0
				for i := range wt {
					p[e] += wt[i] / sum * q[i][l][e]
				}
			}
			out[s][l] = back[l*E : (l+1)*E : (l+1)*E]
			multinomial(out[s][l], routings, p, src)
		}
	}
	return out, nil
}

// multinomial fills x with a draw of n items over the categories of
// distribution p (summing to 1), by sequential binomials.
func multinomial(x []float64, n float64, p []float64, src rand.Source) {
	left, mass := n, 1.0
	for e, pe := range p {
		if left <= 0 {
			break
		}
		if pe <= 0 {
			continue
		}
		if e == len(p)-1 || mass <= pe {
			x[e] = left
			break
		}
		v := distuv.Binomial{N: left, P: math.Min(1, pe/mass), Src: src}.Rand()
		x[e] = v
		left -= v
		mass -= pe
	}
}

// Cut returns the per-step loads of trace t cut into steps of
// tokensPerStep consecutive tokens (the last step may be shorter):
// steps[s][l][e] counts the step's tokens routed to e at layer l.
func Cut(t *routing.Trace, tokensPerStep int) ([][][]float64, error) {
	if tokensPerStep < 1 {
		return nil, fmt.Errorf("series: %d tokens per step: want at least 1", tokensPerStep)
	}
	L, K, E := t.Layers, t.TopK, t.Experts
	var out [][][]float64
	for from := 0; from < t.Tokens; from += tokensPerStep {
		to := min(from+tokensPerStep, t.Tokens)
		m := make([][]float64, L)
		for l := range m {
			m[l] = make([]float64, E)
		}
		for tok := from; tok < to; tok++ {
			ids := t.IDs[tok*L*K : (tok+1)*L*K]
			for l := range L {
				for _, e := range ids[l*K : (l+1)*K] {
					m[l][e]++
				}
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// EncodeLogicalCount returns steps as SGLang's stat dump writes
// logical_count, {"logical_count": [S][modelLayers][E]}: MoE layer i in
// row layerIDs[i], zero rows for the dense layers (which readers drop).
func EncodeLogicalCount(steps [][][]float64, layerIDs []int, modelLayers int) ([]byte, error) {
	if len(steps) == 0 || len(steps[0]) != len(layerIDs) {
		return nil, fmt.Errorf("series: %d steps with %d layer ids: want steps of one row per MoE layer", len(steps), len(layerIDs))
	}
	rowOf := make([]int, modelLayers)
	for r := range rowOf {
		rowOf[r] = -1
	}
	for i, id := range layerIDs {
		if id < 0 || id >= modelLayers {
			return nil, fmt.Errorf("series: layer id %d out of [0,%d)", id, modelLayers)
		}
		rowOf[id] = i
	}
	E := len(steps[0][0])
	b := []byte("{\"logical_count\": [\n")
	for s, st := range steps {
		b = append(b, '[')
		for r, i := range rowOf {
			if r > 0 {
				b = append(b, ',')
			}
			b = append(b, '[')
			for e := range E {
				if e > 0 {
					b = append(b, ',')
				}
				if i < 0 {
					b = append(b, '0')
					continue
				}
				b = strconv.AppendFloat(b, st[i][e], 'f', -1, 64)
			}
			b = append(b, ']')
		}
		b = append(b, ']')
		if s < len(steps)-1 {
			b = append(b, ',')
		}
		b = append(b, '\n')
	}
	return append(b, "]}\n"...), nil
}

// WriteLogicalCount writes EncodeLogicalCount's JSON to path atomically.
func WriteLogicalCount(path string, steps [][][]float64, layerIDs []int, modelLayers int) error {
	data, err := EncodeLogicalCount(steps, layerIDs, modelLayers)
	if err != nil {
		return err
	}
	return placement.WriteFileAtomic(path, data)
}
