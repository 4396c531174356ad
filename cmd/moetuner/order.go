package main

import (
	"fmt"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// keepTrace reports whether setup must read the per-token traces whole:
// replay measures them, --holdout cuts them, and vLLM's dispatch counts
// each token's row in its rank's batch from them.
func (c *common) keepTrace() bool {
	return c.needTrace || c.holdout > 0 || c.dispatch == placement.DispatchVLLM.String()
}

// cutAndOrder applies --holdout to stats (read from sources with lo) and,
// for --dispatch vllm, attaches the token order of the one per-token
// trace (routing.Trace.TokenOrder, cut into passes of --pass-tokens) to
// the statistics planned and scored on; it returns the statistics to plan
// on. Where no order can be had, dispatchNotes says why.
func (c *common) cutAndOrder(sources []*routing.Source, stats *routing.Stats, lo routing.LoadOptions) (*routing.Stats, error) {
	if c.passTokens < 0 {
		return nil, usagef("--pass-tokens %d: want the tokens each rank runs per forward pass, or 0 (a step, or all of a rank's tokens, is one pass)", c.passTokens)
	}
	if c.holdout > 0 {
		train, test, cut, err := holdoutSplit(sources, c.holdout, routing.StatsOptions{Transitions: lo.Transitions, PathError: lo.PathError})
		if err != nil {
			return nil, err
		}
		c.held = &heldOut{stats: test, cut: cut, tokens: sources[0].Trace.Tokens}
		sources[0].Stats, stats = train, train
	}
	if c.dispatch != placement.DispatchVLLM.String() {
		return stats, nil
	}
	if len(sources) != 1 || sources[0].Trace == nil {
		c.orderErr = fmt.Errorf("it needs one per-token trace to read each token's row from, not %d traces (per-token: %v)", len(sources), len(sources) == 1 && sources[0].Trace != nil)
		return stats, nil
	}
	tr := sources[0].Trace
	if c.held != nil {
		o, err := tr.Slice(c.held.cut, tr.Tokens).TokenOrder(c.passTokens)
		if err != nil {
			c.orderErr = err
			return stats, nil
		}
		c.held.stats.Order = o
		tr = tr.Slice(0, c.held.cut)
	}
	stats.Order, c.orderErr = tr.TokenOrder(c.passTokens)
	return stats, nil
}

// dispatchNotes are the notes on how dispatch d is modeled on stats for G
// GPUs in flow: per-source dispatches without source ranks, and whether
// vLLM's hash is counted token by token or taken by its expectation.
func (c *common) dispatchNotes(d placement.Dispatch, stats *routing.Stats, G int, flow costmodel.Flow) []string {
	if d.PerSource() && !stats.HasSources() {
		return []string{fmt.Sprintf("%s dispatch splits each rank's tokens by where they come from, but the trace has no source ranks: every rank is taken to send an equal share of each expert's tokens", d)}
	}
	if d != placement.DispatchVLLM {
		return nil
	}
	why := c.orderErr
	switch {
	case why != nil:
	case flow != costmodel.FlowHome:
		return []string{"vllm dispatch: in chain flow a token has no single source rank, so each copy takes its even share (the hash's expectation)"}
	default:
		why = costmodel.HashOrder(stats, G)
	}
	if why != nil {
		return []string{fmt.Sprintf("vllm dispatch: each copy takes its even share, the hash's expectation, not the hash token by token: %v", why)}
	}
	rows := "each rank's tokens in the trace are one forward pass (--pass-tokens cuts them)"
	switch {
	case stats.Order.PassTokens > 0:
		rows = fmt.Sprintf("forward passes of %d tokens per rank (--pass-tokens)", stats.Order.PassTokens)
	case stats.Order.Steps:
		rows = "a step of the trace is one forward pass"
	}
	return []string{fmt.Sprintf("vllm dispatch: every token's copy counted by vLLM's hash of its row in its rank's batch; %s", rows)}
}
