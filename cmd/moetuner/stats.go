package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

func cmdStats(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("stats", "stats [flags] TRACE...", stderr)
	var format, transitions string
	choiceVar(fs, &format, "trace-format", "", traceFormats, "force the trace format (default: detect)")
	topK := fs.Int("top-k", 0, "top-k for count formats that do not state it")
	choiceVar(fs, &transitions, "transitions", "all-pairs", []string{"all-pairs", "top1"}, "transition counting: all-pairs or top1")
	jsonOut := fs.String("json", "", "also write the summary as JSON to this file")
	logicalCount := fs.String("logical-count", "", "also write the loads as SGLang's {\"logical_count\": [decoder layers][experts]} JSON to this file (dense layers as zero rows), for --init-expert-location to run SGLang's own EPLB on")
	model := fs.String("model", "", "with --logical-count: model preset or YAML file that says the decoder layers when the trace does not (default: the preset matching the trace's shape)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errUsage
	}
	lo := routing.LoadOptions{Format: routing.Format(format), TopK: *topK}
	if transitions == "top1" {
		lo.Transitions = routing.TransitionTop1
	} else if transitions != "all-pairs" {
		return fmt.Errorf("--transitions %q: want all-pairs or top1", transitions)
	}
	stats, sources, err := routing.LoadAll(fs.Args(), lo)
	if err != nil {
		return err
	}
	sum := routing.Summary(stats)
	for _, s := range sources {
		fmt.Fprintf(stdout, "source %s (%s)\n", s.Path, s.Format)
	}
	topk := "unknown"
	if sum.TopK > 0 {
		topk = fmt.Sprint(sum.TopK)
	}
	fmt.Fprintf(stdout, "tokens %.0f  layers %d  experts %d  top-k %s", sum.Tokens, sum.Layers, sum.Experts, topk)
	if sum.HasTransitions {
		fmt.Fprintf(stdout, "  transitions %s", sum.TransitionMode)
	}
	fmt.Fprintln(stdout)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "layer\tname\ttokens·k\tmax\tmean\tmax/mean\tcv\ttop-E pair share\trow max share\t")
	for _, l := range sum.PerLayer {
		fmt.Fprintf(tw, "%d\t%d\t%.0f\t%.0f\t%.1f\t%.3f\t%.3f\t%s\t%s\t\n", l.Layer, l.Name, l.Total, l.Max, l.Mean, l.Skew, l.CV,
			optPct(sum.HasTransitions && int(l.Layer) < sum.Layers-1, l.TopPairShare), optPct(sum.HasTransitions && int(l.Layer) < sum.Layers-1, l.RowMaxShare))
	}
	tw.Flush()
	if *logicalCount != "" {
		c := common{model: *model}
		m, err := c.loadModel(stats)
		if err != nil && *model != "" {
			return err
		}
		// Without a matching preset the trace alone must say.
		c.layout, c.modelName = planLayout(stats, m, costmodel.Cluster{Nodes: 1, GPUsPerNode: 1}), m.Name
		if err := placement.WriteLogicalCountFile(*logicalCount, stats, c.layout); err != nil {
			return c.layoutError(err, *logicalCount, costmodel.Cluster{})
		}
		fmt.Fprintf(stdout, "wrote %s: logical_count of %d decoder layers × %d experts\n", *logicalCount, c.layout.ModelLayers, stats.Experts)
	}
	return writeJSON(*jsonOut, sum)
}

func optPct(ok bool, v float64) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}
