package routing

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeTraceFiles writes tr as t.npy (with t.source.npy when it has
// sources) and t.jsonl in a new directory.
func writeTraceFiles(t *testing.T, tr *Trace) (npyPath, jsonlPath string) {
	dir := t.TempDir()
	var buf bytes.Buffer
	require.NoError(t, WriteNPY(&buf, tr))
	npyPath = filepath.Join(dir, "t.npy")
	require.NoError(t, os.WriteFile(npyPath, buf.Bytes(), 0o644))
	if tr.Source != nil {
		src := make([]int64, tr.Tokens)
		for i, r := range tr.Source {
			src[i] = int64(r)
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, "t.source.npy"), npyBytes("<i4", []int{tr.Tokens}, src), 0o644))
	}
	buf.Reset()
	require.NoError(t, WriteJSONL(&buf, tr))
	jsonlPath = filepath.Join(dir, "t.jsonl")
	require.NoError(t, os.WriteFile(jsonlPath, buf.Bytes(), 0o644))
	return npyPath, jsonlPath
}

// TestStreamedStatsMatchWholeTrace reads NPY and JSONL traces with
// StatsOnly (chunks straight into the counters) and without (the trace
// kept, then Trace.Stats), from files and from plain readers, with 1 and
// 4 counting goroutines: every variant must give the same stats, and
// StatsOnly no trace. It catches a chunk counted twice or not at all, a
// source or step shifted by a chunk, a sample that depends on chunking or
// workers, and a streamed reader that keeps the trace anyway.
func TestStreamedStatsMatchWholeTrace(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, sh := range []struct {
		T, L, K, E int
		src        bool
	}{{1, 1, 1, 1, false}, {37, 3, 2, 7, true}, {900, 4, 3, 20, true}, {3000, 2, 2, 300, false}} {
		tr := randomTrace(rng, sh.T, sh.L, sh.K, sh.E, sh.src, false)
		tr.Experts = int(maxOf(tr.IDs)) + 1
		npyPath, jsonlPath := writeTraceFiles(t, tr)
		// n₀ = (k−1)²/0.16: sampled; many chunks even for small traces.
		opts := LoadOptions{PathError: 0.2, chunkIDs: 64}
		want := tr.Stats(opts.statsOptions())
		want.Sources = nil
		for _, procs := range []int{1, 4} {
			runtime.GOMAXPROCS(procs)
			for _, path := range []string{npyPath, jsonlPath} {
				name := fmt.Sprintf("T%d-%s-procs%d", sh.T, filepath.Ext(path), procs)
				t.Run(name, func(t *testing.T) {
					for _, statsOnly := range []bool{false, true} {
						o := opts
						o.StatsOnly = statsOnly
						src, err := Load(path, o)
						require.NoError(t, err)
						require.NoError(t, src.Stats.Validate())
						assert.Equal(t, statsOnly, src.Trace == nil, "StatsOnly %v", statsOnly)
						got := src.Stats
						assert.Equal(t, []string{path}, got.Sources)
						got.Sources = nil
						assert.Equal(t, want, got, "StatsOnly %v", statsOnly)
						if filepath.Ext(path) == ".npy" && tr.Source != nil {
							continue // a reader has no sidecar
						}
						data, err := os.ReadFile(path)
						require.NoError(t, err)
						rsrc, err := Read(bytes.NewReader(data), path, o)
						require.NoError(t, err)
						rsrc.Stats.Sources = nil
						assert.Equal(t, want, rsrc.Stats, "Read, StatsOnly %v", statsOnly)
					}
				})
			}
		}
	}
}

func maxOf(ids []int16) int16 {
	m := int16(0)
	for _, v := range ids {
		m = max(m, v)
	}
	return m
}

