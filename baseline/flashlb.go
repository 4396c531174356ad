package baseline

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// This file ports vllm-ascend's FlashLB policy,
// vllm_ascend/eplb/core/policy/policy_flashlb.py at
// vllm-project/vllm-ascend@0834773c34252cfd664072378b3265accb83369f (the
// algorithm of vllm-project/vllm-ascend#3042 with the per-step "multi-stage"
// hotness of #6477): compute_piece_counts, jsq_placement,
// group_based_adaptive_bloating_kernel and group_based_adaptive_bloating,
// the placement rebalance_layer computes for one layer.
//
// Later trees of that file, and SGLang's unmerged FlashLB
// (sgl-project/sglang#14176, eplb_algorithms/flash_lb.py), replaced it with
// a different algorithm (a mean/variance/covariance "flash_tree" search);
// this is the version whose published example (#3042: loads 600, 560, 120,
// 120, 20, 10, 10, 10 on 8 devices of 2 slots, busiest device 205 where
// EPLB gives 232) the tests reproduce.
//
// Upstream runs under numba; the port keeps numba's types: float32 arrays,
// float64 scalars, float32 divided by an integer giving float64, and
// numba's np.argsort (numba/misc/quicksort.py, not stable).

// FlashLBOptions are the optional settings of FlashLB. The zero value
// places without redundant slots, one stage per step.
type FlashLBOptions struct {
	// RedundantSlots is the number of physical slots per layer beyond one
	// per expert; Experts+RedundantSlots must be a multiple of the GPU
	// count. 0 means no replication.
	RedundantSlots int
	// MaxStages is upstream's max_stage_window: how many stages (rows of
	// hotness) FlashLB sees. With 1 the one stage is the load summed over
	// the trace, the hotness of one window; with more, the steps are the
	// stages, average-pooled into MaxStages rows as upstream's
	// compress_by_avg_pooling_fast_nd pools a longer window. 0 means 1,
	// upstream's default (policy_flashlb.py's FlashLB.__init__).
	MaxStages int
}

// FlashLBLayer places one layer as vllm-ascend's FlashLB
// group_based_adaptive_bloating(X, P, M, stage_weights) does, with
// rebalance_layer's stage weights (each stage's total over the largest
// total; all 1 when every stage is empty, where upstream divides by zero).
// hotness[s][e] is expert e's load in stage s; slots is P, the physical
// slots, and devices M, the GPUs. It returns the deployment [M][P/M]
// (expert ids, -1 where upstream's jsq_placement left a slot empty and
// fills it at random), the copies of every expert and whether FlashLB kept
// its first, "simulated" plan (the grouped search came out worse).
func FlashLBLayer(hotness [][]float64, slots, devices int) (deployment [][]int, pieces []int, simulated bool, err error) {
	if len(hotness) == 0 || len(hotness[0]) == 0 {
		return nil, nil, false, errors.New("baseline: flashlb: no hotness; pass at least one stage of expert loads")
	}
	n := len(hotness[0])
	switch {
	case n > placement.MaxExperts:
		return nil, nil, false, fmt.Errorf("baseline: flashlb: %d experts; need at most %d", n, placement.MaxExperts)
	case devices < 1 || devices > placement.MaxGPUs:
		return nil, nil, false, fmt.Errorf("baseline: flashlb: %d devices; need [1,%d]", devices, placement.MaxGPUs)
	case slots < n || slots > placement.MaxExperts*8 || slots%devices != 0:
		return nil, nil, false, fmt.Errorf("baseline: flashlb: %d slots for %d experts on %d devices; need at least one slot per expert and the same number on every device", slots, n, devices)
	}
	if err := checkLoadsOf("flashlb", "FlashLB", "hotness", hotness, n); err != nil {
		return nil, nil, false, err
	}
	X := newMat(len(hotness), n)
	for s, row := range hotness {
		copy(X.row(s), row)
	}
	return flashLB(X, slots, devices)
}

