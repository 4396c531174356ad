package trafficbound

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// Shape is the cluster a bound is for: Nodes × GPUsPerNode GPUs, GPU g on
// node g / GPUsPerNode, GPU g holding at most SlotsPerGPU[g] experts per
// layer (len Nodes·GPUsPerNode). Σ SlotsPerGPU − Experts are the redundant
// slots (copies beyond one per expert).
type Shape struct {
	Nodes, GPUsPerNode int
	SlotsPerGPU        []int
}

// Uniform returns the Shape with slots slots on each of nodes × gpusPerNode
// GPUs.
func Uniform(nodes, gpusPerNode, slots int) Shape {
	return Shape{Nodes: nodes, GPUsPerNode: gpusPerNode, SlotsPerGPU: slices.Repeat([]int{slots}, max(nodes*gpusPerNode, 0))}
}

// Method names what certified a Bound.
type Method string

const (
	// MethodOneNode: one node, so nothing crosses a NIC; the bound 0 is
	// the optimum.
	MethodOneNode Method = "one-node"
	// MethodNoTokens: the layer has no token weight; 0 is the optimum.
	MethodNoTokens Method = "no-tokens"
	// MethodMoments: the configuration LP over certified moment budgets
	// (see the package documentation).
	MethodMoments Method = "moments"
)

// Work counts what a bound computed, for budgets and benchmarks.
type Work struct {
	MatVecs     int // dense matrix–vector products of the Lanczos shift steps
	Eigen       int // full eigendecompositions (certificates)
	SVD         int // singular value decompositions (chain-flow certificate)
	Pivots      int // simplex pivots of the configuration LP
	Relaxations int // arc relaxations of the transportation search
}

// Bound is a certified lower bound for one layer. Value is in token-
// weighted copies, the unit of Σ_t Count_t·R_t (home flow: remote nodes a
// token is sent to; chain flow: cross-node transitions). The budgets are
// the certified upper bounds on the moments (token-weighted sums over the
// layer's tokens) that the configuration LP used, and Multipliers the LP
// duals, one per budget (home flow: HomeBudget, PairBudget; chain flow:
// PrevPairBudget, PairBudget, PrevGPUPairBudget, CrossBudget): Value = Σ_groups
// weight·min_config(cost + Multipliers·f) − Multipliers·budgets,
// recomputed in Go, less a 1e-9 relative rounding margin, and at least 0.
// The zero Bound (Value 0) is valid for every problem.
type Bound struct {
	Value  float64
	Method Method
	Work   Work
	// Tokens is Σ Count over the layer's patterns.
	Tokens float64
	// HomeBudget bounds Σ_t Count·E[experts served on the source's node]
	// (home flow).
	HomeBudget float64
	// PairBudget bounds Σ_t Count·E[pairs of the token's experts on a
	// common node] at the layer.
	PairBudget float64
	// PrevPairBudget is PairBudget for layer−1, PrevGPUPairBudget bounds
	// the pairs of a token's layer−1 experts on a common GPU, and
	// CrossBudget Σ_t Count·(pairs (e1 at layer−1, e2 at layer) on a
	// common node) (chain flow).
	PrevPairBudget, PrevGPUPairBudget, CrossBudget float64
	Multipliers                                    []float64
	// Capped: the pair budget came from Options.MaxNodeLoad's balance
	// term, so Value holds only for the plans that meet that cap (else
	// for every plan, whatever the options).
	Capped bool
}

// DefaultShiftSteps is the number of diagonal-shift steps of the spectral
// pair bound when Options.ShiftSteps is 0.
const DefaultShiftSteps = 12

