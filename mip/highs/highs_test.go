package highs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gohighs "github.com/bartolsthoorn/gohighs/highs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/mip"
)

var inf = math.Inf(1)

// dense builds a MIP from dense rows.
func dense(cost, lower, upper []float64, integer []bool, rows [][]float64, rlo, rhi []float64) *mip.Model {
	m := &mip.Model{Cost: cost, Lower: lower, Upper: upper, Integer: integer, RowLower: rlo, RowUpper: rhi}
	m.RowStart = []int{0}
	for _, r := range rows {
		for j, v := range r {
			if v != 0 {
				m.RowIndex = append(m.RowIndex, j)
				m.RowValue = append(m.RowValue, v)
			}
		}
		m.RowStart = append(m.RowStart, len(m.RowIndex))
	}
	return m
}

func objective(m *mip.Model, x []float64) float64 {
	s := m.Offset
	for j, c := range m.Cost {
		s += c * x[j]
	}
	return s
}

// knapsack returns a 0/1 knapsack (as a minimisation of -value) with n items.
func knapsack(seed uint64, n int) (*mip.Model, []float64, []float64, float64) {
	r := rand.New(rand.NewPCG(seed, 1))
	value := make([]float64, n)
	weight := make([]float64, n)
	total := 0.0
	for j := range n {
		value[j] = float64(1 + r.IntN(50))
		weight[j] = float64(1 + r.IntN(40))
		total += weight[j]
	}
	capacity := math.Floor(total / 2)
	cost := make([]float64, n)
	lo := make([]float64, n)
	hi := make([]float64, n)
	integer := make([]bool, n)
	for j := range n {
		cost[j], hi[j], integer[j] = -value[j], 1, true
	}
	return dense(cost, lo, hi, integer, [][]float64{weight}, []float64{-inf}, []float64{capacity}), value, weight, capacity
}

func bruteKnapsack(value, weight []float64, capacity float64) float64 {
	best := 0.0
	for mask := 0; mask < 1<<len(value); mask++ {
		v, w := 0.0, 0.0
		for j := range value {
			if mask&(1<<j) != 0 {
				v += value[j]
				w += weight[j]
			}
		}
		if w <= capacity && v > best {
			best = v
		}
	}
	return -best
}

// marketSplit returns a Cornuéjols–Dawande market split instance with slacks:
// rows Σ a_ij x_j + s⁺_i − s⁻_i = d_i, minimise Σ s. Hard for branch and
// bound. It also returns the feasible start x = 0, s⁺ = d; when planted, d
// is a·x* for a random binary x*, and the start is x* (objective 0).
func marketSplit(seed uint64, rows int, planted bool) (*mip.Model, []float64) {
	r := rand.New(rand.NewPCG(seed, 2))
	n := 10 * (rows - 1)
	cols := n + 2*rows
	m := &mip.Model{
		Cost: make([]float64, cols), Lower: make([]float64, cols), Upper: make([]float64, cols),
		Integer: make([]bool, cols), Names: make([]string, cols),
		RowLower: make([]float64, rows), RowUpper: make([]float64, rows), RowStart: []int{0},
	}
	start := make([]float64, cols)
	for j := range n {
		m.Upper[j], m.Integer[j], m.Names[j] = 1, true, fmt.Sprintf("x%d", j)
		if planted {
			start[j] = float64(r.IntN(2))
		}
	}
	for i := range rows {
		sum, hit := 0.0, 0.0
		for j := range n {
			a := float64(r.IntN(100))
			sum += a
			hit += a * start[j]
			m.RowIndex = append(m.RowIndex, j)
			m.RowValue = append(m.RowValue, a)
		}
		sp, sm := n+2*i, n+2*i+1
		m.Names[sp], m.Names[sm] = fmt.Sprintf("sp%d", i), fmt.Sprintf("sm%d", i)
		m.Cost[sp], m.Cost[sm] = 1, 1
		m.Upper[sp], m.Upper[sm] = inf, inf
		m.RowIndex = append(m.RowIndex, sp, sm)
		m.RowValue = append(m.RowValue, 1, -1)
		m.RowStart = append(m.RowStart, len(m.RowIndex))
		d := math.Floor(sum / 2)
		if planted {
			d = hit
		} else {
			start[sp] = d
		}
		m.RowLower[i], m.RowUpper[i] = d, d
	}
	return m, start
}