// mat is a dense row-major float64 matrix.
type mat struct {
	r, c int
	v    []float64
}

func newMat(r, c int) mat             { return mat{r, c, make([]float64, r*c)} }
func (m mat) row(i int) []float64     { return m.v[i*m.c : (i+1)*m.c] }
func (m mat) at(i, j int) float64     { return m.v[i*m.c+j] }
func (m mat) set(i, j int, x float64) { m.v[i*m.c+j] = x }

func flashLB(X mat, P, M int) ([][]int, []int, bool, error) {
	S, N := X.r, X.c
	sw := make([]float64, S)
	top := 0.0
	for s := range S {
		for _, x := range X.row(s) {
			sw[s] += x
		}
		top = math.Max(top, sw[s])
	}
	for s := range sw {
		if top > 0 {
			sw[s] /= top
		} else {
			sw[s] = 1
		}
	}
	if M == 1 {
		// One device: the slopes upstream's kernel compares are empty (it
		// fails); every split of the replicas gives the same load.
		pieces := pieceCounts(X, P, sw)
		return jsqPlacement(X, pieces, M, sw), pieces, true, nil
	}
	simPieces := pieceCounts(X, P, sw)
	simDep := jsqPlacement(X, simPieces, M, sw)
	// The kernel takes X and the weights as float32.
	X32 := newMat(S, N)
	for i, x := range X.v {
		X32.v[i] = float64(float32(x))
	}
	sw32 := make([]float64, S)
	for s, x := range sw {
		sw32[s] = float64(float32(x))
	}
	pieces, err := bloatingKernel(X32, P, M, simPieces, sw32)
	if err != nil {
		return nil, nil, false, err
	}
	dep := jsqPlacement(X, pieces, M, sw)

	xall := make([]float64, N)
	for s := range S {
		for j, x := range X.row(s) {
			xall[j] += x
		}
	}
	maxLoad := func(dep [][]int, pieces []int) float64 {
		best := math.Inf(-1)
		row := make([]float64, 0, P/M)
		for _, d := range dep {
			row = row[:0]
			for _, e := range d {
				if e < 0 {
					e = N - 1 // unit_load[-1], as NumPy indexes
				}
				u := 0.0
				if pieces[e] != 0 {
					u = xall[e] / float64(pieces[e])
				}
				row = append(row, u)
			}
			best = math.Max(best, numpySum(row))
		}
		return best
	}
	if maxLoad(dep, pieces) > maxLoad(simDep, simPieces) {
		return simDep, simPieces, true, nil
	}
	return dep, pieces, false, nil
}

// pieceCounts is compute_piece_counts: starting from one copy each, every
// extra copy goes to the expert with the largest stage-weighted gain,
// where in every stage only the hottest expert gains: by how much its
// per-copy load would drop (to its load over one more copy, or to the
// runner-up's per-copy load if that is higher), or by the stage's weight
// when it would not drop at all.
func pieceCounts(X mat, P int, sw []float64) []int {
	S, N := X.r, X.c
	pieces := make([]int, N)
	for j := range pieces {
		pieces[j] = 1
	}
	unit := newMat(S, N)
	copy(unit.v, X.v)
	deltas := make([]float32, N)
	for range P - N {
		clear(deltas)
		for i := range S {
			idx1, idx2 := -1, -1
			val1, val2 := -1.0, -1.0
			for j, v := range unit.row(i) {
				if v > val1 {
					val2, idx2 = val1, idx1
					val1, idx1 = v, j
				} else if v > val2 {
					val2, idx2 = v, j
				}
			}
			if idx2 < 0 {
				idx2 += N // unit[i, -1]
			}
			origin := unit.at(i, idx1)
			secv := unit.at(i, idx2)
			alt := X.at(i, idx1) / float64(pieces[idx1]+1)
			delta := origin - max(alt, secv)
			add := sw[i]
			if delta != 0 {
				add = delta * sw[i]
			}
			deltas[idx1] = float32(float64(deltas[idx1]) + add)
		}
		m := 0
		for j, d := range deltas {
			if d > deltas[m] {
				m = j
			}
		}
		pieces[m]++
		for i := range S {
			unit.set(i, m, X.at(i, m)/float64(pieces[m]))
		}
	}
	return pieces
}

