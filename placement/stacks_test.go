package placement

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/routing"
)

// stackFormats are the formats that lay a layer out as a rank-major slot
// list, with moetuner's own two for comparison.
var stackFormats = []Format{FormatJSON, FormatYAML, FormatSGLang, FormatEPLB, FormatVLLMMap, FormatVLLMMapping, FormatVLLMAscend, FormatTRTLLM}

// randomStackPlan returns a random plan that every stack format can hold:
// G GPUs with S slots each in every layer, E ≤ G·S experts all placed, no
// expert twice on a GPU, slots in random (not GPU-major) order, and a
// random layout placing its layers among 0–3 extra dense decoder layers.
func randomStackPlan(rng *rand.Rand) (*Plan, Layout) {
	G, S, L := 1+rng.IntN(5), 1+rng.IntN(4), 1+rng.IntN(4)
	E := S + rng.IntN(G*S-S+1)
	p := &Plan{GPUs: G, Experts: E, Layers: make([]LayerPlan, L)}
	for l := range p.Layers {
		slotGPU := make([]int, 0, G*S)
		for g := range G {
			for range S {
				slotGPU = append(slotGPU, g)
			}
		}
		rng.Shuffle(len(slotGPU), func(i, j int) { slotGPU[i], slotGPU[j] = slotGPU[j], slotGPU[i] })
		on := make([]map[int]bool, G)
		for g := range on {
			on[g] = map[int]bool{}
		}
		lp := LayerPlan{}
		for s, g := range slotGPU {
			e := s // the first E slots cover every expert once
			if s >= E {
				for e = rng.IntN(E); on[g][e]; e = rng.IntN(E) {
				}
			}
			on[g][e] = true
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
			lp.SlotGPU = append(lp.SlotGPU, GPU(g))
		}
		p.Layers[l] = lp
	}
	all := L + rng.IntN(4)
	ids := rng.Perm(all)[:L]
	slices.Sort(ids)
	return p, Layout{ModelLayers: all, LayerIDs: ids}
}

// slotSets is the placement of p as the sorted experts of every GPU in
// every layer: what must survive any file format.
func slotSets(p *Plan) [][][]int {
	out := make([][][]int, len(p.Layers))
	for l, lp := range p.Layers {
		out[l] = make([][]int, p.GPUs)
		for s, e := range lp.SlotExpert {
			g := lp.SlotGPU[s]
			out[l][g] = append(out[l][g], int(e))
		}
		for _, set := range out[l] {
			slices.Sort(set)
		}
	}
	return out
}

// TestStackRoundTripProperty writes random valid plans in every format and
// reads them back, by name and by detection, with the layout a CLI user
// has (GPUs and experts known): the slot sets per GPU must come back. It
// catches a reader that puts slot p on GPU p mod G instead of p/(P/G), a
// writer or reader that shifts the MoE rows among the dense ones, drops or
// reorders a layer, or keys TensorRT-LLM's lists by the wrong decoder
// layer.
func TestStackRoundTripProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 7))
	for i := range 300 {
		p, layout := randomStackPlan(rng)
		want := slotSets(p)
		for _, f := range stackFormats {
			var b bytes.Buffer
			require.NoError(t, WriteWith(&b, p, f, layout), "plan %d format %s", i, f)
			read := layout
			read.GPUs, read.Experts = p.GPUs, p.Experts
			for _, rf := range []Format{f, ""} {
				q, err := ReadWith(bytes.NewReader(b.Bytes()), rf, read)
				require.NoError(t, err, "plan %d format %s read as %q:\n%s", i, f, rf, b.String())
				assert.Equal(t, p.GPUs, q.GPUs)
				assert.Equal(t, p.Experts, q.Experts)
				assert.Equal(t, want, slotSets(q), "plan %d format %s read as %q", i, f, rf)
			}
		}
	}
}

// TestVLLMExpertToRankProperty: single-copy plans with one map for every
// layer survive expert_to_ep_rank. It catches a reader that applies the map
// to the wrong number of layers or reads ranks as experts.
func TestVLLMExpertToRankProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for range 200 {
		G, L := 1+rng.IntN(5), 1+rng.IntN(4)
		E := G + rng.IntN(12)
		row := make([]GPU, E)
		for e := range row {
			row[e] = GPU(e % G) // every GPU gets one
		}
		rng.Shuffle(E, func(i, j int) { row[i], row[j] = row[j], row[i] })
		p := FromAssignment(G, sameEveryLayer(L, row), "")
		var b bytes.Buffer
		require.NoError(t, Write(&b, p, FormatVLLM))
		q, err := ReadWith(&b, "", Layout{GPUs: G, Layers: L})
		require.NoError(t, err)
		assert.Equal(t, slotSets(p), slotSets(q))
	}
}

