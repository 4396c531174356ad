package routing

import (
	"archive/zip"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/internal/torchpt"
)

// ptBytes writes v as a torch.save archive.
func ptBytes(t testing.TB, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, torchpt.Write(&buf, "x", v))
	return buf.Bytes()
}

func i32(t testing.TB, shape []int, v []int32) *torchpt.Tensor {
	t.Helper()
	ten, err := torchpt.NewInt32(shape, v)
	require.NoError(t, err)
	return ten
}

func i64(t testing.TB, shape []int, v []int64) *torchpt.Tensor {
	t.Helper()
	ten, err := torchpt.NewInt64(shape, v)
	require.NoError(t, err)
	return ten
}

// perToken builds a per_token dump of L_all = 3 layers (layer 0 dense),
// P = 6 slots mapping to 4 experts (slots 4, 5 copy experts 0, 1), top-2
// padded to width 4: token t of a record routes to slots ids(l, t).
type perToken struct {
	rank   int
	passes int
	tokens int
	ids    func(pass, l, t int) []int32 // nil: the default routing
}

func (p perToken) bytes(t testing.TB) []byte {
	const L, W = 3, 4
	var recs []any
	for pass := range p.passes {
		v := make([]int32, L*p.tokens*W)
		for i := range v {
			v[i] = -1
		}
		for l := 1; l < L; l++ {
			for tok := range p.tokens {
				ids := []int32{int32((tok + l) % 4), int32((tok + l + 1) % 4)}
				if p.ids != nil {
					ids = p.ids(pass, l, tok)
				}
				copy(v[(l*p.tokens+tok)*W:], ids)
			}
		}
		recs = append(recs, map[string]any{
			"forward_pass_id": 2*pass + p.rank, "rank": p.rank, "gatherer_key": "primary",
			"topk_ids_of_layer": i32(t, []int{L, p.tokens, W}, v),
		})
	}
	return ptBytes(t, map[string]any{
		"records":                      recs,
		"last_physical_to_logical_map": i64(t, []int{L, 6}, []int64{0, 1, 2, 3, 0, 1, 0, 1, 2, 3, 0, 1, 0, 1, 2, 3, 0, 1}),
	})
}

