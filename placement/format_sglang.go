package placement

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/moetuner/moetuner/internal/torchpt"
)

type sglangDoc struct {
	PhysicalToLogicalMap [][]int `json:"physical_to_logical_map"`
	LogicalCount         any     `json:"logical_count"`
}

// sglangLayoutError says what l lacks to place MoE layers among the rows
// of an SGLang file (format "sglang", key "physical_to_logical_map"), or
// nil.
func sglangLayoutError(l Layout, format, key string) error {
	switch {
	case l.ModelLayers == 0:
		return needLayers(format, "%s has one row per decoder layer, dense ones included, and the layout does not say how many decoder layers the model has; set Layout.ModelLayers (num_hidden_layers), and Layout.LayerIDs unless every decoder layer is a MoE layer", key)
	case l.decoderIDs() == nil:
		return needLayers(format, "the model has %d decoder layers and %d MoE layers, and the layout does not say which are MoE layers; set Layout.LayerIDs", l.ModelLayers, l.moeLayers())
	}
	return nil
}

// sglangRows returns SGLang's physical_to_logical_map of p,
// [l.ModelLayers][P]: the rank-major slot list of plan layer i at row
// l.LayerIDs[i] (decoder layer), SGLang's trivial map arange(P) % Experts
// in the rows of dense layers. p must be valid.
func sglangRows(p *Plan, l Layout, format string) ([][]int, error) {
	if err := sglangLayoutError(l, format, "physical_to_logical_map"); err != nil {
		return nil, err
	}
	moe, err := rankMajor(p, format, "SGLang")
	if err != nil {
		return nil, err
	}
	ids := l.decoderIDs()
	if len(ids) != len(moe) {
		return nil, fmt.Errorf("placement: %s: plan has %d layers but the layout places %d MoE layers; set Layout.LayerIDs to the plan's layers", format, len(moe), len(ids))
	}
	slots := len(moe[0])
	rows := make([][]int, l.ModelLayers)
	for i := range rows {
		rows[i] = trivialRow(slots, p.Experts)
	}
	for i, id := range ids {
		rows[id] = moe[i]
	}
	return rows, nil
}

// SGLangRows returns the physical_to_logical_map FormatSGLang writes for
// p under layout l: one row per decoder layer ([l.ModelLayers][P], row
// l.LayerIDs[i] holding plan layer i's slots GPU by GPU, every dense
// layer's row SGLang's trivial map arange(P) % Experts), and the row of
// every plan layer. Without the decoder layers in l (ModelLayers 0) the
// rows are the plan's layers alone. It fails as the writer does on a plan
// SGLang cannot number (different slot counts per GPU).
func SGLangRows(p *Plan, l Layout) (rows [][]int, moeRows []int, err error) {
	if l.ModelLayers == 0 {
		rows, err = rankMajor(p, "sglang", "SGLang")
		if err != nil {
			return nil, nil, err
		}
		moeRows = make([]int, len(rows))
		for i := range moeRows {
			moeRows[i] = i
		}
		return rows, moeRows, nil
	}
	if rows, err = sglangRows(p, l, "sglang"); err != nil {
		return nil, nil, err
	}
	return rows, append([]int(nil), l.decoderIDs()...), nil
}

func encodeSGLang(p *Plan, l Layout) ([]byte, error) {
	rows, err := sglangRows(p, l, "sglang")
	if err != nil {
		return nil, err
	}
	var b []byte
	b = append(b, "{\n  \"physical_to_logical_map\": [\n"...)
	b = appendLines(b, rows, appendInts[int])
	return append(b, "  ]\n}\n"...), nil
}

// encodeSGLangPT writes the map as torch.save does:
// {"physical_to_logical_map": int64 tensor [L_all, P]}, loadable with
// torch.load(weights_only=True).
func encodeSGLangPT(p *Plan, l Layout) ([]byte, error) {
	rows, err := sglangRows(p, l, "sglang-pt")
	if err != nil {
		return nil, err
	}
	flat := make([]int64, 0, len(rows)*len(rows[0]))
	for _, r := range rows {
		for _, e := range r {
			flat = append(flat, int64(e))
		}
	}
	t, err := torchpt.NewInt64([]int{len(rows), len(rows[0])}, flat)
	if err != nil {
		return nil, fmt.Errorf("placement: sglang-pt: %v", err)
	}
	var buf bytes.Buffer
	if err := torchpt.Write(&buf, "archive", map[string]any{"physical_to_logical_map": t}); err != nil {
		return nil, fmt.Errorf("placement: sglang-pt: %v", err)
	}
	return buf.Bytes(), nil
}