// jsqPlacement is jsq_placement: experts in descending order of their
// per-copy load summed over stages (numba's argsort), each copy to the
// device with room and no copy of the expert yet that minimises
// Σ_s w_s · max(load_s + x_s, stage_max_s) / (mean_s + 0.01).
func jsqPlacement(X mat, pieces []int, M int, sw []float64) [][]int {
	S, N := X.r, X.c
	total := 0
	for _, p := range pieces {
		total += p
	}
	per := total / M
	unit := make([]float32, S*N) // [s][i]
	for i := range N {
		for s := range S {
			if pieces[i] > 0 {
				unit[s*N+i] = float32(X.at(s, i) / float64(pieces[i]))
			}
		}
	}
	neg := make([]float64, N)
	for i := range N {
		var sc float32
		for s := range S {
			sc += unit[s*N+i]
		}
		neg[i] = float64(-sc)
	}
	idx := numbaArgsort(neg)
	loads := make([]float32, S*M) // [s][j]
	cnt := make([]int, M)
	dep := make([][]int, M)
	for j := range dep {
		dep[j] = make([]int, per)
		for k := range dep[j] {
			dep[j][k] = -1
		}
	}
	w := make([]float32, S)
	smax := make([]float32, S)
	denom := make([]float32, S)
	used := make([]bool, M)
	for _, i := range idx {
		clear(used)
		for range pieces[i] {
			for s := range S {
				w[s] = unit[s*N+i]
				row := loads[s*M : (s+1)*M]
				smax[s] = slices.Max(row)
				acc := 0.0
				for _, x := range row {
					acc += float64(x + w[s])
				}
				denom[s] = float32(acc/float64(M) + 1e-2)
			}
			best, bestVal := -1, 1e30
			for j := range M {
				if cnt[j] >= per || used[j] {
					continue
				}
				score := 0.0
				for s := range S {
					t := loads[s*M+j] + w[s]
					num := max(t, smax[s])
					score += sw[s] * float64(num/denom[s])
				}
				if score < bestVal {
					best, bestVal = j, score
				}
			}
			if best < 0 {
				continue
			}
			used[best] = true
			for s := range S {
				loads[s*M+best] += w[s]
			}
			dep[best][cnt[best]] = i
			cnt[best]++
		}
	}
	return dep
}

// sliceValues is slice_values: every expert's load over its copies,
// repeated once per copy, in float32.
func sliceValues(x []float64, pieces []int) []float64 {
	var out []float64
	for i, v := range x {
		q := float64(float32(v / float64(pieces[i])))
		for range pieces[i] {
			out = append(out, q)
		}
	}
	return out
}