// Options are the optional settings. The zero value works.
type Options struct {
	// ShiftSteps is the number of subgradient steps refining the spectral
	// pair bound's diagonal shift, each one Lanczos run (about 40 dense
	// matrix–vector products); 0 means DefaultShiftSteps, negative none.
	// One full eigendecomposition certifies the result either way.
	ShiftSteps int
	// Parallel is the number of layers HomeRemoteLayers bounds at once;
	// 0 means 1. Results do not depend on it.
	Parallel int
	// MaxNodeLoad, when not 0, restricts HomeRemote to the plans whose
	// every node serves at most MaxNodeLoad times the mean node's token
	// load in the layer (on equal GPUs, every plan whose busiest GPU is
	// at most MaxNodeLoad times the mean): under even and static
	// dispatch the pair budget then also uses the nodes' balance
	// (balancedPairBudget), which popular experts otherwise let crowd
	// onto one node. At least 1.
	MaxNodeLoad float64

	// mutation weakens the balance term for the tests that must catch
	// it; the zero value (noMutation) is the bound.
	mutation balanceMutation
}

func (o Options) steps() int {
	switch {
	case o.ShiftSteps == 0:
		return DefaultShiftSteps
	case o.ShiftSteps < 0:
		return 0
	}
	return o.ShiftSteps
}

// check validates the shape against stats and returns the node capacities.
func (c Shape) check(stats *routing.Stats) ([]int, error) {
	if c.Nodes < 1 || c.GPUsPerNode < 1 {
		return nil, fmt.Errorf("trafficbound: Shape has %d nodes × %d GPUs per node; need at least 1 each", c.Nodes, c.GPUsPerNode)
	}
	G := c.Nodes * c.GPUsPerNode
	if len(c.SlotsPerGPU) != G {
		return nil, fmt.Errorf("trafficbound: Shape.SlotsPerGPU has %d entries for %d GPUs (Nodes × GPUsPerNode)", len(c.SlotsPerGPU), G)
	}
	caps := make([]int, c.Nodes)
	total := 0
	for g, s := range c.SlotsPerGPU {
		if s < 0 {
			return nil, fmt.Errorf("trafficbound: Shape.SlotsPerGPU[%d] is %d; need 0 or more", g, s)
		}
		caps[g/c.GPUsPerNode] += s
		total += s
	}
	if total < stats.Experts {
		return nil, fmt.Errorf("trafficbound: Shape has %d slots per layer for %d experts; every expert needs one", total, stats.Experts)
	}
	return caps, nil
}

func checkStats(stats *routing.Stats, layer int) error {
	if stats == nil {
		return errors.New("trafficbound: nil stats")
	}
	if stats.Patterns == nil {
		return errors.New("trafficbound: stats have no per-token patterns (count-only statistics); the bound needs each token's expert set: load a per-token trace")
	}
	if stats.Layers < 1 || stats.Experts < 1 || stats.TopK < 1 {
		return fmt.Errorf("trafficbound: stats have %d layers, %d experts, top-k %d; need at least 1 each", stats.Layers, stats.Experts, stats.TopK)
	}
	if layer < 0 || layer >= stats.Layers {
		return fmt.Errorf("trafficbound: layer %d out of range [0,%d)", layer, stats.Layers)
	}
	return nil
}

// layerTokens is one layer's tokens reduced to what the masters need.
type layerTokens struct {
	E, N, G, P int
	total      float64
	kWeight    map[int]float64 // distinct experts per token → weight
	C          []float64       // E×E pair weights (co-activation)
	nodeLoad   [][]float64     // [e][B]: weight of e's tokens sourced on node B
	gpuLoad    [][]float64     // [e][h]: weight of e's tokens sourced on GPU h (nil unless needed)
	kmax       int
}

