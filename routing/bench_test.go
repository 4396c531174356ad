package routing

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/internal/sharedfiles"
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

// cpuTime is the process's user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIngestNPY reads the shared DeepSeek-V3-shaped trace (32768
// tokens × 58 layers × top-8, with its source ranks) statistics-only, as
// moetuner stats does, and reports token-layers per second of wall time
// and per CPU-second (all goroutines together: the per-core rate, which
// other processes on the machine do not dilute). Set MOETUNER_INGEST_NPY to
// read another .npy instead. It skips when the trace is absent.
func BenchmarkIngestNPY(b *testing.B) {
	path := os.Getenv("MOETUNER_INGEST_NPY")
	if path == "" {
		path = sharedfiles.Find(filepath.Join("shared", "traces", "synthetic-deepseek-v3", "ds3-prefill4096-32k.npy"))
	}
	if path == "" {
		b.Skip("shared/traces/synthetic-deepseek-v3 is absent")
	}
	var tokenLayers float64
	cpu0 := cpuTime()
	for b.Loop() {
		src, err := Load(path, LoadOptions{StatsOnly: true})
		if err != nil {
			b.Fatal(err)
		}
		tokenLayers += src.Stats.Tokens * float64(src.Stats.Layers)
	}
	cpu := cpuTime() - cpu0
	b.ReportMetric(tokenLayers/b.Elapsed().Seconds(), "token-layers/s")
	if cpu > 0 {
		b.ReportMetric(tokenLayers/cpu.Seconds(), "token-layers/cpu-s")
	}
}
