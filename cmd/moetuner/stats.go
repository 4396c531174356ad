package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
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
	out := fs.String("out", "", "also write the aggregated statistics to this file (merge several with: moetuner stats a.json b.json --out all.json)")
	var outFormat string
	choiceVar(fs, &outFormat, "format", "moetuner", []string{"moetuner", "logical-count"},
		"format of --out: moetuner (moetuner.stats/v1, read back by every command; files add up) or logical-count ({\"logical_count\": [decoder layers][experts]}, dense layers zero, for SGLang's --init-expert-location and EPLB)")
	model := fs.String("model", "", "model preset or YAML file: the trace's expert ids are checked against its experts, and with --format logical-count it says the decoder layers when the trace does not (default: the preset matching the trace's shape)")
	pathError := fs.Float64("path-error", routing.DefaultPathError, "per-token traces: target relative standard error of the per-token means estimated from the sample of token paths kept for long traces (0: keep every path)")
	ppOffsets := fs.String("pp-layer-offset", "", ppOffsetUsage)
	servingPath := fs.String("plan", "", "the placement that was serving while the trace was recorded: TensorRT-LLM's load balancer records physical slot ids (meta_info.json's num_experts is then num_slots), which it folds back to logical experts (a static placement, in any format moetuner reads)")
	epSize := fs.Int("ep-size", 0, "the expert-parallel size the --plan served on, for placement files that do not record it (SGLang, vLLM maps; a TensorRT-LLM file needs none)")
	quiet := fs.Bool("quiet", false, "print only errors (no notes on what the statistics left out, no progress)")
	// Flags may follow the traces (moetuner stats a.pt b.pt --out s.json).
	var traces []string
	for {
		if err := parse(fs, args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		if i := len(args) - fs.NArg() - 1; i >= 0 && args[i] == "--" {
			traces = append(traces, fs.Args()...)
			break
		}
		traces = append(traces, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(traces) == 0 {
		fs.Usage()
		return errUsage
	}
	if *out == "" && outFormat != "moetuner" {
		return usagef("--format %s needs --out FILE", outFormat)
	}
	if strings.HasSuffix(*out, ".pt") {
		// SGLang loads a --init-expert-location ending in .pt with torch.load
		// (python/sglang/srt/eplb/expert_location.py@01fec5c).
		return usagef("--out %s: stats writes JSON, and a name ending in .pt is loaded with torch.load; name it .json", *out)
	}
	if *pathError < 0 {
		return usagef("--path-error %v: want 0 (every path) or a positive relative error such as 0.01", *pathError)
	}
	lo := routing.LoadOptions{Format: routing.Format(format), TopK: *topK, StatsOnly: true, PathError: libPathError(*pathError)}
	offsets, err := parsePPOffsets(*ppOffsets)
	if err != nil {
		return err
	}
	lo.MegatronLayerOffsets = offsets
	if transitions == "top1" {
		lo.Transitions = routing.TransitionTop1
	} else if transitions != "all-pairs" {
		return fmt.Errorf("--transitions %q: want all-pairs or top1", transitions)
	}
	if err := (&common{model: *model}).modelLoadOptions(&lo); err != nil {
		return err
	}
	serving := servingPlan{path: *servingPath, flag: "--plan"}
	if *servingPath != "" {
		var err error
		if lo.SlotExperts, err = statsServingSlots(*servingPath, *epSize, lo.Experts); err != nil {
			return err
		}
	}
	pr, stdout, stderr := startProgress(stdout, stderr, *quiet)
	defer pr.close()
	rd := pr.reading(traces)
	stats, sources, err := routing.LoadAll(traces, rd.options(lo))
	rd.end(stats, err)
	if err != nil {
		return routingError(err)
	}
	if !*quiet {
		printNotes(stderr, stats.Notes)
		printSlotNotes(stderr, sources, serving, stats.Experts)
	}
	sum := routing.Summary(stats)
	printStatsSummary(stdout, sources, sum)
	printGroupsTouched(stdout, stats, *model, &sum)
	if *out != "" {
		if err := writeStatsOut(stdout, stderr, stats, *out, outFormat, *model); err != nil {
			return err
		}
	}
	return writeJSON(*jsonOut, sum)
}

// printStatsSummary prints stats' report: the sources, the totals and a
// row per layer.
func printStatsSummary(stdout io.Writer, sources []*routing.Source, sum routing.SummaryReport) {
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
}

// printGroupsTouched prints how many expert groups a token touches per
// layer when the model groups its experts, and records it in sum.
func printGroupsTouched(stdout io.Writer, stats *routing.Stats, model string, sum *routing.SummaryReport) {
	if m, err := (&common{model: model}).loadModel(stats); err == nil && m.ExpertGroups > 0 {
		if per, most, ok := routing.GroupsTouched(stats, m.ExpertGroups); ok {
			lo, hi, mean := per[0], per[0], 0.0
			for _, v := range per {
				lo, hi, mean = min(lo, v), max(hi, v), mean+v/float64(len(per))
			}
			fmt.Fprintf(stdout, "groups touched per token and layer (%d groups of %d experts, model %s): mean %.2f (layers %.2f–%.2f), most %d\n", m.ExpertGroups, stats.Experts/m.ExpertGroups, m.Name, mean, lo, hi, most)
			sum.GroupsTouched = per
		}
	}
}

// writeStatsOut writes stats to out, atomically, in outFormat (moetuner
// or logical-count), and says so on stdout.
func writeStatsOut(stdout, stderr io.Writer, stats *routing.Stats, out, outFormat, model string) error {
	w := stats
	if outFormat == "logical-count" {
		var err error
		if w, err = withLayout(stats, model, stderr); err != nil {
			return err
		}
	}
	var buf bytes.Buffer
	if err := routing.WriteStats(&buf, w, routing.StatsFormat(outFormat)); err != nil {
		return err
	}
	if err := placement.WriteFileAtomic(out, buf.Bytes()); err != nil {
		return err
	}
	if outFormat == "logical-count" {
		rows, n := routing.LogicalCountRows(w)
		fmt.Fprintf(stdout, "wrote %s: logical_count of %d rows × %d experts, MoE layers at rows %v\n", out, n, stats.Experts, rows)
	} else {
		fmt.Fprintf(stdout, "wrote %s (moetuner.stats/v1)\n", out)
	}
	return nil
}

// statsServingSlots reads stats' --plan, saying what is missing: stats has
// no cluster flags, so --ep-size gives the GPU count a file may not record
// (a TensorRT-LLM load-balancer YAML is read in its own slot order and
// needs none).
func statsServingSlots(path string, epSize, experts int) ([][]routing.Expert, error) {
	if epSize < 0 {
		return nil, usagef("--ep-size %d: want the expert-parallel size the --plan served on", epSize)
	}
	if rows, ok := trtllmSlots(path); ok {
		return rows, nil
	}
	p, err := placement.ReadFileWith(path, placement.Layout{GPUs: epSize, Experts: experts})
	if errors.Is(err, placement.ErrNeedGPUs) {
		return nil, fmt.Errorf("--plan %s does not record its GPU count: add --ep-size N, the expert-parallel size it served on", path)
	}
	if err != nil {
		return nil, fmt.Errorf("--plan %s: %w", path, err)
	}
	out, err := rankMajorSlots(p)
	if err != nil {
		return nil, fmt.Errorf("--plan %s: %w (TensorRT-LLM numbers its slots rank-major, the same number on every rank)", path, err)
	}
	return out, nil
}

func optPct(ok bool, v float64) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}

// withLayout returns stats (a copy when it changes anything) with the
// decoder layers the trace does not record taken from the model (--model,
// else the preset matching the trace's shape), as plan places SGLang
// maps. When neither knows the decoder-layer count, it says so on stderr:
// the file then ends at the last MoE layer.
func withLayout(stats *routing.Stats, model string, stderr io.Writer) (*routing.Stats, error) {
	c := common{model: model}
	m, err := c.loadModel(stats)
	if err != nil && model != "" {
		return nil, err
	}
	l := planLayout(stats, m, costmodel.Cluster{Nodes: 1, GPUsPerNode: 1})
	w := stats
	if l.ModelLayers != stats.ModelLayers || (l.LayerIDs != nil && stats.LayerNames == nil) {
		c := *stats
		c.ModelLayers, c.LayerNames = l.ModelLayers, l.LayerIDs
		w = &c
	}
	if w.ModelLayers == 0 {
		fmt.Fprintln(stderr, "moetuner: stats: neither the trace nor a model preset says how many decoder layers the model has: logical_count ends at the last MoE layer (pass --model to add trailing dense layers)")
	}
	return w, nil
}