// tokenSet fills the layer's pattern data; withGPU keeps per-GPU loads.
func tokenSet(stats *routing.Stats, layer int, c Shape, withGPU bool) (*layerTokens, error) {
	E, k := stats.Experts, stats.TopK
	G := c.Nodes * c.GPUsPerNode
	lt := &layerTokens{E: E, N: c.Nodes, G: G, P: c.GPUsPerNode, kWeight: map[int]float64{}}
	lt.C = make([]float64, E*E)
	lt.nodeLoad = make([][]float64, E)
	for e := range lt.nodeLoad {
		lt.nodeLoad[e] = make([]float64, c.Nodes)
	}
	if withGPU {
		lt.gpuLoad = make([][]float64, E)
		for e := range lt.gpuLoad {
			lt.gpuLoad[e] = make([]float64, G)
		}
	}
	ex := make([]int, 0, k)
	for i := range stats.Patterns {
		pt := &stats.Patterns[i]
		if len(pt.Experts) != stats.Layers*k {
			return nil, fmt.Errorf("trafficbound: pattern %d has %d experts, want layers × top-k = %d", i, len(pt.Experts), stats.Layers*k)
		}
		w := pt.Count
		if !(w >= 0) || math.IsInf(w, 0) {
			return nil, fmt.Errorf("trafficbound: pattern %d: count %v", i, w)
		}
		if pt.Source < -1 || int(pt.Source) >= G {
			return nil, fmt.Errorf("trafficbound: pattern %d: source %d out of range [-1,%d) for %d GPUs", i, pt.Source, G, G)
		}
		if w == 0 {
			continue
		}
		ex = ex[:0]
		for _, e := range pt.Experts[layer*k : (layer+1)*k] {
			if e < 0 || int(e) >= E {
				return nil, fmt.Errorf("trafficbound: pattern %d layer %d: expert %d out of range [0,%d)", i, layer, e, E)
			}
			if !slices.Contains(ex, int(e)) {
				ex = append(ex, int(e))
			}
		}
		lt.total += w
		lt.kWeight[len(ex)] += w
		lt.kmax = max(lt.kmax, len(ex))
		for j, a := range ex {
			if pt.Source >= 0 {
				lt.nodeLoad[a][int(pt.Source)/c.GPUsPerNode] += w
			} else {
				for B := range c.Nodes {
					lt.nodeLoad[a][B] += w / float64(c.Nodes)
				}
			}
			if withGPU {
				if pt.Source >= 0 {
					lt.gpuLoad[a][pt.Source] += w
				} else {
					for h := range G {
						lt.gpuLoad[a][h] += w / float64(G)
					}
				}
			}
			for _, b := range ex[j+1:] {
				lt.C[a*E+b] += w
				lt.C[b*E+a] += w
			}
		}
	}
	return lt, nil
}

// HomeRemote bounds from below, over every placement of the layer's
// experts on shape c (each expert at least one copy, copies of an expert
// on distinct GPUs, at most SlotsPerGPU[g] experts on GPU g) served with
// dispatch d, the home flow's Σ_t Count_t·R_t: the expected number of
// remote nodes each token is sent to from its source GPU (Source −1:
// averaged over all GPUs), as costmodel counts it. stats must carry
// Patterns. The bound is deterministic; see the package documentation
// for the certificate.
func HomeRemote(ctx context.Context, stats *routing.Stats, layer int, c Shape, d placement.Dispatch, opts Options) (Bound, error) {
	if err := checkStats(stats, layer); err != nil {
		return Bound{}, err
	}
	caps, err := c.check(stats)
	if err != nil {
		return Bound{}, err
	}
	switch d {
	case placement.DispatchEven, placement.DispatchStaticMean, placement.DispatchLocal:
	case placement.DispatchVLLM, placement.DispatchTRTLLM:
		d = placement.DispatchEven // their expectation
	default:
		return Bound{}, fmt.Errorf("trafficbound: no bound for %v dispatch (bounds are for the closed-form dispatches: even, local, static-mean, vllm)", d)
	}
	if m := opts.MaxNodeLoad; m != 0 && !(m >= 1 && !math.IsInf(m, 1)) {
		return Bound{}, fmt.Errorf("trafficbound: Options.MaxNodeLoad is %v; a node's share of the load can be capped at 1 (perfect balance) or more, or 0 for no cap", m)
	}
	if err := ctx.Err(); err != nil {
		return Bound{}, err
	}
	R := 0
	for _, s := range c.SlotsPerGPU {
		R += s
	}
	R -= stats.Experts
	lt, err := tokenSet(stats, layer, c, d == placement.DispatchStaticMean && R > 0)
	if err != nil {
		return Bound{}, err
	}
	b := Bound{Tokens: lt.total}
	switch {
	case c.Nodes == 1:
		b.Method = MethodOneNode
		return b, nil
	case lt.total == 0:
		b.Method = MethodNoTokens
		return b, nil
	}
	b.Method = MethodMoments
	b.HomeBudget = homeBudget(lt, caps, R, d, &b.Work)
	b.PairBudget = pairBudget(lt, caps, R, d, opts.steps(), &b.Work)
	if opts.MaxNodeLoad != 0 {
		if w := balancedPairBudget(lt, caps, R, d, opts.MaxNodeLoad, opts.steps(), opts.mutation, &b.Work); w < b.PairBudget {
			b.PairBudget, b.Capped = w, true
		}
	}
	groups := make([]group, 0, len(lt.kWeight))
	for _, k := range sortedKeys(lt.kWeight) {
		groups = append(groups, group{weight: lt.kWeight[k], configs: homeConfigs(k, c.Nodes)})
	}
	budget := []float64{b.HomeBudget, b.PairBudget}
	nu, piv := multipliers(groups, budget)
	b.Work.Pivots += piv
	b.Multipliers = nu
	b.Value = settle(certify(groups, budget, nu), lt.total)
	return b, nil
}