// rawPT is an archive with the given pickle and no storages.
func rawPT(t testing.TB, pkl string) []byte {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	w, err := zw.CreateRaw(&zip.FileHeader{Name: "x/data.pkl", Method: zip.Store, CRC32: crc32.ChecksumIEEE([]byte(pkl)),
		CompressedSize64: uint64(len(pkl)), UncompressedSize64: uint64(len(pkl))})
	require.NoError(t, err)
	_, err = w.Write([]byte(pkl))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

// TestSGLangBadInput checks the exact error of each broken or hostile
// SGLang dump; several files are written into one directory, read as one
// trace.
func TestSGLangBadInput(t *testing.T) {
	good, err := os.ReadFile(testdataPath(t, "serving-stacks", "sglang_per_token_0.pt"))
	require.NoError(t, err)
	stat := func(v *torchpt.Tensor) []byte { return ptBytes(t, map[string]any{"rank": 0, "logical_count": v}) }
	float32Tensor := func() *torchpt.Tensor {
		// A float tensor read back from a file torch wrote.
		f, err := os.ReadFile(filepath.Join(repoRoot(t), "internal", "torchpt", "testdata", "mixed.pt"))
		require.NoError(t, err)
		pf, err := torchpt.Open(bytes.NewReader(f), int64(len(f)), torchpt.Options{})
		require.NoError(t, err)
		v, _ := pf.Root.(*torchpt.Dict).Get("f32")
		return v.(*torchpt.Tensor)
	}
	for _, c := range []struct {
		name  string
		files map[string][]byte
		opts  LoadOptions
		want  string
	}{
		{"truncated zip", map[string][]byte{"a.pt": good[:len(good)/2]}, LoadOptions{}, "a.pt: reading the zip archive: zip: not a valid zip file (the file is truncated or not a torch.save file)"},
		{"pickle calls os.system", map[string][]byte{"a.pt": rawPT(t, "\x80\x02cposix\nsystem\nX\x02\x00\x00\x00ls\x85R.")}, LoadOptions{}, "a.pt: pickle calls posix.system: not a tensor-only file"},
		{"not a dump", map[string][]byte{"a.pt": ptBytes(t, map[string]any{"weights": 1})}, LoadOptions{}, "a.pt: not an SGLang expert-distribution dump: want \"logical_count\" (stat mode) or \"records\" and \"last_physical_to_logical_map\" (per_pass, per_token), got keys [weights]"},
		{"not a dict", map[string][]byte{"a.pt": ptBytes(t, []any{1})}, LoadOptions{}, "a.pt: the saved object is a list, not a dict"},
		{"placement file", map[string][]byte{"a.pt": ptBytes(t, map[string]any{"physical_to_logical_map": i64(t, []int{1, 2}, []int64{0, 1})})}, LoadOptions{}, "a.pt: physical_to_logical_map: this is a placement file (--init-expert-location), not a routing trace"},
		{"wrong dtype", map[string][]byte{"a.pt": stat(float32Tensor())}, LoadOptions{}, "a.pt: logical_count: dtype float32, want an integer tensor"},
		{"wrong rank", map[string][]byte{"a.pt": stat(i32(t, []int{2}, []int32{1, 2}))}, LoadOptions{}, "a.pt: logical_count: shape [2], want 3 dimensions"},
		{"negative count", map[string][]byte{"a.pt": stat(i32(t, []int{1, 1, 2}, []int32{3, -1}))}, LoadOptions{}, "a.pt: logical_count[0][0][1]: count -1 is negative"},
		{"all zero", map[string][]byte{"a.pt": stat(i32(t, []int{2, 1, 2}, []int32{0, 0, 0, 0}))}, LoadOptions{}, "every layer is all zeros: no token was recorded"},
		{"experts disagree", map[string][]byte{"a.pt": stat(i32(t, []int{1, 1, 2}, []int32{1, 1}))}, LoadOptions{Experts: 4}, "a.pt: logical_count: 2 experts, but LoadOptions.Experts is 4"},
		{"physical id out of range", map[string][]byte{"a.pt": perToken{passes: 1, tokens: 3, ids: func(_, l, tok int) []int32 {
			if tok == 2 && l == 2 {
				return []int32{1, 99}
			}
			return []int32{0, 1}
		}}.bytes(t)}, LoadOptions{}, "a.pt: records[0].topk_ids_of_layer[2][2][1]: physical slot 99 out of range [0,6)"},
		{"logical id out of range", map[string][]byte{"a.pt": perToken{passes: 1, tokens: 2}.bytes(t)}, LoadOptions{Experts: 3}, "a.pt: last_physical_to_logical_map[0][3]: logical expert 3 out of range [0,3)"},
		{"copies of one expert", map[string][]byte{"a.pt": perToken{passes: 1, tokens: 2, ids: func(_, _, _ int) []int32 { return []int32{0, 4} }}.bytes(t)}, LoadOptions{}, "a.pt: records[0].topk_ids_of_layer[1][0] (mapped to logical ids): expert 0 appears twice in the token's top-k"},
		{"ragged padding", map[string][]byte{"a.pt": perToken{passes: 1, tokens: 2, ids: func(_, l, tok int) []int32 {
			if l == 1 && tok == 1 {
				return []int32{2, -1}
			}
			return []int32{2, 3}
		}}.bytes(t)}, LoadOptions{}, "a.pt: records[0].topk_ids_of_layer: layer 1 has 3 ids for 2 tokens: every token of a MoE layer needs the same top-k (-1 only as padding)"},
		{"top-k differs across ranks", map[string][]byte{
			"a_0.pt": perToken{rank: 0, passes: 1, tokens: 2}.bytes(t),
			"a_1.pt": perToken{rank: 1, passes: 1, tokens: 2, ids: func(_, _, tok int) []int32 { return []int32{int32(tok)} }}.bytes(t),
		}, LoadOptions{}, "a_1.pt: records[0].topk_ids_of_layer: top-k 1, but "},
		{"layers differ across files", map[string][]byte{
			"a_0.pt": perToken{rank: 0, passes: 1, tokens: 2}.bytes(t),
			"a_1.pt": perToken{rank: 1, passes: 1, tokens: 2, ids: func(_, l, tok int) []int32 {
				if l == 1 {
					return []int32{-1, -1}
				}
				return []int32{0, 1}
			}}.bytes(t),
		}, LoadOptions{}, "a_1.pt: records[0].topk_ids_of_layer: MoE layers [2], but "},
		{"modes mixed", map[string][]byte{
			"a_0.pt": perToken{passes: 1, tokens: 2}.bytes(t),
			"b.pt":   stat(i32(t, []int{1, 1, 2}, []int32{1, 1})),
		}, LoadOptions{}, "b.pt: a stat dump, but "},
		{"records not a list", map[string][]byte{"a.pt": ptBytes(t, map[string]any{"records": map[string]any{}, "last_physical_to_logical_map": i64(t, []int{1, 2}, []int64{0, 1})})}, LoadOptions{}, "a.pt: records: is a dict, want a list of dicts"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, b := range c.files {
				require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
			}
			path := dir
			if len(c.files) == 1 {
				for name := range c.files {
					path = filepath.Join(dir, name)
				}
			}
			src, err := Load(path, c.opts)
			require.Error(t, err)
			assert.Nil(t, src)
			var pe *ParseError
			assert.ErrorAs(t, err, &pe)
			assert.Contains(t, err.Error(), c.want)
			assert.True(t, strings.HasPrefix(err.Error(), "routing: "), err.Error())
		})
	}
}

