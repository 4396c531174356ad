package placement

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/moetuner/moetuner/routing"
)

// maxFuzzBytes caps fuzz inputs: every reader is linear in its input, so
// larger ones find nothing new and only slow the search.
const maxFuzzBytes = 1 << 14

// goldenData returns the golden files' contents.
func goldenData() [][]byte {
	var out [][]byte
	for _, gf := range goldenFiles {
		if data, err := os.ReadFile(filepath.Join("testdata", gf.file)); err == nil {
			out = append(out, data)
		}
	}
	return out
}

// checkRead fails t unless a reader's result is a valid plan that agrees
// with layout l, or an error with no plan; a plan must also survive
// moetuner JSON and, where it fits, its own format again.
func checkRead(t *testing.T, format Format, l Layout, p *Plan, err error) {
	t.Helper()
	if err != nil {
		if p != nil {
			t.Fatalf("plan and error both returned: %v", err)
		}
		return
	}
	if verr := p.Validate(ValidateOptions{Experts: l.Experts, Layers: l.moeLayers()}); verr != nil {
		t.Fatalf("reader returned an invalid plan: %v", verr)
	}
	if l.GPUs != 0 && p.GPUs != l.GPUs {
		t.Fatalf("plan has %d GPUs, layout %d", p.GPUs, l.GPUs)
	}
	var b bytes.Buffer
	if err := Write(&b, p, FormatJSON); err != nil {
		t.Fatalf("write json: %v", err)
	}
	q, err := Read(&b, FormatJSON)
	if err != nil || !p.Equal(q) {
		t.Fatalf("json round trip: %v", err)
	}
	if format == "" || format == FormatJSON || format == FormatYAML || p.Layers[0].SlotShare != nil {
		return // shares (merged TensorRT-LLM copies) have no rank-major list
	}
	w := l
	switch {
	case w.LayerIDs != nil && w.ModelLayers == 0:
		// Read with the MoE rows known but not the model's size: the
		// smallest model that has them.
		w.ModelLayers = w.LayerIDs[len(w.LayerIDs)-1] + 1
	case w.decoderIDs() == nil:
		w.ModelLayers, w.Layers = len(p.Layers), 0
	}
	b.Reset()
	if err := WriteWith(&b, p, format, w); err != nil {
		t.Fatalf("write back as %s: %v", format, err)
	}
	w.GPUs, w.Experts = p.GPUs, p.Experts
	q, err = ReadWith(&b, format, w)
	if err != nil {
		t.Fatalf("read back %s: %v\n%s", format, err, b.String())
	}
	if got, want := slotSets(q), slotSets(p); !equalSets(got, want) {
		t.Fatalf("%s round trip changed the placement: %v != %v", format, got, want)
	}
}

func equalSets(a, b [][][]int) bool {
	if len(a) != len(b) {
		return false
	}
	for l := range a {
		if len(a[l]) != len(b[l]) {
			return false
		}
		for g := range a[l] {
			if len(a[l][g]) != len(b[l][g]) {
				return false
			}
			for i := range a[l][g] {
				if a[l][g][i] != b[l][g][i] {
					return false
				}
			}
		}
	}
	return true
}

// fuzzLayout turns fuzzed bytes into a layout: gpus 0..7, a model of up to
// 7 decoder layers whose MoE layers are the bits of ids (none: unknown).
func fuzzLayout(gpus, model, ids uint8) Layout {
	l := Layout{GPUs: int(gpus % 8), ModelLayers: int(model % 8)}
	for i := range 8 {
		if ids&(1<<i) != 0 && (l.ModelLayers == 0 || i < l.ModelLayers) {
			l.LayerIDs = append(l.LayerIDs, i)
		}
	}
	return l
}

// FuzzRead: detection and every reader never panic, and whatever reads is
// valid, agrees with the layout and writes back.
func FuzzRead(f *testing.F) {
	for _, data := range goldenData() {
		f.Add(data)
	}
	f.Add([]byte(`{"physical_to_logical_map": [[0,1],[1,0]]}`))
	f.Add([]byte(`{"schema": "moetuner.placement/v1", "gpus": 1, "experts": 1, "layers": [{"slot_expert": [0], "slot_gpu": [0]}]}`))
	f.Add([]byte("schema: moetuner.placement/v1\ngpus: 1\nexperts: 1\nlayers: [{slot_expert: [0], slot_gpu: [0]}]\n"))
	f.Add([]byte(`{"logical_count": [[1]]}`))
	f.Add([]byte(`{"expert_to_ep_rank": [1,0,1,0]}`))
	f.Add([]byte("PK\x03\x04"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxFuzzBytes {
			t.Skip("input too large")
		}
		for _, f := range []Format{"", FormatJSON, FormatYAML} {
			p, err := Read(bytes.NewReader(data), f)
			if errors.Is(err, ErrNeedGPUs) && f != "" {
				t.Fatalf("format %q reported ErrNeedGPUs", f)
			}
			checkRead(t, f, Layout{}, p, err)
		}
		for _, g := range []int{1, 2, 3} {
			p, err := ReadSGLang(bytes.NewReader(data), g)
			checkRead(t, FormatSGLang, Layout{GPUs: g}, p, err)
			p, err = ReadVLLM(bytes.NewReader(data), g, 2)
			checkRead(t, FormatVLLM, Layout{GPUs: g, Layers: 2}, p, err)
		}
		for _, g := range []int{0, 2} {
			p, err := ReadEPLB(bytes.NewReader(data), g)
			checkRead(t, FormatEPLB, Layout{GPUs: g}, p, err)
			if err == nil {
				// An EPLB file writes back as EPLB and reads back unchanged.
				var b bytes.Buffer
				if err := Write(&b, p, FormatEPLB); err != nil {
					t.Fatalf("write eplb: %v", err)
				}
				q, err := ReadEPLB(&b, p.GPUs)
				if err != nil || !p.Equal(q) {
					t.Fatalf("eplb round trip: %v, %+v != %+v", err, p, q)
				}
			}
		}
	})
}

