package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/moetuner/moetuner/costmodel"
)

func cmdEval(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("eval", "eval --trace T... --plan FILE [flags]", stderr)
	var c common
	c.register(fs, false)
	planPath := fs.String("plan", "", "placement file in any format moetuner writes (moetuner JSON/YAML, SGLang, EPLB, vLLM, vllm-ascend, TensorRT-LLM), detected from its content; the GPU count comes from the file or else --nodes/--gpus-per-node/--cluster")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *planPath == "" {
		return usagef("eval needs --plan FILE")
	}
	c.serving = servingPlan{path: *planPath, flag: "--plan", replicatedOnly: true}
	pr, stdout, _ := c.startProgress(stdout, stderr)
	defer pr.close()
	p, _, err := c.setup(false)
	if err != nil {
		return err
	}
	plan, err := c.readPlan(*planPath, p.Cluster)
	if err != nil {
		return err
	}
	rep, err := costmodel.Evaluate(plan, p.Stats, p.Cluster, p.Model, costmodel.Options{Flow: p.Flow, Mode: p.Mode, Dispatch: p.Dispatch})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "plan %s (%s) on %s, %d GPUs, model %s, flow %s, mode %s\n", *planPath, strategyOf(plan), p.Cluster.Name, p.Cluster.GPUs(), p.Model.Name, p.Flow, p.Mode)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "layer\tmax tokens\tmax/mean\tcompute tail\tall-to-all\tcross-node\tsequential\toverlapped\t")
	for _, l := range rep.Layers {
		fmt.Fprintf(tw, "%d\t%.0f\t%.3f\t%s\t%s\t%s\t%s\t%s\t\n", l.Layer, l.MaxTokens, l.Balance, dur(l.ComputeTail), dur(l.CommTime), bytesStr(l.CrossNodeBytes), dur(l.Sequential), dur(l.Overlapped))
	}
	fmt.Fprintf(tw, "total\t%.0f\t%.3f\t%s\t%s\t%s\t%s\t%s\t\n", rep.MaxTokensSum, rep.MeanBalance, dur(rep.ComputeTail), dur(rep.CommTime), bytesStr(rep.CrossNodeBytes), dur(rep.Sequential), dur(rep.Overlapped))
	tw.Flush()
	return writeJSON(c.jsonOut, rep)
}