func TestDetect(t *testing.T) {
	for _, gf := range goldenFiles {
		data, err := os.ReadFile(filepath.Join("testdata", gf.file))
		require.NoError(t, err)
		assert.Equal(t, gf.format, detect(data), gf.file)
	}
	assert.Equal(t, FormatVLLM, detect([]byte(`{"expert_to_ep_rank": [0]}`)))
	assert.Equal(t, FormatSGLangPT, detect([]byte("PK\x03\x04rest")))
	assert.Equal(t, FormatVLLMMap, detect([]byte(" [0, 1]")))
	assert.Equal(t, FormatVLLMMapping, detect([]byte("{\"record_type\": \"eplb_load_stats\"}\n{\"record_type\": \"x\"}\n")))
	assert.Equal(t, FormatTRTLLM, detect([]byte("num_slots: 4\n")))
	assert.Equal(t, FormatYAML, detect([]byte("schema: x\n")))
}

func TestSGLangDenseRows(t *testing.T) {
	// Decoder layers 0 and 2 dense (arange(4) % 3), 1 and 3 MoE.
	const good = `{"physical_to_logical_map": [[0,1,2,0],[1,0,2,0],[0,1,2,0],[2,0,1,0]]}`
	l := Layout{GPUs: 2, ModelLayers: 4, LayerIDs: []int{1, 3}}
	p, err := ReadWith(strings.NewReader(good), FormatSGLang, l)
	require.NoError(t, err)
	assert.Equal(t, &Plan{GPUs: 2, Experts: 3, Layers: []LayerPlan{
		{SlotExpert: ex(1, 0, 2, 0), SlotGPU: gp(0, 0, 1, 1)},
		{SlotExpert: ex(2, 0, 1, 0), SlotGPU: gp(0, 0, 1, 1)},
	}}, p)

	cases := []struct {
		name, in string
		layout   Layout
		want     string
	}{
		{"dense row not trivial", `{"physical_to_logical_map": [[0,1,2,0],[1,0,2,0],[0,2,1,0],[2,0,1,0]]}`, l,
			"placement: sglang: physical_to_logical_map[2] is a dense layer (not in Layout.LayerIDs) but not SGLang's trivial map arange(4) % 3: slot 1 holds expert 2, want 1; check Layout.LayerIDs"},
		{"rows per MoE layer only", `{"physical_to_logical_map": [[1,0,2,0],[2,0,1,0]]}`, l,
			"placement: sglang: physical_to_logical_map has 2 rows (SGLang needs one per decoder layer, dense ones included) but Layout.ModelLayers is 4; use the Layout of the model the plan is for, or make a plan for this one"},
		{"unknown MoE rows", good, Layout{GPUs: 2, Layers: 2},
			"placement: sglang: physical_to_logical_map has 4 rows for 2 MoE layers, and the layout does not say which rows are MoE layers; set Layout.LayerIDs"},
		{"layer id beyond the rows", `{"physical_to_logical_map": [[0,1,2,0],[1,2,0,0]]}`, Layout{GPUs: 2, LayerIDs: []int{1, 3}},
			"placement: sglang: Layout.LayerIDs names decoder layer 3 but physical_to_logical_map has 2 rows; check the model's layers"},
		{"slots not divisible", `{"physical_to_logical_map": [[0,1,2]]}`, Layout{GPUs: 2},
			"placement: sglang: the slot lists have 3 slots, not a positive multiple of 2 GPUs; SGLang puts slot p on rank p/(P/ep_size), so check the GPU count (ep_size)"},
		{"duplicate on a rank", `{"physical_to_logical_map": [[0,1,2,0],[1,1,0,2],[0,1,2,0],[2,0,1,0]]}`, l,
			"placement: sglang: physical_to_logical_map[1]: expert 1 is on rank 0 twice (slots 0 and 1 of 2 per rank); SGLang needs the copies of an expert on different ranks, so the file is wrong or for another GPU count than 2"},
		{"expert beyond the model", good, Layout{GPUs: 2, Experts: 2, ModelLayers: 4, LayerIDs: []int{1, 3}},
			"placement: sglang: physical_to_logical_map[1][2] is 2; logical expert ids must be in [0,2)"},
		{"no gpus", good, Layout{ModelLayers: 4, LayerIDs: []int{1, 3}},
			"placement: sglang: physical_to_logical_map does not record the GPU count; set Layout.GPUs to the expert-parallel size"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadWith(strings.NewReader(tc.in), FormatSGLang, tc.layout)
			assert.EqualError(t, err, tc.want)
		})
	}
	_, err = ReadWith(strings.NewReader(good), FormatSGLang, Layout{GPUs: 2, Layers: 2})
	assert.ErrorIs(t, err, ErrNeedLayers)
}

