package routing

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"codeberg.org/sbinet/npyio/npy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFLAMEJSONLMatchesCSVSample(t *testing.T) {
	full := loadFLAMEJSONL(t)
	require.NoError(t, full.Validate())
	assert.Equal(t, 1024, full.Tokens)
	assert.Equal(t, 8, full.Layers)
	assert.Equal(t, 6, full.TopK)
	assert.Equal(t, 64, full.Experts)
	assert.Equal(t, []int{2, 3, 4, 5, 6, 7, 8, 9}, full.LayerNames)

	src, err := Load(testdataPath(t, "flame-moe-290m", "csv-sample"), LoadOptions{})
	require.NoError(t, err)
	assert.Equal(t, FormatFLAME, src.Format)
	csv := src.Trace
	require.NoError(t, csv.Validate())
	require.Equal(t, 64, csv.Tokens)
	require.Equal(t, []int{2, 3}, csv.LayerNames)
	for tok := range 64 {
		for l := range 2 {
			for j := range 6 {
				i := (tok*8+l)*6 + j
				c := (tok*2+l)*6 + j
				require.Equal(t, full.IDs[i], csv.IDs[c], "token %d layer %d rank %d", tok, l, j)
				require.Equal(t, full.Weights[i], csv.Weights[c])
			}
		}
	}
	// Weights are descending within a layer.
	for i := 0; i < len(csv.Weights); i += 6 {
		for j := 1; j < 6; j++ {
			assert.GreaterOrEqual(t, csv.Weights[i+j-1], csv.Weights[i+j])
		}
	}

	one, err := Load(filepath.Join(testdataPath(t, "flame-moe-290m", "csv-sample"),
		"flame-moe-290m_runid31066_epoch5473_layer3_shard0-0_to_0-0_encoder_32seqs_2048tokens.csv"), LoadOptions{})
	require.NoError(t, err)
	assert.Equal(t, []int{3}, one.Trace.LayerNames)
	assert.Equal(t, 1, one.Stats.Layers)
	assert.Empty(t, one.Stats.Transitions)
}

func TestJSONLRoundTrip(t *testing.T) {
	path := testdataPath(t, "flame-moe-290m", "trace.jsonl")
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, WriteJSONL(&buf, loadFLAMEJSONL(t)))
	assert.Equal(t, string(want), buf.String(), "WriteJSONL(ReadJSONL(f)) must reproduce f")

	tr := handTrace()
	tr.Weights = []float32{0.5, 0.25, 1, 0, 0.125, 3, 1e-7, 2, 0.1, 0.2, 0.3, 0.4}
	buf.Reset()
	require.NoError(t, WriteJSONL(&buf, tr))
	got, err := ReadJSONL(&buf)
	require.NoError(t, err)
	tr.Experts = 4
	assert.Equal(t, tr, got)
}

func TestJSONLWithoutHeader(t *testing.T) {
	in := "{\"layers\":[[0,3],[1,2]],\"source\":1}\n\n{\"layers\":[[2,0],[1,4]]}\n"
	tr, err := ReadJSONL(strings.NewReader(in))
	require.NoError(t, err)
	assert.Equal(t, 5, tr.Experts)
	assert.Equal(t, 2, tr.TopK)
	assert.Equal(t, []int32{1, -1}, tr.Source)
	assert.Nil(t, tr.Step)
	assert.Nil(t, tr.Weights)

	tr, err = ReadJSONL(strings.NewReader("{\"layers\":[[0],[1]]}\n{\"layers\":[[1],[0]],\"source\":4}"))
	require.NoError(t, err)
	assert.Equal(t, []int32{-1, 4}, tr.Source)
}

