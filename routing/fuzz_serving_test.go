package routing

import (
	"archive/zip"
	"bytes"
	"hash/crc32"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// ptParts splits a vendored .pt file into its data.pkl and other entries.
func ptParts(t testing.TB, elem ...string) (pkl []byte, rest map[string][]byte, prefix string) {
	t.Helper()
	b, err := os.ReadFile(testdataPath(t, elem...))
	require.NoError(t, err)
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	require.NoError(t, err)
	rest = map[string][]byte{}
	for _, zf := range zr.File {
		rc, err := zf.Open()
		require.NoError(t, err)
		data, err := io.ReadAll(rc)
		require.NoError(t, err)
		rc.Close()
		p, name, _ := strings.Cut(zf.Name, "/")
		prefix = p
		if name == "data.pkl" {
			pkl = data
		} else {
			rest[name] = data
		}
	}
	return pkl, rest, prefix
}

// zipPT rebuilds a torch archive with pkl as its data.pkl.
func zipPT(t testing.TB, prefix string, pkl []byte, rest map[string][]byte) []byte {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	add := func(name string, data []byte) {
		w, err := zw.CreateRaw(&zip.FileHeader{Name: prefix + "/" + name, Method: zip.Store, CRC32: crc32.ChecksumIEEE(data),
			CompressedSize64: uint64(len(data)), UncompressedSize64: uint64(len(data))})
		require.NoError(t, err)
		_, err = w.Write(data)
		require.NoError(t, err)
	}
	add("data.pkl", pkl)
	for _, k := range sortedKeys(rest) {
		add(k, rest[k])
	}
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

// FuzzSGLangPT mutates the pickle of a real per_token dump (its storages
// kept), so inputs reach the SGLang reader rather than failing the zip CRC.
func FuzzSGLangPT(f *testing.F) {
	pkl, rest, prefix := ptParts(f, "serving-stacks", "sglang_per_token_0.pt")
	f.Add(pkl)
	for _, name := range []string{"sglang_per_pass_0.pt", "sglang_stat.pt"} {
		p, _, _ := ptParts(f, "serving-stacks", name)
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxFuzzInput {
			t.Skip()
		}
		checkRead(t, zipPT(t, prefix, data, rest), "x.pt", LoadOptions{})
	})
}

// FuzzSGLangPTFile mutates whole .pt files (the zip layer). The seeds are
// small dumps: the fuzzer minimizes every new input, which takes long for
// the vendored ones.
func FuzzSGLangPTFile(f *testing.F) {
	f.Add(perToken{passes: 1, tokens: 2}.bytes(f))
	f.Add(ptBytes(f, map[string]any{"rank": 0, "logical_count": i32(f, []int{2, 1, 2}, []int32{1, 0, 0, 0})}))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRead(t, data, "x.pt", LoadOptions{Format: FormatSGLangPT})
	})
}

func FuzzSafetensors(f *testing.F) {
	// Small seeds: the fuzzer minimizes every new input.
	for _, name := range []string{"rank0.safetensors", "rank1.safetensors"} {
		b, err := os.ReadFile(testdataPath(f, "serving-stacks", "trtllm_cooccurrence", name))
		require.NoError(f, err)
		f.Add(b)
	}
	for _, dir := range []string{"trtllm_raw", "trtllm_load_balancer"} {
		b, err := os.ReadFile(testdataPath(f, "serving-stacks", dir, "rank0_raw.safetensors"))
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add(safetensorsBytes("100_3", "I32", []int{2, 2}, le32(0, 1, 1, 0), "100_4", "I32", []int{2, 2}, le32(1, 0, 0, 1)))
	// Slots 0..3 of two layers folded onto experts 0..2. The lone token
	// file is read with the model's experts, as the CLI's --model does:
	// without them a mutated id of 1000 makes every per-token reader count
	// dense 1000² transitions, slow enough to stall the fuzzer.
	slots := [][]Expert{{0, 1, 2, 0}, {2, 1, 0, 1}}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRead(t, data, "rank0.safetensors", LoadOptions{})
		checkRead(t, data, "x.safetensors", LoadOptions{Format: FormatTRTLLM, TopK: 2})
		checkRead(t, data, "rank0_raw.safetensors", LoadOptions{Experts: 72})
		checkRead(t, data, "rank1.safetensors", LoadOptions{SlotExperts: slots})
	})
}

