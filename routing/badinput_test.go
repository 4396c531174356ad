package routing

import (
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

// tokensJSONL is a headerless-or-not JSONL trace of tokens records over
// layers layers of top-k ids (token t, layer l: experts (t+l+i) mod
// experts).
func tokensJSONL(header string, tokens, layers, k, experts int) string {
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

// TestBadInputLibrary is the library side of the command line's bad-input
// table (cmd/moetuner TestBadInputCLI): the same files through Load and
// LoadAll, with the errors in the library's words (LoadOptions fields
// where the command line names flags). Each error is a *ParseError naming
// the file, pinned whole; none allocates more than 64 MiB. DIR is the
// test's temporary directory.
func TestBadInputLibrary(t *testing.T) {
	hdr := `{"moetuner_trace":1,"experts":8,"top_k":2}`
	good := npyBytes("<i2", []int{2, 1, 2}, []int64{0, 1, 2, 3})
	ones := func(n int) []int64 {
		v := make([]int64, 0, 2*n)
		for range n {
			v = append(v, 0, 1)
		}
		return v
	}
	vllm := func(load string) string {
		return `{"record_type": "eplb_load_stats", "version": 1, "step": 0, "expert_load": [` + load + `], "p2l_map": [[0, 1]]}` + "\n"
	}
	cases := []struct {
		name  string
		files map[string]string
		paths []string // DIR/NAME; nil: the one file
		opts  LoadOptions
		want  string
	}{
		{"npy truncated data", map[string]string{"t.npy": string(good[:len(good)-3])}, nil, LoadOptions{},
			"routing: DIR/t.npy: truncated data: 5 bytes, shape [2 1 2] of <i2 needs 8: the file is cut short (an interrupted write or copy); write or copy it again"},
		{"npy truncated header", map[string]string{"t.npy": string(good[:20])}, nil, LoadOptions{},
			"routing: DIR/t.npy: truncated NPY header: the file is cut short (an interrupted write or copy); write or copy it again"},
		{"npy 4-D shape", map[string]string{"t.npy": string(npyBytes("<i2", []int{1, 1, 1, 2}, []int64{0, 1}))}, nil, LoadOptions{},
			"routing: DIR/t.npy: shape: 4 dimensions, want [tokens, layers, top-k] or [tokens, layers]"},
		{"npy hostile shape", map[string]string{"t.npy": string(npyBytes("<i2", []int{1 << 40, 1 << 20, 8}, []int64{0, 1}))}, nil, LoadOptions{StatsOnly: true},
			`routing: DIR/t.npy: shape: bad dimension "1099511627776": want an integer in [0,4294967296]; the header is corrupt, or the array too large for one file: save it again with numpy.save, split into several files`},
		{"npy hostile token count", map[string]string{"t.npy": string(npyBytes("<i2", []int{1 << 30, 32, 2}, []int64{0, 1}))}, nil, LoadOptions{StatsOnly: true},
			"routing: DIR/t.npy: truncated data: 4 bytes, shape [1073741824 32 2] of <i2 needs 137438953472: the file is cut short (an interrupted write or copy); write or copy it again"},
		{"npy hostile token count, trace kept", map[string]string{"t.npy": string(npyBytes("<i2", []int{1 << 30, 32, 2}, []int64{0, 1}))}, nil, LoadOptions{},
			"routing: DIR/t.npy: shape: shape [1073741824 32 2] claims more than 4294967296 elements: split the trace"},
		{"npy id beyond LoadOptions.Experts", map[string]string{"t.npy": string(npyBytes("<i2", []int{1, 32, 2}, append(ones(31), 0, 9)))}, nil, LoadOptions{Experts: 8},
			"routing: DIR/t.npy: data[0,31,1]: expert 9 out of range [0,8): fix the id, or set LoadOptions.Experts to the model's experts per layer"},
		{"npy id beyond LoadOptions.Experts, stats only", map[string]string{"t.npy": string(npyBytes("<i2", []int{1, 32, 2}, append(ones(31), 0, 9)))}, nil, LoadOptions{Experts: 8, StatsOnly: true},
			"routing: DIR/t.npy: data[0,31,1]: expert 9 out of range [0,8): fix the id, or set LoadOptions.Experts to the model's experts per layer"},

		{"jsonl id beyond the header's experts", map[string]string{"t.jsonl": hdr + "\n" + `{"layers":[[0,1]]}` + "\n" + `{"layers":[[0,8]]}` + "\n"}, nil, LoadOptions{},
			`routing: DIR/t.jsonl:3: layers[0][1]: expert 8 out of range [0,8): set "experts" in the header or fix the id`},
		{"jsonl id beyond LoadOptions.Experts", map[string]string{"t.jsonl": strings.Replace(tokensJSONL("", 2, 32, 2, 8), "[0,1]", "[0,9]", 1)}, nil, LoadOptions{Experts: 8, StatsOnly: true},
			"routing: DIR/t.jsonl:1: layers[0][1]: expert 9 out of range [0,8): fix the id, or set LoadOptions.Experts to the model's experts per layer"},
		{"jsonl header contradicts LoadOptions.Experts", map[string]string{"t.jsonl": hdr + "\n" + `{"layers":[[0,1]]}` + "\n"}, nil, LoadOptions{Experts: 16},
			"routing: DIR/t.jsonl:1: experts: the header says 8 experts, but LoadOptions.Experts is 16: set LoadOptions.Experts to the model's experts per layer, or fix the header"},
		{"jsonl truncated", map[string]string{"t.jsonl": hdr + "\n" + `{"layers":[[0,1]]}` + "\n" + `{"layers":[[0,`}, nil, LoadOptions{},
			"routing: DIR/t.jsonl:3: truncated record: the file is cut short (an interrupted write or copy); write or copy it again"},
		{"jsonl top-k changes between rows", map[string]string{"t.jsonl": `{"layers":[[0,1]]}` + "\n" + `{"layers":[[0,1,2]]}` + "\n"}, nil, LoadOptions{},
			"routing: DIR/t.jsonl:2: layers[0]: 3 experts, want top-k 2 like the other layers and records"},
		{"jsonl duplicate id in a token", map[string]string{"t.jsonl": `{"layers":[[3,3]]}` + "\n"}, nil, LoadOptions{},
			"routing: DIR/t.jsonl:1: layers[0][1]: expert 3 appears twice in this token's top-k: list each selected expert once"},
		{"layers disagree across files", map[string]string{"a.jsonl": tokensJSONL("", 8, 4, 2, 8), "b.jsonl": tokensJSONL("", 8, 3, 2, 8)}, []string{"a.jsonl", "b.jsonl"}, LoadOptions{},
			"routing: DIR/b.jsonl: 3 MoE layers, but DIR/a.jsonl has 4: traces added up must come from one model; load the others separately"},
		{"experts disagree across files", map[string]string{"a.jsonl": tokensJSONL(`{"moetuner_trace":1,"experts":8}`, 2, 4, 2, 8), "b.jsonl": tokensJSONL(`{"moetuner_trace":1,"experts":16}`, 2, 4, 2, 16)}, []string{"a.jsonl", "b.jsonl"}, LoadOptions{},
			"routing: DIR/b.jsonl: 16 experts per layer, but DIR/a.jsonl has 8: traces added up must come from one model; load the others separately (a per-token trace that does not state its experts counts the largest id + 1: set LoadOptions.Experts to the model's experts per layer)"},
		{"top-k disagrees across files", map[string]string{"a.jsonl": tokensJSONL("", 8, 4, 2, 8), "b.jsonl": tokensJSONL("", 8, 4, 1, 8)}, []string{"a.jsonl", "b.jsonl"}, LoadOptions{},
			"routing: DIR/b.jsonl: top-k 1, but DIR/a.jsonl has top-k 2: traces added up must come from one model; load the others separately"},
		{"files in a directory disagree", map[string]string{"a.jsonl": tokensJSONL("", 8, 4, 2, 8), "b.jsonl": tokensJSONL("", 8, 3, 2, 8)}, []string{""}, LoadOptions{},
			"routing: DIR/b.jsonl: 3 MoE layers, but DIR/a.jsonl has 4: traces added up must come from one model; load the others separately"},
		{"decoder layers disagree across files", map[string]string{"a.json": `{"logical_count": [[0, 0], [1, 2]]}`, "b.json": `{"logical_count": [[1, 2], [0, 0]]}`}, []string{"a.json", "b.json"}, LoadOptions{},
			"routing: DIR/b.json: MoE layers at decoder layers [0], but DIR/a.json has them at [1]: traces added up must come from one model; load the others separately"},
		{"top-k contradicts LoadOptions.TopK", map[string]string{"t.jsonl": tokensJSONL("", 8, 4, 2, 8)}, nil, LoadOptions{TopK: 3},
			"routing: DIR/t.jsonl: the file routes each token to 2 experts per layer, but LoadOptions.TopK is 3: leave LoadOptions.TopK 0 for a file that records its top-k, or give the model's"},

		{"logical_count NaN", map[string]string{"c.json": `{"logical_count": [[1, NaN, 3, 4]]}`}, nil, LoadOptions{},
			"routing: DIR/c.json:1: malformed JSON: NaN is not a JSON number (Python's json.dump writes it for a float nan or inf): replace it with a finite number"},
		{"logical_count -Infinity on a later line", map[string]string{"c.json": "{\"logical_count\": [\n  [1, 2, 3, 4],\n  [5, -Infinity, 7, 8]\n]}"}, nil, LoadOptions{},
			"routing: DIR/c.json:3: malformed JSON: -Infinity is not a JSON number (Python's json.dump writes it for a float nan or inf): replace it with a finite number"},
		{"logical_count negative on a later line", map[string]string{"c.json": "{\"logical_count\": [\n  [1, 2, 3, 4],\n  [5, -6, 7, 8]\n]}"}, nil, LoadOptions{},
			"routing: DIR/c.json:3: logical_count[1][1]: count -6 is negative: counts must be ≥ 0"},
		{"logical_count huge", map[string]string{"c.json": `{"logical_count": [[1, 1e300, 3, 4]]}`}, nil, LoadOptions{},
			"routing: DIR/c.json:1: logical_count[0][1]: count 1e+300 exceeds 2^53 = 9007199254740992, the largest exact count: the file is corrupt or does not hold token counts"},
		{"logical_count overflows float64", map[string]string{"c.json": `{"logical_count": [[[1, 2]], [[3, 1e400]]]}`}, nil, LoadOptions{},
			"routing: DIR/c.json:1: logical_count[1][0][1]: count 1e400 does not fit a float64: the file is corrupt or does not hold token counts"},
		{"logical_count all zeros", map[string]string{"c.json": `{"logical_count": [[0, 0, 0, 0]]}`}, nil, LoadOptions{},
			"routing: DIR/c.json:1: logical_count: every layer is all zeros: set LoadOptions.KeepZeroLayers to keep them"},
		{"logical_count contradicts LoadOptions.Experts", map[string]string{"c.json": `{"logical_count": [[1, 2, 3, 4]]}`}, nil, LoadOptions{Experts: 8},
			"routing: DIR/c.json: the file has 4 experts per layer, but LoadOptions.Experts is 8: set LoadOptions.Experts to the model's experts per layer"},
		{"vllm load NaN", map[string]string{"v.jsonl": vllm("[1, NaN]")}, nil, LoadOptions{},
			"routing: DIR/v.jsonl:1: NaN is not a JSON number (Python's json.dump writes it for a float nan or inf): replace it with a finite number"},
		{"vllm load negative", map[string]string{"v.jsonl": vllm("[1, -2]")}, nil, LoadOptions{},
			"routing: DIR/v.jsonl:1: expert_load[0][1]: count -2 is negative: counts must be ≥ 0"},
		{"vllm load huge", map[string]string{"v.jsonl": vllm("[1, 1e300]")}, nil, LoadOptions{},
			"routing: DIR/v.jsonl:1: expert_load[0][1]: count 1e+300 exceeds 2^53 = 9007199254740992, the largest exact count: the file is corrupt or does not hold token counts"},
		{"fiddler huge on a later line", map[string]string{"f.json": "{\"expert_popularity\": [\n[1, 2],\n[3, 1e300]]}"}, nil, LoadOptions{},
			"routing: DIR/f.json:3: expert_popularity[1][1]: count 1e+300 exceeds 2^53 = 9007199254740992, the largest exact count: the file is corrupt or does not hold token counts"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, body := range tc.files {
				require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
			}
			paths := tc.paths
			if paths == nil {
				for name := range tc.files {
					paths = append(paths, name)
				}
			}
			for i, p := range paths {
				paths[i] = filepath.Join(dir, p)
			}
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			_, _, err := LoadAll(paths, tc.opts)
			runtime.ReadMemStats(&ms1)
			require.Error(t, err)
			var pe *ParseError
			require.True(t, errors.As(err, &pe), "want a *ParseError, got %T: %v", err, err)
			assert.True(t, strings.HasPrefix(pe.File, dir), "names the file: %q", pe.File)
			assert.Equal(t, tc.want, strings.ReplaceAll(err.Error(), dir, "DIR"))
			assert.Less(t, ms1.TotalAlloc-ms0.TotalAlloc, uint64(64<<20), "allocated")
		})
	}
}

// TestJSONLine finds the line of a field in a JSON document written over
// many lines, and 0 for fields that are not there.
func TestJSONLine(t *testing.T) {
	doc := "{\"a\": 1,\n \"logical_count\": [\n  [1, 2],\n  [3,\n   4]\n ],\n \"x\": {\"y\": [5]}}"
	for field, want := range map[string]int{
		"a": 1, "logical_count": 2, "logical_count[0]": 3, "logical_count[1][0]": 4, "logical_count[1][1]": 5,
		"logical_count[2]": 0, "logical_count[0][2]": 0, "missing": 0, "a[0]": 0, "x[0]": 0, "bad[": 0, "logical_count[-1]": 0,
	} {
		assert.Equal(t, want, jsonLine([]byte(doc), field), field)
	}
	assert.Equal(t, 3, jsonLine([]byte("[\n [1],\n [2, 3]]"), "[1][1]"), "a bare array")
}
