package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/moetuner/moetuner/internal/torchpt"
)

// The stacks' loaders, re-implemented from their newest source readable
// here, with every check that would stop the server or silently route to
// the wrong weights. They read the file the way the stack does (by name,
// with the stack's parser), not through package placement, so a writer bug
// that placement's reader shares is still caught.

// deployment is what the server is started with.
type deployment struct {
	layers    int   // num_hidden_layers (SGLang's rows)
	moeLayers []int // decoder-layer ids of the MoE layers
	experts   int   // logical experts E
	redundant int   // --ep-num-redundant-experts / num_redundant_experts R
	ep        int   // EP size G
}

// checkRow is the part every loader shares: P = E + R slots, split evenly
// over G ranks, ids in [0, E), every expert at least once, and no expert
// twice on a rank (SGLang's static table and vllm-ascend's expert_map lose
// such a copy; TensorRT-LLM would take it, but moetuner never writes one).
func (d deployment) checkRow(what string, row []int64) error {
	P := d.experts + d.redundant
	if len(row) != P {
		return fmt.Errorf("%s: %d slots, but the server has E + R = %d + %d = %d", what, len(row), d.experts, d.redundant, P)
	}
	if P%d.ep != 0 {
		return fmt.Errorf("%s: %d slots do not split over %d ranks", what, P, d.ep)
	}
	per := P / d.ep
	seen := make([]bool, d.experts)
	onRank := map[[2]int64]bool{}
	for s, e := range row {
		if e < 0 || e >= int64(d.experts) {
			return fmt.Errorf("%s[%d]: expert %d out of [0,%d)", what, s, e, d.experts)
		}
		seen[e] = true
		k := [2]int64{int64(s / per), e}
		if onRank[k] {
			return fmt.Errorf("%s: expert %d twice on rank %d", what, e, s/per)
		}
		onRank[k] = true
	}
	for e, ok := range seen {
		if !ok {
			return fmt.Errorf("%s: expert %d has no slot", what, e)
		}
	}
	return nil
}

// loadSGLang is compute_initial_expert_location_metadata and
// ExpertLocationMetadata.init_by_mapping (sgl-project/sglang
// python/sglang/srt/eplb/expert_location.py@01fec5c): torch.load
// (weights_only) for a name ending in ".pt", json for ".json", inline JSON
// otherwise; the dict is passed as keyword arguments to a function taking
// only physical_to_logical_map; the map has one row per decoder layer and
// P = num_logical_experts + ep_num_redundant_experts columns, P divisible
// by ep_size (_init_common); every logical expert needs a physical copy,
// or compute_logical_to_rank_dispatch_physical_map's _fair_choices divides
// by zero; an id outside [0, E) indexes past (or, negative, wraps around)
// logical_to_all_physical_map.
func loadSGLang(path string, d deployment) error {
	var rows [][]int64
	switch {
	case strings.HasSuffix(path, ".pt"):
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		pt, err := torchpt.Open(f, fi.Size(), torchpt.Options{})
		if err != nil {
			return fmt.Errorf("torch.load: %v", err)
		}
		dict, ok := pt.Root.(*torchpt.Dict)
		if !ok {
			return fmt.Errorf("torch.load: not a dict")
		}
		if len(dict.Keys) != 1 || dict.Keys[0] != "physical_to_logical_map" {
			return fmt.Errorf("init_by_mapping() got keys %v", dict.Keys)
		}
		v, _ := dict.Get("physical_to_logical_map")
		t, ok := v.(*torchpt.Tensor)
		if !ok || len(t.Shape) != 2 || !t.DType.IsInteger() {
			return fmt.Errorf("physical_to_logical_map is not a 2-D integer tensor")
		}
		vals, err := t.Int64s()
		if err != nil {
			return err
		}
		for r := range t.Shape[0] {
			rows = append(rows, vals[r*t.Shape[1]:(r+1)*t.Shape[1]])
		}
	case strings.HasSuffix(path, ".json"):
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var doc map[string]json.RawMessage
		if err := json.Unmarshal(data, &doc); err != nil {
			return fmt.Errorf("json.loads: %v", err)
		}
		if len(doc) != 1 || doc["physical_to_logical_map"] == nil {
			return fmt.Errorf("init_by_mapping() got %d keys, want only physical_to_logical_map", len(doc))
		}
		if err := json.Unmarshal(doc["physical_to_logical_map"], &rows); err != nil {
			return fmt.Errorf("torch.tensor(physical_to_logical_map): %v", err)
		}
	default:
		return fmt.Errorf("json.loads(%q): the value is parsed as inline JSON", path)
	}
	if len(rows) != d.layers {
		return fmt.Errorf("physical_to_logical_map has %d rows, the model %d decoder layers", len(rows), d.layers)
	}
	for l, row := range rows {
		if err := d.checkRow(fmt.Sprintf("physical_to_logical_map[%d]", l), row); err != nil {
			return err
		}
	}
	return nil
}

