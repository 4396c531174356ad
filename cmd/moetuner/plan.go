package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/moetuner/moetuner/mip"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver"
)

func cmdPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("plan", "plan [--trace T]... [flags]", stderr)
	var c common
	c.register(fs, true)
	var strategy, format string
	choiceVar(fs, &strategy, "strategy", "joint", strategyNames(), "joint, moetuner, greedy, eplb, eplb-hierarchical, contiguous, round-robin, or a stack's own algorithm: deepseek-vec, deepseek-vec-hierarchical (SGLang's --eplb-algorithm deepseek_vec[_hierarchical]) or flashlb (vllm-ascend's FlashLB policy)")
	out := fs.String("out", "placement.json", "placement file to write (atomically)")
	choiceVar(fs, &format, "format", "", formatNames(), "placement format: moetuner (JSON), yaml, sglang (--init-expert-location), sglang-pt (the same as a torch.save .pt), eplb, vllm (expert_to_ep_rank), vllm-map (initial_expert_map_path), vllm-mapping (offline-EPLB JSONL), vllm-ascend, trtllm (moe_load_balancer YAML) (default: from --out's extension: .yaml, .sglang.json, .pt, .eplb.json, .vllm.json, .vllm-map.json, .vllm-mapping.jsonl, .vllm-ascend.json, .trtllm.yaml, else moetuner JSON)")
	writeLP := fs.String("write-model", "", "also write the joint ILP(s) for debugging to PREFIX<i>.lp (CPLEX LP, written in Go) or, with a .mps suffix (PREFIX.mps), PREFIX<i>.mps via HiGHS")
	dispatchMap := fs.String("dispatch-map", "", "also write, for --dispatch local, each rank's static dispatch table [rank][layer][expert] → physical slot (GPU-major numbering as in the sglang/eplb files) to this JSON file")
	topology := fs.String("write-topology", "", "also write the cluster's EP-rank cost matrix, {\"rank_cost_matrix\": [[...]]} in picoseconds per byte (one-way NVLink within a node, the NIC across nodes), for SGLang's --eplb-algorithm topology_aware --eplb-topology FILE")
	quiet := &c.quiet
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("plan takes no positional arguments (got %q); use --trace", fs.Args())
	}
	pr, stdout, stderr := c.startProgress(stdout, stderr)
	defer pr.close()
	if *dispatchMap != "" && c.dispatch != "local" {
		return usagef("--dispatch-map writes the tables of local dispatch; add --dispatch local")
	}
	st, err := parseStrategy(strategy)
	if err != nil {
		return err
	}
	pf, note, err := planFormat(format, *out)
	if err != nil {
		return err
	}
	if note != "" && !*quiet {
		fmt.Fprintf(stderr, "moetuner plan: note: %s\n", note)
	}
	p, sources, err := c.setup(true)
	if err != nil {
		return err
	}
	// Fail before the solve when the format needs what nobody knows.
	if err := placement.CheckLayout(pf, c.layout); err != nil {
		return c.layoutError(err, *out, p.Cluster)
	}
	if *writeLP != "" {
		if err := writeJointModels(p, c.options(), *writeLP); err != nil {
			return err
		}
	}
	// Score the contiguous baseline first: the summary shows it, and its
	// time (one evaluation of the cost model) sizes what the command keeps
	// of --time-limit for scoring and writing after the solve. Where the
	// GPUs do not divide the experts (3 nodes of 8 GPUs with 256 experts
	// and redundant slots) there is no contiguous layout, and round-robin,
	// which every shape has, takes its place.
	t0 := time.Now()
	ref := solver.StrategyContiguous
	base, err := solver.Solve(ctx, p, solver.Options{Strategy: ref})
	if errors.Is(err, solver.ErrInfeasible) {
		ref = solver.StrategyRoundRobin
		base, err = solver.Solve(ctx, p, solver.Options{Strategy: ref})
	}
	if err != nil {
		return err
	}
	reserve := time.Since(t0)
	var running *solver.Result
	if c.from != "" {
		// The running plan is a row too (one more evaluation after the
		// solve): the plan is measured against it.
		if running, err = scorePlan(p, p.Current, c.from); err != nil {
			return err
		}
		reserve *= 2
	}
	opts := c.optionsShare(1, reserve)
	opts.Strategy = st
	sp := pr.solving(st)
	var res *solver.Result
	if isPeer(st) {
		if note := stepsNote(p, []solver.Strategy{st}); note != "" && !*quiet {
			fmt.Fprintln(stderr, "moetuner plan: "+note)
		}
		res, err = solvePeer(p, st)
	} else {
		res, err = solver.Solve(ctx, p, sp.options(opts))
		res, err = solved(res, err)
	}
	sp.end(res, err)
	if err != nil && (res == nil || res.Plan == nil || ctx.Err() == nil) {
		return err
	}
	if ctx.Err() != nil {
		// Interrupted (Ctrl-C, SIGTERM): a plan the solver returned is
		// the best it found; write it rather than lose the work, and exit 0.
		fmt.Fprintf(stderr, "moetuner plan: %v; writing the best plan found so far (status %s)\n", context.Cause(ctx), res.Status)
	}
	plan := res.Plan
	plan.Meta = planMeta(p, res, sources)
	outs := planOutputs{out: *out, format: pf, dispatchMap: *dispatchMap, topology: *topology}
	if err := c.writePlanOutputs(stdout, stderr, p, plan, outs); err != nil {
		return err
	}
	results := []*solver.Result{base}
	if st != ref {
		results = append(results, res)
	}
	if running != nil {
		results = append(results, running)
	}
	if !*quiet {
		fmt.Fprintf(stdout, "wrote %s (%s format): %s placement of %d layers × %d experts on %d GPUs (%d nodes), flow %s\n",
			*out, pf, st, p.Stats.Layers, p.Stats.Experts, p.Cluster.GPUs(), p.Cluster.Nodes, p.Flow)
		printCompare(stdout, p, results)
	}
	return writeJSON(c.jsonOut, jsonResults(p, results))
}