func TestNPY(t *testing.T) {
	tr := handTrace()
	var buf bytes.Buffer
	require.NoError(t, WriteNPY(&buf, tr))
	assert.Zero(t, (bytes.IndexByte(buf.Bytes(), '\n')+1)%64, "header padded to 64 bytes")

	// An independent reader agrees on the data and the shape.
	r, err := npy.NewReader(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	assert.Equal(t, []int{3, 2, 2}, r.Header.Descr.Shape)
	var flat []int16
	require.NoError(t, r.Read(&flat))
	assert.Equal(t, tr.IDs, flat)

	got, err := ReadNPY(bytes.NewReader(buf.Bytes()), 0)
	require.NoError(t, err)
	assert.Equal(t, tr.IDs, got.IDs)
	assert.Equal(t, 4, got.Experts)
	got, err = ReadNPY(bytes.NewReader(buf.Bytes()), 10)
	require.NoError(t, err)
	assert.Equal(t, 10, got.Experts)

	tests := []struct {
		name  string
		descr string
		shape []int
		vals  []int64
		topK  int
	}{
		{"int32", "<i4", []int{2, 2, 2}, []int64{0, 1, 2, 3, 3, 2, 1, 0}, 2},
		{"int64", "<i8", []int{1, 2, 2}, []int64{0, 1, 2, 3}, 2},
		{"uint8", "|u1", []int{2, 1, 2}, []int64{0, 7, 7, 6}, 2},
		{"big-endian int16", ">i2", []int{1, 1, 2}, []int64{300, 2}, 2},
		{"top1 2-d", "<i2", []int{3, 2}, []int64{0, 1, 1, 1, 2, 0}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data := npyBytes(tc.descr, tc.shape, tc.vals)
			src, err := Read(bytes.NewReader(data), "x.npy", LoadOptions{})
			require.NoError(t, err)
			assert.Equal(t, FormatNPY, src.Format)
			assert.Equal(t, tc.topK, src.Trace.TopK)
			for i, v := range tc.vals {
				assert.Equal(t, int16(v), src.Trace.IDs[i])
			}
		})
	}
}

// npyBytes builds an NPY v1.0 file by hand.
func npyBytes(descr string, shape []int, vals []int64) []byte {
	dims := make([]string, len(shape))
	for i, d := range shape {
		dims[i] = fmt.Sprint(d)
	}
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%s,), }\n", descr, strings.Join(dims, ", "))
	var b bytes.Buffer
	b.WriteString(npyMagic)
	b.Write([]byte{1, 0, byte(len(dict)), byte(len(dict) >> 8)})
	b.WriteString(dict)
	var order binary.ByteOrder = binary.LittleEndian
	if descr[0] == '>' {
		order = binary.BigEndian
	}
	for _, v := range vals {
		switch descr[1:] {
		case "i2":
			_ = binary.Write(&b, order, int16(v))
		case "i4":
			_ = binary.Write(&b, order, int32(v))
		case "i8":
			_ = binary.Write(&b, order, v)
		case "u1":
			b.WriteByte(byte(v))
		}
	}
	return b.Bytes()
}

func TestFiddler(t *testing.T) {
	dir := testdataPath(t, "mixtral-8x7b", "fiddler")
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	require.NoError(t, err)
	require.Len(t, files, 7)
	var tokens float64
	for _, f := range files {
		src, err := Load(f, LoadOptions{})
		require.NoError(t, err, f)
		s := src.Stats
		assert.Equal(t, FormatFiddler, src.Format)
		assert.Nil(t, src.Trace)
		assert.Equal(t, 32, s.Layers)
		assert.Equal(t, 8, s.Experts)
		assert.Equal(t, 2, s.TopK)
		for l := range s.Layers {
			assert.Equal(t, 2*s.Tokens, s.LayerTotal(Layer(l)), "%s layer %d: every row adds up to 2 × tokens", f, l)
		}
		if strings.Contains(f, "machine_learning") {
			assert.Equal(t, 4733.0, s.Tokens)
		}
		tokens += s.Tokens
	}
	src, err := Load(dir, LoadOptions{})
	require.NoError(t, err)
	assert.Equal(t, tokens, src.Stats.Tokens)
	assert.Len(t, src.Stats.Sources, 7)
	assert.Equal(t, FormatFiddler, src.Format)

	top4, err := Load(files[0], LoadOptions{TopK: 4})
	require.NoError(t, err)
	assert.Equal(t, 4, top4.Stats.TopK)
}