func TestWriteNeedsLayers(t *testing.T) {
	p := goldenPlan()
	cases := []struct {
		format Format
		layout Layout
		want   string
	}{
		{FormatSGLang, Layout{}, "placement: sglang: physical_to_logical_map has one row per decoder layer, dense ones included, and the layout does not say how many decoder layers the model has; set Layout.ModelLayers (num_hidden_layers), and Layout.LayerIDs unless every decoder layer is a MoE layer"},
		{FormatSGLang, Layout{LayerIDs: []int{1, 3}}, "placement: sglang: physical_to_logical_map has one row per decoder layer, dense ones included, and the layout does not say how many decoder layers the model has; set Layout.ModelLayers (num_hidden_layers), and Layout.LayerIDs unless every decoder layer is a MoE layer"},
		{FormatSGLang, Layout{ModelLayers: 4, Layers: 2}, "placement: sglang: the model has 4 decoder layers and 2 MoE layers, and the layout does not say which are MoE layers; set Layout.LayerIDs"},
		{FormatTRTLLM, Layout{}, "placement: trtllm: initial_global_assignments is keyed by decoder-layer index, and the layout does not say which decoder layers the MoE layers are; set Layout.LayerIDs, or Layout.ModelLayers when every decoder layer is a MoE layer"},
		{FormatSGLangPT, Layout{}, "placement: sglang-pt: physical_to_logical_map has one row per decoder layer, dense ones included, and the layout does not say how many decoder layers the model has; set Layout.ModelLayers (num_hidden_layers), and Layout.LayerIDs unless every decoder layer is a MoE layer"},
	}
	for _, tc := range cases {
		t.Run(string(tc.format), func(t *testing.T) {
			err := WriteWith(&bytes.Buffer{}, p, tc.format, tc.layout)
			assert.EqualError(t, err, tc.want)
			assert.EqualError(t, CheckLayout(tc.format, tc.layout), tc.want, "CheckLayout says so before any plan exists")
			assert.ErrorIs(t, err, ErrNeedLayers)
		})
	}
	// Every decoder layer a MoE layer: the ids are known without a list.
	require.NoError(t, WriteWith(&bytes.Buffer{}, p, FormatSGLang, Layout{ModelLayers: 2}))
	require.NoError(t, WriteWith(&bytes.Buffer{}, p, FormatTRTLLM, Layout{ModelLayers: 2}))
	err := WriteWith(&bytes.Buffer{}, p, FormatTRTLLM, Layout{LayerIDs: []int{4}})
	assert.EqualError(t, err, "placement: trtllm: the plan has 2 MoE layers but Layout.LayerIDs lists 1; use the Layout of the model the plan is for, or make a plan for this one")
	_, err = ReadWith(bytes.NewReader([]byte("PK\x03\x04")), "", Layout{GPUs: 2})
	assert.ErrorContains(t, err, "placement: sglang-pt: torchpt: ")
}

