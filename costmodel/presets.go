package costmodel

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Link latencies used by the cluster presets. They are assumptions (typical
// one-hop figures for NVLink4/NVSwitch and for ConnectX-7 InfiniBand RDMA),
// not measurements; override them in a cluster file.
const (
	PresetNVLinkLatency = 3 * time.Microsecond
	PresetNICLatency    = 8 * time.Microsecond
)

// clusterPresets builds each preset afresh, so callers may modify what they
// get (Speed, Sigma) without touching the table.
var clusterPresets = map[string]func() Cluster{
	// 8× H100 SXM 80 GB on NVLink4/NVSwitch, one ConnectX-7 400 Gb/s NIC
	// per GPU (MoETuner Table 2).
	"h100x8": func() Cluster {
		return Cluster{
			Name: "h100x8", Nodes: 1, GPUsPerNode: 8,
			NVLinkGBps: 900, NICGbps: 400,
			NVLinkLatency: PresetNVLinkLatency, NICLatency: PresetNICLatency,
			GPUMemBytes: 80 << 30, // nominal 80 GB (GiB as reported by nvidia-smi)
			TFLOPS:      989, HBMGBps: 3350,
		}
	},
	// 8× H200 SXM 141 GB, one ConnectX-7 800 Gb/s NIC per GPU (MoETuner
	// Table 3).
	"h200x8": func() Cluster {
		return Cluster{
			Name: "h200x8", Nodes: 1, GPUsPerNode: 8,
			NVLinkGBps: 900, NICGbps: 800,
			NVLinkLatency: PresetNVLinkLatency, NICLatency: PresetNICLatency,
			GPUMemBytes: 141 << 30, // nominal 141 GB
			TFLOPS:      989, HBMGBps: 4800,
		}
	},
}

// modelPresets holds the MoE shapes of the models moetuner has traces for.
// Layers counts only MoE layers; DecoderLayers is num_hidden_layers, and
// the MoE layers are the last Layers of them. Shared experts are not
// modeled.
var modelPresets = map[string]Model{
	"mixtral-8x7b": {Name: "mixtral-8x7b", Layers: 32, Experts: 8, TopK: 2,
		Hidden: 4096, FFN: 14336, BytesPerActivation: 2, DecoderLayers: 32},
	// DeepSeek-V3: 61 decoder layers, the first 3 dense
	// (first_k_dense_replace = 3), MoE in layers 3..60.
	"deepseek-v3": {Name: "deepseek-v3", Layers: 58, Experts: 256, TopK: 8,
		Hidden: 7168, FFN: 2048, BytesPerActivation: 2, ExpertGroups: 8, DecoderLayers: 61},
	// Qwen3-235B-A22B: every one of its 94 decoder layers is MoE
	// (decoder_sparse_step 1, no mlp_only_layers).
	"qwen3-235b-a22b": {Name: "qwen3-235b-a22b", Layers: 94, Experts: 128, TopK: 8,
		Hidden: 4096, FFN: 1536, BytesPerActivation: 2, DecoderLayers: 94},
	"olmoe-1b-7b": {Name: "olmoe-1b-7b", Layers: 16, Experts: 64, TopK: 8,
		Hidden: 2048, FFN: 1024, BytesPerActivation: 2, DecoderLayers: 16},
	// FLAME-MoE-290M: 8 MoE layers (decoder layers 2..9 of 10), 64 routed
	// experts, top-6 (the FLAME-MoE-Traces data set, testdata/NOTICE). Hidden 1024 and FFN
	// 704 are ASSUMED: the trace's source does not state them.
	"flame-moe-290m": {Name: "flame-moe-290m", Layers: 8, Experts: 64, TopK: 6,
		Hidden: 1024, FFN: 704, BytesPerActivation: 2, DecoderLayers: 10},
}

// ClusterNames returns the names of the cluster presets, sorted. Every
// preset also exists with more nodes as "<n>x<name>" ("2xh100x8").
func ClusterNames() []string {
	names := make([]string, 0, len(clusterPresets))
	for n := range clusterPresets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ModelNames returns the names of the model presets, sorted.
func ModelNames() []string {
	names := make([]string, 0, len(modelPresets))
	for n := range modelPresets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ClusterPreset returns the cluster preset called name, or an error naming
// the presets. "<n>x<name>" (for example "4xh200x8") returns the preset
// with n nodes; see WithNodes.
func ClusterPreset(name string) (Cluster, error) {
	if f, ok := clusterPresets[name]; ok {
		return f(), nil
	}
	if i := strings.Index(name, "x"); i > 0 {
		if n, err := strconv.Atoi(name[:i]); err == nil && n >= 1 {
			if f, ok := clusterPresets[name[i+1:]]; ok {
				return f().WithNodes(n), nil
			}
		}
	}
	return Cluster{}, fmt.Errorf("costmodel: unknown cluster preset %q (have %s, or <n>x<preset> for n nodes)",
		name, strings.Join(ClusterNames(), ", "))
}

// ModelPreset returns the model preset called name, or an error naming the
// presets.
func ModelPreset(name string) (Model, error) {
	if m, ok := modelPresets[name]; ok {
		return m, nil
	}
	return Model{}, fmt.Errorf("costmodel: unknown model preset %q (have %s)",
		name, strings.Join(ModelNames(), ", "))
}

// WithNodes returns c with n nodes (the --nodes override). A one-node
// cluster named "h100x8" becomes "2xh100x8"; a per-GPU Speed is repeated
// node by node when it described whole nodes.
func (c Cluster) WithNodes(n int) Cluster {
	old := c.GPUs()
	base := c.Name
	if i := strings.Index(base, "x"); i > 0 {
		if _, err := strconv.Atoi(base[:i]); err == nil {
			if _, ok := clusterPresets[base[i+1:]]; ok {
				base = base[i+1:]
			}
		}
	}
	if base != "" {
		if n == 1 {
			c.Name = base
		} else {
			c.Name = fmt.Sprintf("%dx%s", n, base)
		}
	}
	c.Nodes = n
	if len(c.Speed) > 0 && len(c.Speed) == old && c.GPUsPerNode > 0 && old%c.GPUsPerNode == 0 {
		sp := make([]float64, c.GPUs())
		for g := range sp {
			sp[g] = c.Speed[g%len(c.Speed)]
		}
		c.Speed = sp
	}
	return c
}

// WithGPUsPerNode returns c with n GPUs per node (the --gpus-per-node
// override), keeping its name, links and nodes. Per-GPU speeds (Speed)
// describe GPUs that no longer exist once the GPU count changes, so they
// are then dropped (every GPU speed 1); per-GPU memory (MemBytes) is kept,
// and Validate reports it when it no longer has one entry per GPU.
func (c Cluster) WithGPUsPerNode(n int) Cluster {
	old := c.GPUs()
	c.GPUsPerNode = n
	if c.GPUs() != old {
		c.Speed = nil
	}
	return c
}

// Validate reports every inconsistent field of c, each as
// `costmodel: cluster "name": ...`, joined; nil when c is usable.
func (c Cluster) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("costmodel: cluster %q: "+format, append([]any{c.Name}, args...)...))
	}
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
	if c.Nodes < 1 {
		bad("nodes must be ≥ 1, have %d", c.Nodes)
	}
	if c.GPUsPerNode < 1 {
		bad("gpus_per_node must be ≥ 1, have %d", c.GPUsPerNode)
	}
	if !finite(c.NVLinkGBps) || c.NVLinkGBps < 0 || (c.NVLinkGBps == 0 && c.GPUsPerNode > 1) {
		bad("nvlink_gbps must be > 0, have %v", c.NVLinkGBps)
	}
	if !finite(c.NICGbps) || c.NICGbps < 0 || (c.NICGbps == 0 && c.Nodes > 1) {
		bad("nic_gbps must be > 0 with more than one node, have %v", c.NICGbps)
	}
	if c.NVLinkLatency < 0 {
		bad("nvlink_latency must be ≥ 0, have %v", c.NVLinkLatency)
	}
	if c.NICLatency < 0 {
		bad("nic_latency must be ≥ 0, have %v", c.NICLatency)
	}
	if len(c.MemBytes) != 0 && len(c.MemBytes) != c.GPUs() {
		bad("mem_bytes has %d entries for %d GPUs; give one per GPU or none", len(c.MemBytes), c.GPUs())
	}
	for g, m := range c.MemBytes {
		if m < 0 {
			bad("mem_bytes[%d] must be ≥ 0 (0 = unlimited), have %d", g, m)
		}
	}
	if c.GPUMemBytes < 0 {
		bad("gpu_mem_bytes must be ≥ 0 (0 = unlimited), have %d", c.GPUMemBytes)
	}
	if !finite(c.TFLOPS) || c.TFLOPS < 0 {
		bad("tflops must be ≥ 0, have %v", c.TFLOPS)
	}
	if !finite(c.HBMGBps) || c.HBMGBps < 0 {
		bad("hbm_gbps must be ≥ 0, have %v", c.HBMGBps)
	}
	if !finite(c.Efficiency) || c.Efficiency < 0 || c.Efficiency > 1 {
		bad("efficiency must be in [0,1] (0 = default 0.6), have %v", c.Efficiency)
	}
	if c.TokenCost < 0 {
		bad("token_cost must be ≥ 0, have %v", c.TokenCost)
	}
	if c.ExpertCost < 0 {
		bad("expert_cost must be ≥ 0, have %v", c.ExpertCost)
	}
	if c.TokenCost == 0 && !(c.TFLOPS > 0) {
		bad("needs tflops > 0 or token_cost > 0 to cost expert compute")
	}
	if len(c.Speed) > 0 {
		if c.Nodes >= 1 && c.GPUsPerNode >= 1 && len(c.Speed) != c.GPUs() {
			bad("speed has %d entries, want one per GPU (%d)", len(c.Speed), c.GPUs())
		}
		for g, s := range c.Speed {
			if !finite(s) || s <= 0 {
				bad("speed[%d] must be > 0, have %v", g, s)
			}
		}
	}
	if c.Sigma != nil && (!finite(*c.Sigma) || *c.Sigma < 0 || *c.Sigma >= 1) {
		bad("sigma must be in [0,1), have %v", *c.Sigma)
	}
	return errors.Join(errs...)
}