// TestProgress: the hook is called per chunk with growing counts and once
// at the end with Done, the file and its size; other formats call it once.
// It catches a hook never called, called without Done, or with counts
// that go backwards.
func TestProgress(t *testing.T) {
	tr := randomTrace(rand.New(rand.NewPCG(51, 52)), 500, 2, 2, 9, true, false)
	npyPath, jsonlPath := writeTraceFiles(t, tr)
	for _, path := range []string{npyPath, jsonlPath, testdataPath(t, "mixtral-8x7b", "fiddler", "expert_popularity_machine_learning.json")} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			var calls []ReadProgress
			_, err := Load(path, LoadOptions{StatsOnly: true, chunkIDs: 64, Progress: func(p ReadProgress) { calls = append(calls, p) }})
			require.NoError(t, err)
			require.NotEmpty(t, calls)
			fi, err := os.Stat(path)
			require.NoError(t, err)
			last := calls[len(calls)-1]
			assert.True(t, last.Done)
			assert.Equal(t, path, last.File)
			assert.Equal(t, fi.Size(), last.TotalBytes)
			assert.Equal(t, fi.Size(), last.Bytes)
			for i := 1; i < len(calls); i++ {
				assert.GreaterOrEqual(t, calls[i].Bytes, calls[i-1].Bytes)
				assert.GreaterOrEqual(t, calls[i].Tokens, calls[i-1].Tokens)
				assert.False(t, calls[i-1].Done, "Done only on the last call")
			}
			if filepath.Ext(path) == ".npy" {
				assert.Greater(t, len(calls), 10, "one call per chunk")
				assert.Equal(t, int64(tr.Tokens), last.Tokens)
			}
		})
	}
	// A directory of FLAME layer files reports each file once, with Done
	// and its size.
	dir := testdataPath(t, "flame-moe-290m", "csv-sample")
	var calls []ReadProgress
	_, err := Load(dir, LoadOptions{Progress: func(p ReadProgress) { calls = append(calls, p) }})
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(dir, "*.csv"))
	require.NoError(t, err)
	require.Len(t, calls, len(files))
	for i, f := range files {
		fi, err := os.Stat(f)
		require.NoError(t, err)
		assert.Equal(t, ReadProgress{File: f, Bytes: fi.Size(), TotalBytes: fi.Size(), Done: true}, calls[i])
	}
}

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestHostileHeaders feeds small files whose headers declare huge arrays
// and requires a clear error and less than 64 MiB allocated. It catches a
// reader that allocates what the header says before checking the bytes
// present (the shape, the sidecar's shape, a safetensors entry) and one
// that buffers a JSON line without bound.
func TestHostileHeaders(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, data, 0o644))
		return p
	}
	small := npyBytes("<i2", []int{2, 1, 1}, []int64{0, 1})
	tests := []struct {
		name  string
		path  string
		opts  LoadOptions
		read  bool // through Read, size unknown
		field string
		want  string
		limit uint64 // bytes it may allocate; 0: 64 MiB
	}{
		{"npy shape, file", write("a.npy", npyBytes("<i2", []int{1 << 28, 4, 2}, []int64{0, 1})), LoadOptions{}, false, "", "truncated data: 4 bytes, shape [268435456 4 2] of <i2 needs 4294967296", 0},
		{"npy shape, stats only", write("b.npy", npyBytes("<i4", []int{1 << 28, 4, 2}, []int64{0, 1})), LoadOptions{StatsOnly: true}, false, "", "truncated data", 0},
		{"npy shape, reader", write("c.npy", npyBytes("<i2", []int{1 << 28, 4, 2}, []int64{0, 1})), LoadOptions{}, true, "", "truncated data", 0},
		{"npy shape, reader, stats only", write("d.npy", npyBytes("<i2", []int{1 << 28, 4, 2}, []int64{0, 1})), LoadOptions{StatsOnly: true}, true, "", "truncated data", 0},
		{"npy claims 2^32 tokens, reader, stats only", write("f.npy", npyBytes("<i2", []int{1 << 32, 1, 1}, []int64{0, 1})), LoadOptions{StatsOnly: true}, true, "", "truncated data", 0},
		{"npy beyond the stream cap", write("e.npy", npyBytes("<i2", []int{1 << 30, 1 << 10, 1 << 10}, nil)), LoadOptions{StatsOnly: true}, false, "shape", "claims more than", 0},
		{"npy wide token", write("w.npy", npyBytes("<i2", []int{1, 1 << 20, 1 << 13}, nil)), LoadOptions{StatsOnly: true}, false, "shape", "claims more than", 0},
		{"sidecar shape", func() string {
			write("s.source.npy", npyBytes("<i8", []int{2}, nil))
			return write("s.npy", small)
		}(), LoadOptions{}, false, "", "truncated data", 0},
		{"sidecar claims more tokens", func() string {
			write("u.source.npy", npyBytes("<i8", []int{1 << 40}, []int64{0, 1}))
			return write("u.npy", small)
		}(), LoadOptions{}, false, "shape", "bad dimension", 0},
		{"safetensors shape", write("trt/rank0.safetensors", safetensorsBytes("0_3", "I64", []int{1 << 40}, le64s(1))), LoadOptions{}, false, "0_3", "does not fit in the file", 0},
		{"jsonl huge line", write("h.jsonl", []byte(`{"layers":[[`+strings.Repeat("1,", 9<<20)+`1]]}`)), LoadOptions{StatsOnly: true}, false, "", "line longer than", 8 * maxLineBytes},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			used := allocated(func() {
				if tc.read {
					data, rerr := os.ReadFile(tc.path)
					require.NoError(t, rerr)
					_, err = Read(bytes.NewReader(data), tc.path, tc.opts)
				} else {
					_, err = Load(tc.path, tc.opts)
				}
			})
			require.Error(t, err)
			var pe *ParseError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, tc.field, pe.Field, err.Error())
			assert.Contains(t, err.Error(), tc.want)
			limit := tc.limit
			if limit == 0 {
				limit = 64 << 20
			}
			assert.Less(t, used, limit, "allocated %d bytes for a %s", used, tc.name)
		})
	}
}