func TestLayoutCheck(t *testing.T) {
	cases := []struct {
		layout Layout
		want   string
	}{
		{Layout{GPUs: -1}, "placement: Layout.GPUs is -1; want the expert-parallel size in [1,1048576], or 0 when unknown"},
		{Layout{Experts: -2}, "placement: Layout.Experts is -2"},
		{Layout{Layers: maxLayers + 1}, "placement: Layout.Layers is 4097"},
		{Layout{ModelLayers: -1}, "placement: Layout.ModelLayers is -1"},
		{Layout{LayerIDs: []int{}}, "placement: Layout.LayerIDs is empty"},
		{Layout{LayerIDs: []int{1, 2}, Layers: 3}, "placement: Layout.Layers is 3 but Layout.LayerIDs lists 2 layers; make them agree"},
		{Layout{Layers: 5, ModelLayers: 4}, "placement: Layout.Layers is 5 but Layout.ModelLayers is 4"},
		{Layout{LayerIDs: []int{2, 2}}, "placement: Layout.LayerIDs[1] is 2; want strictly ascending decoder-layer indices in [0,4096)"},
		{Layout{LayerIDs: []int{1, 4}, ModelLayers: 4}, "placement: Layout.LayerIDs[1] is 4; want strictly ascending decoder-layer indices in [0,4)"},
	}
	for _, tc := range cases {
		assert.ErrorContains(t, tc.layout.check(), tc.want)
		_, err := ReadWith(strings.NewReader("{}"), "", tc.layout)
		assert.ErrorContains(t, err, tc.want, "readers check the layout")
	}
	assert.ErrorContains(t, CheckLayout("csv", Layout{}), `unknown format "csv"`)
}

func TestGPUCountMismatch(t *testing.T) {
	cases := []struct {
		format Format
		in     string
		want   string
	}{
		{FormatJSON, string(encodeT(t, goldenPlan(), FormatJSON)), "placement: moetuner: the file records 2 GPUs (gpus) but Layout.GPUs is 4; read it for the expert-parallel size it was written for"},
		{FormatEPLB, string(encodeT(t, goldenPlan(), FormatEPLB)), "placement: eplb: the file records 2 GPUs (num_gpus) but Layout.GPUs is 4; read it for the expert-parallel size it was written for"},
		{FormatVLLMAscend, string(encodeT(t, goldenPlan(), FormatVLLMAscend)), "placement: vllm-ascend: the file records 2 GPUs (device_count) but Layout.GPUs is 4; read it for the expert-parallel size it was written for"},
		{FormatTRTLLM, "num_slots: 4\nep_size: 2\ninitial_global_assignments:\n  0: [0, 1, 2, 0]\n", "placement: trtllm: the file records 2 GPUs (ep_size) but Layout.GPUs is 4; read it for the expert-parallel size it was written for"},
	}
	for _, tc := range cases {
		t.Run(string(tc.format), func(t *testing.T) {
			_, err := ReadWith(strings.NewReader(tc.in), "", Layout{GPUs: 4})
			assert.EqualError(t, err, tc.want)
			var ge *GPUCountError
			require.ErrorAs(t, err, &ge)
			assert.Equal(t, GPUCountError{Format: tc.format, Field: ge.Field, File: 2, Given: 4}, *ge)
			p, err := ReadWith(strings.NewReader(tc.in), "", Layout{GPUs: 2})
			require.NoError(t, err)
			assert.Equal(t, 2, p.GPUs)
		})
	}
}

