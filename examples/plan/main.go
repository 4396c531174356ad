// Command plan shows the library API end to end: read a trace, describe
// the cluster and model, solve the joint placement, validate it, compare it
// with Megatron's contiguous placement and write an SGLang file.
//
//	go run ./examples/plan
package main

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
)

func main() {
	src, err := routing.Load("testdata/flame-moe-290m/trace.jsonl", routing.LoadOptions{})
	if err != nil {
		log.Fatal(err)
	}
	cluster, err := costmodel.ClusterPreset("2xh100x8") // 2 nodes
	if err != nil {
		log.Fatal(err)
	}
	cluster = cluster.WithGPUsPerNode(4) // 8 EP ranks in all
	model, err := costmodel.ModelPreset("flame-moe-290m")
	if err != nil {
		log.Fatal(err)
	}
	p := solver.Problem{Stats: src.Stats, Cluster: cluster, Model: model, Flow: costmodel.FlowChain}
	ctx := context.Background()
	res, err := solver.Solve(ctx, p, solver.Options{TimeLimit: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	base, err := solver.Solve(ctx, p, solver.Options{Strategy: solver.StrategyContiguous})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("joint: %s, modeled time %.1f µs (contiguous %.1f µs, %.1f%% lower), gap %.1f%% on its ILP model\n",
		res.Status, res.Objective*1e6, base.Objective*1e6, 100*(base.Objective-res.Objective)/base.Objective, 100*res.Gap)
	// SGLang's map has a row for every decoder layer: the trace names the
	// MoE layers (2..9), the model preset counts the decoder layers (10).
	out := filepath.Join(os.TempDir(), "flame.sglang.json")
	if err := placement.WriteFileWith(out, res.Plan, placement.FormatSGLang, res.Layout); err != nil {
		log.Fatal(err)
	}
	fmt.Println("wrote", out)
}
