package baseline

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

func checkShape(name string, layers, experts, gpus int) error {
	switch {
	case layers < 1:
		return fmt.Errorf("baseline: %s: layers is %d; need at least 1", name, layers)
	case experts < 1 || experts > placement.MaxExperts:
		return fmt.Errorf("baseline: %s: experts is %d; need [1,%d]", name, experts, placement.MaxExperts)
	case gpus < 1 || gpus > placement.MaxGPUs:
		return fmt.Errorf("baseline: %s: gpus is %d; need [1,%d]", name, gpus, placement.MaxGPUs)
	}
	return nil
}

func sameEveryLayer(layers int, row []placement.GPU) [][]placement.GPU {
	assign := make([][]placement.GPU, layers)
	for l := range assign {
		assign[l] = slices.Clone(row)
	}
	return assign
}

// Contiguous returns Megatron's default layout: expert e on GPU
// e/(experts/gpus) in every layer, so slot s is expert s. It fails unless
// gpus divides experts.
func Contiguous(layers, experts, gpus int) (*placement.Plan, error) {
	if err := checkShape("contiguous", layers, experts, gpus); err != nil {
		return nil, err
	}
	if experts%gpus != 0 {
		return nil, fmt.Errorf("baseline: contiguous: %d experts do not divide evenly over %d GPUs; use RoundRobin or a GPU count that divides %d", experts, gpus, experts)
	}
	per := experts / gpus
	row := make([]placement.GPU, experts)
	for e := range row {
		row[e] = placement.GPU(e / per)
	}
	return placement.FromAssignment(gpus, sameEveryLayer(layers, row), "contiguous"), nil
}

// RoundRobin places expert e on GPU e%gpus in every layer. Slots are laid
// out GPU-major (see placement.FromAssignment). Any positive sizes work; GPUs beyond
// the expert count stay empty.
func RoundRobin(layers, experts, gpus int) (*placement.Plan, error) {
	if err := checkShape("round-robin", layers, experts, gpus); err != nil {
		return nil, err
	}
	row := make([]placement.GPU, experts)
	for e := range row {
		row[e] = placement.GPU(e % gpus)
	}
	return placement.FromAssignment(gpus, sameEveryLayer(layers, row), "round-robin"), nil
}

// GreedyOptions are the optional settings of Greedy; the zero value gives
// every GPU experts/gpus slots and the same speed.
type GreedyOptions struct {
	// SlotsPerGPU is the number of experts each GPU may hold per layer (len
	// gpus, sum at least the expert count). Nil gives experts/gpus each and
	// requires gpus to divide experts.
	SlotsPerGPU []int
	// Speed is the relative compute speed of every GPU (len gpus, each > 0);
	// a GPU's load is its token count divided by its speed. Nil means all 1.
	Speed []float64
}

// Greedy places every layer by longest-processing-time first: experts in
// order of descending stats.Load (ties: lower id), each on the GPU with the
// least load so far (token load divided by Speed; ties: lower GPU index)
// among those with a free slot. The result depends only on its inputs. It
// fails on malformed stats (nil, Load not Layers×Experts, negative or
// non-finite loads) or options.
func Greedy(stats *routing.Stats, gpus int, opts GreedyOptions) (*placement.Plan, error) {
	if stats == nil {
		return nil, fmt.Errorf("baseline: greedy: nil stats")
	}
	layers, experts := stats.Layers, stats.Experts
	if err := checkShape("greedy", layers, experts, gpus); err != nil {
		return nil, err
	}
	if len(stats.Load) != layers {
		return nil, fmt.Errorf("baseline: greedy: stats.Load has %d layers, stats.Layers is %d", len(stats.Load), layers)
	}
	for l, row := range stats.Load {
		if len(row) != experts {
			return nil, fmt.Errorf("baseline: greedy: stats.Load[%d] has %d experts, stats.Experts is %d", l, len(row), experts)
		}
		for e, x := range row {
			if x < 0 || math.IsNaN(x) || math.IsInf(x, 0) {
				return nil, fmt.Errorf("baseline: greedy: stats.Load[%d][%d] is %v; loads must be finite and non-negative", l, e, x)
			}
		}
	}
	slots := opts.SlotsPerGPU
	if slots == nil {
		if experts%gpus != 0 {
			return nil, fmt.Errorf("baseline: greedy: %d experts do not divide evenly over %d GPUs; set GreedyOptions.SlotsPerGPU or use a GPU count that divides %d", experts, gpus, experts)
		}
		slots = make([]int, gpus)
		for g := range slots {
			slots[g] = experts / gpus
		}
	}
	if len(slots) != gpus {
		return nil, fmt.Errorf("baseline: greedy: GreedyOptions.SlotsPerGPU has %d entries for %d GPUs", len(slots), gpus)
	}
	capacity := 0
	for g, c := range slots {
		if c < 0 {
			return nil, fmt.Errorf("baseline: greedy: GreedyOptions.SlotsPerGPU[%d] is %d; slots must be non-negative", g, c)
		}
		capacity += c
	}
	if capacity < experts {
		return nil, fmt.Errorf("baseline: greedy: GreedyOptions.SlotsPerGPU holds %d slots for %d experts; add slots", capacity, experts)
	}
	speed := opts.Speed
	if speed != nil && len(speed) != gpus {
		return nil, fmt.Errorf("baseline: greedy: GreedyOptions.Speed has %d entries for %d GPUs", len(speed), gpus)
	}
	for g, s := range speed {
		if !(s > 0) || math.IsInf(s, 0) {
			return nil, fmt.Errorf("baseline: greedy: GreedyOptions.Speed[%d] is %v; speeds must be positive and finite", g, s)
		}
	}

	assign := make([][]placement.GPU, layers)
	order := make([]int, experts)
	tokens := make([]float64, gpus)
	used := make([]int, gpus)
	for l, load := range stats.Load {
		for e := range order {
			order[e] = e
		}
		slices.SortStableFunc(order, func(a, b int) int {
			if c := cmp.Compare(load[b], load[a]); c != 0 {
				return c
			}
			return cmp.Compare(a, b)
		})
		clear(tokens)
		clear(used)
		row := make([]placement.GPU, experts)
		for _, e := range order {
			best, bestLoad := -1, 0.0
			for g := range gpus {
				if used[g] >= slots[g] {
					continue
				}
				x := tokens[g]
				if speed != nil {
					x /= speed[g]
				}
				if best < 0 || x < bestLoad {
					best, bestLoad = g, x
				}
			}
			row[e] = placement.GPU(best)
			tokens[best] += load[e]
			used[best]++
		}
		assign[l] = row
	}
	return placement.FromAssignment(gpus, assign, "greedy"), nil
}