func TestReadTRTLLM(t *testing.T) {
	// Rank 0 holds expert 0 twice (TensorRT-LLM allows it): one slot with
	// two of expert 0's three copies' share of its tokens.
	const dup = "num_slots: 6\ninitial_global_assignments:\n  5: [0, 0, 1, 2, 0, 3]\nlayer_updates_per_iter: 0\n"
	p, err := ReadWith(strings.NewReader(dup), "", Layout{GPUs: 3})
	require.NoError(t, err)
	assert.Equal(t, &Plan{GPUs: 3, Experts: 4, Layers: []LayerPlan{{
		SlotExpert: ex(0, 1, 2, 0, 3), SlotGPU: gp(0, 1, 1, 2, 2),
		SlotShare: []float64{2.0 / 3, 1, 1, 1.0 / 3, 1},
	}}}, p)

	const good = "num_slots: 4\ninitial_global_assignments:\n  1: [0, 1, 2, 0]\n  3: [2, 0, 1, 0]\n"
	cases := []struct {
		name, in string
		layout   Layout
		want     string
	}{
		{"not divisible", "num_slots: 10\ninitial_global_assignments:\n  0: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n", Layout{GPUs: 4},
			"placement: trtllm: num_slots 10 is not divisible by 4 GPUs (ep_size); TensorRT-LLM needs the same number of slots on every rank"},
		{"missing MoE layer", good, Layout{GPUs: 2, LayerIDs: []int{1, 2, 3}},
			"placement: trtllm: initial_global_assignments has no entry for decoder layer 2, a MoE layer; TensorRT-LLM needs one for every MoE layer"},
		{"dense layer listed", good, Layout{GPUs: 2, LayerIDs: []int{3}},
			"placement: trtllm: initial_global_assignments has decoder layer 1, which the layout does not list as a MoE layer; check Layout.LayerIDs"},
		{"layer beyond the model", good, Layout{GPUs: 2, ModelLayers: 3},
			"placement: trtllm: initial_global_assignments has decoder layer 3 but the model has 3 decoder layers (Layout.ModelLayers)"},
		{"short list", "num_slots: 4\ninitial_global_assignments:\n  1: [0, 1, 2]\n", Layout{GPUs: 2},
			"placement: trtllm: initial_global_assignments[1] has 3 entries, want num_slots 4"},
		{"unknown key", good + "ep_sizes: 2\n", Layout{GPUs: 2},
			"placement: trtllm: yaml: unmarshal errors:\n  line 5: field ep_sizes not found in type placement.trtllmDoc; TensorRT-LLM's moe_load_balancer takes num_slots, initial_global_assignments and layer_updates_per_iter"},
		{"no slots", "initial_global_assignments:\n  1: [0]\n", Layout{GPUs: 1},
			"placement: trtllm: \"num_slots\" must be the physical slots per layer, at least 1"},
		{"no gpus", good, Layout{},
			"placement: trtllm: a load-balancer config without ep_size does not record the GPU count; set Layout.GPUs to the expert-parallel size"},
		{"negative layer", "num_slots: 1\ninitial_global_assignments:\n  -1: [0]\n", Layout{GPUs: 1},
			"placement: trtllm: initial_global_assignments has decoder layer -1; keys are decoder-layer indices, 0 or more"},
		{"expert missing", "num_slots: 2\ninitial_global_assignments:\n  0: [0, 2]\n", Layout{GPUs: 2},
			"placement: layer 0: expert 1 has no slot; place it on at least one GPU"},
		{"two documents", good + "---\nnum_slots: 1\n", Layout{GPUs: 2},
			"placement: trtllm: more than one YAML document; keep one load-balancer config per file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadWith(strings.NewReader(tc.in), FormatTRTLLM, tc.layout)
			assert.EqualError(t, err, tc.want)
		})
	}
}

func TestReadVLLMMap(t *testing.T) {
	p, err := ReadWith(strings.NewReader(`[0, 1, 2, 3, 0, 1]`), "", Layout{GPUs: 3, Layers: 2})
	require.NoError(t, err, "one list for every MoE layer")
	require.Len(t, p.Layers, 2)
	assert.Equal(t, p.Layers[0], p.Layers[1])
	assert.Equal(t, gp(0, 0, 1, 1, 2, 2), p.Layers[0].SlotGPU)

	cases := []struct {
		name, in string
		layout   Layout
		want     string
	}{
		{"one list, layers unknown", `[0, 1]`, Layout{GPUs: 2},
			"placement: vllm-map: the file holds one list for every MoE layer, and the layout does not say how many there are; set Layout.Layers"},
		{"layer count", `[[0, 1], [1, 0]]`, Layout{GPUs: 2, Layers: 3},
			"placement: vllm-map: the map has 2 lists (one per MoE layer) but Layout.Layers is 3; use the Layout of the model the plan is for, or make a plan for this one"},
		{"duplicate on a rank", `[[0, 0, 1, 1]]`, Layout{GPUs: 2},
			"placement: vllm-map: list 0: expert 0 is on rank 0 twice (slots 0 and 1 of 2 per rank); vLLM needs the copies of an expert on different ranks, so the file is wrong or for another GPU count than 2"},
		{"ragged", `[[0, 1], [0]]`, Layout{GPUs: 1},
			"placement: vllm-map: list 1 has 1 slots but list 0 has 2; give every layer the same number of slots"},
		{"negative", `[[0, -1]]`, Layout{GPUs: 1},
			"placement: vllm-map: [0][1] is -1; logical expert ids must be in [0,1048576)"},
		{"not a list of ids", `[["a"]]`, Layout{GPUs: 1},
			"placement: vllm-map: json: cannot unmarshal string into Go value of type int; want a JSON list [[P logical expert ids], ...] with one list per MoE layer, or one list [P] for all of them"},
		{"no gpus", `[[0]]`, Layout{},
			"placement: vllm-map: an initial expert map does not record the GPU count; set Layout.GPUs to the expert-parallel size"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadWith(strings.NewReader(tc.in), FormatVLLMMap, tc.layout)
			assert.EqualError(t, err, tc.want)
		})
	}
}