// TestSGLangSharedStorage refuses a dump whose records share one tensor,
// which would let a small file claim a huge trace.
func TestSGLangSharedStorage(t *testing.T) {
	// torchpt.Write gives every tensor its own storage, so the sharing is
	// crafted by hand: both records' topk_ids_of_layer use storage "0".
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	tensor := "ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nIntStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQK\x00K\x02K\x01K\x02\x87K\x02K\x02K\x01\x87\x89ccollections\nOrderedDict\n)RtR"
	pmap := "ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nLongStorage\nX\x01\x00\x00\x001X\x03\x00\x00\x00cpuK\x04tQK\x00K\x02K\x02\x86K\x02K\x01\x86\x89ccollections\nOrderedDict\n)RtR"
	rec2 := func(pass byte) string {
		return "}(X\x11\x00\x00\x00topk_ids_of_layer" + tensor + "X\x0f\x00\x00\x00forward_pass_idK" + string([]byte{pass}) + "u"
	}
	pkl := "\x80\x02}(X\x07\x00\x00\x00records](" + rec2(0) + rec2(1) + "eX\x1c\x00\x00\x00last_physical_to_logical_map" + pmap + "u."
	for _, e := range []struct {
		name string
		data []byte
	}{{"x/data.pkl", []byte(pkl)}, {"x/data/0", le32(-1, -1, 0, 1)}, {"x/data/1", le64s(0, 1, 0, 1)}} {
		w, err := zw.CreateRaw(&zip.FileHeader{Name: e.name, Method: zip.Store, CRC32: crc32.ChecksumIEEE(e.data), CompressedSize64: uint64(len(e.data)), UncompressedSize64: uint64(len(e.data))})
		require.NoError(t, err)
		_, err = w.Write(e.data)
		require.NoError(t, err)
	}
	require.NoError(t, zw.Close())
	_, err := Read(bytes.NewReader(buf.Bytes()), "a.pt", LoadOptions{})
	assert.ErrorContains(t, err, "routing: a.pt: records[1].topk_ids_of_layer: shares its data with records[0]: each pass records its own tokens")
}

