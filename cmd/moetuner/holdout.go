package main

import (
	"fmt"
	"io"
	"math"
	"text/tabwriter"

	"github.com/moetuner/moetuner/routing"
	"github.com/moetuner/moetuner/solver"
)

// holdoutSplit cuts the one per-token trace of sources into the tokens the
// plans are made on and the last frac of them, which they are scored on
// as well: what a deployment lives with is traffic its plan has not seen.
// With step ids the cut falls between steps (the first step boundary at or
// after the token the fraction names). It returns the statistics of both
// parts and the token the held-out part starts at.
func holdoutSplit(sources []*routing.Source, frac float64, opts routing.StatsOptions) (train, test *routing.Stats, cut int, err error) {
	if len(sources) != 1 || sources[0].Trace == nil {
		return nil, nil, 0, fmt.Errorf("--holdout %v needs one per-token --trace (npy, jsonl, SGLang per_token, …) to cut in time; got %d traces, per-token: %v", frac, len(sources), len(sources) == 1 && sources[0].Trace != nil)
	}
	tr := sources[0].Trace
	cut = int(math.Round((1 - frac) * float64(tr.Tokens)))
	if tr.Step != nil {
		for cut > 0 && cut < tr.Tokens && tr.Step[cut] == tr.Step[cut-1] {
			cut++
		}
	}
	if cut <= 0 || cut >= tr.Tokens {
		return nil, nil, 0, fmt.Errorf("--holdout %v leaves no tokens on one side of the cut (%d tokens%s); pick a fraction in (0, 1) that cuts between steps", frac, tr.Tokens, map[bool]string{true: " in whole steps", false: ""}[tr.Step != nil])
	}
	train = tr.Slice(0, cut).Stats(opts)
	test = tr.Slice(cut, tr.Tokens).Stats(opts)
	return train, test, cut, nil
}

// printHeldOut scores every result's plan on the held-out statistics and
// prints it beside the in-sample numbers.
func printHeldOut(w io.Writer, p solver.Problem, test *routing.Stats, from, tokens int, results []*solver.Result) error {
	fmt.Fprintf(w, "\nheld out: planned on tokens 0–%d, scored on %d–%d (%s dispatch):\n", from-1, from, tokens-1, p.Dispatch)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\tmax/mean\tworst\theld-out max/mean\tworst\tremote/token\tlayer time\t")
	sc := p.Scenario()
	sc.Stats = test
	for _, r := range results {
		if r == nil || r.Plan == nil || r.Report == nil {
			continue
		}
		rep, err := sc.Evaluate(r.Plan)
		if err != nil {
			return fmt.Errorf("held-out score of %s: %w", string(r.Strategy), err)
		}
		remote := math.NaN()
		if rep.Tokens > 0 {
			remote = rep.RemoteCopies / (rep.Tokens * float64(len(rep.Layers)))
		}
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%.3f\t%.3f\t%.4f\t%s\t\n", rowLabel(p, r), r.Report.MeanBalance, r.Report.MaxBalance, rep.MeanBalance, rep.MaxBalance, remote, dur(rep.Time))
	}
	return tw.Flush()
}

// heldOut is what setup keeps back with --holdout: the held-out part's
// statistics and where it starts.
type heldOut struct {
	stats       *routing.Stats
	cut, tokens int
}
