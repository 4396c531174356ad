package main

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver"
)

// The libraries' errors name their options (routing.LoadOptions,
// placement.Layout); the command line's must name its flags. This file
// rewords them.

// readPlan reads a placement file in any format with the command's layout
// (the cluster's GPU count where the file does not record it; the trace's
// MoE layers and experts, which the file must match) and says what went
// wrong in the command line's words.
func (c *common) readPlan(path string, cluster costmodel.Cluster) (*placement.Plan, error) {
	p, err := placement.ReadFileWith(path, c.layout)
	if err != nil {
		return nil, c.layoutError(err, path, cluster)
	}
	return p, nil
}

// layoutError rewords the placement package's layout errors for the
// command line: what the library calls Layout fields are the cluster
// flags, the trace and the model here.
func (c *common) layoutError(err error, file string, cluster costmodel.Cluster) error {
	var ge *placement.GPUCountError
	var ce *placement.CountError
	switch {
	case errors.As(err, &ge):
		return fmt.Errorf("%s records %d GPUs (%s) but the cluster has %d (%d nodes × %d GPUs); set --nodes and --gpus-per-node (or --cluster) to the file's expert-parallel size", file, ge.File, ge.Field, ge.Given, cluster.Nodes, cluster.GPUsPerNode)
	case errors.As(err, &ce):
		return &cliError{err: err, msg: c.countWords(ce, file)}
	case errors.Is(err, placement.ErrNeedLayers):
		return fmt.Errorf("%s: the file's layers are indexed by decoder layer, and neither the trace nor model %q says which of the model's decoder layers are its %d MoE layers: use a trace that records them (SGLang dumps do), or pass --model with a preset or YAML file that sets decoder_layers (num_hidden_layers) and, when the MoE layers are not the last ones, moe_layer_ids", file, c.modelName, c.layout.Layers)
	}
	msg := gpuCountWords.ReplaceAllString(err.Error(), "for another GPU count than the $1 of --nodes × --gpus-per-node")
	return &cliError{err: err, msg: layoutWords.Replace(msg)}
}

// countWords says what a *placement.CountError means on the command line:
// the Layout's layers and experts are the trace's, its decoder layers the
// trace's or the model's.
func (c *common) countWords(ce *placement.CountError, file string) string {
	subject := file
	if ce.Subject != "the plan" {
		subject = file + ": " + ce.Subject
	}
	traces := c.traceNames()
	switch ce.LayoutField {
	case "Layout.Experts":
		return fmt.Sprintf("%s has %d %s but the trace (%s) has %d; give the --trace the plan was made for, or make a plan for this trace with moetuner plan", subject, ce.File, ce.What, traces, ce.Given)
	case "Layout.ModelLayers":
		return fmt.Sprintf("%s has %d %s but %s; the file is for another model: give the --trace and --model it was made for, or make a plan for this model with moetuner plan", subject, ce.File, ce.What, c.decoderLayersWords(ce.Given))
	}
	return fmt.Sprintf("%s has %d %s but the trace (%s) has %d MoE layers; give the --trace the plan was made for, or make a plan for this trace with moetuner plan", subject, ce.File, ce.What, traces, ce.Given)
}

// decoderLayersWords says where the layout's n decoder layers came from.
func (c *common) decoderLayersWords(n int) string {
	if c.decoderFromTrace {
		return fmt.Sprintf("the trace (%s) records %d decoder layers", c.traceNames(), n)
	}
	return fmt.Sprintf("model %q has %d decoder layers (decoder_layers)", c.modelName, n)
}

// traceNames lists the traces the command read.
func (c *common) traceNames() string {
	if len(c.traces) == 0 {
		return DefaultTrace
	}
	return strings.Join(c.traces, ", ")
}

// gpuCountWords finds the placement readers' "for another GPU count than
// N" (N the Layout's GPUs, the cluster's here).
var gpuCountWords = regexp.MustCompile(`for another GPU count than (\d+)`)

// layoutWords names the Layout fields as a command-line user sets them.
var layoutWords = strings.NewReplacer(
	"Layout.ModelLayers", "the model's decoder-layer count",
	"Layout.LayerIDs", "the MoE layer ids (the trace's, else the model's moe_layer_ids)",
	"Layout.Layers", "the trace's MoE layers",
	"Layout.Experts", "the trace's experts",
	"Layout.GPUs", "the cluster's GPUs (--nodes × --gpus-per-node)",
)

// solverWords names the flags behind the solver's Problem and Options
// fields.
var solverWords = strings.NewReplacer(
	"Problem.MaxImbalance", "--max-imbalance",
	"Problem.RedundantSlots", "--redundant-slots",
	"Options.TimeLimit", "--time-limit",
	", set Options.Backend to a mip.Backend, or choose a strategy that needs no ILP", ", or pass a --strategy that needs no ILP",
)

// solved rewords what solver.Solve returned for the command line: its
// error and the result's note name flags, not Problem and Options fields.
func solved(res *solver.Result, err error) (*solver.Result, error) {
	if res != nil {
		res.Note = solverWords.Replace(res.Note)
	}
	if err == nil {
		return res, nil
	}
	msg := solverWords.Replace(err.Error())
	if msg == err.Error() {
		return res, err
	}
	return res, &cliError{err: err, msg: msg}
}

// routingError rewords an error of the routing readers for the command
// line: LoadOptions fields are flags here (--model sets Experts and
// ModelLayers, --top-k TopK, --trace-format Format), and options the
// command line does not offer become what to do instead.
func routingError(err error) error {
	if err == nil {
		return nil
	}
	msg := routingWords.Replace(err.Error())
	if msg == err.Error() {
		return err
	}
	return &cliError{err: err, msg: msg}
}

// routingWords rewords the routing package's advice. Longer phrases come
// first: strings.Replacer tries them in order at each position.
var routingWords = strings.NewReplacer(
	"set LoadOptions.SlotExperts to the placement it was serving", "give the placement it was serving with --plan (stats, eval) or --from (plan)",
	"the placement in LoadOptions.SlotExperts", "the serving placement (--plan, --from)",
	"set LoadOptions.Experts to the model's experts per layer", "pass the --model the trace was recorded with",
	"LoadOptions.Experts is", "--model has",
	"leave LoadOptions.TopK 0", "drop --top-k",
	"LoadOptions.TopK is", "--top-k is",
	"set LoadOptions.TopK", "pass --top-k",
	"set LoadOptions.Format", "pass --trace-format",
	"set LoadOptions.ModelLayers (the model's num_hidden_layers)", "pass --model with its decoder_layers (num_hidden_layers)",
	"every layer is all zeros: set LoadOptions.KeepZeroLayers to keep them", "every layer is all zeros: the file recorded no tokens; record again while the server handles requests",
	"(set LoadOptions.KeepZeroLayers to keep them)", "(record again while the server handles requests)",
	"load the others separately", "give the others to a separate command",
)

// cliError is an error reworded for the command line; errors.Is and As
// still see the original.
type cliError struct {
	err error
	msg string
}

func (e *cliError) Error() string { return e.msg }
func (e *cliError) Unwrap() error { return e.err }