func le32(v ...int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

func le64s(v ...int64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return b
}

// safetensorsBytes writes a safetensors file; entries are key, dtype,
// shape and raw data.
func safetensorsBytes(entries ...any) []byte {
	hdr := map[string]any{}
	var data []byte
	for i := 0; i < len(entries); i += 4 {
		raw := entries[i+3].([]byte)
		hdr[entries[i].(string)] = map[string]any{"dtype": entries[i+1], "shape": entries[i+2], "data_offsets": []int{len(data), len(data) + len(raw)}}
		data = append(data, raw...)
	}
	h, _ := json.Marshal(hdr)
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	return append(append(out, h...), data...)
}

func TestTRTLLMBadInput(t *testing.T) {
	good := safetensorsBytes("100_3", "I64", []int{2}, le64s(1, 2))
	for _, c := range []struct {
		name string
		file []byte
		meta string
		want string
	}{
		{"truncated header", good[:12], "", "rank0.safetensors: safetensors header of"},
		{"empty", nil, "", "rank0.safetensors: truncated safetensors file: no header length"},
		{"huge header length", append(binary.LittleEndian.AppendUint64(nil, 1<<60), '{'), "", "rank0.safetensors: safetensors header of 1152921504606846976 bytes in a file of 9: the file is truncated or not safetensors"},
		{"truncated data", good[:len(good)-4], "", "rank0.safetensors: 100_3: data_offsets [0 16] outside the 12 data bytes (the file is truncated or corrupt)"},
		{"wrong dtype", safetensorsBytes("100_3", "F32", []int{2}, le32(1, 2)), "", "rank0.safetensors: 100_3: dtype F32, want an integer type (I64 or I32)"},
		{"unknown dtype", safetensorsBytes("100_3", "C64", []int{1}, le64s(1)), "", "rank0.safetensors: 100_3: unknown dtype \"C64\""},
		{"shape vs bytes", safetensorsBytes("100_3", "I64", []int{3}, le64s(1, 2)), "", "rank0.safetensors: 100_3: shape [3] of I64 needs 24 bytes, data_offsets give 16"},
		{"huge shape", safetensorsBytes("100_3", "I64", []int{1 << 40, 1 << 40}, le64s(1, 2)), "", "rank0.safetensors: 100_3: shape [1099511627776 1099511627776] does not fit in the file"},
		{"bad key", safetensorsBytes("layer3", "I64", []int{2}, le64s(1, 2)), "", "rank0.safetensors: layer3: key is not \"{iteration}_{layer}\""},
		{"negative count", safetensorsBytes("100_3", "I64", []int{2}, le64s(1, -2)), "", "rank0.safetensors: 100_3[1]: count -2 is negative"},
		{"experts vs meta", good, `{"num_experts": 4, "num_experts_per_token": 2}`, "rank0.safetensors: 100_3: shape [2], want [4]: one count per logical expert"},
		{"bad meta", good, `{"num_experts": 4, "num_experts_per_token": 9}`, "meta_info.json:1: num_experts_per_token: 9 out of range [1,4]"},
		{"overlapping tensors", []byte(string(binary.LittleEndian.AppendUint64(nil, 117)) + `{"100_3":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},"101_3":{"dtype":"I64","shape":[2],"data_offsets":[8,24]}}` + string(le64s(1, 2, 3))), "", "rank0.safetensors: 101_3: data_offsets overlap those of 100_3: the file is corrupt"},
		{"malformed header", append(binary.LittleEndian.AppendUint64(nil, 3), "{x}"...), "", "rank0.safetensors: malformed safetensors header"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "rank0.safetensors"), c.file, 0o644))
			if c.meta != "" {
				require.NoError(t, os.WriteFile(filepath.Join(dir, "meta_info.json"), []byte(c.meta), 0o644))
			}
			_, err := Load(dir, LoadOptions{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			assert.True(t, strings.HasPrefix(err.Error(), "routing: "), err.Error())
		})
	}
}

func megatronLine(step, layer int, rows [][]int) string {
	b, _ := json.Marshal(map[string]any{"step": step, "stage": "pre_dispatch", "block": "decoder", "layer": layer, "rank": 0,
		"num_tokens": len(rows), "topk": len(rows[0]), "top_indices": rows})
	return string(b) + "\n"
}