// bloatingKernel is group_based_adaptive_bloating_kernel (X and sw in
// float32): experts in descending total load are taken in P/M groups of
// M slots; a binary search picks how many of a group's slots go to extra
// copies, comparing the spread the group would leave on the devices with
// the steepest drop still ahead in the simulated plan's slices.
func bloatingKernel(X mat, P, M int, simPieces []int, sw []float64) ([]int, error) {
	S, N := X.r, X.c
	groups := P / M
	xall := make([]float64, N)
	for i := range S {
		for j := range N {
			xall[j] = float64(float32(xall[j] + X.at(i, j)))
		}
	}
	neg := make([]float64, N)
	for j, x := range xall {
		neg[j] = -x
	}
	order := numbaArgsort(neg)
	sorted := sliceValues(xall, simPieces)
	slices.Sort(sorted)
	slices.Reverse(sorted)
	slopes := make([]float64, len(sorted)-M+1)
	for k := range slopes {
		slopes[k] = float64(float32(sorted[k]-sorted[k+M-1])) / float64(M)
	}
	loads := make([]float64, M) // float32 values
	pieces := make([]int, N)
	remain := P - N
	cur := 0
	group := func(keep int) mat {
		cols := max(min(keep, 2*M, N-cur), 0)
		g := newMat(S, cols)
		for s := range S {
			for k := range cols {
				g.set(s, k, X.at(s, order[cur+k]))
			}
		}
		return g
	}
	colSum := func(g mat) []float64 {
		out := make([]float64, g.c)
		for s := range g.r {
			for k, x := range g.row(s) {
				out[k] = float64(float32(out[k] + x))
			}
		}
		return out
	}
	cl := make([]float64, M)
	for range groups {
		low := max(0, cur+M-N)
		high := min(remain, M-1)
		for high-low > 1 {
			mid := (high + low) / 2
			keep := M - mid
			g := group(keep)
			if g.c == 0 {
				return nil, fmt.Errorf("baseline: flashlb: group at expert %d of %d: its window is empty, where upstream reads outside its arrays; use fewer redundant slots", cur, N)
			}
			cp := pieceCounts(g, M, sw)
			for k := range cp {
				cp[k] = max(cp[k], 1)
			}
			cs := sliceValues(colSum(g), cp)
			slices.Sort(cs)
			for k := range cl {
				x := float64(float32(loads[k] + cs[k]))
				if math.IsNaN(x) || math.IsInf(x, 0) {
					x = 0
				}
				cl[k] = x
			}
			cslope := float64(float32(slices.Max(cl)-slices.Min(cl))) / float64(M)
			if cur+keep >= len(slopes) {
				return nil, fmt.Errorf("baseline: flashlb: group at expert %d of %d: no slices left to compare with, where upstream fails on the max of an empty array; use more redundant slots", cur, N)
			}
			nslope := slices.Max(slopes[cur+keep:])
			if math.Abs(cslope) > math.Abs(nslope) {
				low = mid
			} else {
				high = mid
			}
		}
		keep := M - high
		g := group(keep)
		if g.c < keep {
			return nil, fmt.Errorf("baseline: flashlb: group at expert %d of %d wants %d experts; upstream reads past its window here", cur, N, keep)
		}
		cp := pieceCounts(g, M, sw)
		for k := range keep {
			pieces[order[cur+k]] = cp[k]
		}
		cs := sliceValues(colSum(g), cp)
		slices.Sort(cs)
		for k := range loads {
			loads[k] = float64(float32(loads[k] + cs[k]))
		}
		slices.Sort(loads)
		slices.Reverse(loads)
		cur += keep
		remain -= high
	}
	return pieces, nil
}

// numbaArgsort is numba's np.argsort(a) (kind "quicksort",
// numba/misc/quicksort.py at numba/numba@13ece9b): a median-of-three
// quicksort down to runs of 15, then insertion sort. Not stable; the
// order of equal keys is what numba's gives.
func numbaArgsort(a []float64) []int {
	const small = 15
	R := make([]int, len(a))
	for i := range R {
		R[i] = i
	}
	if len(a) < 2 {
		return R
	}
	lt := func(x, y float64) bool { return math.IsNaN(y) || x < y }
	insertion := func(low, high int) {
		for i := low + 1; i <= high; i++ {
			k := R[i]
			v := a[k]
			j := i
			for j > low && lt(v, a[R[j-1]]) {
				R[j] = R[j-1]
				j--
			}
			R[j] = k
		}
	}
	partition := func(low, high int) int {
		mid := (low + high) >> 1
		if lt(a[R[mid]], a[R[low]]) {
			R[low], R[mid] = R[mid], R[low]
		}
		if lt(a[R[high]], a[R[mid]]) {
			R[high], R[mid] = R[mid], R[high]
		}
		if lt(a[R[mid]], a[R[low]]) {
			R[low], R[mid] = R[mid], R[low]
		}
		pivot := a[R[mid]]
		R[high], R[mid] = R[mid], R[high]
		i, j := low, high-1
		for {
			for i < high && lt(a[R[i]], pivot) {
				i++
			}
			for j >= low && lt(pivot, a[R[j]]) {
				j--
			}
			if i >= j {
				break
			}
			R[i], R[j] = R[j], R[i]
			i++
			j--
		}
		R[i], R[high] = R[high], R[i]
		return i
	}
	type span struct{ lo, hi int }
	stack := []span{{0, len(a) - 1}}
	for len(stack) > 0 {
		top := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		low, high := top.lo, top.hi
		for high-low >= small {
			i := partition(low, high)
			if high-i > i-low {
				if high > i {
					stack = append(stack, span{i + 1, high})
				}
				high = i - 1
			} else {
				if i > low {
					stack = append(stack, span{low, i - 1})
				}
				low = i + 1
			}
		}
		insertion(low, high)
	}
	return R
}