// loadAscend is vllm-ascend's init_eplb_config with expert_file_to_tensor
// and generate_log2phy_map (vllm-project/vllm-ascend
// vllm_ascend/eplb/core/eplb_utils.py, main after #5533), called once per
// MoE layer with its 0-based MoE-layer index: layer_id > moe_layer_count
// is "Invalid EPLB Table", layer_id == moe_layer_count is taken for an
// MTP layer (no map), so moe_layer_count must be the MoE layer count;
// layer_list is indexed by position; device_list[r] for r < ep_size is
// rank r's slots, stacked into one tensor (equal lengths: the log2phy map
// numbers slots as rank·(rank 0's count) + local); expert_map[placement] =
// arange assigns by index, so an expert twice on a device loses a slot and
// a negative id wraps; an expert without a copy is left at physical slot 0.
// The redundant count is taken from the file (physical_count − E); it must
// equal eplb_config.num_redundant_experts, which the server also sizes by.
func loadAscend(path string, d deployment) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc struct {
		MoELayerCount *int `json:"moe_layer_count"`
		LayerList     []struct {
			DeviceList []struct {
				DeviceExpert []int64 `json:"device_expert"`
			} `json:"device_list"`
		} `json:"layer_list"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("json.load: %v", err)
	}
	if doc.MoELayerCount == nil {
		return fmt.Errorf(`KeyError: "moe_layer_count"`)
	}
	L := len(d.moeLayers)
	if *doc.MoELayerCount != L {
		return fmt.Errorf("moe_layer_count %d, the model has %d MoE layers", *doc.MoELayerCount, L)
	}
	if len(doc.LayerList) < L {
		return fmt.Errorf("layer_list has %d layers, want %d", len(doc.LayerList), L)
	}
	for l := range L {
		devs := doc.LayerList[l].DeviceList
		if len(devs) != d.ep {
			return fmt.Errorf("layer_list[%d]: %d devices for ep_size %d", l, len(devs), d.ep)
		}
		var row []int64
		for r, dev := range devs {
			if len(dev.DeviceExpert) != len(devs[0].DeviceExpert) {
				return fmt.Errorf("layer_list[%d].device_list[%d]: %d experts, device 0 %d", l, r, len(dev.DeviceExpert), len(devs[0].DeviceExpert))
			}
			row = append(row, dev.DeviceExpert...)
		}
		if err := d.checkRow(fmt.Sprintf("layer_list[%d]", l), row); err != nil {
			return err
		}
	}
	return nil
}

// loadVLLMMap is vLLM #49572's eplb_config.initial_expert_map_path: one
// physical-to-logical list [P] for every MoE layer, or one per MoE layer;
// dimensions, logical-id ranges and full coverage are validated, with P =
// E + num_redundant_experts.
func loadVLLMMap(path string, d deployment) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rows [][]int64
	if err := json.Unmarshal(data, &rows); err != nil {
		var one []int64
		if err2 := json.Unmarshal(data, &one); err2 != nil {
			return fmt.Errorf("json: %v", err)
		}
		rows = [][]int64{one}
	}
	if len(rows) != 1 && len(rows) != len(d.moeLayers) {
		return fmt.Errorf("%d maps for %d MoE layers", len(rows), len(d.moeLayers))
	}
	for l, row := range rows {
		if err := d.checkRow(fmt.Sprintf("map[%d]", l), row); err != nil {
			return err
		}
	}
	return nil
}

// loadTRTLLM is TensorRT-LLM's moe_config.load_balancer
// (MoeLoadBalancerConfig in tensorrt_llm/llmapi/llm_args.py, newest tree:
// get_layer_initial_global_assignments; older trees' model_config.py also
// assert num_slots ≥ E, num_slots % ep_size == 0 and every expert
// present): a YAML mapping with num_slots and initial_global_assignments
// keyed by decoder-layer index, one list of num_slots expert ids per MoE
// layer; slot p lives on rank p / (num_slots / ep_size).
func loadTRTLLM(path string, d deployment) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc struct {
		NumSlots    *int            `yaml:"num_slots"`
		Assignments map[int][]int64 `yaml:"initial_global_assignments"`
		Updates     *int            `yaml:"layer_updates_per_iter"`
		Extra       map[string]any  `yaml:",inline"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("yaml: %v", err)
	}
	if len(doc.Extra) > 0 {
		return fmt.Errorf("unknown keys %v (StrictBaseModel)", doc.Extra)
	}
	if doc.NumSlots == nil {
		return fmt.Errorf("`num_slots` is not set")
	}
	if *doc.NumSlots != d.experts+d.redundant {
		return fmt.Errorf("num_slots %d, but the deployment has E + R = %d", *doc.NumSlots, d.experts+d.redundant)
	}
	for _, l := range d.moeLayers {
		row, ok := doc.Assignments[l]
		if !ok {
			return fmt.Errorf("layer_idx %d not found in `initial_global_assignments`", l)
		}
		if err := d.checkRow(fmt.Sprintf("initial_global_assignments[%d]", l), row); err != nil {
			return err
		}
	}
	return nil
}