// planFormat is plan's placement format: --format (json for moetuner),
// else the one --out's extension names, checked against --out's name; note
// says what the name changed.
func planFormat(format, out string) (placement.Format, string, error) {
	var err error
	pf := placement.Format(format)
	if format == "json" {
		pf = placement.FormatJSON
	}
	if pf == "" {
		if pf, err = placement.FormatFromPath(out); err != nil {
			return "", "", err
		}
	}
	return formatForName(pf, out)
}

// writeJointModels writes the joint ILP(s) of p to prefix<i>.lp or, with
// a .mps suffix, prefix<i>.mps (plan --write-model).
func writeJointModels(p solver.Problem, opts solver.Options, prefix string) error {
	mips, err := solver.JointMIPs(p, opts)
	if err != nil {
		return err
	}
	for i, m := range mips {
		var err error
		if base, ok := strings.CutSuffix(prefix, ".mps"); ok {
			err = writeMPSFile(m, fmt.Sprintf("%s%d.mps", base, i))
		} else {
			err = writeLPFile(fmt.Sprintf("%s%d.lp", strings.TrimSuffix(prefix, ".lp"), i), m)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// planMeta is what a written plan records of how it was made.
func planMeta(p solver.Problem, res *solver.Result, sources []*routing.Source) map[string]string {
	return map[string]string{
		"flow":      p.Flow.String(),
		"mode":      p.Mode.String(),
		"dispatch":  p.Dispatch.String(),
		"cluster":   fmt.Sprintf("%s (%d nodes × %d GPUs)", p.Cluster.Name, p.Cluster.Nodes, p.Cluster.GPUsPerNode),
		"model":     p.Model.Name,
		"objective": fmt.Sprintf("%.9g s", res.Objective),
		"status":    res.Status.String(),
		"traces":    sourceList(sources),
	}
}

// planOutputs are the files plan writes: the placement, and with
// --dispatch-map and --write-topology the dispatch tables and the rank
// cost matrix.
type planOutputs struct {
	out         string
	format      placement.Format
	dispatchMap string
	topology    string
}

// writePlanOutputs writes plan's files, each atomically, checking all of
// them before writing any.
func (c *common) writePlanOutputs(stdout, stderr io.Writer, p solver.Problem, plan *placement.Plan, o planOutputs) error {
	var err error
	var costs [][]float64
	if o.topology != "" {
		if costs, err = rankCosts(p.Cluster); err != nil {
			return err
		}
		if _, err := placement.EncodeRankCostMatrix(costs); err != nil {
			return err
		}
	}
	var dm *placement.DispatchMap
	if o.dispatchMap != "" {
		// Check before writing anything: both files or neither.
		if dm, err = placement.LocalDispatchMap(plan, p.Cluster.GPUsPerNode); err != nil {
			return err
		}
	}
	if err := placement.WriteFileWith(o.out, plan, o.format, c.layout); err != nil {
		return c.layoutError(err, o.out, p.Cluster)
	}
	if dm != nil {
		if err := placement.WriteDispatchMap(o.dispatchMap, plan, p.Cluster.GPUsPerNode); err != nil {
			return err
		}
	}
	if costs != nil {
		if err := placement.WriteRankCostMatrix(o.topology, costs); err != nil {
			return err
		}
		if !c.quiet {
			fmt.Fprintf(stdout, "wrote %s: rank_cost_matrix of %d EP ranks, picoseconds per byte (%s); for SGLang's --eplb-algorithm topology_aware --eplb-topology %s\n", o.topology, len(costs), topologyWords(p.Cluster, costs), o.topology)
		}
		if len(plan.Layers) > 0 && plan.Slots(0) != plan.Experts && !c.quiet {
			fmt.Fprintf(stderr, "moetuner: note: SGLang's topology_aware EPLB places no redundant experts (--ep-num-redundant-experts 0); this plan has %d slots for %d experts\n", plan.Slots(0), plan.Experts)
		}
	}
	return nil
}

func writeLPFile(path string, m *mip.Model) error {
	var buf bytes.Buffer
	if err := m.WriteLP(&buf); err != nil {
		return err
	}
	return placement.WriteFileAtomic(path, buf.Bytes())
}

func sourceList(sources []*routing.Source) string {
	var s []string
	for _, src := range sources {
		s = append(s, filepath.ToSlash(src.Path))
	}
	return strings.Join(s, ",")
}

// formatForName is the format to write to out, so that the stack that
// loads the file by its name reads what it expects. SGLang's
// compute_initial_expert_location_metadata (python/sglang/srt/eplb/
// expert_location.py@01fec5c) reads --init-expert-location with
// torch.load(weights_only=True) when the name ends in ".pt", with
// json.loads when it ends in ".json", and parses any other value as inline
// JSON: --format sglang into a .pt name is written as the .pt (note says
// so), and a name SGLang would misread is refused.
func formatForName(pf placement.Format, out string) (placement.Format, string, error) {
	pt := strings.HasSuffix(out, ".pt")
	switch {
	case pf == placement.FormatSGLang && pt:
		return placement.FormatSGLangPT, fmt.Sprintf("writing %s as a torch.save .pt (sglang-pt): SGLang loads a --init-expert-location ending in .pt with torch.load", out), nil
	case pf == placement.FormatSGLang && !strings.HasSuffix(out, ".json"):
		return "", "", usagef("--out %s: SGLang reads --init-expert-location as a file only when its name ends in .json or .pt (any other value is parsed as inline JSON); name it PLAN.sglang.json or PLAN.pt", out)
	case pf == placement.FormatSGLangPT && !pt:
		return "", "", usagef("--out %s with --format sglang-pt: SGLang loads --init-expert-location with torch.load only when the name ends in .pt; name it PLAN.pt, or use --format sglang for JSON", out)
	case pf != placement.FormatSGLangPT && pt:
		return "", "", usagef("--out %s: --format %s is text, but a name ending in .pt is loaded with torch.load; use --format sglang-pt (SGLang's .pt) or a name that matches the format", out, pf)
	}
	return pf, "", nil
}

// formatNames lists the values of plan's --format ("" takes the format
// from --out; "json" is moetuner JSON).
func formatNames() []string {
	out := []string{"", "json"}
	for _, f := range placement.Formats {
		out = append(out, string(f))
	}
	return out
}

// strategyNames lists the values of --strategy.
func strategyNames() []string {
	var out []string
	for _, st := range solver.Strategies {
		out = append(out, string(st))
	}
	for _, st := range peerStrategies {
		out = append(out, string(st))
	}
	return append(out, "roundrobin")
}
