package baseline

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

func TestContiguousRoundRobin(t *testing.T) {
	cases := []struct {
		name           string
		build          func(l, e, g int) (*placement.Plan, error)
		layers, e, g   int
		wantAssign     []placement.GPU
		wantSlotExpert []routing.Expert
		wantErr        string
	}{
		{name: "contiguous 8/4", build: Contiguous, layers: 2, e: 8, g: 4,
			wantAssign: gp(0, 0, 1, 1, 2, 2, 3, 3), wantSlotExpert: ex(0, 1, 2, 3, 4, 5, 6, 7)},
		{name: "contiguous 4/1", build: Contiguous, layers: 1, e: 4, g: 1,
			wantAssign: gp(0, 0, 0, 0), wantSlotExpert: ex(0, 1, 2, 3)},
		{name: "contiguous 4/4", build: Contiguous, layers: 1, e: 4, g: 4,
			wantAssign: gp(0, 1, 2, 3), wantSlotExpert: ex(0, 1, 2, 3)},
		{name: "contiguous uneven", build: Contiguous, layers: 1, e: 10, g: 4,
			wantErr: "contiguous: 10 experts do not divide evenly over 4 GPUs; use RoundRobin"},
		{name: "contiguous zero layers", build: Contiguous, layers: 0, e: 4, g: 2, wantErr: "layers is 0"},
		{name: "round-robin 8/4", build: RoundRobin, layers: 3, e: 8, g: 4,
			wantAssign: gp(0, 1, 2, 3, 0, 1, 2, 3), wantSlotExpert: ex(0, 4, 1, 5, 2, 6, 3, 7)},
		{name: "round-robin uneven", build: RoundRobin, layers: 1, e: 5, g: 2,
			wantAssign: gp(0, 1, 0, 1, 0), wantSlotExpert: ex(0, 2, 4, 1, 3)},
		{name: "round-robin more gpus", build: RoundRobin, layers: 1, e: 2, g: 3,
			wantAssign: gp(0, 1), wantSlotExpert: ex(0, 1)},
		{name: "round-robin zero gpus", build: RoundRobin, layers: 1, e: 2, g: 0, wantErr: "gpus is 0"},
		{name: "round-robin zero experts", build: RoundRobin, layers: 1, e: 0, g: 2, wantErr: "experts is 0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := tc.build(tc.layers, tc.e, tc.g)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.NoError(t, p.Validate(placement.ValidateOptions{Layers: tc.layers, Experts: tc.e}))
			require.Len(t, p.Layers, tc.layers)
			assert.True(t, p.IsGPUMajor())
			for l := range p.Layers {
				assert.Equal(t, tc.wantAssign, p.Assignment(l))
				assert.Equal(t, tc.wantSlotExpert, p.Layers[l].SlotExpert)
			}
		})
	}
}

func statsOf(load ...[]float64) *routing.Stats {
	return &routing.Stats{Layers: len(load), Experts: len(load[0]), Load: load}
}

func TestGreedyHand(t *testing.T) {
	cases := []struct {
		name    string
		load    []float64
		gpus    int
		opts    GreedyOptions
		want    []placement.GPU
		wantErr string
	}{
		{name: "lpt", load: []float64{10, 7, 1, 3}, gpus: 2, want: gp(0, 1, 0, 1)},
		// order 0,1,3,2: 0→g0, 1→g1, 3→g1 (7<10), 2→g0 (g1 full).
		{name: "ties by id then gpu", load: []float64{5, 5, 5, 5}, gpus: 2, want: gp(0, 1, 0, 1)},
		// Zero loads tie on every GPU, so the lowest GPU fills first.
		{name: "zero loads", load: []float64{0, 0, 0, 0}, gpus: 2, want: gp(0, 0, 1, 1)},
		{name: "one gpu", load: []float64{3, 1, 2}, gpus: 1, want: gp(0, 0, 0)},
		{name: "speed", load: []float64{6, 6, 6, 6}, gpus: 2,
			opts: GreedyOptions{SlotsPerGPU: []int{3, 3}, Speed: []float64{1, 3}}, want: gp(0, 1, 1, 1)},
		{name: "uneven slots", load: []float64{4, 3, 2, 1}, gpus: 2,
			opts: GreedyOptions{SlotsPerGPU: []int{1, 3}}, want: gp(0, 1, 1, 1)},
		{name: "slots for non-dividing", load: []float64{9, 8, 7, 6, 5}, gpus: 2,
			opts: GreedyOptions{SlotsPerGPU: []int{3, 3}}, want: gp(0, 1, 1, 0, 0)},
		// 0→g0(9), 1→g1(8), 2→g1(15), 3→g0(15), 4: tie 15/15 → g0.
		{name: "zero-slot gpu", load: []float64{1, 2}, gpus: 3,
			opts: GreedyOptions{SlotsPerGPU: []int{0, 1, 1}}, want: gp(2, 1)},
		{name: "non-dividing without slots", load: []float64{1, 2, 3}, gpus: 2, wantErr: "3 experts do not divide evenly over 2 GPUs; set GreedyOptions.SlotsPerGPU"},
		{name: "too few slots", load: []float64{1, 2, 3}, gpus: 2, opts: GreedyOptions{SlotsPerGPU: []int{1, 1}}, wantErr: "holds 2 slots for 3 experts"},
		{name: "slots length", load: []float64{1, 2}, gpus: 2, opts: GreedyOptions{SlotsPerGPU: []int{2}}, wantErr: "SlotsPerGPU has 1 entries for 2 GPUs"},
		{name: "negative slots", load: []float64{1, 2}, gpus: 2, opts: GreedyOptions{SlotsPerGPU: []int{-1, 3}}, wantErr: "SlotsPerGPU[0] is -1"},
		{name: "speed length", load: []float64{1, 2}, gpus: 2, opts: GreedyOptions{Speed: []float64{1}}, wantErr: "Speed has 1 entries"},
		{name: "zero speed", load: []float64{1, 2}, gpus: 2, opts: GreedyOptions{Speed: []float64{1, 0}}, wantErr: "Speed[1] is 0"},
		{name: "negative load", load: []float64{1, -2}, gpus: 2, wantErr: "Load[0][1] is -2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Greedy(statsOf(tc.load), tc.gpus, tc.opts)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.NoError(t, p.Validate(placement.ValidateOptions{SlotsPerGPU: tc.opts.SlotsPerGPU}))
			assert.Equal(t, tc.want, p.Assignment(0))
			assert.Equal(t, "greedy", p.Strategy)
			assert.True(t, p.IsGPUMajor())
		})
	}
}