func TestOLMoE(t *testing.T) {
	tests := []struct {
		file          string
		experts, topK int
		tokens        float64
	}{
		{"mixtral-8x7b/arxiv.json", 8, 2, 208896},
		{"olmoe-1b-7b/c4.json", 64, 8, 208896},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			src, err := Load(testdataPath(t, "olmoe-routing-analysis", tc.file), LoadOptions{})
			require.NoError(t, err)
			assert.Equal(t, FormatOLMoE, src.Format)
			s := src.Stats
			assert.Equal(t, 3, s.Layers)
			assert.Equal(t, []int{0, 7, 15}, s.LayerNames)
			assert.Equal(t, tc.experts, s.Experts)
			assert.Equal(t, tc.topK, s.TopK)
			assert.Equal(t, tc.tokens, s.Tokens)
			assert.Nil(t, s.Transitions, "skip-layer pairs are not transitions")
			for l := range 3 {
				assert.Equal(t, tc.tokens*float64(tc.topK), s.LayerTotal(Layer(l)))
			}
			f := src.OLMoE
			require.NotNil(t, f)
			require.Len(t, f.CrosslayerCounts, 2)
			assert.Equal(t, [][2]int{{0, 7}, {7, 15}}, f.CrosslayerPairs)
			for a := range tc.experts {
				var row float64
				for _, v := range f.CrosslayerCounts[0][a] {
					row += v
				}
				assert.Equal(t, s.Load[0][a], row, "rank-aligned pair rows add up to the layer-0 counts")
			}
			var top1 float64
			for _, r := range f.CrosslayerCountsTop1[1] {
				for _, v := range r {
					top1 += v
				}
			}
			assert.Equal(t, tc.tokens, top1)
		})
	}
}

func TestLogicalCount(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		opts     LoadOptions
		load     [][]float64
		names    []int
		steps    int
		tokens   float64
		topK     int
		errField string
	}{
		{"object drops zero layers", `{"logical_count": [[0.0,0.0,0.0],[1.0,2.0,3.0],[0,0,0],[3,3,0]]}`, LoadOptions{TopK: 2},
			[][]float64{{1, 2, 3}, {3, 3, 0}}, []int{1, 3}, 0, 3, 2, ""},
		{"keep zero layers", `{"logical_count": [[0,0,0],[1,2,3]]}`, LoadOptions{KeepZeroLayers: true},
			[][]float64{{0, 0, 0}, {1, 2, 3}}, nil, 0, 0, 0, ""},
		{"bare EPLB weight", `[[1,1],[2,0]]`, LoadOptions{},
			[][]float64{{1, 1}, {2, 0}}, nil, 0, 0, 0, ""},
		{"steps", `{"logical_count": [[[0,0],[1,2]],[[0,0],[3,0]]]}`, LoadOptions{TopK: 1},
			[][]float64{{4, 2}}, []int{1}, 2, 6, 1, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src, err := Read(strings.NewReader(tc.in), "counts.json", tc.opts)
			require.NoError(t, err)
			assert.Equal(t, FormatLogicalCount, src.Format)
			s := src.Stats
			assert.Equal(t, tc.load, s.Load)
			assert.Equal(t, tc.names, s.LayerNames)
			assert.Len(t, s.StepLoad, tc.steps)
			assert.Equal(t, tc.tokens, s.Tokens)
			assert.Equal(t, tc.topK, s.TopK)
			require.NoError(t, s.Validate())
		})
	}
	src, err := Read(strings.NewReader(`{"logical_count": [[[0,0],[1,2]],[[0,0],[3,0]]]}`), "", LoadOptions{})
	require.NoError(t, err)
	assert.Equal(t, [][][]float64{{{1, 2}}, {{3, 0}}}, src.Stats.StepLoad)
}