// decodeSGLangPT reads a torch.save file holding
// {"physical_to_logical_map": [L_all, P]} (a tensor or nested lists).
func decodeSGLangPT(data []byte, l Layout) (*Plan, error) {
	f, err := torchpt.Open(bytes.NewReader(data), int64(len(data)), torchpt.Options{})
	if err != nil {
		return nil, fmt.Errorf("placement: sglang-pt: %v", err)
	}
	d, ok := f.Root.(*torchpt.Dict)
	if !ok {
		return nil, errors.New("placement: sglang-pt: the saved object is not a dict; want {\"physical_to_logical_map\": int64 tensor [decoder layers, physical slots]}")
	}
	v, ok := d.Get("physical_to_logical_map")
	if !ok {
		if _, stats := d.Get("logical_count"); stats {
			return nil, errors.New("placement: sglang-pt: file has \"logical_count\" (load statistics), not \"physical_to_logical_map\"; read it as routing statistics (a trace)")
		}
		return nil, errors.New("placement: sglang-pt: missing \"physical_to_logical_map\"; want {\"physical_to_logical_map\": int64 tensor [decoder layers, physical slots]}")
	}
	rows, err := ptRows(v)
	if err != nil {
		return nil, fmt.Errorf("placement: sglang-pt: physical_to_logical_map: %v", err)
	}
	return planFromSGLangRows(rows, l, "sglang-pt")
}

// ptRows turns a 2-D integer tensor or a list of integer lists into rows.
func ptRows(v any) ([][]int, error) {
	switch x := v.(type) {
	case *torchpt.Tensor:
		if len(x.Shape) != 2 {
			return nil, fmt.Errorf("tensor has shape %v; want [decoder layers, physical slots]", x.Shape)
		}
		if !x.DType.IsInteger() {
			return nil, fmt.Errorf("tensor is %v; want an integer tensor (int64)", x.DType)
		}
		vals, err := x.Int64s()
		if err != nil {
			return nil, err
		}
		n, p := x.Shape[0], x.Shape[1]
		if n == 0 || p == 0 {
			return nil, fmt.Errorf("tensor has shape %v; want at least one layer and one slot", x.Shape)
		}
		rows := make([][]int, n)
		for i := range rows {
			rows[i] = make([]int, p)
			for j := range rows[i] {
				e := vals[i*p+j]
				if e < math.MinInt32 || e > math.MaxInt32 {
					return nil, fmt.Errorf("row %d slot %d holds %d, not an expert id", i, j, e)
				}
				rows[i][j] = int(e)
			}
		}
		return rows, nil
	case []any:
		rows := make([][]int, len(x))
		for i, r := range x {
			list, ok := r.([]any)
			if !ok {
				return nil, fmt.Errorf("row %d is %T; want a list of expert ids", i, r)
			}
			rows[i] = make([]int, len(list))
			for j, e := range list {
				n, ok := e.(int64)
				if !ok || n < math.MinInt32 || n > math.MaxInt32 {
					return nil, fmt.Errorf("row %d slot %d is %v; want an expert id", i, j, e)
				}
				rows[i][j] = int(n)
			}
		}
		return rows, nil
	}
	return nil, fmt.Errorf("is %T; want an int64 tensor [decoder layers, physical slots]", v)
}

func decodeSGLang(data []byte, l Layout) (*Plan, error) {
	var doc sglangDoc
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("placement: sglang: %v; want {\"physical_to_logical_map\": [[...], ...]}", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("placement: sglang: data after the top-level object; keep one object per file")
	}
	if doc.PhysicalToLogicalMap == nil {
		if doc.LogicalCount != nil {
			return nil, errors.New("placement: sglang: file has \"logical_count\" (load statistics), not \"physical_to_logical_map\"; read it as routing statistics (a trace)")
		}
		return nil, errors.New("placement: sglang: missing \"physical_to_logical_map\"; want {\"physical_to_logical_map\": [[...], ...]} with one row per decoder layer")
	}
	return planFromSGLangRows(doc.PhysicalToLogicalMap, l, "sglang")
}

