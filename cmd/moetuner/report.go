package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/report"
	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver"
)

func cmdReport(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("report", "report --trace T... --plan A.json [--plan B.json ...] [--replay R.json] [--backtest B.json] --out report.html [flags]", stderr)
	var c common
	c.register(fs, false)
	var plans multiFlag
	fs.Var(&plans, "plan", "placement file to show (repeatable; a plan whose strategy is contiguous, else the first, is the reference)")
	out := fs.String("out", "report.html", "HTML file to write (atomically; self-contained, loads nothing from the network)")
	replayJSON := fs.String("replay", "", "add the measurements of a 'moetuner replay --json' file")
	backtestJSON := fs.String("backtest", "", `add a backtest: JSON {"title", "unit", "windows": [names], "series": [{"name", "values": [one per window]}], "note"}`)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("report takes no positional arguments (got %q); use --trace and --plan", fs.Args())
	}
	if len(plans) == 0 {
		return usagef("report needs --plan FILE (one or more)")
	}
	pr, stdout, _ := c.startProgress(stdout, stderr)
	defer pr.close()
	p, sources, err := c.setup(false)
	if err != nil {
		return err
	}
	sc := p.Scenario()
	names := report.PlanNames(plans)
	var rps []report.Plan
	for k, path := range plans {
		plan, err := c.readPlan(path, p.Cluster)
		if err != nil {
			return err
		}
		if plan.GPUs != p.Cluster.GPUs() {
			return fmt.Errorf("%s: plan has %d GPUs but the cluster %d (%d nodes × %d); set --nodes/--gpus-per-node", path, plan.GPUs, p.Cluster.GPUs(), p.Cluster.Nodes, p.Cluster.GPUsPerNode)
		}
		rep, err := sc.Evaluate(plan)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		rps = append(rps, report.Plan{Name: names[k], Plan: plan, Report: rep, Status: "file", Gap: math.NaN()})
	}
	in := reportInput(p, sources, rps)
	if *replayJSON != "" {
		if in.Replay, err = readReplayJSON(*replayJSON); err != nil {
			return err
		}
	}
	if *backtestJSON != "" {
		if in.Backtest, err = readBacktestJSON(*backtestJSON); err != nil {
			return err
		}
	}
	if err := writeReport(*out, in); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s: %d plans, %d plots\n", *out, len(rps), report.Figures(in))
	return nil
}

// reportInput describes the problem p and its plans for report.Write.
func reportInput(p solver.Problem, sources []*routing.Source, plans []report.Plan) report.Input {
	var traces []string
	for _, s := range sources {
		traces = append(traces, filepath.ToSlash(s.Path))
	}
	desc := []string{
		fmt.Sprintf("trace %s: %d MoE layers × %d experts (top-%d), %.0f tokens", strings.Join(traces, ", "), p.Stats.Layers, p.Stats.Experts, p.Stats.TopK, p.Stats.Tokens),
		fmt.Sprintf("cluster %s: %d nodes × %d GPUs; model %s", p.Cluster.Name, p.Cluster.Nodes, p.Cluster.GPUsPerNode, p.Model.Name),
		fmt.Sprintf("flow %s, mode %s, dispatch %s; every number on this page is modeled by costmodel unless marked measured", p.Flow, p.Mode, p.Dispatch),
	}
	return report.Input{Title: "moetuner report", Description: desc, Cluster: p.Cluster, Plans: plans, Bound: math.NaN()}
}

func writeReport(path string, in report.Input) error {
	var buf bytes.Buffer
	if err := report.Write(&buf, in); err != nil {
		return err
	}
	return placement.WriteFileAtomic(path, buf.Bytes())
}

// maxJSONBytes caps the replay and backtest files report reads.
const maxJSONBytes = 256 << 20

func readJSONFile(path, flag string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	if st.Size() > maxJSONBytes {
		return nil, fmt.Errorf("--%s %s: %d bytes, more than the %d MiB a %s file may have", flag, path, st.Size(), maxJSONBytes>>20, flag)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	return data, nil
}

// readReplayJSON reads what 'moetuner replay --json' writes.
func readReplayJSON(path string) (*report.Replay, error) {
	data, err := readJSONFile(path, "replay")
	if err != nil {
		return nil, err
	}
	r, err := report.ReadReplay(data)
	if err != nil {
		return nil, fmt.Errorf("--replay %s: %w", path, err)
	}
	return r, nil
}

func readBacktestJSON(path string) (*report.Backtest, error) {
	data, err := readJSONFile(path, "backtest")
	if err != nil {
		return nil, err
	}
	b, err := report.ReadBacktest(data)
	if err != nil {
		return nil, fmt.Errorf("--backtest %s: %w", path, err)
	}
	return b, nil
}

// compareReport writes compare's results as a report: every strategy's
// plan, status and gap, priced against the best certified bound on the
// exact cost model when one exists (as the table's "exact" gap).
func compareReport(path string, p solver.Problem, sources []*routing.Source, results []*solver.Result) error {
	bound := math.NaN()
	var plans []report.Plan
	for _, r := range results {
		if !math.IsNaN(r.CostBound) && !(r.CostBound <= bound) {
			bound = r.CostBound
		}
		plans = append(plans, report.Plan{Name: string(r.Strategy), Plan: r.Plan, Report: r.Report, Status: r.Status.String(), Gap: r.Gap, SolveTime: r.SolveTime, Note: r.Note})
	}
	in := reportInput(p, sources, plans)
	in.Bound = bound
	return writeReport(path, in)
}