// Validate reports every inconsistent field of m, each as
// `costmodel: model "name": ...`, joined; nil when m is usable.
func (m Model) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("costmodel: model %q: "+format, append([]any{m.Name}, args...)...))
	}
	if m.Layers < 1 {
		bad("layers must be ≥ 1, have %d", m.Layers)
	}
	if m.Experts < 1 {
		bad("experts must be ≥ 1, have %d", m.Experts)
	}
	if m.TopK < 1 || (m.Experts >= 1 && m.TopK > m.Experts) {
		bad("top_k must be in [1,experts], have %d", m.TopK)
	}
	if m.Hidden < 1 {
		bad("hidden must be ≥ 1, have %d", m.Hidden)
	}
	if m.FFN < 1 {
		bad("ffn must be ≥ 1, have %d", m.FFN)
	}
	if m.BytesPerActivation < 1 {
		bad("bytes_per_activation must be ≥ 1, have %d", m.BytesPerActivation)
	}
	if m.BytesPerExpert < 0 {
		bad("bytes_per_expert must be ≥ 0 (0 = derived), have %d", m.BytesPerExpert)
	}
	switch {
	case m.DecoderLayers < 0:
		bad("decoder_layers must be ≥ 0 (0 = unknown), have %d", m.DecoderLayers)
	case m.DecoderLayers > 0 && m.DecoderLayers < m.Layers:
		bad("decoder_layers is %d but the model has %d MoE layers; decoder_layers counts every decoder layer, dense ones included", m.DecoderLayers, m.Layers)
	}
	if m.MoELayerIDs != nil {
		if m.DecoderLayers < 1 {
			bad("moe_layer_ids needs decoder_layers (num_hidden_layers)")
		}
		if len(m.MoELayerIDs) != m.Layers {
			bad("moe_layer_ids has %d entries for %d MoE layers; list the decoder-layer index of every MoE layer", len(m.MoELayerIDs), m.Layers)
		}
		for i, id := range m.MoELayerIDs {
			if id < 0 || (m.DecoderLayers > 0 && id >= m.DecoderLayers) || (i > 0 && id <= m.MoELayerIDs[i-1]) {
				bad("moe_layer_ids[%d] is %d; want ascending decoder-layer indices in [0,%d)", i, id, m.DecoderLayers)
				break
			}
		}
	}
	return errors.Join(errs...)
}