// numpySum is NumPy's pairwise float64 sum of a contiguous row
// (numpy/core/src/umath/loops_utils.h.src, pairwise_sum): sequential
// below 8 elements, eight interleaved accumulators up to 128, halves
// (rounded to a multiple of 8) above.
func numpySum(x []float64) float64 {
	n := len(x)
	switch {
	case n < 8:
		s := 0.0
		for _, v := range x {
			s += v
		}
		return s
	case n <= 128:
		var r [8]float64
		copy(r[:], x[:8])
		i := 8
		for ; i < n-n%8; i += 8 {
			for k := range 8 {
				r[k] += x[i+k]
			}
		}
		s := ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
		for ; i < n; i++ {
			s += x[i]
		}
		return s
	}
	n2 := n / 2
	n2 -= n2 % 8
	return numpySum(x[:n2]) + numpySum(x[n2:])
}

// avgPool is compress_by_avg_pooling_fast_nd: row i of the n rows goes to
// output row i*m/n, and every output row is the mean of its rows.
func avgPool(rows [][]float64, m int) [][]float64 {
	n := len(rows)
	d := len(rows[0])
	out := make([][]float64, m)
	counts := make([]float64, m)
	for i := range out {
		out[i] = make([]float64, d)
	}
	for i, r := range rows {
		k := i * m / n
		for j, x := range r {
			out[k][j] += x
		}
		counts[k]++
	}
	for k := range out {
		for j := range out[k] {
			out[k][j] /= counts[k]
		}
	}
	return out
}

