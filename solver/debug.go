package solver

import (
	"github.com/moetuner/moetuner/mip"
	"github.com/moetuner/moetuner/solver/internal/jointilp"
)

// JointMIPs builds the joint strategy's ILP(s) for p without solving them:
// one per layer in the home flow, one for all layers in the chain flow. It
// is meant for debugging (write them with mip.Model.WriteLP).
func JointMIPs(p Problem, opts Options) ([]*mip.Model, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	jm, err := jointilp.New(p.Scenario(), opts.MaxPairs)
	if err != nil {
		return nil, public(err)
	}
	return jm.MIPs(), nil
}
