package main

import (
	"fmt"
	"io"

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
// gives nil, and the command reads it again once the trace is known.
func (sp servingPlan) slotExperts(gpus, experts int) [][]routing.Expert {
	if sp.path == "" {
		return nil
	}
	p, err := placement.ReadFileWith(sp.path, placement.Layout{GPUs: gpus, Experts: experts})
	if err != nil {
		return nil
	}
	out, err := rankMajorSlots(p)
	if err != nil || (sp.replicatedOnly && len(out[0]) == p.Experts) {
		return nil
	}
	return out
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
