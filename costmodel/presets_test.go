package costmodel

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPresetsValidate(t *testing.T) {
	require.Equal(t, []string{"h100x8", "h200x8"}, ClusterNames())
	for _, name := range ClusterNames() {
		c, err := ClusterPreset(name)
		require.NoError(t, err)
		assert.NoError(t, c.Validate(), name)
		assert.Equal(t, 8, c.GPUs())
		assert.Equal(t, 3*time.Microsecond, c.NVLinkLatency)
		assert.Equal(t, 8*time.Microsecond, c.NICLatency)
	}
	require.Equal(t, []string{"deepseek-v3", "flame-moe-290m", "mixtral-8x7b", "olmoe-1b-7b", "qwen3-235b-a22b"}, ModelNames())
	for _, name := range ModelNames() {
		m, err := ModelPreset(name)
		require.NoError(t, err)
		assert.NoError(t, m.Validate(), name)
		assert.Equal(t, name, m.Name)
	}
	mix, _ := ModelPreset("mixtral-8x7b")
	assert.Equal(t, 8192.0, mix.TokenBytes()) // 4096 × bf16

	h200, _ := ClusterPreset("h200x8")
	assert.Equal(t, 100e9, h200.NICBytesPerSec())
	assert.Equal(t, 450e9, h200.NVLinkBytesPerSec())

	two, err := ClusterPreset("2xh100x8")
	require.NoError(t, err)
	assert.Equal(t, "2xh100x8", two.Name)
	assert.Equal(t, 16, two.GPUs())
	assert.NoError(t, two.Validate())
	assert.Equal(t, "h100x8", two.WithNodes(1).Name)
	assert.Equal(t, "4xh100x8", two.WithNodes(4).Name)

	_, err = ClusterPreset("a100x8")
	assert.ErrorContains(t, err, `unknown cluster preset "a100x8" (have h100x8, h200x8`)
	_, err = ModelPreset("gpt")
	assert.ErrorContains(t, err, `unknown model preset "gpt"`)
}

// TestMoELayers checks each preset's decoder-layer ids of its MoE layers
// against the model's config (num_hidden_layers, first_k_dense_replace); a
// preset that counted its dense layers at the end, or forgot them, fails.
func TestMoELayers(t *testing.T) {
	want := map[string]struct{ decoder, first int }{
		"deepseek-v3":     {61, 3},
		"qwen3-235b-a22b": {94, 0},
		"mixtral-8x7b":    {32, 0},
		"olmoe-1b-7b":     {16, 0},
		"flame-moe-290m":  {10, 2},
	}
	require.Len(t, want, len(ModelNames()))
	for name, w := range want {
		m, err := ModelPreset(name)
		require.NoError(t, err)
		assert.Equal(t, w.decoder, m.DecoderLayers, name)
		ids := m.MoELayers()
		require.Len(t, ids, m.Layers, name)
		for i, id := range ids {
			assert.Equal(t, w.first+i, id, "%s MoE layer %d", name, i)
		}
	}
	m := Model{Layers: 2, DecoderLayers: 5, MoELayerIDs: []int{1, 3}}
	assert.Equal(t, []int{1, 3}, m.MoELayers())
	m.MoELayers()[0] = 7
	assert.Equal(t, []int{1, 3}, m.MoELayerIDs, "MoELayers returns a copy")
	assert.Nil(t, Model{Layers: 2}.MoELayers(), "unknown decoder layers")
	assert.Nil(t, Model{Layers: 3, DecoderLayers: 2}.MoELayers(), "inconsistent")

	// The YAML keys read into the fields and write back.
	got, err := ReadModel(strings.NewReader("base: mixtral-8x7b\nlayers: 2\ndecoder_layers: 5\nmoe_layer_ids: [1, 3]\n"))
	require.NoError(t, err)
	assert.Equal(t, []int{1, 3}, got.MoELayers())
	var buf bytes.Buffer
	require.NoError(t, WriteModelYAML(&buf, got))
	assert.Contains(t, buf.String(), "decoder_layers: 5\nmoe_layer_ids: [1, 3]\n")
	back, err := ReadModel(&buf)
	require.NoError(t, err)
	assert.Equal(t, got, back)
}