// clusterFile and modelFile are the YAML documents: every field of the
// type, plus an optional base preset that the other fields override.
type clusterFile struct {
	Base    string `yaml:"base,omitempty"`
	Cluster `yaml:",inline"`
}

type modelFile struct {
	Base  string `yaml:"base,omitempty"`
	Model `yaml:",inline"`
}

type baseOnly struct {
	Base string `yaml:"base"`
}

// LoadCluster returns the preset named pathOrPreset (see ClusterPreset), or
// else reads the YAML file at that path (see ReadCluster). The result is
// validated.
func LoadCluster(pathOrPreset string) (Cluster, error) {
	if c, err := ClusterPreset(pathOrPreset); err == nil {
		return c, nil
	}
	data, err := os.ReadFile(pathOrPreset)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Cluster{}, fmt.Errorf("costmodel: %q is neither a cluster preset (%s) nor a file",
				pathOrPreset, strings.Join(ClusterNames(), ", "))
		}
		return Cluster{}, fmt.Errorf("costmodel: %w", err)
	}
	c, err := ReadCluster(bytes.NewReader(data))
	if err != nil {
		return Cluster{}, fmt.Errorf("%w (file %s)", err, pathOrPreset)
	}
	return c, nil
}

// LoadModel returns the preset named pathOrPreset, or else reads the YAML
// file at that path (see ReadModel). The result is validated.
func LoadModel(pathOrPreset string) (Model, error) {
	if m, err := ModelPreset(pathOrPreset); err == nil {
		return m, nil
	}
	data, err := os.ReadFile(pathOrPreset)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Model{}, fmt.Errorf("costmodel: %q is neither a model preset (%s) nor a file",
				pathOrPreset, strings.Join(ModelNames(), ", "))
		}
		return Model{}, fmt.Errorf("costmodel: %w", err)
	}
	m, err := ReadModel(bytes.NewReader(data))
	if err != nil {
		return Model{}, fmt.Errorf("%w (file %s)", err, pathOrPreset)
	}
	return m, nil
}

