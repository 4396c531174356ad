package placement

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/internal/torchpt"
)

// flameLayout is the deployment of testdata/plans/stacks: 8 EP ranks,
// decoder layers 2..9 of 10 are MoE layers.
var flameLayout = Layout{GPUs: 8, ModelLayers: 10, LayerIDs: []int{2, 3, 4, 5, 6, 7, 8, 9}}

const stacksDir = "../testdata/plans/stacks"

// TestReadSGLangPTWrittenByTorch: the .pt that torch.save wrote (gen.py)
// holds the same placement as the .sglang.json written beside it, read
// with the format detected from the content and from the flag alike.
func TestReadSGLangPTWrittenByTorch(t *testing.T) {
	want, err := ReadFileWith(filepath.Join(stacksDir, "flame.sglang.json"), flameLayout)
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(stacksDir, "flame.sglang.pt"))
	require.NoError(t, err)
	for _, f := range []Format{"", FormatSGLangPT} {
		got, err := ReadWith(bytes.NewReader(data), f, flameLayout)
		require.NoError(t, err)
		assert.Equal(t, slotSets(want), slotSets(got))
		assert.Equal(t, want.Layers, got.Layers, "same slot order too")
	}
	// Without LayerIDs the ten rows cannot be told apart from eight MoE layers.
	_, err = ReadFileWith(filepath.Join(stacksDir, "flame.sglang.pt"), Layout{GPUs: 8, Layers: 8})
	assert.ErrorIs(t, err, ErrNeedLayers)
	assert.ErrorContains(t, err, "placement: sglang-pt: physical_to_logical_map has 10 rows for 8 MoE layers")
}

// TestSGLangPTRoundTrip: what moetuner writes reads back as the same plan,
// and its tensor is exactly the JSON form's map.
func TestSGLangPTRoundTrip(t *testing.T) {
	p, err := ReadFileWith(filepath.Join(stacksDir, "flame.sglang.json"), flameLayout)
	require.NoError(t, err)
	var pt, js bytes.Buffer
	require.NoError(t, WriteWith(&pt, p, FormatSGLangPT, flameLayout))
	require.NoError(t, WriteWith(&js, p, FormatSGLang, flameLayout))
	assert.Equal(t, FormatSGLangPT, detect(pt.Bytes()))
	q, err := ReadWith(bytes.NewReader(pt.Bytes()), "", flameLayout)
	require.NoError(t, err)
	assert.Equal(t, p.Layers, q.Layers)

	f, err := torchpt.Open(bytes.NewReader(pt.Bytes()), int64(pt.Len()), torchpt.Options{})
	require.NoError(t, err)
	v, ok := f.Root.(*torchpt.Dict).Get("physical_to_logical_map")
	require.True(t, ok)
	tensor := v.(*torchpt.Tensor)
	assert.Equal(t, torchpt.Int64, tensor.DType)
	assert.Equal(t, []int{10, 72}, tensor.Shape)
	vals, err := tensor.Int64s()
	require.NoError(t, err)
	var doc struct {
		M [][]int64 `json:"physical_to_logical_map"`
	}
	require.NoError(t, json.Unmarshal(js.Bytes(), &doc))
	var flat []int64
	for _, r := range doc.M {
		flat = append(flat, r...)
	}
	assert.Equal(t, flat, vals)

	// The golden two-layer plan at decoder layers 1 and 3 of 4.
	var b bytes.Buffer
	require.NoError(t, WriteWith(&b, goldenPlan(), FormatSGLangPT, goldenLayout))
	g, err := ReadWith(&b, FormatSGLangPT, Layout{GPUs: 2, ModelLayers: 4, LayerIDs: []int{1, 3}})
	require.NoError(t, err)
	assert.Equal(t, slotSets(goldenPlan()), slotSets(g))
}