// flameDeployment is FLAME-MoE-290M (testdata/flame-moe-290m: decoder
// layers 2..9 of 10 are MoE, 64 experts) on the default 8 GPUs.
func flameDeployment(redundant int) deployment {
	return deployment{layers: 10, moeLayers: []int{2, 3, 4, 5, 6, 7, 8, 9}, experts: 64, redundant: redundant, ep: 8}
}

// TestEveryStrategyLoadsInEveryStack: plan with --redundant-slots by
// every strategy, written for SGLang (.json and .pt), vllm-ascend, vLLM's
// map and TensorRT-LLM's load balancer, is accepted by each loader started with E + R slots, and
// refused by one started without redundant experts. Before contiguous,
// round-robin, greedy and moetuner honoured --redundant-slots they wrote
// P = E and every loader here refused the file. FLAME (dense layers
// among the MoE ones) takes the quick strategies; Mixtral (8 experts on 4
// GPUs) all six, moetuner's ILP and joint being quick there.
func TestEveryStrategyLoadsInEveryStack(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	loaders := []struct {
		name string
		load func(string, deployment) error
	}{
		{"p.sglang.json", loadSGLang},
		{"p.pt", loadSGLang},
		{"p.vllm-ascend.json", loadAscend},
		{"p.vllm-map.json", loadVLLMMap},
		{"p.trtllm.yaml", loadTRTLLM},
	}
	mixtral := func(redundant int) deployment {
		d := deployment{layers: 32, experts: 8, redundant: redundant, ep: 4}
		for l := range 32 {
			d.moeLayers = append(d.moeLayers, l)
		}
		return d
	}
	cases := []struct {
		name   string
		args   []string
		strats []string
		d      func(int) deployment
		r      int
	}{
		{"flame", []string{"--trace", flameTrace}, []string{"contiguous", "round-robin", "greedy", "eplb"}, flameDeployment, 8},
		{"mixtral", []string{"--trace", "testdata/mixtral-8x7b/fiddler", "--model", "mixtral-8x7b", "--gpus-per-node", "4", "--time-limit", "5s"},
			[]string{"contiguous", "round-robin", "greedy", "eplb", "moetuner", "joint"}, mixtral, 4},
	}
	for _, tc := range cases {
		for _, st := range tc.strats {
			t.Run(tc.name+"/"+st, func(t *testing.T) {
				for _, ld := range loaders {
					out := filepath.Join(dir, tc.name+"-"+st+"-"+ld.name)
					args := append([]string{"plan", "--strategy", st, "--redundant-slots", fmt.Sprint(tc.r), "--quiet", "--out", out}, tc.args...)
					code, _, stderr := runCLI(t, args...)
					require.Equal(t, 0, code, stderr)
					assert.NoError(t, ld.load(out, tc.d(tc.r)), "%s %s", st, ld.name)
					assert.Error(t, ld.load(out, tc.d(0)), "a server started without redundant experts must refuse %s", ld.name)
				}
			})
		}
	}
}