// planFromSGLangRows builds the plan of an SGLang physical_to_logical_map
// (rows [L_all][P], slot p on GPU p/(P/l.GPUs)). With l.LayerIDs the plan
// has those rows, and every other row must be SGLang's trivial map
// arange(P) % Experts (a dense layer); without it every row is a layer,
// which l must allow (l.Layers and l.ModelLayers 0 or the row count).
// Experts is l.Experts, else the largest id plus one. The plan is not yet
// checked against l's counts; Strategy and Meta are empty.
func planFromSGLangRows(rows [][]int, l Layout, format string) (*Plan, error) {
	if l.GPUs == 0 {
		return nil, needGPUs(format, "physical_to_logical_map")
	}
	if len(rows) == 0 {
		return nil, errors.New("placement: " + format + ": physical_to_logical_map has no rows; add one row per decoder layer")
	}
	if l.ModelLayers > 0 && len(rows) != l.ModelLayers {
		return nil, &CountError{Format: Format(format), Subject: "physical_to_logical_map", What: "rows (SGLang needs one per decoder layer, dense ones included)", LayoutField: "Layout.ModelLayers", File: len(rows), Given: l.ModelLayers}
	}
	slots := len(rows[0])
	for r, row := range rows {
		if len(row) != slots {
			return nil, fmt.Errorf("placement: %s: physical_to_logical_map[%d] has %d slots but row 0 has %d; give every layer the same number of slots", format, r, len(row), slots)
		}
	}
	ids := l.LayerIDs
	switch n := l.moeLayers(); {
	case ids != nil:
		if top := ids[len(ids)-1]; top >= len(rows) {
			return nil, fmt.Errorf("placement: %s: Layout.LayerIDs names decoder layer %d but physical_to_logical_map has %d rows; check the model's layers", format, top, len(rows))
		}
	case n == 0 || n == len(rows):
		ids = make([]int, len(rows))
		for i := range ids {
			ids[i] = i
		}
	default:
		return nil, needLayers(format, "physical_to_logical_map has %d rows for %d MoE layers, and the layout does not say which rows are MoE layers; set Layout.LayerIDs", len(rows), n)
	}
	moe := make([][]int, len(ids))
	for i, id := range ids {
		moe[i] = rows[id]
	}
	p, err := buildPlan(moe, l.GPUs, l.Experts, rowSpec{
		format: format, stack: "SGLang",
		cell: func(i, s int) string { return fmt.Sprintf("physical_to_logical_map[%d][%d]", ids[i], s) },
		list: func(i int) string { return fmt.Sprintf("physical_to_logical_map[%d]", ids[i]) },
	})
	if err != nil {
		return nil, err
	}
	next := 0
	for r, row := range rows {
		if next < len(ids) && ids[next] == r {
			next++
			continue
		}
		for s, e := range row {
			if e != s%p.Experts {
				return nil, fmt.Errorf("placement: %s: physical_to_logical_map[%d] is a dense layer (not in Layout.LayerIDs) but not SGLang's trivial map arange(%d) %% %d: slot %d holds expert %d, want %d; check Layout.LayerIDs", format, r, slots, p.Experts, s, e, s%p.Experts)
			}
		}
	}
	if err := p.Validate(ValidateOptions{}); err != nil {
		return nil, err
	}
	return p, nil
}

// ReadSGLang reads an SGLang {"physical_to_logical_map": [[...]]} file for
// gpus expert-parallel ranks, every row a plan layer: it is ReadWith(r,
// FormatSGLang, Layout{GPUs: gpus}). Use ReadWith with Layout.LayerIDs to
// read a map with rows for dense layers back to its MoE layers.
func ReadSGLang(r io.Reader, gpus int) (*Plan, error) {
	if gpus < 1 || gpus > MaxGPUs {
		return nil, fmt.Errorf("placement: sglang: gpus is %d; pass the expert-parallel size (ep_size), in [1,%d]", gpus, MaxGPUs)
	}
	return ReadWith(r, FormatSGLang, Layout{GPUs: gpus})
}