func TestLP(t *testing.T) {
	// min −x − y  s.t. x + 2y ≤ 4, 3x + y ≤ 6, x, y ≥ 0: optimum (1.6, 1.2).
	m := dense([]float64{-1, -1}, []float64{0, 0}, []float64{inf, inf}, nil,
		[][]float64{{1, 2}, {3, 1}}, []float64{-inf, -inf}, []float64{4, 6})
	m.Offset = 10
	sol, err := Backend{}.Solve(context.Background(), m, mip.Options{})
	require.NoError(t, err)
	require.Equal(t, mip.Optimal, sol.Status)
	require.Len(t, sol.X, 2)
	assert.InDelta(t, 1.6, sol.X[0], 1e-7)
	assert.InDelta(t, 1.2, sol.X[1], 1e-7)
	assert.InDelta(t, 10-2.8, sol.Objective, 1e-7)
	assert.InDelta(t, objective(m, sol.X), sol.Objective, 1e-7)
	assert.InDelta(t, sol.Objective, sol.Bound, 1e-7)
	assert.False(t, sol.TimedOut)
	// Row duals: −1 = y1 + 3·y2 and −1 = 2·y1 + y2 give (−0.4, −0.2), and
	// 4·y1 + 6·y2 = −2.8 is the objective without the offset.
	require.Len(t, sol.RowDual, 2)
	assert.InDelta(t, -0.4, sol.RowDual[0], 1e-7)
	assert.InDelta(t, -0.2, sol.RowDual[1], 1e-7)
}

func TestKnapsackMatchesBruteForce(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			m, value, weight, capacity := knapsack(seed, 14)
			sol, err := Backend{}.Solve(context.Background(), m, mip.Options{Seed: int(seed)})
			require.NoError(t, err)
			require.Equal(t, mip.Optimal, sol.Status)
			want := bruteKnapsack(value, weight, capacity)
			assert.InDelta(t, want, objective(m, sol.X), 1e-6)
			assert.InDelta(t, want, sol.Objective, 1e-6)
			assert.LessOrEqual(t, sol.Bound, want+1e-6)
			w := 0.0
			for j, x := range sol.X {
				assert.InDelta(t, math.Round(x), x, 1e-6)
				w += weight[j] * x
			}
			assert.LessOrEqual(t, w, capacity+1e-6)
		})
	}
}

func TestInfeasible(t *testing.T) {
	// x + y ≥ 3 with x, y binary.
	m := dense([]float64{1, 1}, []float64{0, 0}, []float64{1, 1}, []bool{true, true},
		[][]float64{{1, 1}}, []float64{3}, []float64{inf})
	sol, err := Backend{}.Solve(context.Background(), m, mip.Options{})
	require.NoError(t, err)
	assert.Equal(t, mip.Infeasible, sol.Status)
	assert.Nil(t, sol.X)
}

func TestUnboundedIsError(t *testing.T) {
	m := dense([]float64{-1}, []float64{0}, []float64{inf}, []bool{true}, nil, nil, nil)
	sol, err := Backend{}.Solve(context.Background(), m, mip.Options{})
	require.Error(t, err)
	require.NotNil(t, sol)
	assert.Equal(t, mip.Error, sol.Status)
}

func TestZeroRows(t *testing.T) {
	m := &mip.Model{
		Cost: []float64{1, -2, 0.5}, Lower: []float64{-3, 0, 1}, Upper: []float64{5, 4.5, 2},
		Integer: []bool{true, true, false}, Offset: 1,
	}
	sol, err := Backend{}.Solve(context.Background(), m, mip.Options{})
	require.NoError(t, err)
	require.Equal(t, mip.Optimal, sol.Status)
	assert.InDeltaSlice(t, []float64{-3, 4, 1}, sol.X, 1e-9)
	assert.InDelta(t, 1-3-8+0.5, sol.Objective, 1e-9)

	lp := &mip.Model{Cost: []float64{1}, Lower: []float64{2}, Upper: []float64{3}}
	sol, err = Backend{}.Solve(context.Background(), lp, mip.Options{})
	require.NoError(t, err)
	require.Equal(t, mip.Optimal, sol.Status)
	assert.InDelta(t, 2, sol.X[0], 1e-9)
}

