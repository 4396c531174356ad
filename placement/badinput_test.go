package placement

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// planJSON is a moetuner plan file of layers layers of E experts on gpus
// GPUs, slot s holding expert s on GPU s*gpus/E; edit changes layer 0's
// slots.
func planJSON(gpus, E, layers int, edit func(experts, gpu []int)) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{\n  \"schema\": \"moetuner.placement/v1\",\n  \"strategy\": \"contiguous\",\n  \"gpus\": %d,\n  \"experts\": %d,\n  \"layers\": [\n", gpus, E)
	for l := range layers {
		experts, gpu := make([]int, E), make([]int, E)
		for s := range gpu {
			experts[s], gpu[s] = s, s*gpus/E
		}
		if l == 0 && edit != nil {
			edit(experts, gpu)
		}
		sep := ","
		if l == layers-1 {
			sep = ""
		}
		fmt.Fprintf(&b, "    {\"slot_expert\": %s, \"slot_gpu\": %s}%s\n", intList(experts), intList(gpu), sep)
	}
	b.WriteString("  ],\n  \"meta\": {}\n}\n")
	return b.String()
}

func intList(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return "[" + strings.Join(s, ",") + "]"
}

// TestBadInputLibrary is the library side of the command line's bad-input
// table (cmd/moetuner TestBadInputCLI) for placement files: the same files
// through ReadFileWith, with the errors in the library's words (Layout
// fields where the command line names flags and the trace), pinned whole
// and of the documented types. The layout is the command line's for the
// bundled Mixtral trace on 4 GPUs. DIR is the test's temporary directory.
func TestBadInputLibrary(t *testing.T) {
	mixtral := Layout{GPUs: 4, Experts: 8, Layers: 32, ModelLayers: 32}
	eplb8 := func() string {
		p, err := Read(strings.NewReader(planJSON(8, 8, 32, nil)), FormatJSON)
		require.NoError(t, err)
		var b bytes.Buffer
		require.NoError(t, WriteWith(&b, p, FormatEPLB, Layout{}))
		return b.String()
	}
	rows := func(n int, row string) string {
		return `{"physical_to_logical_map": [` + strings.Repeat(row+",", n-1) + row + `]}`
	}
	var validation *ValidationError
	var gpuCount *GPUCountError
	var count *CountError
	cases := []struct {
		name   string
		file   string
		layout Layout
		as     any // a pointer to the error type it must be, or nil
		want   string
	}{
		{"duplicate slot", planJSON(4, 8, 32, func(e, _ []int) { e[1] = 0 }), mixtral, &validation,
			"placement: layer 0: expert 0 has two copies on GPU 0 (slot 1); remove one (file DIR/p)"},
		{"expert out of range", planJSON(4, 8, 32, func(e, _ []int) { e[1] = 8 }), mixtral, &validation,
			"placement: layer 0: slot 1: expert 8 out of range [0,8); use an expert id below 8 (file DIR/p)"},
		{"GPU out of range", planJSON(4, 8, 32, func(_, g []int) { g[7] = 4 }), mixtral, &validation,
			"placement: layer 0: slot 7: GPU 4 out of range [0,4); use a GPU id below 4 or raise gpus (file DIR/p)"},
		{"plan for another cluster", planJSON(8, 8, 32, nil), mixtral, &gpuCount,
			"placement: moetuner: the file records 8 GPUs (gpus) but Layout.GPUs is 4; read it for the expert-parallel size it was written for (file DIR/p)"},
		{"plan layers differ from the layout", planJSON(4, 8, 30, nil), mixtral, &count,
			"placement: moetuner: the plan has 30 MoE layers but Layout.Layers is 32; use the Layout of the model the plan is for, or make a plan for this one (file DIR/p)"},
		{"plan layers differ from the layout's ids", planJSON(4, 8, 30, nil), Layout{GPUs: 4, LayerIDs: []int{1, 2}}, &count,
			"placement: moetuner: the plan has 30 MoE layers but Layout.LayerIDs lists 2; use the Layout of the model the plan is for, or make a plan for this one (file DIR/p)"},
		{"plan experts differ from the layout", planJSON(4, 16, 32, nil), mixtral, &count,
			"placement: moetuner: the plan has 16 experts per layer but Layout.Experts is 8; use the Layout of the model the plan is for, or make a plan for this one (file DIR/p)"},
		{"plan truncated", planJSON(4, 8, 32, nil)[:200], mixtral, nil,
			"placement: line 8: the JSON document ends early: the file is cut short (an interrupted write or copy); write or copy it again (file DIR/p)"},
		{"plan with a syntax error", strings.Replace(planJSON(4, 8, 2, nil), `"gpus": 4,`, `"gpus": 4,,`, 1), mixtral, nil,
			"placement: line 4: invalid JSON: invalid character ',' looking for beginning of object key string; fix the document (see the placement package doc for the shape) (file DIR/p)"},
		{"sglang rows differ from the model's decoder layers", rows(2, "[0,1,2,3,4,5,6,7]"), mixtral, &count,
			"placement: sglang: physical_to_logical_map has 2 rows (SGLang needs one per decoder layer, dense ones included) but Layout.ModelLayers is 32; use the Layout of the model the plan is for, or make a plan for this one (file DIR/p)"},
		{"sglang duplicate slot", rows(32, "[0,0,2,3,4,5,6,7]"), mixtral, nil,
			"placement: sglang: physical_to_logical_map[0]: expert 0 is on rank 0 twice (slots 0 and 1 of 2 per rank); SGLang needs the copies of an expert on different ranks, so the file is wrong or for another GPU count than 4 (file DIR/p)"},
		{"sglang hostile id", rows(32, "[0,1,2,3,4,5,6,1099511627776]"), mixtral, nil,
			"placement: sglang: physical_to_logical_map[0][7] is 1099511627776; logical expert ids must be in [0,8) (file DIR/p)"},
		{"eplb plan for another cluster", eplb8(), mixtral, &gpuCount,
			"placement: eplb: the file records 8 GPUs (num_gpus) but Layout.GPUs is 4; read it for the expert-parallel size it was written for (file DIR/p)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "p")
			require.NoError(t, os.WriteFile(path, []byte(tc.file), 0o644))
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			p, err := ReadFileWith(path, tc.layout)
			runtime.ReadMemStats(&ms1)
			require.Error(t, err)
			assert.Nil(t, p)
			assert.Equal(t, tc.want, strings.ReplaceAll(err.Error(), dir, "DIR"))
			if tc.as != nil {
				assert.True(t, errors.As(err, tc.as), "want %T, got %T", tc.as, err)
			}
			assert.Less(t, ms1.TotalAlloc-ms0.TotalAlloc, uint64(64<<20), "allocated")
		})
	}
}
