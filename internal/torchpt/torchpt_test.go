package torchpt

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func openBytes(t testing.TB, b []byte) (*File, error) {
	t.Helper()
	return Open(bytes.NewReader(b), int64(len(b)), Options{})
}

func openPath(t testing.TB, path string) *File {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	f, err := openBytes(t, b)
	require.NoError(t, err, path)
	return f
}

func get(t testing.TB, d any, key string) any {
	t.Helper()
	dict, ok := d.(*Dict)
	require.True(t, ok, "want a dict, got %T", d)
	v, ok := dict.Get(key)
	require.True(t, ok, "key %q missing", key)
	return v
}

func ints(t testing.TB, v any) ([]int, []int64) {
	t.Helper()
	ten, ok := v.(*Tensor)
	require.True(t, ok, "want a tensor, got %T", v)
	x, err := ten.Int64s()
	require.NoError(t, err)
	return ten.Shape, x
}

// TestReadTorchWritten reads a file real PyTorch 1.13 wrote with every
// storage type, views (offset, transposed, expanded) and nested containers.
// A wrong stride walk, a dropped offset or a byte-order slip changes a
// value and fails here.
func TestReadTorchWritten(t *testing.T) {
	f := openPath(t, filepath.Join("testdata", "mixed.pt"))
	r := f.Root
	assert.Equal(t, "mixed", f.Name)
	assert.Equal(t, []any{int64(0), int64(255), int64(256), int64(65535), int64(65536), int64(-1), int64(-1 << 31), int64(1 << 31), int64(1 << 40), int64(-(1 << 40))}, get(t, r, "ints"))
	assert.Equal(t, "h\u00e9llo", get(t, r, "text"))
	assert.Equal(t, true, get(t, r, "flag"))
	assert.Nil(t, get(t, r, "none"))
	assert.Equal(t, 1.5, get(t, r, "real"))
	assert.Equal(t, Tuple{int64(1), "two"}, get(t, r, "pair"))
	for _, c := range []struct {
		key   string
		dtype DType
		shape []int
		want  []int64
	}{
		{"t64", Int64, []int{2, 3}, []int64{0, 1, 2, 3, 4, 5}},
		{"t32", Int32, []int{2, 2}, []int64{-1, 2, 3, -4}},
		{"transposed", Int16, []int{4, 3}, []int64{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}},
		{"column", Int16, []int{3}, []int64{1, 5, 9}},
		{"tail", Int64, []int{4}, []int64{6, 7, 8, 9}},
		{"head", Int64, []int{3}, []int64{0, 1, 2}},
		{"expanded", Int8, []int{5}, []int64{7, 7, 7, 7, 7}},
		{"mask", Bool, []int{3}, []int64{1, 0, 1}},
		{"bytes", Uint8, []int{3}, []int64{0, 200, 255}},
		{"scalar", Int64, []int{}, []int64{42}},
		{"empty", Int32, []int{0, 3}, []int64{}},
	} {
		t.Run(c.key, func(t *testing.T) {
			ten := get(t, r, c.key).(*Tensor)
			assert.Equal(t, c.dtype, ten.DType)
			shape, v := ints(t, ten)
			assert.Equal(t, c.shape, shape)
			assert.Equal(t, c.want, v)
		})
	}
	assert.Equal(t, get(t, r, "tail").(*Tensor).StorageKey(), get(t, r, "head").(*Tensor).StorageKey(), "views of one storage share it")
	for key, want := range map[string][]float64{"f32": {0.5, -2}, "f64": {1e-3}, "f16": {1, -0.25, 65504}, "bf16": {3, -0.5}} {
		v, err := get(t, r, key).(*Tensor).Float64s()
		require.NoError(t, err)
		assert.Equal(t, want, v, key)
	}
	_, err := get(t, r, "f32").(*Tensor).Int64s()
	assert.ErrorContains(t, err, "torchpt: float32 tensor: not an integer tensor")
	nested := get(t, get(t, r, "nested"), "list").([]any)
	_, v := ints(t, nested[0])
	assert.Equal(t, []int64{5, 6}, v)
	assert.Equal(t, []any{int64(1), []any{int64(2), []any{int64(3)}}}, nested[1])
}