func TestNoColumns(t *testing.T) {
	m := &mip.Model{Offset: 4}
	sol, err := Backend{}.Solve(context.Background(), m, mip.Options{})
	require.NoError(t, err)
	assert.Equal(t, mip.Optimal, sol.Status)
	assert.Equal(t, 4.0, sol.Objective)
}

func TestMalformedModel(t *testing.T) {
	m := dense([]float64{1, 1}, []float64{0, 0}, []float64{1, 1}, nil,
		[][]float64{{1, 1}}, []float64{0}, []float64{1})
	m.RowIndex[1] = 7
	_, err := Backend{}.Solve(context.Background(), m, mip.Options{})
	assert.Error(t, err)
	m.RowIndex[1] = 1
	m.Upper = m.Upper[:1]
	_, err = Backend{}.Solve(context.Background(), m, mip.Options{})
	assert.Error(t, err)
}

func TestMIPStart(t *testing.T) {
	// The planted start has objective 0, which no heuristic finds in 1 ms.
	m, start := marketSplit(7, 5, true)
	require.Equal(t, 0.0, objective(m, start))
	opts := mip.Options{TimeLimitSec: 0.001}
	sol, err := Backend{}.Solve(context.Background(), m, opts)
	require.NoError(t, err)
	if sol.X != nil {
		require.Greater(t, objective(m, sol.X), 0.0, "found the planted solution without the start")
	}

	opts.Start = start
	sol, err = Backend{}.Solve(context.Background(), m, opts)
	require.NoError(t, err)
	require.Contains(t, []mip.Status{mip.Feasible, mip.Optimal}, sol.Status)
	require.Len(t, sol.X, len(m.Cost))
	assert.InDelta(t, 0, objective(m, sol.X), 1e-6)
	assert.InDelta(t, 0, sol.Objective, 1e-6)

	// An infeasible start is skipped, not an error.
	bad := append([]float64(nil), start...)
	bad[0] = 0.5
	sol, err = Backend{}.Solve(context.Background(), m, mip.Options{TimeLimitSec: 0.2, Start: bad})
	require.NoError(t, err)
	assert.NotEqual(t, mip.Error, sol.Status)
}

func TestCleanStart(t *testing.T) {
	m := dense([]float64{1, 1}, []float64{0, 0}, []float64{3, 1}, []bool{true, false},
		[][]float64{{1, 1}}, []float64{1}, []float64{2})
	x, act, ok := cleanStart(m, []float64{1 + 1e-9, 0.5})
	require.True(t, ok)
	assert.Equal(t, []float64{1, 0.5}, x)
	assert.InDeltaSlice(t, []float64{1.5}, act, 1e-12)
	for _, bad := range [][]float64{{1.5, 0}, {2, 0.5}, {0, 0}, {4, 0}, {1}, {math.NaN(), 0}} {
		_, _, ok := cleanStart(m, bad)
		assert.False(t, ok, "%v", bad)
	}
}

// A market split instance of 7 rows and 60 binaries takes branch and bound
// far longer than a second (such instances are built to defeat it), so
// the time limit must stop HiGHS and say so.
func TestTimeLimit(t *testing.T) {
	m, _ := marketSplit(11, 7, false)
	const limit = 1.0
	begin := time.Now()
	sol, err := Backend{}.Solve(context.Background(), m, mip.Options{TimeLimitSec: limit})
	elapsed := time.Since(begin)
	require.NoError(t, err)
	assert.Less(t, elapsed.Seconds(), limit+3)
	require.NotEqual(t, mip.Optimal, sol.Status, "the instance must outlast the limit; pick a harder one")
	assert.True(t, sol.TimedOut, "status %v", sol.Status)
	assert.Contains(t, []mip.Status{mip.Feasible, mip.NoSolution}, sol.Status)
}