// settle is the reported bound: v less a rounding margin of 1e-9·(|v| +
// total) for the float sums behind it, and never below 0.
func settle(v, total float64) float64 {
	return max(0, v-1e-9*(math.Abs(v)+total))
}

// homeBudget bounds Σ_t Count·E[experts of t served on its source's node]
// over every placement with R redundant slots under dispatch d.
func homeBudget(lt *layerTokens, caps []int, R int, d placement.Dispatch, w *Work) float64 {
	// One primary copy per expert (under even and static dispatch the
	// copy on the node with the most home weight, under local any copy):
	// the primaries fit the node capacities.
	h, aug := maxAssign(lt.nodeLoad, caps)
	w.Relaxations += aug
	if R <= 0 {
		return h
	}
	switch d {
	case placement.DispatchStaticMean:
		// A source owning a copy serves at home; the others split over the
		// copies, which averages at most the primary's node weight. So c
		// copies on GPUs C add at most (1−1/c)·Σ_{h∈C} gpuLoad[e][h].
		h += ownerExtra(lt, R)
	case placement.DispatchLocal:
		// Every node holding a copy serves its sources at home: each extra
		// copy adds at most one (expert, node) entry of nodeLoad.
		all := make([]float64, 0, lt.E*lt.N)
		for _, row := range lt.nodeLoad {
			all = append(all, row...)
		}
		h += topSum(all, R)
	}
	return h
}

// ownerExtra is static dispatch's most for R redundant slots: over the
// copy counts c_e they allow, Σ_e (1 − 1/c_e)·(e's token weight from its
// c_e heaviest sources), what the sources owning a copy of a replicated
// expert serve at home beyond the even share of its copies.
func ownerExtra(lt *layerTokens, R int) float64 {
	return maxExtra(lt.E, R, min(lt.G, R+1), func(e, c int) float64 {
		return (1 - 1/float64(c)) * topSum(slices.Clone(lt.gpuLoad[e]), c)
	})
}