func FuzzMegatron(f *testing.F) {
	seedFile(f, "serving-stacks", "megatron_router_trace", "router_trace_rank0.jsonl")
	f.Add([]byte(`{"step":0,"block":"decoder","layer":1,"num_tokens":1,"topk":2,"top_indices":[[0,1]]}` + "\n" +
		`{"step":0,"block":"decoder","layer":2,"num_tokens":1,"topk":2,"top_indices":[[3,1]]}` + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRead(t, data, "router_trace_rank3.jsonl", LoadOptions{})
	})
}

func FuzzVLLMLoadStats(f *testing.F) {
	seedFile(f, "serving-stacks", "vllm_eplb_load_stats.jsonl")
	seedFile(f, "serving-stacks", "vllm_eplb_load_meta.jsonl")
	f.Add([]byte(`{"record_type":"eplb_load_meta","version":1,"num_ranks":1,"num_groups":1,"num_nodes":1,"num_layers":1,"num_redundant_experts":1}` + "\n" +
		`{"record_type":"eplb_load_stats","version":1,"step":0,"expert_load":[[1,2,3]],"p2l_map":[[0,1,0]]}` + "\n"))
	f.Add([]byte(`{"record_type":"eplb_load_stats","version":1,"step":0,"num_ranks":2,"expert_load":[[1,2,3]],"p2l_map":[[0,1,0]]}` + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRead(t, data, "stats.jsonl", LoadOptions{Format: FormatVLLMLoadStats})
	})
}

func FuzzRoutedExperts(f *testing.F) {
	seedFile(f, "serving-stacks", "sglang_routed_experts.json")
	f.Add([]byte(`{"meta_info":{"prompt_tokens":1,"completion_tokens":1,"routed_experts":"AAAAAAEAAAACAAAAAwAAAA=="}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRead(t, data, "r.json", LoadOptions{Format: FormatSGLangRoutedExperts, TopK: 2})
		checkRead(t, data, "r.json", LoadOptions{Format: FormatSGLangRoutedExperts, TopK: 1, ModelLayers: 2})
	})
}

func FuzzMoetunerStats(f *testing.F) {
	src, err := Load(testdataPath(f, "serving-stacks", "sglang_per_pass_0.pt"), LoadOptions{})
	require.NoError(f, err)
	var buf bytes.Buffer
	require.NoError(f, WriteStats(&buf, src.Stats, StatsMoetuner))
	f.Add(buf.Bytes())
	tr, err := Load(testdataPath(f, "flame-moe-290m", "csv-sample"), LoadOptions{})
	require.NoError(f, err)
	buf.Reset()
	require.NoError(f, WriteStats(&buf, tr.Stats, StatsMoetuner))
	if buf.Len() <= maxFuzzInput {
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRead(t, data, "s.json", LoadOptions{})
		checkRead(t, data, "s.json", LoadOptions{Format: FormatMoetunerStats})
	})
}

func FuzzNPYSources(f *testing.F) {
	f.Add(npyBytes("<i2", []int{3}, []int64{0, 1, -1}))
	f.Add(npyBytes("<i8", []int{3}, []int64{2, 0, 7}))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxFuzzInput {
			t.Skip()
		}
		src, err := readNPYInts(bytes.NewReader(data), "s.source.npy", 3)
		if err != nil {
			var pe *ParseError
			require.ErrorAs(t, err, &pe)
			return
		}
		require.Len(t, src, 3)
		for _, r := range src {
			require.GreaterOrEqual(t, r, int32(-1))
		}
	})
}
