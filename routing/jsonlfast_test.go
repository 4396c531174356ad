package routing

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decodeLine is what the reader does without the fast path.
func decodeLine(line []byte) (jsonlLine, bool) {
	var rec jsonlLine
	dec := json.NewDecoder(bytes.NewReader(line))
	if dec.Decode(&rec) != nil || dec.More() {
		return rec, false
	}
	return rec, true
}

// checkFast requires that a line the fast path accepts decodes with
// encoding/json to the same record, also when the record is reused after
// another line.
func checkFast(t *testing.T, line []byte, prev *jsonlLine) bool {
	line = bytes.TrimSpace(line)
	if !fastLine(line, prev) {
		return false
	}
	want, ok := decodeLine(line)
	require.True(t, ok, "the fast path accepted %q, which encoding/json refuses", line)
	assert.Equal(t, want, *prev, "%q", line)
	return true
}

// TestFastLine: the fast path takes what WriteJSONL writes and leaves
// anything unusual to encoding/json. It catches a fast path that accepts a
// line encoding/json refuses (1.0 as an id, a duplicate key, null) or
// decodes it differently (a stale row from the line before, nil for []).
func TestFastLine(t *testing.T) {
	tests := []struct {
		line string
		fast bool
	}{
		{`{"layers":[[34,28],[60,21]],"weights":[[0.099801,0.052281],[0.1,2e-3]],"source":3,"step":0}`, true},
		{` { "layers" : [ [ 1 , 2 ] ] , "step" : -7 } `, true},
		{`{"layers":[[5,6,7]]}`, true},
		{`{"layers":[]}`, true},
		{`{"layers":[[]],"weights":[]}`, true},
		{`{}`, true},
		{`{"layers":[[1.0]]}`, false},
		{`{"layers":[[1e2]]}`, false},
		{`{"layers":[[01]]}`, false},
		{`{"layers":[[1]],"layers":[[2]]}`, false},
		{`{"layers":[[1]],"source":null}`, false},
		{`{"Layers":[[1]]}`, false},
		{`{"moetuner_trace":1,"experts":4}`, false},
		{`{"layers":[[1]],"extra":1}`, false},
		{`{"layers":[[1]]} {"layers":[[2]]}`, false},
		{`{"layers":[[1,]]}`, false},
		{`{"layers":[[1]],}`, false},
		{`{"layers":[[1]]`, false},
		{`{"layers":[[12345678901234567890]]}`, false},
		{`{"weights":[[1e999]]}`, false},
		{`{"weights":[[-]]}`, false},
		{`{"weights":[[.5]]}`, false},
	}
	var rec jsonlLine
	// A long line first, so that later lines reuse its rows.
	require.True(t, checkFast(t, []byte(`{"layers":[[9,8,7,6],[5,4,3,2],[1,0,11,12]],"weights":[[1,2,3,4],[5,6,7,8],[9,10,11,12]],"source":1,"step":2}`), &rec))
	for _, tc := range tests {
		t.Run(tc.line, func(t *testing.T) {
			assert.Equal(t, tc.fast, checkFast(t, []byte(tc.line), &rec))
			if !tc.fast {
				rec = jsonlLine{}
			}
		})
	}
}

// FuzzJSONLFastPath: whatever the fast path accepts, encoding/json decodes
// to the same record.
func FuzzJSONLFastPath(f *testing.F) {
	f.Add([]byte(`{"layers":[[34,28],[60,21]],"weights":[[0.099801,0.052281],[0.1,2e-3]],"source":3,"step":0}`))
	f.Add([]byte(`{"layers":[[1,2]],"step":-7}`))
	f.Add([]byte(`{"layers":[[1.0]]}`))
	seedFile(f, "flame-moe-290m", "trace.jsonl")
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxFuzzInput {
			t.Skip()
		}
		var rec jsonlLine
		for line := range bytes.SplitSeq(data, []byte("\n")) {
			if !checkFast(t, line, &rec) {
				rec = jsonlLine{}
			}
		}
	})
}