// TestLoadersRefuse: each loader re-implementation refuses what its stack
// refuses, so the test above cannot pass on a file the stack would reject.
func TestLoadersRefuse(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(s), 0o644))
		return p
	}
	d := deployment{layers: 2, moeLayers: []int{1}, experts: 4, redundant: 2, ep: 2}
	ok := `{"physical_to_logical_map": [[0,1,2,3,0,1],[0,1,2,0,3,1]]}`
	require.NoError(t, loadSGLang(write("ok.json", ok), d))
	for name, tc := range map[string]struct{ file, content string }{
		"P = E":        {"a.json", `{"physical_to_logical_map": [[0,1,2,3],[0,1,2,3]]}`},
		"rows":         {"b.json", `{"physical_to_logical_map": [[0,1,2,3,0,1]]}`},
		"extra key":    {"c.json", `{"physical_to_logical_map": [[0,1,2,3,0,1],[0,1,2,0,3,1]], "x": 1}`},
		"missing":      {"d.json", `{"physical_to_logical_map": [[0,1,2,0,1,2],[0,1,2,0,3,1]]}`},
		"json in .pt":  {"e.pt", ok},
		"other name":   {"e.txt", ok},
		"twice a rank": {"f.json", `{"physical_to_logical_map": [[0,0,1,2,3,1],[0,1,2,0,3,1]]}`},
	} {
		assert.Error(t, loadSGLang(write(tc.file, tc.content), d), name)
	}
	okAscend := `{"moe_layer_count": 1, "layer_list": [{"device_list": [{"device_expert": [0,1,2]}, {"device_expert": [3,0,1]}]}]}`
	require.NoError(t, loadAscend(write("ok.vllm-ascend.json", okAscend), d))
	for name, content := range map[string]string{
		"count":   `{"moe_layer_count": 2, "layer_list": [{"device_list": [{"device_expert": [0,1,2]}, {"device_expert": [3,0,1]}]}]}`,
		"unequal": `{"moe_layer_count": 1, "layer_list": [{"device_list": [{"device_expert": [0,1,2,0]}, {"device_expert": [3,1]}]}]}`,
		"R = 0":   `{"moe_layer_count": 1, "layer_list": [{"device_list": [{"device_expert": [0,1]}, {"device_expert": [2,3]}]}]}`,
		"devices": `{"moe_layer_count": 1, "layer_list": [{"device_list": [{"device_expert": [0,1,2,3,0,1]}]}]}`,
	} {
		assert.Error(t, loadAscend(write("x.vllm-ascend.json", content), d), name)
	}
}

// TestPlanFormatMatchesName: SGLang picks its parser by the name's ending,
// so --format sglang --out plan.pt writes the torch.save .pt (with a note)
// that torch.load reads, and names SGLang would misread are refused
// before anything is written. Before, plan.pt held JSON, which torch.load
// rejects.
func TestPlanFormatMatchesName(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	base := []string{"plan", "--trace", flameTrace, "--strategy", "eplb", "--redundant-slots", "8"}
	out := filepath.Join(dir, "plan.pt")
	code, _, stderr := runCLI(t, append(base, "--format", "sglang", "--out", out)...)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "moetuner plan: note: writing "+out+" as a torch.save .pt (sglang-pt): SGLang loads a --init-expert-location ending in .pt with torch.load")
	require.NoError(t, loadSGLang(out, flameDeployment(8)))

	for _, tc := range []struct{ format, name, want string }{
		{"sglang", "plan.sglang", "SGLang reads --init-expert-location as a file only when its name ends in .json or .pt"},
		{"sglang-pt", "plan.json", "SGLang loads --init-expert-location with torch.load only when the name ends in .pt"},
		{"eplb", "eplb.pt", "--format eplb is text, but a name ending in .pt is loaded with torch.load"},
	} {
		out := filepath.Join(dir, tc.name)
		code, _, stderr := runCLI(t, append(base, "--format", tc.format, "--out", out)...)
		assert.Equal(t, 2, code, tc.name)
		assert.Contains(t, stderr, tc.want)
		assert.NoFileExists(t, out)
	}
	code, _, stderr = runCLI(t, "stats", flameTrace, "--format", "logical-count", "--out", filepath.Join(dir, "counts.pt"))
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "stats writes JSON, and a name ending in .pt is loaded with torch.load; name it .json")
}