// ReadCluster decodes one YAML cluster document. `base: <preset>` starts
// from that preset and the other fields override it; unknown fields are
// errors. Durations are strings ("3us"). The result is validated.
func ReadCluster(r io.Reader) (Cluster, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return Cluster{}, fmt.Errorf("costmodel: reading cluster: %w", err)
	}
	var b baseOnly
	if err := yaml.Unmarshal(data, &b); err != nil {
		return Cluster{}, fmt.Errorf("costmodel: cluster YAML: %w", err)
	}
	var f clusterFile
	if b.Base != "" {
		if f.Cluster, err = ClusterPreset(b.Base); err != nil {
			return Cluster{}, fmt.Errorf("costmodel: cluster YAML: base: %w", err)
		}
	}
	if err := decodeStrict(data, &f); err != nil {
		return Cluster{}, fmt.Errorf("costmodel: cluster YAML: %w", err)
	}
	if err := f.Cluster.Validate(); err != nil {
		return Cluster{}, err
	}
	return f.Cluster, nil
}

// ReadModel decodes one YAML model document, with `base:` and strict
// fields as in ReadCluster. The result is validated.
func ReadModel(r io.Reader) (Model, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return Model{}, fmt.Errorf("costmodel: reading model: %w", err)
	}
	var b baseOnly
	if err := yaml.Unmarshal(data, &b); err != nil {
		return Model{}, fmt.Errorf("costmodel: model YAML: %w", err)
	}
	var f modelFile
	if b.Base != "" {
		if f.Model, err = ModelPreset(b.Base); err != nil {
			return Model{}, fmt.Errorf("costmodel: model YAML: base: %w", err)
		}
	}
	if err := decodeStrict(data, &f); err != nil {
		return Model{}, fmt.Errorf("costmodel: model YAML: %w", err)
	}
	if err := f.Model.Validate(); err != nil {
		return Model{}, err
	}
	return f.Model, nil
}

func decodeStrict(data []byte, out any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("empty document")
		}
		return err
	}
	return nil
}

// WriteClusterYAML writes c as a YAML document that ReadCluster reads back
// to an equal Cluster.
func WriteClusterYAML(w io.Writer, c Cluster) error {
	return writeYAML(w, c)
}

// WriteModelYAML writes m as a YAML document that ReadModel reads back to
// an equal Model.
func WriteModelYAML(w io.Writer, m Model) error {
	return writeYAML(w, m)
}

func writeYAML(w io.Writer, v any) error {
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("costmodel: writing YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("costmodel: writing YAML: %w", err)
	}
	return nil
}
