package main

import (
	"context"
	"fmt"
	"io"
	"math"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/internal/sharedfiles"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// runHoldoutFloor is the holdout-floor experiment: how low the busiest GPU
// of a plan made on the first half of a trace can be on the second half,
// when the tokens of the halves are independent draws. A plan balanced
// exactly on half A has its GPUs' true loads off by A's sampling noise, to
// which B adds its own, so on B the GPUs spread by √2·σ (σ: one half's
// relative noise per GPU), and the busiest sits near 1 + c_G·√2·σ with c_G
// the expected maximum of G standard normals. It measures √2·σ directly:
// the spread of every GPU's load between the halves (relative to the
// layer's mean) for EPLB's plan made on A, which fits neither half's
// noise; and prints it next to the Poisson count's own estimate,
// σ = 1/√(tokens a GPU computes in a half).
func runHoldoutFloor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("holdout-floor", stderr)
	slots := f.fs.Int("redundant-slots", 32, "redundant slots per layer (EPLB's num_replicas − experts)")
	disp := f.fs.String("dispatch", "sglang-static", "dispatch the plans are scored under")
	if err := f.parse(args); err != nil {
		return err
	}
	d, err := placement.ParseDispatch(*disp)
	if err != nil {
		return usageError{fmt.Errorf("-dispatch: %w", err)}
	}
	path := f.trace
	if path == "" {
		if path = sharedfiles.Find(defaultTrace); path == "" {
			return usageError{fmt.Errorf("no trace: %s is not beside the repository; pass -trace", defaultTrace)}
		}
	}
	src, err := routing.Load(path, routing.LoadOptions{})
	if err != nil {
		return err
	}
	if src.Trace == nil {
		return usageError{fmt.Errorf("-trace %s: the experiment needs a per-token trace", path)}
	}
	tr := src.Trace
	A := tr.Slice(0, tr.Tokens/2).Stats(routing.StatsOptions{})
	B := tr.Slice(tr.Tokens/2, tr.Tokens).Stats(routing.StatsOptions{})
	m, err := costmodel.InferModel(A)
	if err != nil {
		return err
	}
	c, err := costmodel.ClusterPreset("h100x8")
	if err != nil {
		return err
	}
	c = c.WithNodes(f.nodes)
	G := c.GPUs()
	plan, err := baseline.EPLB(A, G, baseline.EPLBOptions{RedundantSlots: *slots, FixDuplicates: true})
	if err != nil {
		return err
	}
	sc := costmodel.Scenario{Stats: A, Cluster: c, Model: m, Dispatch: d}
	ra, err := sc.Evaluate(plan)
	if err != nil {
		return err
	}
	sc.Stats = B
	rb, err := sc.Evaluate(plan)
	if err != nil {
		return err
	}
	var s2, tok float64
	n := 0
	for l := range ra.Layers {
		ma, mb := ra.Layers[l].MeanTokens, rb.Layers[l].MeanTokens
		tok += mb / float64(len(ra.Layers))
		for g := range G {
			x := ra.Layers[l].Tokens[g]/ma - rb.Layers[l].Tokens[g]/mb
			s2 += x * x
			n++
		}
	}
	spread := math.Sqrt(s2 / float64(n))
	poisson := math.Sqrt2 / math.Sqrt(tok)
	cg := expectedMaxNormal(G)
	fmt.Fprintf(stdout, "%s, %d GPUs, %v dispatch: EPLB made on the first %d tokens: busiest/mean %.4f on them, %.4f on the last %d\n", path, G, d, tr.Tokens/2, ra.MeanBalance, rb.MeanBalance, tr.Tokens-tr.Tokens/2)
	fmt.Fprintf(stdout, "per-GPU spread between the halves (√2·σ): measured %.4f, Poisson %.4f; E[max of %d normals] %.3f\n", spread, poisson, G, cg)
	fmt.Fprintf(stdout, "held-out floor of a plan balanced exactly on the first half: %.4f (measured spread), %.4f (Poisson); of a plan balanced on the true rates: %.4f, %.4f\n",
		1+cg*spread, 1+cg*poisson, 1+cg*spread/math.Sqrt2, 1+cg*poisson/math.Sqrt2)
	return nil
}

// expectedMaxNormal is E[max of n independent standard normals], by
// numerical integration of x·n·φ(x)·Φ(x)^(n−1).
func expectedMaxNormal(n int) float64 {
	const h = 1e-3
	s := 0.0
	for x := -8.0; x < 8; x += h {
		phi := math.Exp(-x*x/2) / math.Sqrt(2*math.Pi)
		s += x * float64(n) * phi * math.Pow(0.5*math.Erfc(-x/math.Sqrt2), float64(n-1)) * h
	}
	return s
}
