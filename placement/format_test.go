package placement

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// goldenPlan is a small fixed plan: a replicated expert, slots that are not
// GPU-major in layer 1, and meta that needs escaping.
func goldenPlan() *Plan {
	return &Plan{
		GPUs: 2, Experts: 3, Strategy: "test",
		Layers: []LayerPlan{
			{SlotExpert: ex(0, 1, 2, 0), SlotGPU: gp(0, 0, 1, 1)},
			{SlotExpert: ex(1, 2, 0, 0), SlotGPU: gp(1, 0, 0, 1)},
		},
		Meta: map[string]string{"source": "trace.jsonl", "objective": `max "load" <1>`, "flow": "ep"},
	}
}

// goldenLayout puts goldenPlan's two layers at decoder layers 1 and 3 of
// a four-layer model, so that the files indexed by decoder layer show
// dense rows.
var goldenLayout = Layout{ModelLayers: 4, LayerIDs: []int{1, 3}}

var goldenFiles = []struct {
	format Format
	file   string
}{
	{FormatJSON, "plan.json.golden"},
	{FormatYAML, "plan.yaml.golden"},
	{FormatSGLang, "plan.sglang.json.golden"},
	{FormatEPLB, "plan.eplb.json.golden"},
	{FormatVLLMMap, "plan.vllm-map.json.golden"},
	{FormatVLLMMapping, "plan.vllm-mapping.jsonl.golden"},
	{FormatVLLMAscend, "plan.vllm-ascend.json.golden"},
	{FormatTRTLLM, "plan.trtllm.yaml.golden"},
}

// vllmGoldenPlan is a single-copy plan with the same map in every layer,
// the only kind FormatVLLM can hold.
func vllmGoldenPlan() *Plan {
	return FromAssignment(3, [][]GPU{gp(2, 0, 1, 0, 2), gp(2, 0, 1, 0, 2)}, "test")
}

func TestGoldenVLLM(t *testing.T) {
	got := encodeT(t, vllmGoldenPlan(), FormatVLLM)
	path := filepath.Join("testdata", "plan.vllm.json.golden")
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./placement -update to create it")
	assert.Equal(t, string(want), string(got))
}

// encodeT writes p in f with the zero Layout.
func encodeT(t *testing.T, p *Plan, f Format) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, Write(&b, p, f))
	return b.Bytes()
}

// encodeGolden writes p in f with goldenLayout.
func encodeGolden(t *testing.T, p *Plan, f Format) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, WriteWith(&b, p, f, goldenLayout))
	return b.Bytes()
}