func TestMegatronBadInput(t *testing.T) {
	ok := megatronLine(0, 2, [][]int{{0, 1}, {2, 3}}) + megatronLine(0, 3, [][]int{{1, 0}, {3, 2}})
	for _, c := range []struct {
		name  string
		files map[string]string
		opts  LoadOptions
		want  string
	}{
		{"malformed", map[string]string{"router_trace_rank0.jsonl": ok + "{\n"}, LoadOptions{}, "router_trace_rank0.jsonl:3: malformed JSON"},
		{"not a record", map[string]string{"router_trace_rank0.jsonl": `{"step": 1}` + "\n"}, LoadOptions{}, "router_trace_rank0.jsonl:1: missing \"step\", \"layer\" or \"top_indices\""},
		{"tokens differ across layers", map[string]string{"router_trace_rank0.jsonl": megatronLine(0, 2, [][]int{{0, 1}, {2, 3}}) + megatronLine(0, 3, [][]int{{1, 0}})}, LoadOptions{}, "router_trace_rank0.jsonl:2: top_indices: 1 tokens at layer 3, but step 0 has 2 at line 1"},
		{"expert out of range", map[string]string{"router_trace_rank0.jsonl": megatronLine(0, 2, [][]int{{0, 7}})}, LoadOptions{Experts: 4}, "router_trace_rank0.jsonl:1: top_indices[0][1]: expert 7 out of range [0,4)"},
		{"repeated expert", map[string]string{"router_trace_rank0.jsonl": megatronLine(0, 2, [][]int{{1, 1}})}, LoadOptions{}, "router_trace_rank0.jsonl:1: step 0 layer 2 token 0: expert 1 appears twice in the token's top-k"},
		{"layer twice", map[string]string{"router_trace_rank0.jsonl": ok + megatronLine(0, 3, [][]int{{1, 0}, {3, 2}})}, LoadOptions{}, "router_trace_rank0.jsonl:3: layer: step 0 layer 3 recorded twice: in training the layer is the index within the model chunk"},
		{"rank differs", map[string]string{"router_trace_rank1.jsonl": ok}, LoadOptions{}, "router_trace_rank1.jsonl:1: rank: 0, but the file is rank 1's"},
		{"empty rows", map[string]string{"router_trace_rank0.jsonl": `{"step":0,"layer":1,"top_indices":[[]]}` + "\n"}, LoadOptions{}, "router_trace_rank0.jsonl:1: top_indices[0]: no expert ids: each row lists the token's top-k experts"},
		{"ragged rows", map[string]string{"router_trace_rank0.jsonl": megatronLine(0, 2, [][]int{{0, 1}, {2}})}, LoadOptions{}, "router_trace_rank0.jsonl:1: top_indices[1]: 1 ids, want top-k 2"},
		{"top-k differs across files", map[string]string{
			"router_trace_rank0.jsonl": ok,
			"router_trace_rank1.jsonl": strings.ReplaceAll(megatronLine(0, 2, [][]int{{0, 1, 2}})+megatronLine(0, 3, [][]int{{0, 1, 2}}), `"rank":0`, `"rank":1`),
		}, LoadOptions{}, "router_trace_rank1.jsonl:1: step 0: top-k 3, but "},
		{"layers differ across files", map[string]string{
			"router_trace_rank0.jsonl": ok,
			"router_trace_rank1.jsonl": strings.ReplaceAll(megatronLine(0, 2, [][]int{{0, 1}}), `"rank":0`, `"rank":1`),
		}, LoadOptions{}, "router_trace_rank1.jsonl: layer: decoder layers [2], but "},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, s := range c.files {
				require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644))
			}
			_, err := Load(dir, c.opts)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func vllmLine(step int, load [][]float64, p2l [][]int) string {
	b, _ := json.Marshal(map[string]any{"record_type": "eplb_load_stats", "version": 1, "step": step, "num_ranks": 2, "expert_load": load, "p2l_map": p2l})
	return string(b) + "\n"
}