// TestSGLangPTLoadsInTorch: torch.load(weights_only=True), the way SGLang
// reads --init-expert-location, loads moetuner's file to the same map.
func TestSGLangPTLoadsInTorch(t *testing.T) {
	py := ""
	for _, c := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(c, "-c", "import torch").Run() == nil {
			py = c
			break
		}
	}
	if py == "" {
		t.Skip("no python3 with torch (apt-get install python3-torch)")
	}
	p, err := ReadFileWith(filepath.Join(stacksDir, "flame.sglang.json"), flameLayout)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "init.pt")
	require.NoError(t, WriteFileWith(path, p, FormatSGLangPT, flameLayout))
	script := `import json, sys, torch
d = torch.load(sys.argv[1], weights_only=True)
m = d["physical_to_logical_map"]
print(json.dumps({"keys": sorted(d), "dtype": str(m.dtype), "rows": m.tolist()}))`
	out, err := exec.Command(py, "-c", script, path).Output()
	require.NoError(t, err)
	var got struct {
		Keys  []string
		DType string
		Rows  [][]int
	}
	require.NoError(t, json.Unmarshal(out, &got))
	want, err := os.ReadFile(filepath.Join(stacksDir, "flame.sglang.json"))
	require.NoError(t, err)
	var doc struct {
		M [][]int `json:"physical_to_logical_map"`
	}
	require.NoError(t, json.Unmarshal(want, &doc))
	assert.Equal(t, []string{"physical_to_logical_map"}, got.Keys, "SGLang passes the dict as keyword arguments: no other key")
	assert.Equal(t, "torch.int64", got.DType)
	assert.Equal(t, doc.M, got.Rows)
}

// TestReadSharedInitExpertLocation reads the serving-stack fixture that
// torch.save wrote for --init-expert-location, when it is present.
func TestReadSharedInitExpertLocation(t *testing.T) {
	path := filepath.Join("..", "..", "shared", "fixtures", "serving-stacks", "sglang_init_expert_location.pt")
	if _, err := os.Stat(path); err != nil {
		t.Skip("shared serving-stack fixtures absent")
	}
	p, err := ReadFileWith(path, flameLayout)
	require.NoError(t, err)
	assert.Equal(t, 8, len(p.Layers))
	assert.Equal(t, 64, p.Experts)
	for _, lp := range p.Layers {
		assert.Len(t, lp.SlotExpert, 72)
	}
}

// TestSGLangPTBadFiles: .pt files that are not a placement fail with what
// they hold and what a placement needs.
func TestSGLangPTBadFiles(t *testing.T) {
	save := func(v any) []byte {
		var b bytes.Buffer
		require.NoError(t, torchpt.Write(&b, "archive", v))
		return b.Bytes()
	}
	m1, err := torchpt.NewInt64([]int{4}, []int64{0, 1, 2, 0})
	require.NoError(t, err)
	counts, err := torchpt.NewInt64([]int{2, 3}, []int64{1, 2, 3, 4, 5, 6})
	require.NoError(t, err)
	l := Layout{GPUs: 2}
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"statistics", save(map[string]any{"logical_count": counts}), `placement: sglang-pt: file has "logical_count" (load statistics), not "physical_to_logical_map"; read it as routing statistics (a trace)`},
		{"other key", save(map[string]any{"x": counts}), `placement: sglang-pt: missing "physical_to_logical_map"; want {"physical_to_logical_map": int64 tensor [decoder layers, physical slots]}`},
		{"not a dict", save([]any{int64(1)}), `placement: sglang-pt: the saved object is not a dict; want {"physical_to_logical_map": int64 tensor [decoder layers, physical slots]}`},
		{"1-D", save(map[string]any{"physical_to_logical_map": m1}), "placement: sglang-pt: physical_to_logical_map: tensor has shape [4]; want [decoder layers, physical slots]"},
		{"string rows", save(map[string]any{"physical_to_logical_map": []any{"a"}}), "placement: sglang-pt: physical_to_logical_map: row 0 is string; want a list of expert ids"},
		{"truncated", save(map[string]any{"physical_to_logical_map": counts})[:40], "placement: sglang-pt: torchpt: "},
		{"expert twice on a rank", save(map[string]any{"physical_to_logical_map": []any{[]any{int64(0), int64(0), int64(1), int64(2)}}}), "placement: sglang-pt: physical_to_logical_map[0]: expert 0 is on rank 0 twice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadWith(bytes.NewReader(tc.data), FormatSGLangPT, l)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// Lists of lists (what a hand-made file might hold) read like a tensor.
	p, err := ReadWith(bytes.NewReader(save(map[string]any{"physical_to_logical_map": []any{[]any{int64(0), int64(1), int64(2), int64(0)}}})), "", l)
	require.NoError(t, err)
	assert.Equal(t, 3, p.Experts)
}
