package report

import (
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/costmodel"
)

// FuzzReadJSON feeds ReadReplay and ReadBacktest arbitrary bytes (seeds:
// testdata/report, written by moetuner replay --json). What they refuse
// must be an error of this package; what they accept must render without
// a panic (an error is fine) beside one tiny plan, so the fuzzer's time
// goes to the parsed parts.
func FuzzReadJSON(f *testing.F) {
	for _, name := range []string{"replay-sim.json", "replay-cpu.json", "backtest.json"} {
		data, err := os.ReadFile(filepath.Join("..", "testdata", "report", name))
		require.NoError(f, err)
		f.Add(data)
	}
	f.Add([]byte(`{"plans": [{"file": "a", "measurement": {"layers": [{"tail_ns": -5}]}}], "comparison": {"diffs": []}}`))
	f.Add([]byte(`{"windows": ["a"], "series": [{"name": "x", "values": [1e308]}]}`))
	c := costmodel.Cluster{Name: "tiny", Nodes: 1, GPUsPerNode: 2}
	rep := &costmodel.Report{Layers: []costmodel.LayerReport{{Tokens: []float64{3, 1}, MaxTokens: 3, MeanTokens: 2, Balance: 1.5,
		Dispatch: [][]float64{{0, 5e6}, {2e6, 0}}, Combine: [][]float64{{0, 2e6}, {5e6, 0}}}}, TimeSec: 1e-4}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		in := Input{Cluster: c, Plans: []Plan{{Name: "a", Report: rep, Gap: math.NaN()}}, Bound: math.NaN()}
		var err error
		if in.Replay, err = ReadReplay(data); err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "report: replay: "), err.Error())
		}
		if in.Backtest, err = ReadBacktest(data); err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "report: backtest: "), err.Error())
		}
		if in.Replay != nil || in.Backtest != nil {
			if err := Write(io.Discard, in); err != nil {
				require.True(t, strings.HasPrefix(err.Error(), "report: "), err.Error())
			}
		}
	})
}