// FlashLB places the experts of every layer with vllm-ascend's FlashLB
// (FlashLBLayer) on stats' loads: by default (MaxStages 1) their sum as
// the one stage, else the per-step loads (StepLoad, pooled to
// opts.MaxStages rows; without steps the aggregate Load is the one stage
// and Meta["steps"] says "1 (aggregate)"): Experts+opts.RedundantSlots
// slots per layer on gpus GPUs, device j's slots GPU j's. Strategy is
// "flashlb". A slot jsq_placement left empty (upstream fills it with a
// random expert not yet on the device) takes the first such expert, and
// Meta["random_fills"] counts them.
//
// It fails on malformed stats or options and where upstream's code would
// fail on the shape. The plan it returns validates: FlashLB never puts two
// copies of an expert on one device.
func FlashLB(stats *routing.Stats, gpus int, opts FlashLBOptions) (*placement.Plan, error) {
	if stats == nil {
		return nil, errors.New("baseline: flashlb: nil stats")
	}
	if len(stats.Load) != stats.Layers {
		return nil, fmt.Errorf("baseline: flashlb: stats.Load has %d layers, stats.Layers is %d", len(stats.Load), stats.Layers)
	}
	E := stats.Experts
	P := E + opts.RedundantSlots
	switch {
	case opts.RedundantSlots < 0:
		return nil, fmt.Errorf("baseline: flashlb: FlashLBOptions.RedundantSlots is %d; need 0 or more", opts.RedundantSlots)
	case opts.MaxStages < 0:
		return nil, fmt.Errorf("baseline: flashlb: FlashLBOptions.MaxStages is %d; need 0 (1) or more", opts.MaxStages)
	case stats.Layers < 1:
		return nil, errors.New("baseline: flashlb: no layers")
	case E < 1 || E > placement.MaxExperts:
		return nil, fmt.Errorf("baseline: flashlb: %d experts per layer; need [1,%d]", E, placement.MaxExperts)
	case gpus < 1 || gpus > placement.MaxGPUs:
		return nil, fmt.Errorf("baseline: flashlb: %d GPUs; need [1,%d]", gpus, placement.MaxGPUs)
	case P%gpus != 0:
		return nil, fmt.Errorf("baseline: flashlb: %d physical slots do not split evenly over %d GPUs; use a slot count that is a multiple of %d (redundant slots %d more or %d fewer)",
			P, gpus, gpus, gpus-P%gpus, P%gpus)
	case P > placement.MaxExperts*8:
		return nil, fmt.Errorf("baseline: flashlb: %d physical slots; need at most %d", P, placement.MaxExperts*8)
	}
	maxStages := max(opts.MaxStages, 1)
	steps, real := stepLoads(stats)
	for st, m := range steps {
		name := "stats.Load"
		if real {
			name = fmt.Sprintf("stats.StepLoad[%d]", st)
		}
		if len(m) != stats.Layers {
			return nil, fmt.Errorf("baseline: flashlb: %s has %d layers, stats.Layers is %d", name, len(m), stats.Layers)
		}
		if err := checkLoadsOf("flashlb", "FlashLB", name, m, E); err != nil {
			return nil, err
		}
	}
	stages := min(len(steps), maxStages)
	p := &placement.Plan{GPUs: gpus, Experts: E, Layers: make([]placement.LayerPlan, stats.Layers), Strategy: "flashlb", Meta: map[string]string{}}
	fills, simulated := 0, 0
	rows := make([][]float64, len(steps))
	for l := range stats.Layers {
		for st := range steps {
			rows[st] = steps[st][l]
		}
		h := rows
		switch {
		case stages == 1:
			h = [][]float64{stats.Load[l]}
		case len(rows) > stages:
			h = avgPool(rows, stages)
		}
		X := newMat(len(h), E)
		for s, r := range h {
			copy(X.row(s), r)
		}
		dep, _, sim, err := flashLB(X, P, gpus)
		if err != nil {
			return nil, fmt.Errorf("%w (layer %d)", err, l)
		}
		if sim {
			simulated++
		}
		lp := placement.LayerPlan{SlotExpert: make([]routing.Expert, 0, P), SlotGPU: make([]placement.GPU, 0, P)}
		for g, d := range dep {
			for k, e := range d {
				if e < 0 {
					// The first expert the device lacks.
					for c := range E {
						if !slices.Contains(d, c) {
							e = c
							break
						}
					}
					d[k] = e
					fills++
				}
				lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
				lp.SlotGPU = append(lp.SlotGPU, placement.GPU(g))
			}
		}
		p.Layers[l] = lp
	}
	p.Meta["redundant_slots"] = strconv.Itoa(opts.RedundantSlots)
	p.Meta["steps"] = strconv.Itoa(len(steps))
	if !real {
		p.Meta["steps"] = "1 (aggregate)"
	}
	p.Meta["stages"] = strconv.Itoa(stages)
	p.Meta["simulated_layers"] = strconv.Itoa(simulated)
	if fills > 0 {
		p.Meta["random_fills"] = strconv.Itoa(fills)
	}
	if err := p.Validate(placement.ValidateOptions{Experts: E, Layers: stats.Layers}); err != nil {
		return nil, fmt.Errorf("baseline: flashlb: %w", err)
	}
	return p, nil
}