// pairBudget bounds Σ_t Count·E[pairs of t's experts on a common node].
func pairBudget(lt *layerTokens, caps []int, R int, d placement.Dispatch, steps int, w *Work) float64 {
	// Under even and static dispatch a non-owner source sees expert a on
	// node B with probability x_aB = (copies on B)/(copies), so the pair
	// term is W(X) = Σ C_ab⟨x_a, x_b⟩ with X row-stochastic. W is linear
	// in each row (C has a zero diagonal), so moving a replicated row to
	// the best of its copy nodes never lowers it, and any such choice is a
	// partition with at most caps[B] experts on B (an expert there has a
	// copy there): the partition bound with the node capacities covers
	// replicas. Local dispatch uses the primaries' partition plus extras.
	wb := pairBound(&pairProblem{C: lt.C, E: lt.E, N: lt.N, caps: caps}, steps, w)
	if R <= 0 {
		return wb
	}
	switch d {
	case placement.DispatchStaticMean:
		// A source h on node A owning a copy of a replicated expert a (c
		// copies, c_A on A) serves it at home instead of by the shares x_a:
		// for each pair (a, b) of its token that changes ⟨x_a, x_b⟩ by at
		// most x_bA·(1 − x_aA) ≤ 1 − 1/c (and 1 − xy ≤ (1−x) + (1−y) when h
		// owns both), k−1 pairs per owned expert.
		wb += float64(lt.kmax-1) * ownerExtra(lt, R)
	case placement.DispatchLocal:
		// Local dispatch: bound by co-presence, primaries (the partition
		// above) plus each extra copy's best node of partners.
		lim := float64(slices.Max(caps) - 1)
		s := make([]float64, 0, lt.E*(lt.N-1))
		row := make([]float64, lt.E)
		for a := range lt.E {
			copy(row, lt.C[a*lt.E:(a+1)*lt.E])
			v := knapsack(row, lim)
			for range lt.N - 1 {
				s = append(s, v)
			}
		}
		wb += topSum(s, R)
	}
	return wb
}

// HomeRemoteLayers is HomeRemote for every layer, opts.Parallel at a
// time; it stops at the first error or when ctx ends (then with the
// layers bounded so far, as eachLayer).
func HomeRemoteLayers(ctx context.Context, stats *routing.Stats, c Shape, d placement.Dispatch, opts Options) ([]Bound, error) {
	if stats == nil {
		return nil, errors.New("trafficbound: nil stats")
	}
	return eachLayer(ctx, stats.Layers, opts.Parallel, func(l int) (Bound, error) {
		return HomeRemote(ctx, stats, l, c, d, opts)
	})
}

// ChainLayers bounds the chain flow's dispatch copies that cross nodes,
// layer by layer, over every single-copy placement: layer 0 is
// dispatched from the homes (HomeRemote), every later layer from the
// GPUs of the layer before (ChainCrossNode). opts.Parallel layers at a
// time; it stops at the first error or when ctx ends (then with the
// layers bounded so far, as eachLayer). Each layer's bound
// holds whatever the other layers' placement, so their sum bounds the
// whole plan.
func ChainLayers(ctx context.Context, stats *routing.Stats, c Shape, opts Options) ([]Bound, error) {
	if stats == nil {
		return nil, errors.New("trafficbound: nil stats")
	}
	memo := &pairMemo{m: map[[2]int]*memoEntry{}}
	return eachLayer(ctx, stats.Layers, opts.Parallel, func(l int) (Bound, error) {
		if l == 0 {
			return HomeRemote(ctx, stats, 0, c, placement.DispatchEven, opts)
		}
		return chainCrossNode(ctx, stats, l, c, opts, memo)
	})
}

// eachLayer runs f for layers 0..L−1, workers at a time, and returns
// their bounds; it stops at the first error or when ctx ends. When ctx
// ends first it returns ctx's error with the layers bounded by then; the
// others have an empty Method (every layer's bound holds on its own, so
// what was bounded still bounds the plan, the rest counting 0).
func eachLayer(ctx context.Context, L, workers int, f func(l int) (Bound, error)) ([]Bound, error) {
	out := make([]Bound, L)
	errs := make([]error, L)
	next := make(chan int)
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l := range next {
				out[l], errs[l] = f(l)
			}
		}()
	}
	for l := range L {
		if ctx.Err() != nil {
			break
		}
		next <- l
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		for l := range out {
			if errs[l] != nil {
				out[l] = Bound{}
			}
		}
		return out, err
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func sortedKeys(m map[int]float64) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