func TestVLLMBadInput(t *testing.T) {
	ok := vllmLine(0, [][]float64{{1, 2, 3}}, [][]int{{0, 1, 0}})
	for _, c := range []struct {
		name, data string
		opts       LoadOptions
		want       string
	}{
		{"no records", `{"record_type": "eplb_initial_mapping"}` + "\n", LoadOptions{}, "s.jsonl: no \"eplb_load_stats\" records"},
		{"p2l out of range", vllmLine(0, [][]float64{{1, 2}}, [][]int{{0, 5}}), LoadOptions{Experts: 2}, "s.jsonl:1: p2l_map[0][1]: logical expert 5 out of range [0,2)"},
		{"fractional load", vllmLine(0, [][]float64{{1.5, 2}}, [][]int{{0, 1}}), LoadOptions{}, "s.jsonl:1: expert_load[0][0]: 1.5 is not an integer count"},
		{"layers change", ok + vllmLine(1, [][]float64{{1, 2, 3}, {1, 1, 1}}, [][]int{{0, 1, 0}, {0, 1, 0}}), LoadOptions{}, "s.jsonl:2: 2 layers of expert_load and 2 of p2l_map, want 1 like the first record"},
		{"step twice", ok + ok, LoadOptions{}, "s.jsonl:2: step: step 0 already recorded on line 1"},
		{"experts change", ok + vllmLine(1, [][]float64{{1, 2, 3}}, [][]int{{0, 1, 2}}), LoadOptions{}, "s.jsonl:2: p2l_map: maps to 3 logical experts, earlier records to 2: set LoadOptions.Experts"},
		{"slots differ", vllmLine(0, [][]float64{{1, 2, 3}}, [][]int{{0, 1}}), LoadOptions{}, "s.jsonl:1: expert_load[0]: 3 loads and 2 p2l entries, want 3 slots"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(c.data), "s.jsonl", LoadOptions{Format: FormatVLLMLoadStats, Experts: c.opts.Experts})
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func routedJSON(ids []int32, prompt, completion int) string {
	b, _ := json.Marshal(map[string]any{"meta_info": map[string]any{"prompt_tokens": prompt, "completion_tokens": completion,
		"routed_experts": base64.StdEncoding.EncodeToString(le32(ids...))}})
	return string(b)
}

func TestRoutedExpertsBadInput(t *testing.T) {
	for _, c := range []struct {
		name, data string
		opts       LoadOptions
		want       string
	}{
		{"no payload", `{"meta_info": {}}`, LoadOptions{TopK: 2}, "r.json: [0]: no meta_info.routed_experts: send the request with return_routed_experts=true"},
		{"not base64", `{"meta_info": {"routed_experts": "!!"}}`, LoadOptions{TopK: 2}, "r.json: [0].meta_info.routed_experts: not base64"},
		{"partial int32", `{"meta_info": {"routed_experts": "AAAA"}}`, LoadOptions{TopK: 2}, "r.json: [0].meta_info.routed_experts: 3 bytes, not a whole number of int32 ids"},
		{"layers unknown", routedJSON([]int32{0, 1, 2, 3, 0, 1}, 5, 5), LoadOptions{TopK: 2}, "r.json: [0].meta_info.routed_experts: 6 ids: cannot tell positions from layers; set LoadOptions.ModelLayers"},
		{"layers do not divide", routedJSON([]int32{0, 1, 2, 3, 0, 1}, 1, 1), LoadOptions{TopK: 2, ModelLayers: 2}, "r.json: [0].meta_info.routed_experts: 6 ids do not split into positions × 2 layers × top-2"},
		{"repeated expert", routedJSON([]int32{0, 1, 3, 3}, 2, 0), LoadOptions{TopK: 2, ModelLayers: 1}, "r.json: [0].meta_info.routed_experts position 1 layer 0: expert 3 appears twice"},
		{"negative id", routedJSON([]int32{0, 1, -5, 3}, 2, 0), LoadOptions{TopK: 2, ModelLayers: 1}, "r.json: [0].meta_info.routed_experts position 1 layer 0: expert -5 out of range"},
		{"layers differ", `[` + routedJSON([]int32{0, 1, 2, 3}, 1, 1) + `,` + routedJSON([]int32{0, 1, 0, 0}, 1, 1) + `]`, LoadOptions{TopK: 2, ModelLayers: 2}, "r.json: [1].meta_info.routed_experts: MoE layers [0], but "},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.opts.Format = FormatSGLangRoutedExperts
			_, err := Read(strings.NewReader(c.data), "r.json", c.opts)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestMoetunerStatsBadInput(t *testing.T) {
	for _, c := range []struct{ name, data, want string }{
		{"schema", `{"schema": "moetuner.stats/v2", "experts": 2, "layers": [0], "load": [[1, 2]]}`, `s.json:1: schema: "moetuner.stats/v2", want "moetuner.stats/v1"`},
		{"layers vs load", `{"schema": "moetuner.stats/v1", "experts": 2, "layers": [0, 1], "load": [[1, 2]]}`, "s.json:1: layers: 2 layer ids for 1 rows of load"},
		{"negative", `{"schema": "moetuner.stats/v1", "experts": 2, "layers": [0], "load": [[1, -2]]}`, "s.json:1: routing: Load[0][1] = -2, want a finite non-negative count"},
		{"mode missing", `{"schema": "moetuner.stats/v1", "experts": 1, "layers": [0, 1], "load": [[1], [1]], "transitions": [[1]]}`, "s.json:1: transition_mode: missing: transitions need their counting mode"},
		{"huge", fmt.Sprintf(`{"schema": "moetuner.stats/v1", "experts": 32768, "layers": [0], "load": [[1]], "step_load": [%s[]]}`, strings.Repeat("[],", 3000)), "s.json:1: more than 67108864 counts: the file is too large"},
		{"experts", `{"schema": "moetuner.stats/v1", "experts": 0, "layers": [0], "load": [[1]]}`, "s.json:1: experts: 0 out of range [1,32768]"},
		{"source over load", `{"schema": "moetuner.stats/v1", "experts": 1, "layers": [0], "load": [[1]], "source_load": [[[2]]]}`, "SourceLoad summed over sources is 2 at layer 0 expert 0, more than Load 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(c.data), "s.json", LoadOptions{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}
