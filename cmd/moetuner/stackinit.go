package main

import (
	"fmt"
	"io"
	"slices"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/solver"
)

// stackRunNote is the note of a compare row dealt as SGLang's
// init_by_eplb.
const stackRunNote = "dealt as SGLang's init_by_eplb: the stack runs this algorithm itself, so its log2phy rows (replica order) are the candidate lists and one random stream serves every rank"

// stackRunPlan builds st's plan as the stack computes it when it runs
// the algorithm itself, with the algorithm's log2phy (Plan.StackEPLB), for
// the algorithms SGLang ships: EPLB (global and hierarchical) and
// deepseek_vec. It returns nil for the others (FlashLB is not among
// SGLang's --eplb-algorithm choices in the tree we follow) and for
// dispatches that do not deal a table, which ignore the order.
func stackRunPlan(p solver.Problem, st solver.Strategy) (*placement.Plan, error) {
	if !p.Dispatch.Dealt() || p.SlotsPerGPU != nil {
		return nil, nil
	}
	g := p.Cluster.GPUs()
	groups := peerGroups(p)
	switch st {
	case solver.StrategyEPLB:
		return baseline.EPLB(p.Stats, g, baseline.EPLBOptions{RedundantSlots: p.RedundantSlots, Nodes: p.Cluster.Nodes, FixDuplicates: true, StackEPLB: true})
	case solver.StrategyEPLBHierarchical:
		if groups == 0 || groups%p.Cluster.Nodes != 0 {
			return nil, nil
		}
		return baseline.EPLB(p.Stats, g, baseline.EPLBOptions{RedundantSlots: p.RedundantSlots, Groups: groups, Nodes: p.Cluster.Nodes, FixDuplicates: true, StackEPLB: true})
	case stratDeepSeekVec:
		return baseline.DeepSeekVec(p.Stats, g, baseline.DeepSeekVecOptions{RedundantSlots: p.RedundantSlots, FixDuplicates: true, StackEPLB: true})
	case stratDeepSeekVecHier:
		if groups == 0 || groups%p.Cluster.Nodes != 0 {
			return nil, nil
		}
		return baseline.DeepSeekVec(p.Stats, g, baseline.DeepSeekVecOptions{RedundantSlots: p.RedundantSlots, Hierarchical: true, Groups: groups, Nodes: p.Cluster.Nodes, FixDuplicates: true, StackEPLB: true})
	}
	return nil, nil
}

// asStackRun rescores r, a compare row of one of the stack's own
// algorithms, as SGLang deals it when it runs that algorithm itself
// (init_by_eplb) under a dealt dispatch: the same slots, the algorithm's
// log2phy order as the candidate lists, one stream for every rank. Rows it
// does not apply to (other strategies, other dispatches, a plan that is
// not the algorithm's output slot for slot) come back as they are; plans
// moetuner writes stay init_by_mapping.
func asStackRun(p solver.Problem, r *solver.Result) (*solver.Result, error) {
	if r == nil || r.Plan == nil {
		return r, nil
	}
	plan, err := stackRunPlan(p, r.Strategy)
	if err != nil {
		return nil, fmt.Errorf("strategy %s as the stack runs it: %w", r.Strategy, err)
	}
	if plan == nil || !sameSlots(plan, r.Plan) {
		return r, nil
	}
	plan.Strategy, plan.Meta = r.Plan.Strategy, r.Plan.Meta
	rep, err := p.Scenario().Evaluate(plan)
	if err != nil {
		return nil, fmt.Errorf("strategy %s as the stack runs it: %w", r.Strategy, err)
	}
	q := *r
	q.Plan, q.Report, q.Objective = plan, rep, rep.TimeSec
	return &q, nil
}

// sglangInit names how SGLang's static table deals r's plan under p's
// dispatch: "init_by_eplb" for a row of the stack running its own
// algorithm (asStackRun), "init_by_mapping" for every other plan, "" when
// the dispatch deals no table.
func sglangInit(p solver.Problem, r *solver.Result) string {
	switch {
	case !p.Dispatch.Dealt():
		return ""
	case r.Plan != nil && r.Plan.StackEPLB != nil:
		return "init_by_eplb"
	}
	return "init_by_mapping"
}

// sameSlots reports whether a and b hold the same experts on the same
// GPUs slot for slot.
func sameSlots(a, b *placement.Plan) bool {
	if len(a.Layers) != len(b.Layers) {
		return false
	}
	for l := range a.Layers {
		if !slices.Equal(a.Layers[l].SlotExpert, b.Layers[l].SlotExpert) || !slices.Equal(a.Layers[l].SlotGPU, b.Layers[l].SlotGPU) {
			return false
		}
	}
	return true
}

// stackRunner returns what compare passes every strategy's result through:
// asStackRun on p, errors passed on.
func stackRunner(p solver.Problem) func(*solver.Result, error) (*solver.Result, error) {
	return func(r *solver.Result, err error) (*solver.Result, error) {
		if err != nil {
			return r, err
		}
		return asStackRun(p, r)
	}
}

// rowLabel is r's name in compare's table: the strategy, marked when it is
// what the stack runs by default and when SGLang's table deals it as
// init_by_eplb.
func rowLabel(p solver.Problem, r *solver.Result) string {
	name := string(r.Strategy)
	if r.Strategy == stackDefault(p) {
		name += " (stack default)"
	}
	if sglangInit(p, r) == "init_by_eplb" {
		name += " [init_by_eplb]"
	}
	return name
}

// stackFooter explains the marks rowLabel gives, once each.
func stackFooter(w io.Writer, p solver.Problem, results []*solver.Result) {
	for _, r := range results {
		if r.Strategy == stackDefault(p) {
			how := "--eplb-algorithm auto picks deepseek (global EPLB): the model has no expert groups, or they are not a multiple of the nodes"
			if r.Strategy == solver.StrategyEPLBHierarchical {
				how = fmt.Sprintf("--eplb-algorithm auto picks deepseek_hierarchical: the model's %d expert groups are a multiple of the %d nodes", p.Model.ExpertGroups, p.Cluster.Nodes)
			}
			fmt.Fprintf(w, "stack default: what SGLang and vLLM run with EPLB on unless told otherwise (SGLang %s);\n", how)
			break
		}
	}
	for _, r := range results {
		if sglangInit(p, r) == "init_by_eplb" {
			fmt.Fprintln(w, "[init_by_eplb]: "+stackRunNote+"; every other row is dealt as a map loaded from a file (init_by_mapping);")
			break
		}
	}
}