func TestGolden(t *testing.T) {
	for _, gf := range goldenFiles {
		t.Run(string(gf.format), func(t *testing.T) {
			got := encodeGolden(t, goldenPlan(), gf.format)
			path := filepath.Join("testdata", gf.file)
			if *update {
				require.NoError(t, os.WriteFile(path, got, 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err, "run go test ./placement -update to create it")
			assert.Equal(t, string(want), string(got))
		})
	}
}

func TestWriteDeterministic(t *testing.T) {
	for _, gf := range goldenFiles {
		first := encodeGolden(t, goldenPlan(), gf.format)
		for range 20 {
			// A fresh map each time gives Go a chance to iterate it in a
			// different order.
			assert.Equal(t, first, encodeGolden(t, goldenPlan(), gf.format), gf.format)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	rr := roundRobin(3, 10, 4)
	rr.Meta = map[string]string{"k": "v"}
	ct := contiguous(2, 8, 4)
	plans := map[string]*Plan{"golden": goldenPlan(), "round-robin": rr, "contiguous": ct,
		"no layers": {GPUs: 1, Experts: 1, Layers: []LayerPlan{}}}
	for name, p := range plans {
		for _, f := range []Format{FormatJSON, FormatYAML} {
			t.Run(name+"/"+string(f), func(t *testing.T) {
				data := encodeT(t, p, f)
				q, err := Read(bytes.NewReader(data), f)
				require.NoError(t, err)
				assert.True(t, p.Equal(q), "got %+v", q)
				q, err = Read(bytes.NewReader(data), "")
				require.NoError(t, err, "detect")
				assert.True(t, p.Equal(q))
			})
		}
	}
	for _, name := range []string{"golden", "contiguous"} {
		p := plans[name]
		t.Run(name+"/sglang", func(t *testing.T) {
			layout := Layout{ModelLayers: len(p.Layers) + 2, LayerIDs: make([]int, len(p.Layers))}
			for i := range layout.LayerIDs {
				layout.LayerIDs[i] = i + 2
			}
			var b bytes.Buffer
			require.NoError(t, WriteWith(&b, p, FormatSGLang, layout))
			data := b.Bytes()
			layout.GPUs = p.GPUs
			q, err := ReadWith(bytes.NewReader(data), FormatSGLang, layout)
			require.NoError(t, err)
			want := p.GPUMajor()
			want.Strategy, want.Meta = "", nil
			assert.True(t, want.Equal(q), "got %+v", q)
			// Without the layer ids every row, dense ones included, is a layer.
			q, err = ReadSGLang(bytes.NewReader(data), p.GPUs)
			require.NoError(t, err)
			assert.Len(t, q.Layers, len(p.Layers)+2)
			_, err = Read(bytes.NewReader(data), "")
			assert.ErrorIs(t, err, ErrNeedGPUs)
		})
		t.Run(name+"/eplb", func(t *testing.T) {
			data := encodeT(t, p, FormatEPLB)
			want := p.GPUMajor()
			want.Strategy, want.Meta = "", nil
			for _, gpus := range []int{0, p.GPUs} {
				q, err := ReadEPLB(bytes.NewReader(data), gpus)
				require.NoError(t, err)
				assert.True(t, want.Equal(q), "got %+v", q)
			}
			for _, f := range []Format{FormatEPLB, ""} {
				q, err := Read(bytes.NewReader(data), f)
				require.NoError(t, err, "format %q", f)
				assert.True(t, want.Equal(q), "got %+v", q)
			}
			// The written maps are EPLBMaps, and they write back unchanged.
			q, err := ReadEPLB(bytes.NewReader(data), 0)
			require.NoError(t, err)
			assert.Equal(t, data, encodeT(t, q, FormatEPLB))
		})
	}
	t.Run("vllm", func(t *testing.T) {
		p := vllmGoldenPlan()
		data := encodeT(t, p, FormatVLLM)
		q, err := ReadVLLM(bytes.NewReader(data), 3, 2)
		require.NoError(t, err)
		p.Strategy = ""
		assert.True(t, p.Equal(q), "got %+v", q)
		for _, f := range []Format{FormatVLLM, ""} {
			_, err = Read(bytes.NewReader(data), f)
			assert.ErrorIs(t, err, ErrNeedGPUs)
			assert.EqualError(t, err, "placement: vllm: expert_to_ep_rank does not record the GPU count; set Layout.GPUs to the expert-parallel size")
			_, err = ReadWith(bytes.NewReader(data), f, Layout{GPUs: 3})
			assert.ErrorIs(t, err, ErrNeedLayers)
			q, err = ReadWith(bytes.NewReader(data), f, Layout{GPUs: 3, Layers: 2})
			require.NoError(t, err)
			assert.True(t, p.Equal(q))
		}
	})
}

func TestWriteVLLMErrors(t *testing.T) {
	err := Write(&bytes.Buffer{}, goldenPlan(), FormatVLLM)
	assert.EqualError(t, err, "placement: vllm: layer 0: expert 0 has 2 copies; vLLM's expert_to_ep_rank allows exactly one copy per expert, so write replicated plans in the vllm-map format (eplb_config.initial_expert_map_path)")
	p := FromAssignment(2, [][]GPU{gp(0, 1, 1), gp(0, 1, 0)}, "x")
	err = Write(&bytes.Buffer{}, p, FormatVLLM)
	assert.EqualError(t, err, "placement: vllm: layer 1 puts expert 2 on GPU 0 but layer 0 puts it on GPU 1; vLLM's expert_to_ep_rank is one map for all layers, so write per-layer plans in the vllm-map format (eplb_config.initial_expert_map_path)")
	err = Write(&bytes.Buffer{}, &Plan{GPUs: 1, Experts: 1}, FormatVLLM)
	assert.ErrorContains(t, err, "no layers")
	err = Write(&bytes.Buffer{}, &Plan{GPUs: 1, Experts: 1}, FormatEPLB)
	assert.ErrorContains(t, err, "no layers")
	err = Write(&bytes.Buffer{}, roundRobin(1, 5, 2), FormatEPLB)
	assert.ErrorContains(t, err, "every GPU needs the same number")
}

func TestReadEPLB(t *testing.T) {
	good := `{"num_gpus": 2, "phy2log": [[0,1,2,0]], "log2phy": [[[0,3],[1,-1],[2,-1]]], "logcnt": [[2,1,1]]}`
	p, err := ReadEPLB(strings.NewReader(good), 0)
	require.NoError(t, err)
	assert.Equal(t, &Plan{GPUs: 2, Experts: 3, Layers: []LayerPlan{{SlotExpert: ex(0, 1, 2, 0), SlotGPU: gp(0, 0, 1, 1)}}}, p)
	// Without num_gpus the caller says; replica order in log2phy is free.
	p, err = ReadEPLB(strings.NewReader(`{"phy2log": [[0,1,2,0]], "log2phy": [[[3,0],[1,-1],[2,-1]]], "logcnt": [[2,1,1]], "weight": [[1,2,3]]}`), 2)
	require.NoError(t, err)
	assert.Equal(t, 2, p.GPUs)

	cases := []struct {
		name, in string
		gpus     int
		want     string
	}{
		{"negative gpus", good, -1, "gpus is -1"},
		{"gpus mismatch", good, 4, "placement: eplb: the file records 2 GPUs (num_gpus) but Layout.GPUs is 4; read it for the expert-parallel size it was written for"},
		{"no gpus", `{"phy2log": [[0]], "log2phy": [[[0]]], "logcnt": [[1]]}`, 0, `missing "num_gpus"`},
		{"zero num_gpus", `{"num_gpus": 0, "phy2log": [[0]], "log2phy": [[[0]]], "logcnt": [[1]]}`, 0, "num_gpus is 0"},
		{"not json", `phy2log`, 1, "want {\"num_gpus\""},
		{"trailing", good + ` {}`, 0, "data after the top-level object"},
		{"missing phy2log", `{"num_gpus": 1, "log2phy": [], "logcnt": []}`, 0, `missing "phy2log"`},
		{"missing log2phy", `{"num_gpus": 1, "phy2log": [], "logcnt": []}`, 0, `missing "log2phy"`},
		{"missing logcnt", `{"num_gpus": 1, "phy2log": [], "log2phy": []}`, 0, `missing "logcnt"`},
		{"no rows", `{"num_gpus": 1, "phy2log": [], "log2phy": [], "logcnt": []}`, 0, "no rows"},
		{"layer counts", `{"num_gpus": 1, "phy2log": [[0]], "log2phy": [], "logcnt": [[1]]}`, 0, "phy2log has 1 layers, log2phy 0 and logcnt 1"},
		{"not multiple", `{"num_gpus": 2, "phy2log": [[0,1,2]], "log2phy": [[[0],[1],[2]]], "logcnt": [[1,1,1]]}`, 0, "3 slots, not a positive multiple of 2 GPUs"},
		{"no experts", `{"num_gpus": 1, "phy2log": [[0]], "log2phy": [[]], "logcnt": [[]]}`, 0, "0 experts"},
		{"ragged", `{"num_gpus": 1, "phy2log": [[0],[0,0]], "log2phy": [[[0]],[[0]]], "logcnt": [[1],[1]]}`, 0, "layer 1 has 2 slots, 1 logcnt and 1 log2phy entries"},
		{"expert out of range", `{"num_gpus": 1, "phy2log": [[1]], "log2phy": [[[0]]], "logcnt": [[1]]}`, 0, "phy2log[0][0] is 1"},
		{"padding", `{"num_gpus": 1, "phy2log": [[0,1]], "log2phy": [[[0],[1,-1]]], "logcnt": [[1,1]]}`, 0, "log2phy[0][1] has 2 entries but log2phy[0][0] has 1"},
		{"count mismatch", `{"num_gpus": 2, "phy2log": [[0,1]], "log2phy": [[[0],[1]]], "logcnt": [[2,1]]}`, 0, "logcnt[0][0] is 2 but expert 0 fills 1 slots"},
		{"count above X", `{"num_gpus": 2, "phy2log": [[0,0]], "log2phy": [[[0]]], "logcnt": [[2]]}`, 0, "logcnt[0][0] is 2 but log2phy rows hold 1 slots"},
		{"not padded", `{"num_gpus": 2, "phy2log": [[0,1]], "log2phy": [[[0,1],[1,-1]]], "logcnt": [[1,1]]}`, 0, "log2phy[0][0][1] is 1; entries beyond logcnt (1) must be -1"},
		{"wrong slot", `{"num_gpus": 2, "phy2log": [[0,1]], "log2phy": [[[1],[0]]], "logcnt": [[1,1]]}`, 0, "log2phy[0][0][0] is 1, not a slot of expert 0"},
		{"slot out of range", `{"num_gpus": 2, "phy2log": [[0,1]], "log2phy": [[[7],[1]]], "logcnt": [[1,1]]}`, 0, "log2phy[0][0][0] is 7"},
		{"slot twice", `{"num_gpus": 2, "phy2log": [[0,0]], "log2phy": [[[0,0]]], "logcnt": [[2]]}`, 0, "log2phy[0][0] lists slot 0 twice"},
		{"duplicate on gpu", `{"num_gpus": 1, "phy2log": [[0,0]], "log2phy": [[[0,1]]], "logcnt": [[2]]}`, 0, "expert 0 has two copies on GPU 0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadEPLB(strings.NewReader(tc.in), tc.gpus)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.True(t, strings.HasPrefix(err.Error(), "placement: "), err.Error())
		})
	}
	_, err = Read(strings.NewReader(`{"phy2log": [[0]], "log2phy": [[[0]]], "logcnt": [[1]]}`), "")
	assert.ErrorIs(t, err, ErrNeedGPUs)
}

func TestReadVLLM(t *testing.T) {
	p, err := ReadVLLM(strings.NewReader(`{"expert_to_ep_rank": [1,0,1,0], "extra": 1}`), 2, 3)
	require.NoError(t, err)
	assert.Len(t, p.Layers, 3)
	assert.Equal(t, LayerPlan{SlotExpert: ex(1, 3, 0, 2), SlotGPU: gp(0, 0, 1, 1)}, p.Layers[2])
	cases := []struct {
		name, in     string
		gpus, layers int
		want         string
	}{
		{"zero gpus", `{"expert_to_ep_rank": [0]}`, 0, 1, "gpus is 0"},
		{"zero layers", `{"expert_to_ep_rank": [0]}`, 1, 0, "layers is 0"},
		{"too many layers", `{"expert_to_ep_rank": [0]}`, 1, 1 << 20, "layers is 1048576"},
		{"not json", `[`, 1, 1, "want {\"expert_to_ep_rank\""},
		{"missing", `{"experts": [0]}`, 1, 1, `missing "expert_to_ep_rank"`},
		{"empty", `{"expert_to_ep_rank": []}`, 1, 1, "0 entries"},
		{"rank out of range", `{"expert_to_ep_rank": [0,2]}`, 2, 1, "expert_to_ep_rank[1] is 2; ranks must be in [0,2)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadVLLM(strings.NewReader(tc.in), tc.gpus, tc.layers)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestWriteSGLangErrors(t *testing.T) {
	all := func(p *Plan) Layout { return Layout{ModelLayers: len(p.Layers)} }
	p := roundRobin(1, 5, 2)
	err := WriteWith(&bytes.Buffer{}, p, FormatSGLang, all(p))
	assert.EqualError(t, err, "placement: sglang: layer 0: GPU 1 holds 2 slots but GPU 0 holds 3; SGLang puts slot p on rank p/(P/ep_size), so every GPU needs the same number of slots (add replicas or move slots)")

	p = goldenPlan()
	p.Layers[1] = LayerPlan{SlotExpert: ex(0, 1, 2, 0, 1, 2), SlotGPU: gp(0, 0, 0, 1, 1, 1)}
	err = WriteWith(&bytes.Buffer{}, p, FormatSGLang, all(p))
	assert.EqualError(t, err, "placement: sglang: layer 1 has 6 slots but layer 0 has 4; SGLang needs the same number of physical slots in every layer (add replicas)")

	err = WriteWith(&bytes.Buffer{}, &Plan{GPUs: 1, Experts: 1}, FormatSGLang, Layout{LayerIDs: []int{0}, ModelLayers: 1})
	assert.EqualError(t, err, "placement: sglang: the plan has 0 MoE layers but Layout.LayerIDs lists 1; use the Layout of the model the plan is for, or make a plan for this one")

	// Two copies of one expert on one GPU: no stack but TensorRT-LLM
	// loads that, and a Plan cannot hold it.
	p = goldenPlan()
	p.Layers[0].SlotGPU = gp(0, 0, 1, 0)
	err = WriteWith(&bytes.Buffer{}, p, FormatSGLang, goldenLayout)
	assert.EqualError(t, err, "placement: layer 0: expert 0 has two copies on GPU 0 (slot 3); remove one")

	err = Write(&bytes.Buffer{}, goldenPlan(), "csv")
	assert.ErrorContains(t, err, `unknown format "csv"`)

	bad := goldenPlan()
	bad.GPUs = 1
	var ve *ValidationError
	assert.ErrorAs(t, Write(&bytes.Buffer{}, bad, FormatJSON), &ve)
}

func TestReadErrors(t *testing.T) {
	cases := []struct {
		name, in string
		format   Format
		want     string
	}{
		{"json missing schema", `{"gpus": 1, "experts": 1, "layers": []}`, FormatJSON, `missing "schema"`},
		{"json wrong schema", `{"schema": "moetuner.placement/v9", "gpus": 1, "experts": 1, "layers": []}`, FormatJSON, `schema is "moetuner.placement/v9"`},
		{"json missing gpus", `{"schema": "moetuner.placement/v1", "experts": 1, "layers": []}`, FormatJSON, `missing "gpus"`},
		{"json missing experts", `{"schema": "moetuner.placement/v1", "gpus": 1, "layers": []}`, FormatJSON, `missing "experts"`},
		{"json missing layers", `{"schema": "moetuner.placement/v1", "gpus": 1, "experts": 1}`, FormatJSON, `missing "layers"`},
		{"json missing slot_gpu", `{"schema": "moetuner.placement/v1", "gpus": 1, "experts": 1, "layers": [{"slot_expert": [0]}]}`, FormatJSON, `layers[0]: missing "slot_gpu"`},
		{"json missing slot_expert", `{"schema": "moetuner.placement/v1", "gpus": 1, "experts": 1, "layers": [{"slot_gpu": [0]}]}`, FormatJSON, `layers[0]: missing "slot_expert"`},
		{"json unknown field", `{"schema": "moetuner.placement/v1", "gpus": 1, "experts": 1, "layers": [], "gpu": 2}`, FormatJSON, `unknown field "gpu"`},
		{"json wrong type", `{"schema": "moetuner.placement/v1", "gpus": "two", "experts": 1, "layers": []}`, FormatJSON, `gpus`},
		{"json trailing", `{"schema": "moetuner.placement/v1", "gpus": 1, "experts": 1, "layers": []} {}`, FormatJSON, `data after the top-level object`},
		{"json invalid plan", `{"schema": "moetuner.placement/v1", "gpus": 1, "experts": 2, "layers": [{"slot_expert": [0], "slot_gpu": [0]}]}`, FormatJSON, `layer 0: expert 1 has no slot`},
		{"yaml empty", ``, FormatYAML, `empty document`},
		{"yaml unknown field", "schema: moetuner.placement/v1\ngpus: 1\nexperts: 1\nlayers: []\nextra: 1\n", FormatYAML, `field extra not found`},
		{"yaml missing layers", "schema: moetuner.placement/v1\ngpus: 1\nexperts: 1\n", FormatYAML, `missing "layers"`},
		{"yaml two documents", "schema: moetuner.placement/v1\ngpus: 1\nexperts: 1\nlayers: []\n---\na: 1\n", FormatYAML, `more than one document`},
		{"sglang via Read", `{"physical_to_logical_map": [[0]]}`, FormatSGLang, `does not record the GPU count; set Layout.GPUs`},
		{"unknown format", `{}`, "csv", `unknown format "csv"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(tc.in), tc.format)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.True(t, strings.HasPrefix(err.Error(), "placement: "), err.Error())
		})
	}
}

func TestReadSGLang(t *testing.T) {
	p, err := ReadSGLang(strings.NewReader(`{"physical_to_logical_map": [[0,1,2,3],[3,2,1,0]], "other": 1}`), 2)
	require.NoError(t, err)
	assert.Equal(t, 4, p.Experts)
	assert.Equal(t, LayerPlan{SlotExpert: ex(3, 2, 1, 0), SlotGPU: gp(0, 0, 1, 1)}, p.Layers[1])

	cases := []struct {
		name, in string
		gpus     int
		want     string
	}{
		{"zero gpus", `{"physical_to_logical_map": [[0]]}`, 0, "gpus is 0"},
		{"missing", `{"x": 1}`, 1, `missing "physical_to_logical_map"`},
		{"logical_count", `{"logical_count": [[1,2]]}`, 1, `"logical_count" (load statistics)`},
		{"no rows", `{"physical_to_logical_map": []}`, 1, "no rows"},
		{"not multiple", `{"physical_to_logical_map": [[0,1,2]]}`, 2, "3 slots, not a positive multiple of 2 GPUs"},
		{"ragged", `{"physical_to_logical_map": [[0,1],[0]]}`, 1, "physical_to_logical_map[1] has 1 slots but row 0 has 2"},
		{"negative", `{"physical_to_logical_map": [[0,-1]]}`, 1, "physical_to_logical_map[0][1] is -1"},
		{"duplicate on gpu", `{"physical_to_logical_map": [[0,0,1,1]]}`, 2, "placement: sglang: physical_to_logical_map[0]: expert 0 is on rank 0 twice (slots 0 and 1 of 2 per rank); SGLang needs the copies of an expert on different ranks, so the file is wrong or for another GPU count than 2"},
		{"not json", `physical_to_logical_map`, 1, "want {\"physical_to_logical_map\""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadSGLang(strings.NewReader(tc.in), tc.gpus)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestFormatFromPath(t *testing.T) {
	cases := map[string]Format{
		"a/plan.json": FormatJSON, "PLAN.JSON": FormatJSON, "p.yaml": FormatYAML, "p.yml": FormatYAML,
		"x/p.sglang.json": FormatSGLang, "p.SGLang.json": FormatSGLang,
		"p.eplb.json": FormatEPLB, "x/P.EPLB.JSON": FormatEPLB, "p.vllm.json": FormatVLLM,
		"p.sglang.pt": FormatSGLangPT, "init.pt": FormatSGLangPT, "p.vllm-map.json": FormatVLLMMap,
		"p.vllm-mapping.jsonl": FormatVLLMMapping, "p.vllm-ascend.json": FormatVLLMAscend,
		"lb.trtllm.yaml": FormatTRTLLM, "lb.TRTLLM.yml": FormatTRTLLM,
	}
	for path, want := range cases {
		got, err := FormatFromPath(path)
		require.NoError(t, err, path)
		assert.Equal(t, want, got, path)
	}
	_, err := FormatFromPath("plan.txt")
	assert.ErrorContains(t, err, `cannot tell the format of "plan.txt"`)
}

func TestWriteFileReadFile(t *testing.T) {
	dir := t.TempDir()
	p := goldenPlan()
	for _, name := range []string{"p.json", "p.yaml", "p.yml"} {
		path := filepath.Join(dir, name)
		require.NoError(t, WriteFile(path, p, ""))
		q, err := ReadFile(path)
		require.NoError(t, err, name)
		assert.True(t, p.Equal(q), name)
	}
	// Content detection when the name says nothing.
	path := filepath.Join(dir, "plan.out")
	require.NoError(t, WriteFile(path, p, FormatYAML))
	q, err := ReadFile(path)
	require.NoError(t, err)
	assert.True(t, p.Equal(q))

	path = filepath.Join(dir, "p.sglang.json")
	assert.ErrorIs(t, WriteFile(path, p, ""), ErrNeedLayers)
	require.NoError(t, WriteFileWith(path, p, "", goldenLayout))
	_, err = ReadFile(path)
	assert.ErrorIs(t, err, ErrNeedGPUs)
	q, err = ReadFileWith(path, Layout{GPUs: 2, ModelLayers: 4, LayerIDs: []int{1, 3}})
	require.NoError(t, err)
	assert.Equal(t, p.GPUMajor().Layers, q.Layers)

	path = filepath.Join(dir, "p.eplb.json")
	require.NoError(t, WriteFile(path, p, ""))
	q, err = ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, p.GPUMajor().Layers, q.Layers)

	path = filepath.Join(dir, "p.vllm.json")
	v := vllmGoldenPlan()
	require.NoError(t, WriteFile(path, v, ""))
	_, err = ReadFile(path)
	assert.ErrorIs(t, err, ErrNeedGPUs)
	assert.Error(t, WriteFile(path, p, ""), "replicated plan in vllm format")

	_, err = ReadFile(filepath.Join(dir, "missing.json"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.Error(t, WriteFile(filepath.Join(dir, "p.txt"), p, ""))

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		assert.False(t, strings.Contains(e.Name(), ".tmp-"), "temp file left: %s", e.Name())
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "plan.json")
	old := []byte("old content\n")
	require.NoError(t, os.WriteFile(path, old, 0o644))

	t.Run("plan fails to encode", func(t *testing.T) {
		bad := goldenPlan()
		bad.Layers[0].SlotGPU[0] = 7
		var ve *ValidationError
		require.ErrorAs(t, WriteFile(path, bad, FormatJSON), &ve)
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, old, got)
		assert.Equal(t, []string{"plan.json"}, listDir(t, dir))
	})
	t.Run("sglang shape fails", func(t *testing.T) {
		require.Error(t, WriteFileWith(path, roundRobin(1, 5, 2), FormatSGLang, Layout{ModelLayers: 1}))
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, old, got)
		assert.Equal(t, []string{"plan.json"}, listDir(t, dir))
	})
	t.Run("rename fails", func(t *testing.T) {
		// Renaming a file over a non-empty directory fails even for root,
		// unlike writing into a read-only directory.
		target := filepath.Join(dir, "sub")
		require.NoError(t, os.Mkdir(target, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(target, "keep"), old, 0o644))
		err := WriteFile(target, goldenPlan(), FormatJSON)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "placement: write ")
		assert.Equal(t, []string{"plan.json", "sub"}, listDir(t, dir))
		assert.Equal(t, []string{"keep"}, listDir(t, target))
		require.NoError(t, os.RemoveAll(target))
	})
	t.Run("missing directory", func(t *testing.T) {
		err := WriteFile(filepath.Join(dir, "nope", "plan.json"), goldenPlan(), FormatJSON)
		assert.ErrorIs(t, err, os.ErrNotExist)
	})
	t.Run("success replaces", func(t *testing.T) {
		require.NoError(t, WriteFile(path, goldenPlan(), FormatJSON))
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, encodeT(t, goldenPlan(), FormatJSON), got)
		assert.Equal(t, []string{"plan.json"}, listDir(t, dir))
		st, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o644), st.Mode().Perm())
	})
}

// roundRobin and contiguous build the two simplest baselines (package
// baseline has them; placement's tests cannot import it).
func roundRobin(layers, experts, gpus int) *Plan {
	row := make([]GPU, experts)
	for e := range row {
		row[e] = GPU(e % gpus)
	}
	return FromAssignment(gpus, sameEveryLayer(layers, row), "round-robin")
}

func contiguous(layers, experts, gpus int) *Plan {
	row := make([]GPU, experts)
	for e := range row {
		row[e] = GPU(e / (experts / gpus))
	}
	return FromAssignment(gpus, sameEveryLayer(layers, row), "contiguous")
}