// TestReadServingStackFixtures reads the SGLang dumps (written by torch.save
// on tensors tagged cuda:0) and checks their declared structure.
func TestReadServingStackFixtures(t *testing.T) {
	dir := sharedFixtures(t)
	stat := openPath(t, filepath.Join(dir, "sglang_stat.pt"))
	shape, lc := ints(t, get(t, stat.Root, "logical_count"))
	assert.Equal(t, []int{32, 10, 64}, shape)
	var total int64
	for _, x := range lc {
		total += x
	}
	assert.Equal(t, int64(1024*6*8), total, "1024 tokens × top-6 × 8 MoE layers")

	loc := openPath(t, filepath.Join(dir, "sglang_init_expert_location.pt"))
	shape, m := ints(t, get(t, loc.Root, "physical_to_logical_map"))
	assert.Equal(t, []int{10, 72}, shape)
	for _, x := range m {
		assert.True(t, x >= 0 && x < 64)
	}
	assert.Equal(t, []int64{0, 1, 2, 3}, m[:4], "dense layer 0 is arange(72) % 64")
	assert.Equal(t, []int64{0, 1, 2, 3, 4, 5, 6, 7}, m[64:72], "dense layer 0 wraps at 64")

	tok := openPath(t, filepath.Join(dir, "sglang_per_token_0.pt"))
	recs := get(t, tok.Root, "records").([]any)
	require.Len(t, recs, 7)
	shape, ids := ints(t, get(t, recs[0], "topk_ids_of_layer"))
	assert.Equal(t, []int{10, 64, 8}, shape)
	assert.Equal(t, int64(-1), ids[0], "dense layer 0 is all -1")
	assert.Equal(t, int64(64), int64(len(get(t, recs[0], "input_ids").([]any))))
}

// sharedFixtures finds ../shared/fixtures/serving-stacks above the working
// directory or skips.
func sharedFixtures(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		p := filepath.Join(dir, "shared", "fixtures", "serving-stacks")
		if _, err := os.Stat(p); err == nil {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skip("shared serving-stack fixtures not present")
		}
		dir = parent
	}
}

// TestWriteRoundTrip writes every kind Write takes and reads it back.
func TestWriteRoundTrip(t *testing.T) {
	t64, err := NewInt64([]int{2, 3}, []int64{0, -1, 1 << 40, 3, 4, 5})
	require.NoError(t, err)
	t32, err := NewInt32([]int{3}, []int32{7, -8, 9})
	require.NoError(t, err)
	value := map[string]any{
		"b": []any{int64(1), -300, int32(70000), int64(-1 << 50), "s", nil, true, false, 2.5, Tuple{1, 2, 3, 4}, Tuple{}},
		"a": &Dict{Keys: []any{"x", int64(3)}, Values: []any{t64, []int{1, 2}}},
		"c": t32,
	}
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, "roundtrip", value))
	var again bytes.Buffer
	require.NoError(t, Write(&again, "roundtrip", value))
	assert.Equal(t, buf.Bytes(), again.Bytes(), "deterministic bytes")

	zr, err := zip.NewReader(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	require.NoError(t, err)
	for _, zf := range zr.File {
		off, err := zf.DataOffset()
		require.NoError(t, err)
		assert.Zero(t, off%64, "%s data at %d, want 64-byte aligned", zf.Name, off)
		assert.Equal(t, zip.Store, zf.Method)
	}
	f, err := openBytes(t, buf.Bytes())
	require.NoError(t, err)
	d := f.Root.(*Dict)
	assert.Equal(t, []any{"a", "b", "c"}, d.Keys, "map keys sorted")
	assert.Equal(t, []any{int64(1), int64(-300), int64(70000), int64(-1 << 50), "s", nil, true, false, 2.5, Tuple{int64(1), int64(2), int64(3), int64(4)}, Tuple{}}, get(t, d, "b"))
	shape, v := ints(t, get(t, get(t, d, "a"), "x"))
	assert.Equal(t, []int{2, 3}, shape)
	assert.Equal(t, []int64{0, -1, 1 << 40, 3, 4, 5}, v)
	inner, _ := get(t, d, "a").(*Dict).Get(int64(3))
	assert.Equal(t, []any{int64(1), int64(2)}, inner)
	_, v = ints(t, get(t, d, "c"))
	assert.Equal(t, []int64{7, -8, 9}, v)
}

