package replay

import (
	"context"
	"errors"
	"time"
)

// RunInterleaved replays several workloads (typically one per plan) in
// rounds: round r runs every workload once, in order, then the next round
// begins. Each GPUTime entry is then the median over the rounds, so slow
// phases of the machine hit every plan alike. rounds ≤ 1 runs each workload
// once. The measurements are returned in the order of ws.
func RunInterleaved(ctx context.Context, b Backend, ws []*Workload, rounds int, opts RunOptions) ([]*Measurement, error) {
	if len(ws) == 0 {
		return nil, errors.New("replay: no workloads")
	}
	rounds = max(rounds, 1)
	runs := make([][]*Measurement, len(ws))
	for range rounds {
		for j, w := range ws {
			m, err := b.Run(ctx, w, opts)
			if err != nil {
				return nil, err
			}
			runs[j] = append(runs[j], m)
		}
	}
	out := make([]*Measurement, len(ws))
	for j, rs := range runs {
		m := rs[0]
		if len(rs) > 1 {
			vals := make([]time.Duration, len(rs))
			for i := range m.GPUTime {
				for l := range m.GPUTime[i] {
					for g := range m.GPUTime[i][l] {
						for r, x := range rs {
							vals[r] = x.GPUTime[i][l][g]
						}
						m.GPUTime[i][l][g] = median(vals)
					}
				}
			}
			m.finish(opts)
		}
		out[j] = m
	}
	return out, nil
}
