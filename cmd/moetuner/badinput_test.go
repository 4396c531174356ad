package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
)

// npyFile is an NPY file of dtype descr and shape holding vals.
func npyFile(descr string, shape []int, vals []int64) []byte {
	dims := make([]string, len(shape))
	for i, d := range shape {
		dims[i] = fmt.Sprint(d)
	}
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%s,), }\n", descr, strings.Join(dims, ", "))
	var b bytes.Buffer
	b.WriteString("\x93NUMPY")
	b.Write([]byte{1, 0, byte(len(dict)), byte(len(dict) >> 8)})
	b.WriteString(dict)
	for _, v := range vals {
		switch descr {
		case "<i2":
			_ = binary.Write(&b, binary.LittleEndian, int16(v))
		case "<i4":
			_ = binary.Write(&b, binary.LittleEndian, int32(v))
		case "<i8":
			_ = binary.Write(&b, binary.LittleEndian, v)
		}
	}
	return b.Bytes()
}

// jsonlTrace is a moetuner JSONL trace of tokens records over layers
// layers of top-k ids (token t, layer l: experts (t+l+i) mod experts),
// after header (empty: none).
func jsonlTrace(header string, tokens, layers, k, experts int) string {
	var b strings.Builder
	if header != "" {
		b.WriteString(header + "\n")
	}
	for t := range tokens {
		b.WriteString(`{"layers":[`)
		for l := range layers {
			if l > 0 {
				b.WriteByte(',')
			}
			b.WriteByte('[')
			for i := range k {
				if i > 0 {
					b.WriteByte(',')
				}
				fmt.Fprint(&b, (t+l+i)%experts)
			}
			b.WriteByte(']')
		}
		b.WriteString("]}\n")
	}
	return b.String()
}

// mixtralPlan is planDoc for Mixtral's 8 experts.
func mixtralPlan(gpus, layers int, edit func(experts, gpu []int) ([]int, []int)) string {
	return planDoc(gpus, 8, layers, edit)
}

// planDoc is a moetuner plan file of layers layers of E experts on gpus
// GPUs, slot s holding expert s on GPU s*gpus/E; edit changes layer 0's
// slots.
func planDoc(gpus, E, layers int, edit func(experts, gpu []int) ([]int, []int)) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{\n  \"schema\": \"moetuner.placement/v1\",\n  \"strategy\": \"contiguous\",\n  \"gpus\": %d,\n  \"experts\": %d,\n  \"layers\": [\n", gpus, E)
	for l := range layers {
		experts := make([]int, E)
		gpu := make([]int, E)
		for s := range gpu {
			experts[s], gpu[s] = s, s*gpus/E
		}
		if l == 0 && edit != nil {
			experts, gpu = edit(experts, gpu)
		}
		sep := ","
		if l == layers-1 {
			sep = ""
		}
		fmt.Fprintf(&b, "    {\"slot_expert\": %s, \"slot_gpu\": %s}%s\n", ints(experts), ints(gpu), sep)
	}
	b.WriteString("  ],\n  \"meta\": {}\n}\n")
	return b.String()
}

// pairs is n layers of the top-2 choice (0, 1), flattened.
func pairs(n int) []int64 {
	v := make([]int64, 0, 2*n)
	for range n {
		v = append(v, 0, 1)
	}
	return v
}

// inFormat rewrites the moetuner plan file doc in format f.
func inFormat(t *testing.T, doc string, f placement.Format) string {
	t.Helper()
	p, err := placement.Read(strings.NewReader(doc), placement.FormatJSON)
	require.NoError(t, err)
	var b bytes.Buffer
	require.NoError(t, placement.WriteWith(&b, p, f, placement.Layout{ModelLayers: len(p.Layers)}))
	return b.String()
}

func ints(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return "[" + strings.Join(s, ",") + "]"
}

