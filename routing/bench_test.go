package routing

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func BenchmarkTraceStats(b *testing.B) {
	tr := loadFLAMEJSONL(b)
	b.ReportAllocs()
	for b.Loop() {
		tr.Stats(StatsOptions{})
	}
	b.ReportMetric(float64(tr.Tokens), "tokens/op")
}

func BenchmarkReadJSONL(b *testing.B) {
	data, err := os.ReadFile(testdataPath(b, "flame-moe-290m", "trace.jsonl"))
	require.NoError(b, err)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := ReadJSONL(bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}
