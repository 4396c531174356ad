package main

import (
	"fmt"
	"io"
	"os"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// servingPlan is a placement that was serving while the trace was
// recorded: TensorRT-LLM's load balancer records physical slot ids, which
// only that placement maps back to logical experts.
type servingPlan struct {
	path string // the file
	flag string // the flag that named it ("--from", "--plan")
	// replicatedOnly passes the placement only when it has more slots
	// than experts, the one case where slot counts cannot be logical
	// counts (eval's --plan is the plan to score, not necessarily the one
	// that was serving).
	replicatedOnly bool
}

// slotExperts reads the serving placement for routing.LoadOptions.SlotExperts:
// its slots rank-major, as TensorRT-LLM numbers them. A placement that
// does not read without the trace (a file indexed by decoder layer, say)
// gives nil and the error, which matters only if the trace turns out to
// count slots; the command reads the file again once the trace is known.
func (sp servingPlan) slotExperts(gpus, experts int) ([][]routing.Expert, error) {
	if sp.path == "" {
		return nil, nil
	}
	if rows, ok := trtllmSlots(sp.path); ok {
		if sp.replicatedOnly && !replicated(rows) {
			return nil, nil
		}
		return rows, nil
	}
	p, err := placement.ReadFileWith(sp.path, placement.Layout{GPUs: gpus, Experts: experts})
	if err != nil {
		return nil, err
	}
	out, err := rankMajorSlots(p)
	if err != nil {
		return nil, err
	}
	if sp.replicatedOnly && len(out[0]) == p.Experts {
		return nil, nil
	}
	return out, nil
}

// rankMajorSlots returns the logical expert of every slot of p, per layer,
// rank-major (slot s on GPU s/(P/GPUs)), as TensorRT-LLM numbers slots.
func rankMajorSlots(p *placement.Plan) ([][]routing.Expert, error) {
	m, err := p.EPLBMaps()
	if err != nil {
		return nil, err
	}
	out := make([][]routing.Expert, len(m.Phy2Log))
	for l, row := range m.Phy2Log {
		out[l] = make([]routing.Expert, len(row))
		for s, e := range row {
			out[l][s] = routing.Expert(e)
		}
	}
	return out, nil
}

// flagGPUs is the GPU count the cluster flags give before the trace is
// read (setup may still fit a small model's cluster to its experts).
func (c *common) flagGPUs() int {
	cluster, err := costmodel.LoadCluster(c.cluster)
	if err != nil {
		return 0
	}
	if c.nodes > 0 {
		cluster = cluster.WithNodes(c.nodes)
	}
	if c.gpusPerNode > 0 {
		cluster.GPUsPerNode = c.gpusPerNode
	}
	return cluster.GPUs()
}

// printSlotNotes says, for every trace whose slot counts were folded back
// to logical experts, which placement did it.
func printSlotNotes(w io.Writer, sources []*routing.Source, sp servingPlan, experts int) {
	if w == nil {
		return
	}
	for _, src := range sources {
		if src.Slots > 0 {
			fmt.Fprintf(w, "moetuner: note: %s counts %d physical slots per layer (TensorRT-LLM's load balancer records slot ids): folded back to %d logical experts through %s %s\n", src.Path, src.Slots, experts, sp.flag, sp.path)
		}
	}
}

// deploymentOf returns the deployment the traces record (vLLM's
// eplb_load_meta), nil when none does; traces that record different ones
// are an error.
func deploymentOf(sources []*routing.Source) (*routing.Deployment, error) {
	var d *routing.Deployment
	for _, src := range sources {
		o := src.Deployment
		if o == nil {
			continue
		}
		if d != nil && (o.Ranks != d.Ranks || o.Nodes != d.Nodes || o.Groups != d.Groups || o.RedundantExperts != d.RedundantExperts) {
			return nil, fmt.Errorf("--trace %s records %d ranks on %d nodes, %d expert groups, %d redundant experts, but --trace %s records %d on %d, %d, %d (eplb_load_meta): add up traces of one deployment", o.File, o.Ranks, o.Nodes, o.Groups, o.RedundantExperts, d.File, d.Ranks, d.Nodes, d.Groups, d.RedundantExperts)
		}
		if d == nil {
			d = o
		}
	}
	return d, nil
}

// applyDeployment plans for the deployment a trace records (vLLM #41141's
// eplb_load_meta: num_ranks on num_nodes, num_groups, num_redundant_experts):
// it sets the cluster's shape (the --cluster preset keeps its links and
// GPUs), the expert groups and, for the commands that solve, the redundant
// slots. A flag given with another value is an error naming the flag and
// the file.
func (c *common) applyDeployment(cluster *costmodel.Cluster, d *routing.Deployment) error {
	where := fmt.Sprintf("--trace %s (line %d, vLLM's eplb_load_meta)", d.File, d.Line)
	perNode := d.Ranks / d.Nodes
	switch {
	case c.nodes > 0 && c.nodes != d.Nodes:
		return fmt.Errorf("--nodes %d, but %s records num_nodes %d: drop --nodes, or give a trace recorded on %d nodes", c.nodes, where, d.Nodes, c.nodes)
	case c.gpusPerNode > 0 && c.gpusPerNode != perNode:
		return fmt.Errorf("--gpus-per-node %d, but %s records num_ranks %d on num_nodes %d (%d per node): drop --gpus-per-node, or give a trace recorded on that deployment", c.gpusPerNode, where, d.Ranks, d.Nodes, perNode)
	case c.given("cluster") && c.nodes == 0 && c.gpusPerNode == 0 && cluster.GPUs() != d.Ranks:
		return fmt.Errorf("--cluster %s has %d GPUs (%d nodes × %d), but %s records num_ranks %d on num_nodes %d: add --nodes %d --gpus-per-node %d, or give a trace recorded on that cluster", c.cluster, cluster.GPUs(), cluster.Nodes, cluster.GPUsPerNode, where, d.Ranks, d.Nodes, d.Nodes, perNode)
	case c.given("expert-groups") && c.groups != d.Groups && !(c.groups == 0 && d.Groups == 1):
		return fmt.Errorf("--expert-groups %d, but %s records num_groups %d: drop --expert-groups", c.groups, where, d.Groups)
	case c.solving && c.given("redundant-slots") && c.redundant != d.RedundantExperts:
		return fmt.Errorf("--redundant-slots %d, but %s records num_redundant_experts %d, which the server must keep (vLLM checks the count of a placement it loads): drop --redundant-slots", c.redundant, where, d.RedundantExperts)
	}
	if cluster.Nodes != d.Nodes {
		*cluster = cluster.WithNodes(d.Nodes)
	}
	if cluster.GPUsPerNode != perNode {
		cluster.GPUsPerNode = perNode
		cluster.Speed = nil
	}
	if d.Groups > 1 {
		c.groups = d.Groups
	}
	if c.solving && c.slotsPerGPU == "" {
		c.redundant = d.RedundantExperts
	}
	return nil
}

// trtllmSlots reads path as a TensorRT-LLM load-balancer YAML, in
// TensorRT-LLM's own slot order (two copies of an expert on one rank stay
// two slots, and no GPU count is needed); ok is false for other files.
func trtllmSlots(path string) ([][]routing.Expert, bool) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	_, rows, err := placement.ReadTRTLLMSlots(f)
	if err != nil {
		return nil, false
	}
	out := make([][]routing.Expert, len(rows))
	for l, row := range rows {
		out[l] = make([]routing.Expert, len(row))
		for s, e := range row {
			out[l][s] = routing.Expert(e)
		}
	}
	return out, true
}

// replicated reports whether some layer has more slots than distinct
// experts.
func replicated(rows [][]routing.Expert) bool {
	for _, row := range rows {
		seen := map[routing.Expert]bool{}
		for _, e := range row {
			if seen[e] {
				return true
			}
			seen[e] = true
		}
	}
	return false
}