// TestBadInputCLI runs moetuner on bad files and pins the whole of what it
// prints: the exit status and the one error line, which names the file and
// the line or field and says what would fix it in the command line's words.
// DIR in args and want is the test's temporary directory, FID the bundled
// Fiddler trace (Mixtral-8x7B: 32 layers × 8 experts).
func TestBadInputCLI(t *testing.T) {
	chdirRoot(t)
	const fid = "testdata/mixtral-8x7b/fiddler/expert_popularity_college_medicine.json"
	hdr := `{"moetuner_trace":1,"experts":8,"top_k":2}`
	good := npyFile("<i2", []int{2, 1, 2}, []int64{0, 1, 2, 3})
	cases := []struct {
		name  string
		files map[string]string
		args  []string
		code  int
		want  string
	}{
		// NPY per-token traces.
		{"npy truncated data", map[string]string{"t.npy": string(good[:len(good)-3])},
			[]string{"stats", "DIR/t.npy"}, 1,
			"moetuner: routing: DIR/t.npy: truncated data: 5 bytes, shape [2 1 2] of <i2 needs 8: the file is cut short (an interrupted write or copy); write or copy it again"},
		{"npy truncated header", map[string]string{"t.npy": string(good[:20])},
			[]string{"stats", "DIR/t.npy"}, 1,
			"moetuner: routing: DIR/t.npy: truncated NPY header: the file is cut short (an interrupted write or copy); write or copy it again"},
		{"npy 1-D shape", map[string]string{"t.npy": string(npyFile("<i2", []int{4}, []int64{0, 1, 2, 3}))},
			[]string{"stats", "DIR/t.npy"}, 1,
			"moetuner: routing: DIR/t.npy: shape: 1 dimensions, want [tokens, layers, top-k] or [tokens, layers]"},
		{"npy 4-D shape", map[string]string{"t.npy": string(npyFile("<i2", []int{1, 1, 1, 2}, []int64{0, 1}))},
			[]string{"stats", "DIR/t.npy"}, 1,
			"moetuner: routing: DIR/t.npy: shape: 4 dimensions, want [tokens, layers, top-k] or [tokens, layers]"},
		{"npy hostile shape", map[string]string{"t.npy": string(npyFile("<i2", []int{1 << 40, 1 << 20, 8}, []int64{0, 1}))},
			[]string{"stats", "DIR/t.npy"}, 1,
			"moetuner: routing: DIR/t.npy: shape: bad dimension \"1099511627776\": want an integer in [0,4294967296]; the header is corrupt, or the array too large for one file: save it again with numpy.save, split into several files"},
		{"npy hostile token count", map[string]string{"t.npy": string(npyFile("<i2", []int{1 << 30, 32, 2}, []int64{0, 1}))},
			[]string{"eval", "--trace", "DIR/t.npy", "--plan", "testdata/plans/mixtral-contiguous.json"}, 1,
			"moetuner: routing: DIR/t.npy: truncated data: 4 bytes, shape [1073741824 32 2] of <i2 needs 137438953472: the file is cut short (an interrupted write or copy); write or copy it again"},
		{"npy negative id", map[string]string{"t.npy": string(npyFile("<i2", []int{1, 1, 2}, []int64{0, -1}))},
			[]string{"stats", "DIR/t.npy"}, 1,
			"moetuner: routing: DIR/t.npy: data[0,0,1]: expert -1 out of range [0,32768): ids must be non-negative int16"},
		{"npy id beyond the model's experts", map[string]string{"t.npy": string(npyFile("<i2", []int{1, 32, 2}, append(pairs(31), 0, 9)))},
			[]string{"eval", "--trace", "DIR/t.npy", "--model", "mixtral-8x7b", "--plan", "testdata/plans/mixtral-contiguous.json"}, 1,
			"moetuner: routing: DIR/t.npy: data[0,31,1]: expert 9 out of range [0,8): fix the id, or pass the --model the trace was recorded with"},

		{"npy sources beyond the cluster's GPUs", map[string]string{"t.npy": string(npyFile("<i2", []int{2, 32, 2}, append(pairs(32), pairs(32)...))), "t.source.npy": string(npyFile("<i2", []int{2}, []int64{0, 5}))},
			[]string{"plan", "--trace", "DIR/t.npy", "--model", "mixtral-8x7b", "--out", "DIR/p.json"}, 1,
			"moetuner: --trace DIR/t.npy: its tokens come from source ranks up to 5 (each token's home GPU in the deployment it was recorded on), but the cluster has 4 GPUs (--nodes 1 × --gpus-per-node 4); plan for the deployment it was recorded on, at least 6 GPUs"},

		// JSONL per-token traces, and traces added up.
		{"jsonl id beyond the header's experts", map[string]string{"t.jsonl": hdr + "\n" + `{"layers":[[0,1]]}` + "\n" + `{"layers":[[0,8]]}` + "\n"},
			[]string{"stats", "DIR/t.jsonl"}, 1,
			"moetuner: routing: DIR/t.jsonl:3: layers[0][1]: expert 8 out of range [0,8): set \"experts\" in the header or fix the id"},
		{"jsonl id beyond the model's experts", map[string]string{"t.jsonl": strings.Replace(jsonlTrace("", 2, 32, 2, 8), "[0,1]", "[0,9]", 1)},
			[]string{"eval", "--trace", "DIR/t.jsonl", "--model", "mixtral-8x7b", "--plan", "testdata/plans/mixtral-contiguous.json"}, 1,
			"moetuner: routing: DIR/t.jsonl:1: layers[0][1]: expert 9 out of range [0,8): fix the id, or pass the --model the trace was recorded with"},
		{"jsonl truncated", map[string]string{"t.jsonl": hdr + "\n" + `{"layers":[[0,1]]}` + "\n" + `{"layers":[[0,`},
			[]string{"stats", "DIR/t.jsonl"}, 1,
			"moetuner: routing: DIR/t.jsonl:3: truncated record: the file is cut short (an interrupted write or copy); write or copy it again"},
		{"jsonl top-k changes between rows", map[string]string{"t.jsonl": `{"layers":[[0,1]]}` + "\n" + `{"layers":[[0,1,2]]}` + "\n"},
			[]string{"stats", "DIR/t.jsonl"}, 1,
			"moetuner: routing: DIR/t.jsonl:2: layers[0]: 3 experts, want top-k 2 like the other layers and records"},
		{"jsonl layers change between rows", map[string]string{"t.jsonl": `{"layers":[[0,1],[2,3]]}` + "\n" + `{"layers":[[0,1]]}` + "\n"},
			[]string{"stats", "DIR/t.jsonl"}, 1,
			"moetuner: routing: DIR/t.jsonl:2: layers: 1 layers, but earlier records have 2: every record must cover the same layers"},
		{"jsonl duplicate id in a token", map[string]string{"t.jsonl": `{"layers":[[3,3]]}` + "\n"},
			[]string{"stats", "DIR/t.jsonl"}, 1,
			"moetuner: routing: DIR/t.jsonl:1: layers[0][1]: expert 3 appears twice in this token's top-k: list each selected expert once"},
		{"layers disagree across files", map[string]string{"a.jsonl": jsonlTrace("", 8, 4, 2, 8), "b.jsonl": jsonlTrace("", 8, 3, 2, 8)},
			[]string{"stats", "DIR/a.jsonl", "DIR/b.jsonl"}, 1,
			"moetuner: routing: DIR/b.jsonl: 3 MoE layers, but DIR/a.jsonl has 4: traces added up must come from one model; give the others to a separate command"},
		{"experts disagree across files", map[string]string{"a.jsonl": jsonlTrace(`{"moetuner_trace":1,"experts":8}`, 2, 4, 2, 8), "b.jsonl": jsonlTrace(`{"moetuner_trace":1,"experts":16}`, 2, 4, 2, 16)},
			[]string{"stats", "DIR/a.jsonl", "DIR/b.jsonl"}, 1,
			"moetuner: routing: DIR/b.jsonl: 16 experts per layer, but DIR/a.jsonl has 8: traces added up must come from one model; give the others to a separate command (a per-token trace that does not state its experts counts the largest id + 1: pass the --model the trace was recorded with)"},
		{"top-k disagrees across files", map[string]string{"a.jsonl": jsonlTrace("", 8, 4, 2, 8), "b.jsonl": jsonlTrace("", 8, 4, 1, 8)},
			[]string{"stats", "DIR/a.jsonl", "DIR/b.jsonl"}, 1,
			"moetuner: routing: DIR/b.jsonl: top-k 1, but DIR/a.jsonl has top-k 2: traces added up must come from one model; give the others to a separate command"},
		{"top-k disagrees with --top-k", map[string]string{"t.jsonl": jsonlTrace("", 8, 4, 2, 8)},
			[]string{"stats", "--top-k", "3", "DIR/t.jsonl"}, 1,
			"moetuner: routing: DIR/t.jsonl: the file routes each token to 2 experts per layer, but --top-k is 3: drop --top-k for a file that records its top-k, or give the model's"},
		{"top-k disagrees with the model", map[string]string{"t.jsonl": jsonlTrace("", 8, 32, 3, 8)},
			[]string{"eval", "--trace", "DIR/t.jsonl", "--model", "mixtral-8x7b", "--plan", "testdata/plans/mixtral-contiguous.json"}, 1,
			"moetuner: model \"mixtral-8x7b\" routes each token to 2 experts per layer (top_k) but the trace (DIR/t.jsonl) routes each to 3; pick the matching --model, or a model YAML file with top_k: 3"},

		// SGLang/EPLB logical_count, vLLM and Fiddler counts.
		{"logical_count NaN", map[string]string{"c.json": `{"logical_count": [[1, NaN, 3, 4]]}`},
			[]string{"stats", "DIR/c.json"}, 1,
			"moetuner: routing: DIR/c.json:1: malformed JSON: NaN is not a JSON number (Python's json.dump writes it for a float nan or inf): replace it with a finite number"},
		{"logical_count NaN on a later line", map[string]string{"c.json": "{\"logical_count\": [\n  [1, 2, 3, 4],\n  [5, NaN, 7, 8]\n]}"},
			[]string{"stats", "DIR/c.json"}, 1,
			"moetuner: routing: DIR/c.json:3: malformed JSON: NaN is not a JSON number (Python's json.dump writes it for a float nan or inf): replace it with a finite number"},
		{"logical_count negative", map[string]string{"c.json": "{\"logical_count\": [\n  [1, 2, 3, 4],\n  [5, -6, 7, 8]\n]}"},
			[]string{"stats", "DIR/c.json"}, 1,
			"moetuner: routing: DIR/c.json:3: logical_count[1][1]: count -6 is negative: counts must be ≥ 0"},
		{"logical_count huge", map[string]string{"c.json": `{"logical_count": [[1, 1e300, 3, 4]]}`},
			[]string{"stats", "DIR/c.json"}, 1,
			"moetuner: routing: DIR/c.json:1: logical_count[0][1]: count 1e+300 exceeds 2^53 = 9007199254740992, the largest exact count: the file is corrupt or does not hold token counts"},
		{"logical_count overflows", map[string]string{"c.json": `{"logical_count": [[1, 1e400, 3, 4]]}`},
			[]string{"stats", "DIR/c.json"}, 1,
			"moetuner: routing: DIR/c.json:1: logical_count[0][1]: count 1e400 does not fit a float64: the file is corrupt or does not hold token counts"},
		{"logical_count ragged", map[string]string{"c.json": `{"logical_count": [[1, 2, 3, 4], [1, 2]]}`},
			[]string{"stats", "DIR/c.json"}, 1,
			"moetuner: routing: DIR/c.json:1: logical_count[1]: 2 entries, want 4 experts like the first row"},
		{"logical_count all zeros", map[string]string{"c.json": `{"logical_count": [[0, 0, 0, 0]]}`},
			[]string{"stats", "DIR/c.json"}, 1,
			"moetuner: routing: DIR/c.json:1: logical_count: every layer is all zeros: the file recorded no tokens; record again while the server handles requests"},
		{"logical_count experts differ from the model", map[string]string{"c.json": `{"logical_count": [[1, 2, 3, 4]]}`},
			[]string{"eval", "--trace", "DIR/c.json", "--model", "mixtral-8x7b", "--plan", "testdata/plans/mixtral-contiguous.json"}, 1,
			"moetuner: routing: DIR/c.json: the file has 4 experts per layer, but --model has 8: pass the --model the trace was recorded with"},
		{"logical_count stated experts disagree with the model", map[string]string{"c.json": `{"logical_count": [[1, 2, 3, 4]]}`},
			[]string{"stats", "--model", "mixtral-8x7b", "DIR/c.json"}, 1,
			"moetuner: routing: DIR/c.json: the file has 4 experts per layer, but --model has 8: pass the --model the trace was recorded with"},
		{"vllm load NaN", map[string]string{"v.jsonl": `{"record_type": "eplb_load_stats", "version": 1, "step": 0, "expert_load": [[1, NaN]], "p2l_map": [[0, 1]]}` + "\n"},
			[]string{"stats", "DIR/v.jsonl"}, 1,
			"moetuner: routing: DIR/v.jsonl:1: NaN is not a JSON number (Python's json.dump writes it for a float nan or inf): replace it with a finite number"},
		{"vllm load negative", map[string]string{"v.jsonl": `{"record_type": "eplb_load_stats", "version": 1, "step": 0, "expert_load": [[1, -2]], "p2l_map": [[0, 1]]}` + "\n"},
			[]string{"stats", "DIR/v.jsonl"}, 1,
			"moetuner: routing: DIR/v.jsonl:1: expert_load[0][1]: count -2 is negative: counts must be ≥ 0"},
		{"vllm load huge", map[string]string{"v.jsonl": `{"record_type": "eplb_load_stats", "version": 1, "step": 0, "expert_load": [[1, 1e300]], "p2l_map": [[0, 1]]}` + "\n"},
			[]string{"stats", "DIR/v.jsonl"}, 1,
			"moetuner: routing: DIR/v.jsonl:1: expert_load[0][1]: count 1e+300 exceeds 2^53 = 9007199254740992, the largest exact count: the file is corrupt or does not hold token counts"},
		{"vllm p2l out of range", map[string]string{"v.jsonl": `{"record_type": "eplb_load_stats", "version": 1, "step": 0, "expert_load": [[1, 2]], "p2l_map": [[0, -1]]}` + "\n"},
			[]string{"stats", "DIR/v.jsonl"}, 1,
			"moetuner: routing: DIR/v.jsonl:1: p2l_map[0][1]: logical expert -1 out of range [0,32768): fix the id, or pass the --model the trace was recorded with"},
		{"fiddler huge", map[string]string{"f.json": `{"expert_popularity": [[1, 1e300]]}`},
			[]string{"stats", "DIR/f.json"}, 1,
			"moetuner: routing: DIR/f.json:1: expert_popularity[0][1]: count 1e+300 exceeds 2^53 = 9007199254740992, the largest exact count: the file is corrupt or does not hold token counts"},

		// Placement files.
		{"plan duplicate slot", map[string]string{"p.json": mixtralPlan(4, 32, func(e, g []int) ([]int, []int) { e[1] = 0; return e, g })},
			[]string{"eval", "--trace", fid, "--plan", "DIR/p.json"}, 1,
			"moetuner: placement: layer 0: expert 0 has two copies on GPU 0 (slot 1); remove one (file DIR/p.json)"},
		{"plan expert out of range", map[string]string{"p.json": mixtralPlan(4, 32, func(e, g []int) ([]int, []int) { e[1] = 8; return e, g })},
			[]string{"eval", "--trace", fid, "--plan", "DIR/p.json"}, 1,
			"moetuner: placement: layer 0: slot 1: expert 8 out of range [0,8); use an expert id below 8 (file DIR/p.json)"},
		{"plan GPU out of range", map[string]string{"p.json": mixtralPlan(4, 32, func(e, g []int) ([]int, []int) { g[7] = 4; return e, g })},
			[]string{"eval", "--trace", fid, "--plan", "DIR/p.json"}, 1,
			"moetuner: placement: layer 0: slot 7: GPU 4 out of range [0,4); use a GPU id below 4 or raise gpus (file DIR/p.json)"},
		{"plan slot lists differ", map[string]string{"p.json": mixtralPlan(4, 32, func(e, g []int) ([]int, []int) { return e, g[:7] })},
			[]string{"eval", "--trace", fid, "--plan", "DIR/p.json"}, 1,
			"moetuner: placement: layer 0: slot_expert has 8 slots but slot_gpu has 7; give both one entry per slot (file DIR/p.json)"},
		{"plan truncated", map[string]string{"p.json": mixtralPlan(4, 32, nil)[:200]},
			[]string{"eval", "--trace", fid, "--plan", "DIR/p.json"}, 1,
			"moetuner: placement: line 8: the JSON document ends early: the file is cut short (an interrupted write or copy); write or copy it again (file DIR/p.json)"},
		{"plan for another cluster", map[string]string{"p.json": mixtralPlan(8, 32, nil)},
			[]string{"eval", "--trace", fid, "--nodes", "1", "--gpus-per-node", "4", "--plan", "DIR/p.json"}, 1,
			"moetuner: DIR/p.json records 8 GPUs (gpus) but the cluster has 4 (1 nodes × 4 GPUs); set --nodes and --gpus-per-node (or --cluster) to the file's expert-parallel size"},
		{"--from plan whose layers have different slots", map[string]string{"p.json": mixtralPlan(4, 32, func(e, g []int) ([]int, []int) { return append(e, 0), append(g, 1) })},
			[]string{"plan", "--trace", fid, "--from", "DIR/p.json", "--max-moves", "2", "--out", "DIR/o.json"}, 1,
			"moetuner: --from DIR/p.json: layer 1 has [2 2 2 2] slots per GPU but layer 0 has [2 3 2 2]; moetuner re-places a plan with the same slots in every layer"},
		{"--from plan against --redundant-slots", map[string]string{"p.json": mixtralPlan(4, 32, nil)},
			[]string{"plan", "--trace", fid, "--from", "DIR/p.json", "--redundant-slots", "4", "--out", "DIR/o.json"}, 1,
			"moetuner: --from DIR/p.json has 0 redundant slots per layer (8 slots on 4 GPUs) but --redundant-slots is 4; drop --redundant-slots to keep the running plan's slots"},
		{"--from plan for another cluster", map[string]string{"p.json": mixtralPlan(8, 32, nil)},
			[]string{"plan", "--trace", fid, "--strategy", "contiguous", "--from", "DIR/p.json", "--out", "DIR/o.json"}, 1,
			"moetuner: DIR/p.json records 8 GPUs (gpus) but the cluster has 4 (1 nodes × 4 GPUs); set --nodes and --gpus-per-node (or --cluster) to the file's expert-parallel size"},
		{"eplb plan for another cluster", map[string]string{"p.eplb.json": inFormat(t, mixtralPlan(8, 32, nil), placement.FormatEPLB)},
			[]string{"eval", "--trace", fid, "--plan", "DIR/p.eplb.json"}, 1,
			"moetuner: DIR/p.eplb.json records 8 GPUs (num_gpus) but the cluster has 4 (1 nodes × 4 GPUs); set --nodes and --gpus-per-node (or --cluster) to the file's expert-parallel size"},
		{"plan layers differ from the trace", map[string]string{"p.json": mixtralPlan(4, 30, nil)},
			[]string{"eval", "--trace", fid, "--plan", "DIR/p.json"}, 1,
			"moetuner: DIR/p.json has 30 MoE layers but the trace (testdata/mixtral-8x7b/fiddler/expert_popularity_college_medicine.json) has 32 MoE layers; give the --trace the plan was made for, or make a plan for this trace with moetuner plan"},
		{"plan layers differ, compare", map[string]string{"p.json": mixtralPlan(4, 30, nil)},
			[]string{"compare", "--trace", fid, "--strategies", "contiguous", "--plan", "DIR/p.json"}, 1,
			"moetuner: DIR/p.json has 30 MoE layers but the trace (testdata/mixtral-8x7b/fiddler/expert_popularity_college_medicine.json) has 32 MoE layers; give the --trace the plan was made for, or make a plan for this trace with moetuner plan"},
		{"plan layers differ, --from", map[string]string{"p.json": mixtralPlan(4, 30, nil)},
			[]string{"plan", "--trace", fid, "--strategy", "contiguous", "--from", "DIR/p.json", "--out", "DIR/o.json"}, 1,
			"moetuner: DIR/p.json has 30 MoE layers but the trace (testdata/mixtral-8x7b/fiddler/expert_popularity_college_medicine.json) has 32 MoE layers; give the --trace the plan was made for, or make a plan for this trace with moetuner plan"},
		{"plan experts differ from the trace", map[string]string{"p.json": planDoc(4, 16, 32, nil)},
			[]string{"eval", "--trace", fid, "--plan", "DIR/p.json"}, 1,
			"moetuner: DIR/p.json has 16 experts per layer but the trace (testdata/mixtral-8x7b/fiddler/expert_popularity_college_medicine.json) has 8; give the --trace the plan was made for, or make a plan for this trace with moetuner plan"},
		{"sglang map rows differ from the model", map[string]string{"p.sglang.json": `{"physical_to_logical_map": [[0,1,2,3,4,5,6,7],[0,1,2,3,4,5,6,7]]}`},
			[]string{"eval", "--trace", fid, "--plan", "DIR/p.sglang.json"}, 1,
			"moetuner: DIR/p.sglang.json: physical_to_logical_map has 2 rows (SGLang needs one per decoder layer, dense ones included) but model \"mixtral-8x7b\" has 32 decoder layers (decoder_layers); the file is for another model: give the --trace and --model it was made for, or make a plan for this model with moetuner plan"},
		{"sglang map duplicate slot", map[string]string{"p.sglang.json": `{"physical_to_logical_map": [` + strings.Repeat(`[0,1,2,3,4,5,6,7],`, 31) + `[0,0,2,3,4,5,6,7]]}`},
			[]string{"eval", "--trace", fid, "--plan", "DIR/p.sglang.json"}, 1,
			"moetuner: placement: sglang: physical_to_logical_map[31]: expert 0 is on rank 0 twice (slots 0 and 1 of 2 per rank); SGLang needs the copies of an expert on different ranks, so the file is wrong or for another GPU count than the 4 of --nodes × --gpus-per-node (file DIR/p.sglang.json)"},
		{"sglang map for another GPU count", map[string]string{"p.sglang.json": `{"physical_to_logical_map": [` + strings.Repeat(`[0,1,2,3, 0,4,5,6, 7,1,2,3, 4,5,6,7],`, 31) + `[0,1,2,3, 0,4,5,6, 7,1,2,3, 4,5,6,7]]}`},
			[]string{"eval", "--trace", fid, "--gpus-per-node", "2", "--plan", "DIR/p.sglang.json"}, 1,
			"moetuner: placement: sglang: physical_to_logical_map[0]: expert 0 is on rank 0 twice (slots 0 and 4 of 8 per rank); SGLang needs the copies of an expert on different ranks, so the file is wrong or for another GPU count than the 2 of --nodes × --gpus-per-node (file DIR/p.sglang.json)"},
		{"sglang map hostile id in every row", map[string]string{"p.sglang.json": `{"physical_to_logical_map": [` + strings.Repeat(`[0,1,2,3,4,5,6,1099511627776],`, 31) + `[0,1,2,3,4,5,6,7]]}`},
			[]string{"eval", "--trace", fid, "--plan", "DIR/p.sglang.json"}, 1,
			"moetuner: placement: sglang: physical_to_logical_map[0][7] is 1099511627776; logical expert ids must be in [0,8) (file DIR/p.sglang.json)"},

		// Usage errors: exit status 2.
		{"negative --move-cost", map[string]string{"p.json": mixtralPlan(4, 32, nil)},
			[]string{"plan", "--trace", fid, "--from", "DIR/p.json", "--move-cost", "-1", "--out", "DIR/o.json"}, 2,
			"moetuner plan: --move-cost -1: want 0 (free moves) or more, in units of busiest/mean load per changed slot, such as 0.001 (run 'moetuner plan -h' for the flags)"},
		{"negative --max-moves", map[string]string{"p.json": mixtralPlan(4, 32, nil)},
			[]string{"plan", "--trace", fid, "--from", "DIR/p.json", "--max-moves", "-3", "--out", "DIR/o.json"}, 2,
			"moetuner plan: --max-moves -3: want 0 (no bound) or more slots per layer (run 'moetuner plan -h' for the flags)"},
		{"--max-moves without --from", nil, []string{"compare", "--trace", fid, "--max-moves", "4"}, 2,
			"moetuner compare: --max-moves counts the moves from a running plan: give that plan with --from (run 'moetuner compare -h' for the flags)"},
		{"negative --path-error", nil, []string{"eval", "--trace", fid, "--plan", "p.json", "--path-error", "-1"}, 2,
			"moetuner eval: --path-error -1: want 0 (every path) or a positive relative error such as 0.01 (run 'moetuner eval -h' for the flags)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, body := range tc.files {
				require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
			}
			args := make([]string, len(tc.args))
			for i, a := range tc.args {
				args[i] = strings.ReplaceAll(a, "DIR", dir)
			}
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			code, stdout, stderr := runCLI(t, append(args, "--quiet")...)
			runtime.ReadMemStats(&ms1)
			got := strings.ReplaceAll(strings.TrimSuffix(stderr, "\n"), dir, "DIR")
			assert.Equal(t, tc.code, code)
			assert.Equal(t, tc.want, got)
			assert.Empty(t, stdout, "fails before it reports anything")
			assert.Less(t, ms1.TotalAlloc-ms0.TotalAlloc, uint64(64<<20), "allocated")
		})
	}
}