// fuzzFormat fuzzes one reader with fuzzed layouts.
func fuzzFormat(f *testing.F, format Format, seeds ...string) {
	seed := goldenData()
	for _, s := range seeds {
		seed = append(seed, []byte(s))
	}
	for _, data := range seed {
		f.Add(data, uint8(2), uint8(0), uint8(0))
		f.Add(data, uint8(2), uint8(4), uint8(0b1010)) // goldenLayout
	}
	f.Fuzz(func(t *testing.T, data []byte, gpus, model, ids uint8) {
		if len(data) > maxFuzzBytes {
			t.Skip("input too large")
		}
		l := fuzzLayout(gpus, model, ids)
		if l.check() != nil {
			t.Skip("inconsistent layout")
		}
		p, err := ReadWith(bytes.NewReader(data), format, l)
		checkRead(t, format, l, p, err)
		p, err = ReadWith(bytes.NewReader(data), "", l)
		checkRead(t, "", l, p, err)
	})
}

func FuzzReadSGLang(f *testing.F) {
	fuzzFormat(f, FormatSGLang,
		`{"physical_to_logical_map": [[0,1,2,0],[1,0,2,0],[0,1,2,0],[2,0,1,0]]}`,
		`{"physical_to_logical_map": [[0,1],[1,0]], "logical_count": null}`)
}

func FuzzReadTRTLLM(f *testing.F) {
	fuzzFormat(f, FormatTRTLLM,
		"num_slots: 6\ninitial_global_assignments:\n  5: [0, 0, 1, 2, 0, 3]\nlayer_updates_per_iter: 0\n",
		"num_slots: 4\nep_size: 2\ninitial_global_assignments:\n  1: [0, 1, 2, 0]\n  3: [2, 0, 1, 0]\n")
}

func FuzzReadVLLMMap(f *testing.F) {
	fuzzFormat(f, FormatVLLMMap, `[0, 1, 2, 3, 0, 1]`, `[[0,1,2,0],[2,0,1,0]]`)
}

func FuzzReadVLLMMapping(f *testing.F) {
	fuzzFormat(f, FormatVLLMMapping,
		`{"record_type":"eplb_load_stats","version":1,"step":3,"num_ranks":2,"expert_load":[[1,2,3,4]],"p2l_map":[[0,1,2,0]]}`+"\n"+
			`{"record_type":"eplb_initial_mapping","version":1,"num_redundant_experts":1,"num_slots":4,"initial_global_assignments":{"0":[0,1,2,0],"1":[2,0,1,0]}}`+"\n")
}

func FuzzReadVLLMAscend(f *testing.F) {
	fuzzFormat(f, FormatVLLMAscend,
		`{"moe_layer_count": 1, "layer_list": [{"layer_id": 0, "device_count": 2, "device_list": [{"device_id": 0, "device_expert": [0, 1]}, {"device_id": 1, "device_expert": [2, 0]}]}]}`)
}

// FuzzReadSGLangPT: the torch.save reader, seeded with a file written by
// torch.save and one moetuner wrote.
func FuzzReadSGLangPT(f *testing.F) {
	if data, err := os.ReadFile(filepath.Join("..", "testdata", "plans", "stacks", "flame.sglang.pt")); err == nil {
		f.Add(data, uint8(0), uint8(0), uint8(0))
	}
	p := &Plan{GPUs: 2, Experts: 3, Layers: []LayerPlan{{SlotExpert: []routing.Expert{0, 1, 2, 0}, SlotGPU: []GPU{0, 0, 1, 1}}}}
	var b bytes.Buffer
	if err := WriteWith(&b, p, FormatSGLangPT, Layout{GPUs: 2, Experts: 3}); err == nil {
		f.Add(b.Bytes(), uint8(2), uint8(0), uint8(0))
	}
	f.Fuzz(func(t *testing.T, data []byte, gpus, model, ids uint8) {
		if len(data) > 1<<16 {
			t.Skip("input too large")
		}
		l := fuzzLayout(gpus, model, ids)
		if l.check() != nil {
			t.Skip("inconsistent layout")
		}
		p, err := ReadWith(bytes.NewReader(data), FormatSGLangPT, l)
		checkRead(t, FormatSGLangPT, l, p, err)
	})
}