// TestStatsOnlyServingStacks reads every vendored serving-stack dump with
// and without StatsOnly: the stats must agree, and StatsOnly must leave
// no trace. With a tiny chunk the per-token formats (SGLang per_token,
// Megatron, TensorRT-LLM token files, routed experts) stream many chunks
// into the counters. It catches a streamed builder that drops the last
// chunk, shifts sources or steps between chunks, or keeps the trace.
func TestStatsOnlyServingStacks(t *testing.T) {
	stacks := testdataPath(t, "serving-stacks")
	for _, tc := range []struct {
		name     string
		path     string
		opts     LoadOptions
		perToken bool
	}{
		{"sglang per_token", copyInto(t, [][]string{{"serving-stacks", "sglang_per_token_0.pt"}, {"serving-stacks", "sglang_per_token_1.pt"}}), LoadOptions{}, true},
		{"megatron", filepath.Join(stacks, "megatron_router_trace"), LoadOptions{}, true},
		{"trtllm tokens", filepath.Join(stacks, "trtllm_expert_statistic"), LoadOptions{}, true},
		{"routed experts", filepath.Join(stacks, "sglang_routed_experts.json"), LoadOptions{TopK: 6}, true},
		{"trtllm counts", filepath.Join(stacks, "trtllm_cooccurrence"), LoadOptions{}, false},
		{"sglang stat", filepath.Join(stacks, "sglang_stat.pt"), LoadOptions{}, false},
		{"vllm", filepath.Join(stacks, "vllm_eplb_load_stats.jsonl"), LoadOptions{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			opts.chunkIDs = 100
			whole, err := Load(tc.path, opts)
			require.NoError(t, err)
			assert.Equal(t, tc.perToken, whole.Trace != nil)
			o := opts
			o.StatsOnly = true
			streamed, err := Load(tc.path, o)
			require.NoError(t, err)
			assert.Nil(t, streamed.Trace)
			assert.Equal(t, whole.Stats, streamed.Stats)
			if tc.perToken {
				assert.NotNil(t, streamed.Stats.Patterns)
			}
		})
	}
}