func TestDetect(t *testing.T) {
	tests := []struct {
		name string
		head string
		want Format
	}{
		{"t.npy", "", FormatNPY},
		{"x", npyMagic + "\x01\x00", FormatNPY},
		{"x.csv", "", FormatFLAME},
		{"x", "layer_id,token_id,expert_0", FormatFLAME},
		{"x.jsonl", "", FormatJSONL},
		{"x", "{\"moetuner_trace\":1}", FormatJSONL},
		{"x.json", " {\"layers\":[[1]]}", FormatJSONL},
		{"x.json", "{\"logical_count\": [[1]]}", FormatLogicalCount},
		{"x.json", "[[1,2]]", FormatLogicalCount},
		{"x.json", "{\"total_input_tokens\": 3, \"expert_popularity\": [[1]]}", FormatFiddler},
		{"x.json", "{\"model\":\"m\",\"num_experts\":8,\"layers\":[0],\"expert_counts\":[[1]]}", FormatOLMoE},
	}
	for _, tc := range tests {
		t.Run(tc.name+"/"+tc.head, func(t *testing.T) {
			got, err := Detect(tc.name, []byte(tc.head))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	for _, head := range []string{"", "   ", "hello", "{\"foo\": 1}"} {
		_, err := Detect("x.json", []byte(head))
		var pe *ParseError
		assert.True(t, errors.As(err, &pe), "%q", head)
	}
}

func TestParseErrorFormat(t *testing.T) {
	err := &ParseError{File: "t.jsonl", Line: 17, Field: "layers[3][1]", Err: errors.New(`expert 71 out of range [0,64): set "experts" in the header or fix the id`)}
	assert.Equal(t, `routing: t.jsonl:17: layers[3][1]: expert 71 out of range [0,64): set "experts" in the header or fix the id`, err.Error())
	assert.Equal(t, "routing: line 2: boom", (&ParseError{Line: 2, Err: errors.New("boom")}).Error())
	assert.Equal(t, "routing: f: x: boom", (&ParseError{File: "f", Field: "x", Err: errors.New("boom")}).Error())
	assert.Equal(t, "routing: boom", (&ParseError{Err: errors.New("boom")}).Error())
}

const csvHead = "layer_id,token_id,expert_0,expert_1,expert_2,expert_3\n"

func TestReaderErrors(t *testing.T) {
	hdr := `{"moetuner_trace":1,"experts":4,"top_k":2}` + "\n"
	tests := []struct {
		name    string
		file    string
		opts    LoadOptions
		in      string
		line    int
		field   string
		message string
	}{
		{"jsonl malformed", "t.jsonl", LoadOptions{}, hdr + `{"layers":[[0,1]],}` + "\n", 2, "", "malformed JSON"},
		{"jsonl unclosed", "t.jsonl", LoadOptions{}, hdr + `{"layers":[[0,1]]` + "\n", 2, "", "truncated record: the file is cut short"},
		{"jsonl truncated", "t.jsonl", LoadOptions{}, `{"layers":[[0,1]]}` + "\n" + `{"layers":[[0,`, 2, "", "truncated record: the file is cut short"},
		{"jsonl out of range", "t.jsonl", LoadOptions{}, hdr + `{"layers":[[0,1]]}` + "\n" + `{"layers":[[0,7]]}`, 3, "layers[0][1]", `expert 7 out of range [0,4): set "experts" in the header or fix the id`},
		{"jsonl negative id", "t.jsonl", LoadOptions{}, `{"layers":[[-1,1]]}`, 1, "layers[0][0]", "out of range"},
		{"jsonl duplicate", "t.jsonl", LoadOptions{}, hdr + `{"layers":[[2,2]]}`, 2, "layers[0][1]", "appears twice"},
		{"jsonl inconsistent k", "t.jsonl", LoadOptions{}, `{"layers":[[0,1],[1,2]]}` + "\n" + `{"layers":[[0,1],[2]]}`, 2, "layers[1]", "want top-k 2"},
		{"jsonl inconsistent L", "t.jsonl", LoadOptions{}, `{"layers":[[0,1],[1,2]]}` + "\n" + `{"layers":[[0,1]]}`, 2, "layers", "every record must cover the same layers"},
		{"jsonl header top_k", "t.jsonl", LoadOptions{}, hdr + `{"layers":[[0,1,2]]}`, 2, "layers[0]", "top_k 2"},
		{"jsonl late header", "t.jsonl", LoadOptions{}, `{"layers":[[0,1]]}` + "\n" + hdr, 2, "moetuner_trace", "first line"},
		{"jsonl empty", "t.jsonl", LoadOptions{}, "\n\n", 0, "", "no records"},
		{"jsonl header only", "t.jsonl", LoadOptions{}, hdr, 0, "", "no records"},
		{"jsonl wrong type", "t.jsonl", LoadOptions{}, `{"layers":[[0,"a"]]}`, 1, "layers", "malformed JSON"},
		{"jsonl weights shape", "t.jsonl", LoadOptions{}, `{"layers":[[0,1]],"weights":[[0.5]]}`, 1, "weights", "want 1 layers × 2 weights"},
		{"jsonl weights missing", "t.jsonl", LoadOptions{}, `{"layers":[[0,1]],"weights":[[0.5,0.1]]}` + "\n" + `{"layers":[[0,1]]}`, 2, "weights", "for every token or for none"},
		{"jsonl step missing", "t.jsonl", LoadOptions{}, `{"layers":[[0,1]],"step":1}` + "\n" + `{"layers":[[0,1]]}`, 2, "step", "for every token or for none"},
		{"jsonl bad source", "t.jsonl", LoadOptions{}, `{"layers":[[0,1]],"source":-3}`, 1, "source", "out of range"},
		{"jsonl layer_names", "t.jsonl", LoadOptions{}, `{"moetuner_trace":1,"layer_names":[1,2]}` + "\n" + `{"layers":[[0,1]]}`, 2, "layers", "layer_names"},
		{"jsonl version", "t.jsonl", LoadOptions{}, `{"moetuner_trace":2}`, 1, "moetuner_trace", "unsupported version"},

		{"csv header", "l.csv", LoadOptions{}, "a,b,c\n1,2,3\n", 1, "", "not a FLAME-MoE trace CSV"},
		{"csv column order", "l.csv", LoadOptions{}, "layer_id,token_id,expert_1\n", 1, "expert_1", "expert_0"},
		{"csv empty", "l.csv", LoadOptions{Format: FormatFLAME}, "", 0, "", "empty file"},
		{"csv no rows", "l.csv", LoadOptions{}, csvHead, 0, "", "no data rows"},
		{"csv short row", "l.csv", LoadOptions{}, csvHead + "0,0,0.5,0.1,0,0\n0,1,0.5\n", 3, "", "3 fields, want 6"},
		{"csv malformed", "l.csv", LoadOptions{}, csvHead + "0,0,\"0.5,0.1,0,0\n", 2, "", "malformed CSV"},
		{"csv nan", "l.csv", LoadOptions{}, csvHead + "0,0,NaN,0.1,0.2,0\n", 2, "expert_0", "finite"},
		{"csv negative", "l.csv", LoadOptions{}, csvHead + "0,0,0.5,-0.1,0.2,0\n", 2, "expert_1", "≥ 0"},
		{"csv not a number", "l.csv", LoadOptions{}, csvHead + "0,0,x,0.1,0.2,0\n", 2, "expert_0", "not a number"},
		{"csv token id", "l.csv", LoadOptions{}, csvHead + "0,z,0.5,0.1,0.2,0\n", 2, "token_id", "not an integer"},
		{"csv inconsistent k", "l.csv", LoadOptions{}, csvHead + "0,0,0.5,0.1,0,0\n0,1,0.5,0.1,0.2,0\n", 3, "", "same top-k"},
		{"csv no selection", "l.csv", LoadOptions{}, csvHead + "0,0,0,0,0,0\n", 2, "", "no expert column"},

		{"npy empty", "a.npy", LoadOptions{}, "", 0, "", "empty file"},
		{"npy bad magic", "a.npy", LoadOptions{}, "\x93NUMPZ\x01\x00\x00\x00", 0, "", "bad magic"},
		{"npy truncated header", "a.npy", LoadOptions{}, npyMagic + "\x01\x00\x40\x00{'descr'", 0, "", "truncated NPY header"},
		{"npy huge", "a.npy", LoadOptions{}, string(npyBytes("<i2", []int{1 << 20, 1 << 10, 8}, nil)), 0, "shape", "more than 4294967296 elements"},
		{"npy truncated data", "a.npy", LoadOptions{}, string(npyBytes("<i2", []int{2, 2, 2}, []int64{0, 1, 2})), 0, "", "truncated data"},
		{"npy trailing", "a.npy", LoadOptions{}, string(npyBytes("<i2", []int{1, 1, 1}, []int64{0, 1})), 0, "", "trailing bytes"},
		{"npy dtype", "a.npy", LoadOptions{}, string(npyBytes("<f4", []int{1, 1, 1}, nil)), 0, "descr", "unsupported dtype"},
		{"npy shape", "a.npy", LoadOptions{}, string(npyBytes("<i2", []int{4}, []int64{0, 1, 2, 3})), 0, "shape", "1 dimensions"},
		{"npy negative id", "a.npy", LoadOptions{}, string(npyBytes("<i2", []int{1, 1, 2}, []int64{0, -1})), 0, "data[0,0,1]", "out of range"},
		{"npy experts", "a.npy", LoadOptions{Experts: 2}, string(npyBytes("<i2", []int{1, 1, 2}, []int64{0, 5})), 0, "data[0,0,1]", "set LoadOptions.Experts"},
		{"npy duplicate", "a.npy", LoadOptions{}, string(npyBytes("<i2", []int{1, 1, 2}, []int64{3, 3})), 0, "data[0,0,1]", "appears twice"},
		{"npy fortran", "a.npy", LoadOptions{}, strings.Replace(string(npyBytes("<i2", []int{1, 1, 1}, []int64{0})), "False", "True ", 1), 0, "fortran_order", "ascontiguousarray"},

		{"counts malformed", "c.json", LoadOptions{}, "{\"logical_count\": [[1,2],\n[3,}", 2, "", "malformed JSON"},
		{"counts truncated", "c.json", LoadOptions{}, "{\"logical_count\": [[1,2],\n[3,", 2, "", "truncated JSON"},
		{"counts negative", "c.json", LoadOptions{}, `{"logical_count": [[1,2],[3,-4]]}`, 1, "logical_count[1][1]", "negative"},
		{"counts ragged", "c.json", LoadOptions{}, `{"logical_count": [[1,2],[3]]}`, 1, "logical_count[1]", "want 2 experts"},
		{"counts fraction", "c.json", LoadOptions{}, `{"logical_count": [[1,2.5]]}`, 1, "logical_count[0][1]", "not an integer"},
		{"counts all zero", "c.json", LoadOptions{}, `{"logical_count": [[0,0]]}`, 1, "logical_count", "KeepZeroLayers"},
		{"counts missing", "c.json", LoadOptions{Format: FormatLogicalCount}, `{"x": 1}`, 1, "logical_count", "missing"},
		{"counts NaN", "c.json", LoadOptions{}, `{"logical_count": [[NaN]]}`, 1, "", "malformed JSON"},
		{"counts wrong shape", "c.json", LoadOptions{}, `{"logical_count": [1,2]}`, 1, "logical_count", "want a [layers][experts]"},
		{"counts empty", "c.json", LoadOptions{Format: FormatLogicalCount}, ``, 0, "", "empty file"},
		{"fiddler negative", "f.json", LoadOptions{}, `{"expert_popularity": [[1,-2]]}`, 1, "expert_popularity[0][1]", "negative"},
		{"fiddler empty", "f.json", LoadOptions{}, `{"expert_popularity": []}`, 1, "expert_popularity", "missing or empty"},
		{"fiddler top-k", "f.json", LoadOptions{TopK: 3}, `{"expert_popularity": [[1,2]]}`, 1, "expert_popularity", "top-k 3"},
		{"olmoe layers", "o.json", LoadOptions{}, `{"num_experts":2,"top_k":1,"layers":[0],"expert_counts":[[1,2],[3,4]]}`, 1, "layers", "one layer per row"},
		{"olmoe experts", "o.json", LoadOptions{}, `{"num_experts":0,"top_k":1,"layers":[0],"expert_counts":[[1,2]]}`, 1, "num_experts", "out of range"},
		{"olmoe pair", "o.json", LoadOptions{}, `{"num_experts":2,"top_k":1,"layers":[0],"expert_counts":[[1,2]],"crosslayer_pairs":[[0,9]]}`, 1, "crosslayer_pairs[0]", "layer 9"},
		{"olmoe row", "o.json", LoadOptions{}, `{"num_experts":2,"top_k":1,"layers":[0],"expert_counts":[[1,2,3]]}`, 1, "expert_counts[0]", "want 2 experts"},
		{"olmoe multi-line type", "o.json", LoadOptions{Format: FormatOLMoE}, "{\"num_experts\":2,\n\"top_k\":\"x\"}", 2, "top_k", "malformed JSON"},
		{"unknown", "x.bin", LoadOptions{}, "hello", 0, "", "cannot detect"},
		{"bad format", "x.bin", LoadOptions{Format: "pt"}, "hello", 0, "", "unknown format"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src, err := Read(strings.NewReader(tc.in), tc.file, tc.opts)
			require.Error(t, err)
			assert.Nil(t, src)
			var pe *ParseError
			require.True(t, errors.As(err, &pe), "want *ParseError, got %T: %v", err, err)
			assert.Equal(t, tc.file, pe.File)
			assert.Equal(t, tc.line, pe.Line, err.Error())
			assert.Equal(t, tc.field, pe.Field, err.Error())
			assert.Contains(t, err.Error(), tc.message)
			assert.True(t, strings.HasPrefix(err.Error(), "routing: "+tc.file), err.Error())
		})
	}
}

func TestFLAMEDirErrors(t *testing.T) {
	write := func(dir, name, body string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	row := func(tok int) string { return fmt.Sprintf("0,%d,0.5,0.2,0,0\n", tok) }
	t.Run("token mismatch", func(t *testing.T) {
		dir := t.TempDir()
		write(dir, "m_layer2_x.csv", csvHead+row(0)+row(1)+row(2))
		write(dir, "m_layer10_x.csv", csvHead+row(0)+row(5)+row(2))
		_, err := Load(dir, LoadOptions{})
		var pe *ParseError
		require.True(t, errors.As(err, &pe), "%v", err)
		assert.Equal(t, filepath.Join(dir, "m_layer10_x.csv"), pe.File)
		assert.Equal(t, 3, pe.Line)
		assert.Equal(t, "token_id", pe.Field)
		assert.Contains(t, err.Error(), "same tokens in the same order")
	})
	t.Run("row count", func(t *testing.T) {
		dir := t.TempDir()
		write(dir, "m_layer2_x.csv", csvHead+row(0)+row(1))
		write(dir, "m_layer3_x.csv", csvHead+row(0))
		_, err := Load(dir, LoadOptions{})
		var pe *ParseError
		require.True(t, errors.As(err, &pe), "%v", err)
		assert.Equal(t, "token_id", pe.Field)
	})
	t.Run("sorted by layer number", func(t *testing.T) {
		dir := t.TempDir()
		write(dir, "m_layer10_x.csv", csvHead+"0,0,0,0,0.5,0.2\n")
		write(dir, "m_layer9_x.csv", csvHead+row(0))
		src, err := Load(dir, LoadOptions{})
		require.NoError(t, err)
		assert.Equal(t, []int{9, 10}, src.Trace.LayerNames)
		assert.Equal(t, []int16{0, 1, 2, 3}, src.Trace.IDs)
		assert.Equal(t, 1.0, src.Stats.Transition(0, 0, 2))
	})
	t.Run("no layer number", func(t *testing.T) {
		dir := t.TempDir()
		write(dir, "a.csv", csvHead+row(0))
		_, err := Load(dir, LoadOptions{})
		var pe *ParseError
		require.True(t, errors.As(err, &pe))
		assert.Contains(t, err.Error(), "layer<N>")
	})
	t.Run("missing path", func(t *testing.T) {
		_, err := Load(filepath.Join(t.TempDir(), "nope"), LoadOptions{})
		var pe *ParseError
		require.True(t, errors.As(err, &pe))
	})
}

func TestLoadAll(t *testing.T) {
	p := testdataPath(t, "flame-moe-290m", "trace.jsonl")
	s, srcs, err := LoadAll([]string{p, p}, LoadOptions{})
	require.NoError(t, err)
	require.Len(t, srcs, 2)
	assert.Equal(t, 2048.0, s.Tokens)
	assert.Equal(t, []string{p, p}, s.Sources)
	one := srcs[0].Stats.Clone()
	one.Scale(2)
	assert.Equal(t, one.Load, s.Load)
	assert.Equal(t, one.Patterns, s.Patterns)

	_, _, err = LoadAll([]string{p, testdataPath(t, "mixtral-8x7b", "fiddler")}, LoadOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "fiddler: 32 MoE layers, but "+p+" has 8: traces added up must come from one model")
}

func TestSharedTraces(t *testing.T) {
	shared := sharedTraces(t)
	t.Run("flame dir equals vendored jsonl", func(t *testing.T) {
		src, err := Load(filepath.Join(shared, "flame-moe-290m"), LoadOptions{})
		require.NoError(t, err)
		assert.Equal(t, loadFLAMEJSONL(t), src.Trace)
		assert.Equal(t, 1024.0, src.Stats.Tokens)
	})
	t.Run("deepseek logical_count", func(t *testing.T) {
		files, err := filepath.Glob(filepath.Join(shared, "sglang-deepseek-v3-expert-counts", "*.json"))
		require.NoError(t, err)
		require.NotEmpty(t, files)
		for _, f := range files {
			src, err := Load(f, LoadOptions{TopK: 8})
			require.NoError(t, err, f)
			s := src.Stats
			assert.Equal(t, FormatLogicalCount, src.Format)
			assert.Equal(t, 58, s.Layers, f)
			assert.Equal(t, 256, s.Experts)
			assert.Equal(t, 3, s.LayerNames[0])
			assert.Equal(t, 60, s.LayerNames[57])
			if strings.HasSuffix(f, "prefill_in1024.json") {
				assert.Equal(t, 8388608.0, s.Tokens)
				assert.Equal(t, 67108864.0, s.LayerTotal(0))
			}
		}
		keep, err := Load(files[0], LoadOptions{KeepZeroLayers: true})
		require.NoError(t, err)
		assert.Equal(t, 61, keep.Stats.Layers)
	})
	t.Run("olmoe and fiddler dirs", func(t *testing.T) {
		src, err := Load(filepath.Join(shared, "olmoe-routing-analysis", "olmoe-1b-7b"), LoadOptions{})
		require.NoError(t, err)
		assert.Equal(t, 64, src.Stats.Experts)
		_, err = Load(filepath.Join(shared, "fiddler-mixtral-popularity", "mixtral_8x7b_original"), LoadOptions{})
		require.NoError(t, err)
	})
}

func TestExportedReaders(t *testing.T) {
	open := func(elem ...string) *os.File {
		f, err := os.Open(testdataPath(t, elem...))
		require.NoError(t, err)
		t.Cleanup(func() { f.Close() })
		return f
	}
	tr, err := ReadFLAMECSV(open("flame-moe-290m", "csv-sample",
		"flame-moe-290m_runid31066_epoch5473_layer2_shard0-0_to_0-0_encoder_32seqs_2048tokens.csv"))
	require.NoError(t, err)
	assert.Equal(t, 64, tr.Tokens)
	assert.Equal(t, 6, tr.TopK)
	assert.Nil(t, tr.LayerNames, "no file name, no layer number")

	of, err := ReadOLMoE(open("olmoe-routing-analysis", "olmoe-1b-7b", "c4.json"))
	require.NoError(t, err)
	assert.Equal(t, "allenai/OLMoE-1B-7B-0924", of.Model)
	assert.Equal(t, 64, of.Stats().Experts)

	fs, err := ReadFiddler(open("mixtral-8x7b", "fiddler", "expert_popularity_machine_learning.json"), 0)
	require.NoError(t, err)
	assert.Equal(t, 4733.0, fs.Tokens)

	ls, err := ReadLogicalCount(strings.NewReader(`{"logical_count": [[0,0],[2,4]]}`), LoadOptions{TopK: 2})
	require.NoError(t, err)
	assert.Equal(t, 3.0, ls.Tokens)
	assert.Equal(t, []int{1}, ls.LayerNames)

	_, err = ReadJSONL(strings.NewReader(""))
	var pe *ParseError
	require.ErrorAs(t, err, &pe)
	assert.Empty(t, pe.File)
}
