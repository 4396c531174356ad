package main

import (
	"fmt"
	"strings"

	"github.com/moetuner/moetuner/costmodel"
)

// rankCosts is the cost of sending one byte from EP rank i to EP rank j
// on the cluster, in picoseconds, for SGLang's topology-aware EPLB
// (--eplb-topology, PR #37923): 0 to itself, the one-way NVLink time
// (half of NVLinkGBps, the bidirectional figure) to a GPU of its node, the
// NIC time (NICGbps per direction) to a GPU of another node, the slowest
// link of that path (DeepEP forwards over NVLink after the NIC, pipelined).
// EP rank g is GPU g on node g/GPUsPerNode, as moetuner numbers GPUs.
// SGLang uses only the ratios; picoseconds keep the numbers readable.
func rankCosts(c costmodel.Cluster) ([][]float64, error) {
	const psPerSecond = 1e12
	if !(c.NVLinkGBps > 0) && c.GPUsPerNode > 1 {
		return nil, fmt.Errorf("--write-topology: cluster %q has no NVLink bandwidth (nvlink_gbps); set it in the --cluster YAML", c.Name)
	}
	if !(c.NICGbps > 0) && c.Nodes > 1 {
		return nil, fmt.Errorf("--write-topology: cluster %q has no NIC bandwidth (nic_gbps) for its %d nodes; set it in the --cluster YAML", c.Name, c.Nodes)
	}
	nvlink := psPerSecond / (c.NVLinkGBps / 2 * 1e9)
	nic := psPerSecond / (c.NICGbps / 8 * 1e9)
	G := c.GPUs()
	cost := make([][]float64, G)
	for i := range G {
		cost[i] = make([]float64, G)
		for j := range G {
			switch {
			case i == j:
			case i/c.GPUsPerNode == j/c.GPUsPerNode:
				cost[i][j] = nvlink
			default:
				cost[i][j] = nic
			}
		}
	}
	return cost, nil
}

// topologyWords says what the matrix holds, for the "wrote" line.
func topologyWords(c costmodel.Cluster, cost [][]float64) string {
	var parts []string
	if c.GPUsPerNode > 1 {
		parts = append(parts, fmt.Sprintf("%.4g within a node", cost[0][1]))
	}
	if c.Nodes > 1 {
		parts = append(parts, fmt.Sprintf("%.4g across nodes", cost[0][c.GPUsPerNode]))
	}
	if parts == nil {
		return "one rank"
	}
	return strings.Join(parts, ", ")
}