// A cancel interrupts HiGHS on the same hard instance (see TestTimeLimit).
func TestContextCancel(t *testing.T) {
	m, _ := marketSplit(13, 7, false)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	begin := time.Now()
	sol, err := Backend{}.Solve(ctx, m, mip.Options{})
	elapsed := time.Since(begin)
	assert.Less(t, elapsed.Seconds(), 3.0)
	require.NotNil(t, sol)
	require.NotEqual(t, mip.Optimal, sol.Status, "the instance must outlast the cancel; pick a harder one")
	assert.True(t, errors.Is(err, context.Canceled), "err %v", err)
	assert.True(t, sol.TimedOut)
	assert.Contains(t, []mip.Status{mip.Feasible, mip.NoSolution}, sol.Status)

	// A context that is already done is refused up front.
	_, err = Backend{}.Solve(ctx, m, mip.Options{})
	assert.ErrorIs(t, err, context.Canceled)
}

func TestProgress(t *testing.T) {
	m, start := marketSplit(3, 4, false)
	var calls []float64
	sol, err := Backend{}.Solve(context.Background(), m, mip.Options{
		TimeLimitSec: 0.5,
		Start:        start,
		Progress: func(obj, bound float64) {
			calls = append(calls, obj, bound)
		},
	})
	require.NoError(t, err)
	require.NotEmpty(t, calls)
	lastObj, lastBound := calls[len(calls)-2], calls[len(calls)-1]
	if sol.Status == mip.Optimal || sol.Status == mip.Feasible {
		assert.InDelta(t, sol.Objective, lastObj, 1e-6)
	}
	assert.LessOrEqual(t, lastBound, lastObj+1e-6)
}

func TestWriteModel(t *testing.T) {
	m, _ := marketSplit(1, 3, false)
	m.RowNames = []string{"split0", "split1", ""}
	dir := t.TempDir()
	for _, ext := range []string{".lp", ".mps"} {
		path := filepath.Join(dir, "model"+ext)
		require.NoError(t, WriteModel(m, path))
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		text := string(data)
		for _, name := range []string{"x0", "x19", "sp2", "sm0", "split1", "r2"} {
			assert.True(t, strings.Contains(text, name), "%s lacks %s", ext, name)
		}
		s, err := gohighs.NewSolver()
		require.NoError(t, err)
		require.NoError(t, s.SetBoolOption("output_flag", false))
		require.NoError(t, s.ReadModel(path))
		assert.Equal(t, len(m.Cost), s.NumCol())
		assert.Equal(t, len(m.RowLower), s.NumRow())
		s.Close()
	}
	assert.Error(t, WriteModel(m, filepath.Join(dir, "model.txt")))
}

func TestParallelSolves(t *testing.T) {
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, value, weight, capacity := knapsack(uint64(100+g), 12)
			sol, err := Backend{}.Solve(context.Background(), m, mip.Options{Threads: 1 + g%2, Seed: g})
			switch {
			case err != nil:
				errs[g] = err
			case sol.Status != mip.Optimal:
				errs[g] = fmt.Errorf("status %v", sol.Status)
			case math.Abs(objective(m, sol.X)-bruteKnapsack(value, weight, capacity)) > 1e-6:
				errs[g] = fmt.Errorf("objective %v, want %v", objective(m, sol.X), bruteKnapsack(value, weight, capacity))
			}
		}()
	}
	wg.Wait()
	for g, err := range errs {
		assert.NoError(t, err, "goroutine %d", g)
	}
}

// A node limit stops HiGHS on the hard instance by work, not time: the
// solve ends, not optimal, and two runs give the same incumbent (with one
// thread HiGHS is deterministic), which a time limit does not promise.
func TestNodeLimitIsReproducible(t *testing.T) {
	m, start := marketSplit(17, 7, false)
	var first []float64
	for run := range 2 {
		sol, err := Backend{}.Solve(context.Background(), m, mip.Options{NodeLimit: 10, Start: start, Threads: 1})
		require.NoError(t, err)
		require.NotEqual(t, mip.Optimal, sol.Status)
		require.NotNil(t, sol.X)
		assert.False(t, sol.TimedOut)
		if run == 0 {
			first = sol.X
		} else {
			assert.Equal(t, first, sol.X)
		}
	}
}