func TestReadVLLMMapping(t *testing.T) {
	rec := func(fields string) string {
		return `{"record_type":"eplb_initial_mapping","version":1,` + fields + "}\n"
	}
	good := rec(`"num_redundant_experts":1,"num_slots":4,"initial_global_assignments":{"1":[2,0,1,0],"0":[0,1,2,0]}`)
	stats := `{"record_type":"eplb_load_stats","version":1,"step":3,"num_ranks":2,"expert_load":[[1,2,3,4]],"p2l_map":[[0,1,2,0]]}` + "\n"
	p, err := ReadWith(strings.NewReader(stats+"\n"+good), "", Layout{GPUs: 2, Experts: 3})
	require.NoError(t, err, "stats lines are skipped")
	assert.Equal(t, &Plan{GPUs: 2, Experts: 3, Layers: []LayerPlan{
		{SlotExpert: ex(0, 1, 2, 0), SlotGPU: gp(0, 0, 1, 1)},
		{SlotExpert: ex(2, 0, 1, 0), SlotGPU: gp(0, 0, 1, 1)},
	}}, p)

	cases := []struct {
		name, in string
		layout   Layout
		want     string
	}{
		{"stats only", stats, Layout{GPUs: 2},
			"placement: vllm-mapping: the file holds 1 eplb_load_stats records (load statistics) and no eplb_initial_mapping; read it as routing statistics (a trace)"},
		{"two mappings", good + good, Layout{GPUs: 2},
			"placement: vllm-mapping: lines 1 and 2 both hold an eplb_initial_mapping record; keep one placement per file"},
		{"version", `{"record_type":"eplb_initial_mapping","version":2}`, Layout{GPUs: 2},
			"placement: vllm-mapping: line 1: \"version\" must be 1, the version this reader knows"},
		{"redundant count", good, Layout{GPUs: 2, Experts: 4},
			"placement: vllm-mapping: line 1: num_slots 4 minus num_redundant_experts 1 is 3 logical experts, but the model has 4 (Layout.Experts); the redundant count must match the server's"},
		{"key gap", rec(`"num_redundant_experts":0,"num_slots":1,"initial_global_assignments":{"0":[0],"2":[0]}`), Layout{GPUs: 1},
			"placement: vllm-mapping: line 1: initial_global_assignments key \"2\"; want the MoE-layer indices \"0\" to \"1\", one per layer"},
		{"short list", rec(`"num_redundant_experts":0,"num_slots":2,"initial_global_assignments":{"0":[0]}`), Layout{GPUs: 1},
			"placement: vllm-mapping: line 1: initial_global_assignments[\"0\"] has 1 entries, want num_slots 2"},
		{"slots not divisible", rec(`"num_redundant_experts":0,"num_slots":3,"initial_global_assignments":{"0":[0,1,2]}`), Layout{GPUs: 2},
			"placement: vllm-mapping: the slot lists have 3 slots, not a positive multiple of 2 GPUs; vLLM puts slot p on rank p/(P/ep_size), so check the GPU count (ep_size)"},
		{"no record type", `{"version":1}`, Layout{GPUs: 1},
			"placement: vllm-mapping: line 1: missing \"record_type\"; want {\"record_type\": \"eplb_initial_mapping\", ...}"},
		{"broken line", good + "{", Layout{GPUs: 2},
			"placement: vllm-mapping: line 2: unexpected end of JSON input; want one JSON object per line"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadWith(strings.NewReader(tc.in), FormatVLLMMapping, tc.layout)
			assert.EqualError(t, err, tc.want)
		})
	}
}