func TestWriteErrors(t *testing.T) {
	for _, c := range []struct {
		name  string
		value any
		want  string
	}{
		{"bad type", map[string]any{"x": struct{}{}}, "torchpt: cannot write a struct {}"},
		{"bad key", &Dict{Keys: []any{[]any{}}, Values: []any{1}}, "torchpt: dict key of type []interface {}"},
		{"ragged dict", &Dict{Keys: []any{"a"}}, "torchpt: dict with 1 keys and 0 values"},
		{"bad utf-8", "\xff", "torchpt: string \"\\xff\" is not valid UTF-8"},
		{"nil tensor", (*Tensor)(nil), "torchpt: nil *Tensor"},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.ErrorContains(t, Write(&bytes.Buffer{}, "x", c.value), c.want)
		})
	}
	assert.ErrorContains(t, Write(&bytes.Buffer{}, "a/b", nil), "torchpt: archive name \"a/b\" must be non-empty and hold no slash")
	_, err := NewInt64([]int{2, 2}, []int64{1})
	assert.ErrorContains(t, err, "torchpt: 1 values for shape [2 2], want 4")
}

// torchPython returns a Python interpreter that imports torch, or skips.
func torchPython(t testing.TB) string {
	t.Helper()
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(p, "-c", "import torch").Run() == nil {
			return p
		}
	}
	t.Skip("no python3 with torch (apt-get install python3-torch)")
	return ""
}

// TestWriteLoadsInTorch checks that real torch.load(weights_only=True)
// accepts what Write writes, including the exact structure of SGLang's
// --init-expert-location file, and sees the same values.
func TestWriteLoadsInTorch(t *testing.T) {
	py := torchPython(t)
	dir := t.TempDir()
	const L, P, E = 5, 12, 8
	p2l := make([]int64, L*P)
	for l := range L {
		for p := range P {
			p2l[l*P+p] = int64((p*(l+1) + l) % E)
		}
	}
	m, err := NewInt64([]int{L, P}, p2l)
	require.NoError(t, err)
	c, err := NewInt32([]int{2, 2}, []int32{1, -2, 3, 1 << 30})
	require.NoError(t, err)
	files := map[string]any{
		"init_expert_location.pt": map[string]any{"physical_to_logical_map": m},
		"mixed.pt": &Dict{Keys: []any{"ints", "text", "counts", "flags", "tuple", "nested"}, Values: []any{
			[]any{0, 255, 256, 65536, -1, int64(1) << 40, int64(-1) << 40}, "moe",
			c, []any{true, false, nil}, Tuple{1, Tuple{2}}, map[string]any{"l": []int{3, 4}},
		}},
	}
	for name, v := range files {
		var buf bytes.Buffer
		require.NoError(t, Write(&buf, strings.TrimSuffix(name, ".pt"), v))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), buf.Bytes(), 0o644))
	}
	script := `
import json, sys, torch
def plain(v):
    if isinstance(v, torch.Tensor):
        return {"dtype": str(v.dtype), "shape": list(v.shape), "values": v.flatten().tolist()}
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v
out = {}
for name in sys.argv[1:]:
    out[name] = plain(torch.load(name, weights_only=True))
print(json.dumps(out))
`
	cmd := exec.Command(py, "-c", script, "init_expert_location.pt", "mixed.pt")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	var got map[string]any
	require.NoError(t, json.Unmarshal(out, &got))
	want := map[string]any{
		"init_expert_location.pt": map[string]any{"physical_to_logical_map": tensorJSON("torch.int64", []int{L, P}, p2l)},
		"mixed.pt": map[string]any{
			"ints":   []any{0., 255., 256., 65536., -1., float64(int64(1) << 40), float64(int64(-1) << 40)},
			"text":   "moe",
			"counts": tensorJSON("torch.int32", []int{2, 2}, []int64{1, -2, 3, 1 << 30}),
			"flags":  []any{true, false, nil},
			"tuple":  []any{1., []any{2.}},
			"nested": map[string]any{"l": []any{3., 4.}},
		},
	}
	assert.Equal(t, want, got)
}

func tensorJSON(dtype string, shape []int, v []int64) map[string]any {
	s := make([]any, len(shape))
	for i, d := range shape {
		s[i] = float64(d)
	}
	vals := make([]any, len(v))
	for i, x := range v {
		vals[i] = float64(x)
	}
	return map[string]any{"dtype": dtype, "shape": s, "values": vals}
}

// TestReadVendoredInitLocation reads the vendored --init-expert-location
// file made by torch.save, so CI without torch still checks a real file.
func TestReadVendoredInitLocation(t *testing.T) {
	f := openPath(t, filepath.Join("testdata", "init_expert_location.pt"))
	shape, v := ints(t, get(t, f.Root, "physical_to_logical_map"))
	assert.Equal(t, []int{4, 6}, shape)
	assert.Equal(t, []int64{0, 1, 2, 3, 0, 1, 2, 0, 3, 1, 2, 0}, v[:12])
}
