package solvertest_test

import (
	"context"
	"fmt"
	"log"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/solver"
	"github.com/moetuner/moetuner/solvertest"
)

// Check in a test of your own placement code: any plan for the problem,
// from moetuner or elsewhere, wrapped in a solver.Result, is validated and
// its cost recomputed. In a *testing.T test use solvertest.Verify(t, p,
// res); in a benchmark, solvertest.ReportRatio(b, res, base,
// "time/contiguous") puts quality next to speed.
func ExampleCheck() {
	p := solvertest.FLAME(1, 8, costmodel.FlowHome)
	res, err := solver.Solve(context.Background(), p, solver.Options{Strategy: solver.StrategyGreedy})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(solvertest.Check(p, res))
	res.Objective /= 2 // a result that lies about its cost
	fmt.Println(solvertest.Check(p, res) != nil)
	// Output:
	// <nil>
	// true
}