func TestReadAscend(t *testing.T) {
	doc := func(layers ...string) string {
		return fmt.Sprintf(`{"moe_layer_count": %d, "layer_list": [%s]}`, len(layers), strings.Join(layers, ","))
	}
	layer := func(devs ...string) string {
		return fmt.Sprintf(`{"layer_id": 9, "device_count": %d, "device_list": [%s]}`, len(devs), strings.Join(devs, ","))
	}
	p, err := ReadWith(strings.NewReader(doc(layer(`{"device_expert": [0, 1]}`, `{"device_id": 1, "device_expert": [2, 0]}`))), "", Layout{})
	require.NoError(t, err, "the file records the device count; layer_id is not used")
	assert.Equal(t, &Plan{GPUs: 2, Experts: 3, Layers: []LayerPlan{{SlotExpert: ex(0, 1, 2, 0), SlotGPU: gp(0, 0, 1, 1)}}}, p)

	cases := []struct{ name, in, want string }{
		{"layer count", `{"moe_layer_count": 2, "layer_list": [` + layer(`{"device_expert": [0]}`) + `]}`,
			"placement: vllm-ascend: moe_layer_count is 2 but layer_list has 1 layers; make them agree"},
		{"device count", doc(`{"device_count": 3, "device_list": [{"device_expert": [0]}]}`),
			"placement: vllm-ascend: layer_list[0]: device_count is 3 but device_list has 1 devices; make them agree"},
		{"uneven devices", doc(layer(`{"device_expert": [0, 1]}`, `{"device_expert": [2]}`)),
			"placement: vllm-ascend: layer_list[0].device_list[1] holds 1 experts but layer_list[0].device_list[0] holds 2; vllm-ascend needs the same number on every device in every layer"},
		{"device order", doc(layer(`{"device_id": 1, "device_expert": [0]}`, `{"device_id": 0, "device_expert": [1]}`)),
			"placement: vllm-ascend: layer_list[0].device_list[0] has device_id 1; vllm-ascend takes devices in list order, so list them by device_id 0..1"},
		{"duplicate on a device", doc(layer(`{"device_expert": [0, 0]}`, `{"device_expert": [1, 2]}`)),
			"placement: vllm-ascend: layer_list[0]: expert 0 is on rank 0 twice (slots 0 and 1 of 2 per rank); vllm-ascend needs the copies of an expert on different ranks, so the file is wrong or for another GPU count than 2"},
		{"devices differ between layers", doc(layer(`{"device_expert": [0]}`), layer(`{"device_expert": [0]}`, `{"device_expert": [0]}`)),
			"placement: vllm-ascend: layer_list[1]: device_count is 2 but layer_list[0] has 1; every layer needs the same devices"},
		{"no layers", `{"moe_layer_count": 0, "layer_list": []}`,
			"placement: vllm-ascend: missing or empty \"layer_list\"; add one entry per MoE layer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadWith(strings.NewReader(tc.in), FormatVLLMAscend, Layout{})
			assert.EqualError(t, err, tc.want)
		})
	}
}

// TestWriteRefusesUnequalSlots: a rank-major list cannot say that GPUs
// hold different slot counts (5 experts on 2 GPUs), nor that layers have
// different P; every stack writer refuses with what to change.
func TestWriteRefusesUnequalSlots(t *testing.T) {
	stacks := map[Format]string{FormatSGLang: "SGLang", FormatSGLangPT: "SGLang", FormatEPLB: "", FormatVLLMMap: "vLLM", FormatVLLMMapping: "vLLM",
		FormatVLLMAscend: "vllm-ascend", FormatTRTLLM: "TensorRT-LLM"}
	uneven := roundRobin(1, 5, 2)
	ragged := goldenPlan()
	ragged.Layers[1] = LayerPlan{SlotExpert: ex(0, 1, 2, 0, 1, 2), SlotGPU: gp(0, 0, 0, 1, 1, 1)}
	for f, stack := range stacks {
		t.Run(string(f), func(t *testing.T) {
			err := WriteWith(&bytes.Buffer{}, uneven, f, Layout{ModelLayers: 1})
			if f == FormatEPLB {
				assert.EqualError(t, err, "placement: layer 0: GPU 1 holds 2 slots but GPU 0 holds 3; every GPU needs the same number (add replicas or move slots)")
				return
			}
			assert.EqualError(t, err, fmt.Sprintf("placement: %s: layer 0: GPU 1 holds 2 slots but GPU 0 holds 3; %s puts slot p on rank p/(P/ep_size), so every GPU needs the same number of slots (add replicas or move slots)", f, stack))
			err = WriteWith(&bytes.Buffer{}, ragged, f, goldenLayout)
			assert.EqualError(t, err, fmt.Sprintf("placement: %s: layer 1 has 6 slots but layer 0 has 4; %s needs the same number of physical slots in every layer (add replicas)", f, stack))
		})
	}
}
