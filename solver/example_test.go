package solver_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver"
	"github.com/moetuner/moetuner/solvertest"
)

// A placement service: fresh per-layer expert counts from the serving
// stack, a time budget from the request's context, a plan back. The model
// is inferred from the counts' shape (here Mixtral-8x7B's 32 × 8), and
// the context's deadline is the budget: whatever the solve has found by
// then is returned, validated.
func Example_service() {
	counts := solvertest.MixtralStats().Load // [layer][expert] token counts
	stats := routing.StatsFromLoad(counts, 0)
	cluster, err := costmodel.ClusterPreset("h100x8")
	if err != nil {
		log.Fatal(err)
	}
	cluster = cluster.WithGPUsPerNode(4) // 4 EP ranks
	p := solver.Problem{Stats: stats, Cluster: cluster}

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	res, err := solver.Solve(ctx, p, solver.Options{})
	if err != nil {
		log.Fatal(err)
	}
	base, err := solver.Solve(context.Background(), p, solver.Options{Strategy: solver.StrategyContiguous})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("valid:", res.Plan.Validate(placement.ValidateOptions{Experts: 8, Layers: 32}) == nil)
	fmt.Println("faster than contiguous:", res.Objective < base.Objective)
	// Output:
	// valid: true
	// faster than contiguous: true
}

// Offline: plan once from recorded routing, with redundant copies of hot
// experts, and write the files the serving stacks load (SGLang's
// --init-expert-location, DeepSeek EPLB's maps).
func Example_offline() {
	p := solvertest.FLAME(2, 4, costmodel.FlowHome)
	p.RedundantSlots = 8 // 72 physical slots per layer, 9 per GPU
	res, err := solver.Solve(context.Background(), p, solver.Options{TimeLimit: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "placements")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	for _, name := range []string{"flame.sglang.json", "flame.eplb.json"} {
		// The layout says where the plan's 8 MoE layers sit among the
		// model's 10 decoder layers, which SGLang's map indexes.
		if err := placement.WriteFileWith(filepath.Join(dir, name), res.Plan, "", res.Layout); err != nil {
			log.Fatal(err)
		}
	}
	back, err := placement.ReadFileWith(filepath.Join(dir, "flame.sglang.json"), res.Layout)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d MoE layers, %d slots per layer on %d GPUs\n", len(back.Layers), back.Slots(0), back.GPUs)
	// Output: 8 MoE layers, 72 slots per layer on 8 GPUs
}

// The library in ten lines, as the README shows it: read a recorded
// trace, describe the cluster and the model, solve, and write the map
// SGLang loads with --init-expert-location. The model is given because
// SGLang's map has a row for every decoder layer: the trace names the MoE
// layers (2..9), the preset counts the decoder layers (10), and
// Problem.Layout puts the two together.
func Example_readme() {
	dir, err := os.MkdirTemp("", "readme")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "flame.sglang.json")

	src, err := routing.Load("../testdata/flame-moe-290m/trace.jsonl", routing.LoadOptions{})
	if err != nil {
		log.Fatal(err)
	}
	cluster, _ := costmodel.ClusterPreset("2xh100x8") // 2 nodes × 8 GPUs
	model, _ := costmodel.ModelPreset("flame-moe-290m")
	p := solver.Problem{Stats: src.Stats, Cluster: cluster, Model: model, Flow: costmodel.FlowHome}
	res, err := solver.Solve(context.Background(), p, solver.Options{TimeLimit: 2 * time.Second}) // joint
	if err != nil {
		log.Fatal(err)
	}
	err = placement.WriteFileWith(out, res.Plan, placement.FormatSGLang, p.Layout())
	if err != nil {
		log.Fatal(err)
	}

	back, err := placement.ReadFileWith(out, p.Layout())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %d MoE layers on %d GPUs\n", filepath.Base(out), len(back.Layers), back.GPUs)
	// Output: flame.sglang.json: 8 MoE layers on 16 GPUs
}