func TestClusterYAMLRoundTrip(t *testing.T) {
	c, err := ClusterPreset("h200x8")
	require.NoError(t, err)
	c = c.WithNodes(2)
	c.Speed = make([]float64, 16)
	for g := range c.Speed {
		c.Speed[g] = 1 + float64(g)/16
	}
	c.Sigma = ptr(0.25)
	c.TokenCost = 1500 * time.Nanosecond
	var buf bytes.Buffer
	require.NoError(t, WriteClusterYAML(&buf, c))
	got, err := ReadCluster(&buf)
	require.NoError(t, err)
	assert.Equal(t, c, got)

	m, _ := ModelPreset("deepseek-v3")
	buf.Reset()
	require.NoError(t, WriteModelYAML(&buf, m))
	gotM, err := ReadModel(&buf)
	require.NoError(t, err)
	assert.Equal(t, m, gotM)
}

func TestLoadOverrides(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	require.NoError(t, os.WriteFile(path, []byte("base: h100x8\nname: two-h100\nnodes: 2\nnic_latency: 5us\nsigma: 0.3\n"), 0o644))
	c, err := LoadCluster(path)
	require.NoError(t, err)
	want, _ := ClusterPreset("h100x8")
	want.Name, want.Nodes, want.NICLatency, want.Sigma = "two-h100", 2, 5*time.Microsecond, ptr(0.3)
	assert.Equal(t, want, c)

	c, err = LoadCluster("h200x8")
	require.NoError(t, err)
	assert.Equal(t, "h200x8", c.Name)

	mpath := filepath.Join(dir, "m.yaml")
	require.NoError(t, os.WriteFile(mpath, []byte("base: olmoe-1b-7b\ntop_k: 4\n"), 0o644))
	m, err := LoadModel(mpath)
	require.NoError(t, err)
	assert.Equal(t, 4, m.TopK)
	assert.Equal(t, 64, m.Experts)

	tests := []struct{ name, yaml, want string }{
		{"unknown field", "base: h100x8\nnvlink_gb: 3\n", "field nvlink_gb not found"},
		{"unknown base", "base: tpu\n", `unknown cluster preset "tpu"`},
		{"invalid", "base: h100x8\nnodes: 0\n", `cluster "h100x8": nodes must be ≥ 1`},
		{"bad duration", "base: h100x8\nnic_latency: fast\n", "line 2: cannot unmarshal !!str `fast` into time.Duration"},
		{"empty", "", "empty document"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "_")+".yaml")
			require.NoError(t, os.WriteFile(p, []byte(tt.yaml), 0o644))
			_, err := LoadCluster(p)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	_, err = LoadModel(mpath + ".missing")
	assert.ErrorContains(t, err, "neither a model preset")
	require.NoError(t, os.WriteFile(mpath, []byte("base: olmoe-1b-7b\nlayerz: 3\n"), 0o644))
	_, err = LoadModel(mpath)
	assert.ErrorContains(t, err, "field layerz not found")
	_, err = LoadCluster(filepath.Join(dir, "nope.yaml"))
	assert.ErrorContains(t, err, "neither a cluster preset")
}

