package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver/internal/trafficbound"
)

// runBoundBudgets is the bound-budgets experiment: where the home-flow
// bound loses against a plan (one copy of every expert, even dispatch).
// Per layer it prints the bound and its two budgets (home H*, pairs W*),
// the moments of EPLB's plan and of a node-level swap search from it at
// EPLB's node loads (trafficbound.NodeSearch), and the configuration LP
// with each budget replaced by the search plan's moment: what a perfect
// master could give. Last, a balance-aware pair budget: for plans whose
// nodes carry at most 1.02 of the mean load, Σ_B load_B² ≤ Q, so for
// μ ≥ 0
//
//	W ≤ max_X Σ_{a<b} (C_ab − 2μ·L_a·L_b)⟨x_a, x_b⟩ + μ·(Q − Σ_a L_a²),
//
// the same pair master on a shifted matrix, minimized over a grid of μ.
func runBoundBudgets(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("bound-budgets", stderr).withLayers(0, 20)
	if err := f.parse(args); err != nil {
		return err
	}
	st, err := f.stats()
	if err != nil {
		return err
	}
	for _, pt := range st.Patterns {
		if pt.Source < 0 {
			// A plan's home moment counts the experts on the source's
			// node; without a source it would read 0, below what the
			// configuration LP can meet.
			return usageError{errors.New("-trace: the experiment needs every token's source rank (a trace with a source sidecar or field)")}
		}
	}
	N := f.nodes
	const P = 8
	S := st.Experts / (N * P)
	shape := trafficbound.Uniform(N, P, S)
	eplb, err := baseline.EPLB(st, N*P, baseline.EPLBOptions{})
	if err != nil {
		return err
	}
	p := &lineWriter{w: stdout}
	for _, l := range f.layers {
		b, err := trafficbound.HomeRemote(ctx, st, l, shape, placement.DispatchEven, trafficbound.Options{})
		if err != nil {
			return err
		}
		hl, err := trafficbound.NewHomeLayer(st, l, shape)
		if err != nil {
			return err
		}
		T := hl.Tokens()
		node := make([]int, st.Experts)
		for s, e := range eplb.Layers[l].SlotExpert {
			node[e] = int(eplb.Layers[l].SlotGPU[s]) / P
		}
		nodeLoad := make([]float64, N)
		for e, B := range node {
			nodeLoad[B] += st.Load[l][e]
		}
		limit := 0.0
		for _, v := range nodeLoad {
			limit = max(limit, v)
		}
		search := trafficbound.NodeSearch(st, l, N, P, node, limit, 3)
		moments := func(node []int) (cost, h, w float64) {
			k := st.TopK
			for _, pt := range st.Patterns {
				A := -1
				if pt.Source >= 0 {
					A = int(pt.Source) / P
				}
				var ex []int
				for _, e := range pt.Experts[l*k : (l+1)*k] {
					if !slices.Contains(ex, int(e)) {
						ex = append(ex, int(e))
					}
				}
				used := make([]bool, N)
				for i, a := range ex {
					used[node[a]] = true
					if node[a] == A {
						h += pt.Count
					}
					for _, c := range ex[i+1:] {
						if node[a] == node[c] {
							w += pt.Count
						}
					}
				}
				for B, u := range used {
					switch {
					case u && A < 0:
						cost += pt.Count * float64(N-1) / float64(N)
					case u && B != A:
						cost += pt.Count
					}
				}
			}
			return cost, h, w
		}
		lp := func(h, w float64) float64 { return hl.ConfigLP(h, w) / T }
		ce, he, we := moments(node)
		cs, hs, ws := moments(search)
		p.printf("layer %d: bound %.4f, H* %.3f, W* %.3f (per token)", l, b.Value/T, b.HomeBudget/T, b.PairBudget/T)
		p.printf("  EPLB:   remote %.4f, H %.3f, W %.3f", ce/T, he/T, we/T)
		p.printf("  search: remote %.4f, H %.3f, W %.3f", cs/T, hs/T, ws/T)
		p.printf("  LP with (H*, W_search) %.4f, (H_search, W*) %.4f, (H_search, W_search) %.4f", lp(b.HomeBudget, ws), lp(hs, b.PairBudget), lp(hs, ws))
		// The balance-aware pair budget at node cap 1.02.
		L := st.Load[l]
		total, sq := 0.0, 0.0
		for _, v := range L {
			total += v
			sq += v * v
		}
		Q, left := 0.0, total
		for range N {
			x := min(left, 1.02*total/float64(N))
			Q += x * x
			left -= x
		}
		best := b.PairBudget
		for _, f := range []float64{1, 2, 4, 8, 16, 32, 64, 128, 256} {
			mu := f * T / (total * total)
			best = min(best, hl.ShiftedPairBound(mu, L)+mu*(Q-sq))
		}
		p.printf("  balance-aware W* (node cap 1.02) %.3f: LP %.4f", best/T, lp(b.HomeBudget, best))
	}
	return nil
}

// runBalancedBound is the balanced-bound experiment: per layer, the
// home-flow bound over every plan and over the plans whose nodes carry at
// most -cap of the mean load, without and with the shift steps, and
// their times.
func runBalancedBound(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("balanced-bound", stderr).withLayers(0, 20)
	slots := f.fs.Int("slots", 9, "slots per GPU (9: 32 redundant slots on 4 × 8 for 256 experts)")
	capRatio := f.fs.Float64("cap", 1.02, "the node cap: a node's load over the mean node's, at least 1")
	dispatch := f.fs.String("dispatch", placement.DispatchStaticMean.String(), "the dispatch the bound is for: even, static-mean, local or vllm")
	if err := f.parse(args); err != nil {
		return err
	}
	d, err := placement.ParseDispatch(*dispatch)
	if err != nil {
		return usageError{fmt.Errorf("-dispatch: %w", err)}
	}
	if *slots < 1 {
		return usageError{fmt.Errorf("-slots %d: need at least 1", *slots)}
	}
	st, err := f.stats()
	if err != nil {
		return err
	}
	shape := trafficbound.Uniform(f.nodes, 8, *slots)
	for _, l := range f.layers {
		t0 := time.Now()
		b0, err := trafficbound.HomeRemote(ctx, st, l, shape, d, trafficbound.Options{ShiftSteps: -1})
		if err != nil {
			return err
		}
		t1 := time.Now()
		b1, err := trafficbound.HomeRemote(ctx, st, l, shape, d, trafficbound.Options{ShiftSteps: -1, MaxNodeLoad: *capRatio})
		if err != nil {
			return err
		}
		t2 := time.Now()
		b2, err := trafficbound.HomeRemote(ctx, st, l, shape, d, trafficbound.Options{MaxNodeLoad: *capRatio})
		if err != nil {
			return err
		}
		T := b0.Tokens
		fmt.Fprintf(stdout, "layer %d: bound %.4f (W* %.3f, %v); at node cap %.2f %.4f (W* %.3f, %v), with the shift steps %.4f (%v)\n", l, b0.Value/T, b0.PairBudget/T, t1.Sub(t0), *capRatio, b1.Value/T, b1.PairBudget/T, t2.Sub(t1), b2.Value/T, time.Since(t2))
	}
	return nil
}
