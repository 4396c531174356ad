package solver_test

import (
	"context"
	"encoding/json"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/routing"
	. "github.com/moetuner/moetuner/solver"
)

// A Result encodes to JSON (its unset quantities, NaN, as null) and
// decodes back to the same numbers: a service can log or ship it. The
// plain encoding/json of a Result with NaN fields fails, which is what
// the custom encoding fixes.
func TestResultJSON(t *testing.T) {
	p := mixtralProblem(t)
	for _, st := range []Strategy{StrategyGreedy, StrategyJoint} {
		res, err := Solve(context.Background(), p, Options{Strategy: st, TimeLimit: 10 * time.Second})
		require.NoError(t, err)
		data, err := json.Marshal(res)
		require.NoError(t, err, "%s", st)
		var back map[string]any
		require.NoError(t, json.Unmarshal(data, &back))
		assert.Equal(t, string(st), back["Strategy"])
		assert.Equal(t, res.Status.String(), back["Status"])
		assert.InDelta(t, res.Objective, back["Objective"], 1e-15)
		if math.IsNaN(res.Stage1Objective) {
			assert.Nil(t, back["Stage1Objective"], "%s: NaN encodes as null", st)
		}
		var plan struct{ Plan struct{ GPUs, Experts int } }
		require.NoError(t, json.Unmarshal(data, &plan))
		assert.Equal(t, res.Plan.GPUs, plan.Plan.GPUs)
	}
}

// Every float64 field of a Result set to NaN or ±Inf still encodes, as
// null: a field added later without its jsonFloat wrapper fails here.
func TestResultJSONAllFloats(t *testing.T) {
	var r Result
	v := reflect.ValueOf(&r).Elem()
	var names []string
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if f.Kind() == reflect.Float64 && f.CanSet() {
			f.SetFloat(math.NaN())
			if i%2 == 1 {
				f.SetFloat(math.Inf(1))
			}
			names = append(names, v.Type().Field(i).Name)
		}
	}
	require.NotEmpty(t, names)
	data, err := json.Marshal(r)
	require.NoError(t, err)
	var back map[string]any
	require.NoError(t, json.Unmarshal(data, &back))
	for _, n := range names {
		val, ok := back[n]
		assert.True(t, ok, "%s is encoded", n)
		assert.Nil(t, val, "%s: NaN/Inf encodes as null", n)
	}
}

// With no model and count-only statistics without a top-k, Solve infers
// both the way the command line does (costmodel.InferModel, the model's
// top-k), and scores the plan exactly as with them given.
func TestSolveInfersModel(t *testing.T) {
	p := mixtralProblem(t)
	counts := routing.StatsFromLoad(p.Stats.Load, 0)
	bare := Problem{Stats: counts, Cluster: p.Cluster}
	res, err := Solve(context.Background(), bare, Options{Strategy: StrategyGreedy})
	require.NoError(t, err)
	m, err := costmodel.InferModel(p.Stats)
	require.NoError(t, err)
	assert.Equal(t, "mixtral-8x7b", m.Name)
	given := Problem{Stats: p.Stats, Cluster: p.Cluster, Model: m}
	want, err := Solve(context.Background(), given, Options{Strategy: StrategyGreedy})
	require.NoError(t, err)
	assert.InDelta(t, want.Objective, res.Objective, 1e-15)
	assert.Zero(t, counts.TopK, "the caller's stats are not modified")
}