func TestGreedyBadStats(t *testing.T) {
	_, err := Greedy(nil, 2, GreedyOptions{})
	assert.ErrorContains(t, err, "nil stats")
	s := statsOf([]float64{1, 2})
	s.Layers = 2
	_, err = Greedy(s, 2, GreedyOptions{})
	assert.ErrorContains(t, err, "stats.Load has 1 layers")
	s = statsOf([]float64{1, 2}, []float64{1})
	_, err = Greedy(s, 2, GreedyOptions{})
	assert.ErrorContains(t, err, "stats.Load[1] has 1 experts")
}

// lptReference is an independent, deliberately naive LPT: repeatedly take
// the heaviest unplaced expert (lowest id on ties) and put it on the
// least-loaded GPU with room (lowest index on ties).
func lptReference(load []float64, slots []int, speed []float64) []placement.GPU {
	e := len(load)
	out := make([]placement.GPU, e)
	placed := make([]bool, e)
	sum := make([]float64, len(slots))
	used := make([]int, len(slots))
	for range e {
		pick := -1
		for i := range e {
			if !placed[i] && (pick < 0 || load[i] > load[pick]) {
				pick = i
			}
		}
		best := -1
		for g := range slots {
			if used[g] == slots[g] {
				continue
			}
			if best < 0 || sum[g]/speed[g] < sum[best]/speed[best] {
				best = g
			}
		}
		placed[pick] = true
		out[pick] = placement.GPU(best)
		sum[best] += load[pick]
		used[best]++
	}
	return out
}

func TestGreedyRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		gpus := 1 + rng.IntN(5)
		experts := 1 + rng.IntN(12)
		layers := 1 + rng.IntN(3)
		load := make([][]float64, layers)
		for l := range load {
			load[l] = make([]float64, experts)
			for e := range load[l] {
				// Small integers make ties common.
				load[l][e] = float64(rng.IntN(6))
			}
		}
		slots := make([]int, gpus)
		for range experts + rng.IntN(4) {
			slots[rng.IntN(gpus)]++
		}
		speed := make([]float64, gpus)
		for g := range speed {
			speed[g] = float64(1 + rng.IntN(3))
		}
		opts := GreedyOptions{SlotsPerGPU: slots, Speed: speed}
		if trial%3 == 0 {
			opts.Speed = nil
			for g := range speed {
				speed[g] = 1
			}
		}
		name := fmt.Sprintf("trial %d: gpus=%d slots=%v speed=%v load=%v", trial, gpus, slots, opts.Speed, load)
		p, err := Greedy(statsOf(load...), gpus, opts)
		require.NoError(t, err, name)
		require.NoError(t, p.Validate(placement.ValidateOptions{Layers: layers, Experts: experts, SlotsPerGPU: slots}), name)
		for l := range load {
			require.Equal(t, lptReference(load[l], slots, speed), p.Assignment(l), name)
		}
		again, err := Greedy(statsOf(load...), gpus, opts)
		require.NoError(t, err)
		require.True(t, p.Equal(again), "deterministic: %s", name)
	}
}
