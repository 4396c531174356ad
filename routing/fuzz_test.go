package routing

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// maxFuzzInput caps fuzz inputs so each run stays fast.
const maxFuzzInput = 64 << 10

// maxSeed bounds seeds: the fuzzer minimizes every new input it finds,
// which takes long for big ones.
const maxSeed = 4 << 10

// seedFile adds a testdata file as a seed, cut after the last complete line
// within maxSeed bytes.
func seedFile(f *testing.F, elem ...string) {
	f.Helper()
	b, err := os.ReadFile(testdataPath(f, elem...))
	require.NoError(f, err)
	if len(b) > maxSeed {
		b = b[:maxSeed]
		if i := bytes.LastIndexByte(b, '\n'); i > 0 {
			b = b[:i+1]
		}
	}
	f.Add(b)
}

// checkRead reads data as format and requires either a *ParseError or a
// result whose trace and stats validate, and the same outcome (equal
// stats, or an error) when read with StatsOnly, in small chunks.
func checkRead(t *testing.T, data []byte, name string, opts LoadOptions) {
	if len(data) > maxFuzzInput {
		t.Skip()
	}
	src, err := Read(bytes.NewReader(data), name, opts)
	streamOpts := opts
	streamOpts.StatsOnly = true
	streamOpts.chunkIDs = 16
	streamed, serr := Read(bytes.NewReader(data), name, streamOpts)
	if err != nil {
		var pe *ParseError
		require.ErrorAs(t, err, &pe)
		require.Nil(t, src)
		require.Error(t, serr, "StatsOnly read what the whole read refused: %v", err)
		return
	}
	require.NoError(t, serr)
	require.NotNil(t, src.Stats)
	require.NoError(t, src.Stats.Validate())
	if src.Trace != nil {
		require.NoError(t, src.Trace.Validate())
		require.Nil(t, streamed.Trace)
	}
	require.Equal(t, src.Stats, streamed.Stats)
}

func FuzzJSONL(f *testing.F) {
	seedFile(f, "flame-moe-290m", "trace.jsonl")
	f.Add([]byte(`{"layers":[[0,1],[2,3]],"weights":[[0.5,0.5],[1,0]],"source":2,"step":1}`))
	f.Add([]byte("{\"moetuner_trace\":1,\"experts\":4,\"top_k\":1}\n{\"layers\":[[3]]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRead(t, data, "f.jsonl", LoadOptions{Format: FormatJSONL})
	})
}

func FuzzFLAMECSV(f *testing.F) {
	matches, err := filepath.Glob(testdataPath(f, "flame-moe-290m", "csv-sample", "*.csv"))
	require.NoError(f, err)
	for _, m := range matches {
		seedFile(f, "flame-moe-290m", "csv-sample", filepath.Base(m))
	}
	f.Add([]byte(csvHead + "0,0,0.5,0.2,0,0\n0,1,0,0.1,0.3,0\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRead(t, data, "f.csv", LoadOptions{Format: FormatFLAME})
	})
}

func FuzzNPY(f *testing.F) {
	var buf bytes.Buffer
	require.NoError(f, WriteNPY(&buf, handTrace()))
	f.Add(buf.Bytes())
	f.Add(npyBytes("<i4", []int{2, 2}, []int64{0, 1, 1, 0}))
	f.Add(npyBytes("|u1", []int{1, 1, 2}, []int64{0, 1}))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRead(t, data, "f.npy", LoadOptions{Format: FormatNPY})
	})
}

func FuzzCountsJSON(f *testing.F) {
	seedFile(f, "mixtral-8x7b", "fiddler", "expert_popularity_machine_learning.json")
	seedFile(f, "olmoe-routing-analysis", "mixtral-8x7b", "arxiv.json")
	f.Add([]byte(`{"logical_count": [[0,0],[1,2]]}`))
	f.Add([]byte(`{"logical_count": [[[0,0],[1,2]],[[0,0],[3,0]]]}`))
	f.Add([]byte(`[[1,2],[3,4]]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		// Auto-detection picks the counts format from the keys.
		checkRead(t, data, "f.json", LoadOptions{})
		checkRead(t, data, "f.json", LoadOptions{Format: FormatOLMoE})
		checkRead(t, data, "f.json", LoadOptions{Format: FormatFiddler, TopK: 1})
		checkRead(t, data, "f.json", LoadOptions{Format: FormatLogicalCount, TopK: 2})
	})
}