func TestValidateErrors(t *testing.T) {
	good := tinyCluster(2, 2)
	tests := []struct {
		name string
		edit func(*Cluster)
		want string
	}{
		{"nodes", func(c *Cluster) { c.Nodes = 0 }, `costmodel: cluster "tiny": nodes must be ≥ 1`},
		{"gpus per node", func(c *Cluster) { c.GPUsPerNode = -1 }, "gpus_per_node must be ≥ 1"},
		{"nvlink", func(c *Cluster) { c.NVLinkGBps = 0 }, "nvlink_gbps must be > 0"},
		{"nic", func(c *Cluster) { c.NICGbps = -4 }, "nic_gbps must be > 0"},
		{"latency", func(c *Cluster) { c.NICLatency = -1 }, "nic_latency must be ≥ 0"},
		{"speed length", func(c *Cluster) { c.Speed = []float64{1, 1} }, "speed has 2 entries, want one per GPU (4)"},
		{"speed value", func(c *Cluster) { c.Speed = []float64{1, 1, 0, 1} }, "speed[2] must be > 0"},
		{"sigma", func(c *Cluster) { c.Sigma = ptr(1.0) }, "sigma must be in [0,1)"},
		{"sigma negative", func(c *Cluster) { c.Sigma = ptr(-0.1) }, "sigma must be in [0,1)"},
		{"efficiency", func(c *Cluster) { c.Efficiency = 2 }, "efficiency must be in [0,1]"},
		{"no compute", func(c *Cluster) { c.TokenCost = 0 }, "needs tflops > 0 or token_cost > 0"},
		{"mem", func(c *Cluster) { c.GPUMemBytes = -1 }, "gpu_mem_bytes"},
	}
	require.NoError(t, good.Validate())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.edit(&c)
			assert.ErrorContains(t, c.Validate(), tt.want)
		})
	}
	one := tinyCluster(1, 2)
	one.NICGbps = 0
	assert.NoError(t, one.Validate(), "NIC is unused on one node")

	mtests := []struct {
		name string
		edit func(*Model)
		want string
	}{
		{"layers", func(m *Model) { m.Layers = 0 }, `costmodel: model "tiny": layers must be ≥ 1`},
		{"experts", func(m *Model) { m.Experts = 0 }, "experts must be ≥ 1"},
		{"topk", func(m *Model) { m.TopK = 5 }, "top_k must be in [1,experts]"},
		{"hidden", func(m *Model) { m.Hidden = 0 }, "hidden must be ≥ 1"},
		{"ffn", func(m *Model) { m.FFN = 0 }, "ffn must be ≥ 1"},
		{"dtype", func(m *Model) { m.BytesPerActivation = 0 }, "bytes_per_activation must be ≥ 1"},
		{"expert bytes", func(m *Model) { m.BytesPerExpert = -1 }, "bytes_per_expert"},
		{"decoder layers negative", func(m *Model) { m.DecoderLayers = -1 }, "decoder_layers must be ≥ 0 (0 = unknown), have -1"},
		{"decoder layers below moe", func(m *Model) { m.DecoderLayers = 1 }, "decoder_layers is 1 but the model has 2 MoE layers"},
		{"moe ids without decoder layers", func(m *Model) { m.MoELayerIDs = []int{0, 1} }, "moe_layer_ids needs decoder_layers"},
		{"moe ids count", func(m *Model) { m.DecoderLayers, m.MoELayerIDs = 4, []int{1} }, "moe_layer_ids has 1 entries for 2 MoE layers"},
		{"moe ids order", func(m *Model) { m.DecoderLayers, m.MoELayerIDs = 4, []int{2, 1} }, "moe_layer_ids[1] is 1; want ascending decoder-layer indices in [0,4)"},
		{"moe ids range", func(m *Model) { m.DecoderLayers, m.MoELayerIDs = 4, []int{1, 4} }, "moe_layer_ids[1] is 4"},
	}
	require.NoError(t, tinyModel(2, 4, 2).Validate())
	for _, tt := range mtests {
		t.Run(tt.name, func(t *testing.T) {
			m := tinyModel(2, 4, 2)
			tt.edit(&m)
			assert.ErrorContains(t, m.Validate(), tt.want)
		})
	}
}

// WithGPUsPerNode changes the GPUs per node and nothing else but the
// per-GPU speeds, which no longer describe the GPUs once their count
// changes; the caller's cluster is not modified.
func TestWithGPUsPerNode(t *testing.T) {
	c, err := ClusterPreset("2xh100x8")
	require.NoError(t, err)
	c.Speed = make([]float64, 16)
	for g := range c.Speed {
		c.Speed[g] = 1 + float64(g%2)
	}
	four := c.WithGPUsPerNode(4)
	assert.Equal(t, 4, four.GPUsPerNode)
	assert.Equal(t, 8, four.GPUs())
	assert.Nil(t, four.Speed, "speeds of 16 GPUs do not describe 8")
	assert.NoError(t, four.Validate())
	assert.Len(t, c.Speed, 16, "the receiver keeps its speeds")
	assert.Equal(t, 8, c.GPUsPerNode)
	want := c
	want.GPUsPerNode, want.Speed = 4, nil
	assert.Equal(t, want, four, "only GPUsPerNode and Speed change")

	same := c.WithGPUsPerNode(8)
	assert.Equal(t, c, same, "the same count keeps the speeds")

	c.MemBytes = make([]int64, 16)
	bad := c.WithGPUsPerNode(2)
	assert.ErrorContains(t, bad.Validate(), "mem_bytes has 16 entries for 4 GPUs")
}
