// Package report renders what moetuner knows about a set of placements as
// one self-contained HTML page: the modeled comparison table and plots
// (per-layer × per-GPU load heatmaps, busiest/mean per layer, GPU×GPU and
// node×node dispatch traffic, cross-node bytes per layer, the gap to a
// lower bound), and, when given, replay measurements with their confidence
// intervals and a backtest. Plots are drawn with gonum.org/v1/plot and
// embedded as base64 PNG; the page loads nothing from the network (no
// fonts, styles or scripts from elsewhere; the only script is inline and
// records, for tests, how many plots the browser decoded and where).
//
// Write takes an Input the caller fills: the cost reports come from
// costmodel (Scenario.Evaluate), bounds and gaps from whatever solved the
// plans (report does not import the solver), measurements from replay.
//
// # Figures
//
// Per plan (Input.Plans, in order): the load heatmap, z[l][g] =
// Report.Layers[l].Tokens[g] / MeanTokens on one color scale 1 ± d for all
// plans (d the largest deviation from 1 over them); the GPU × GPU dispatch
// matrix, Σ_l Report.Layers[l].Dispatch[src][dst] in MB, row 0 on top; with
// several nodes the node × node matrix, the same bytes summed over the
// nodes' GPUs (off the diagonal: the NIC bytes, one copy per destination
// node, as costmodel counts them). For all plans: Imbalance per layer; with
// several nodes CrossNodeBytes per layer; the gap per plan, TimeSec/Bound −
// 1 when Input.Bound is set, else Plan.Gap where it is not NaN. Figures
// returns how many there are; the page records it in <body data-plots>.
package report
