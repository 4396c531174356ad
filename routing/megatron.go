package routing

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
)

// Megatron-Core's --moe-routing-trace-path writes router_trace_rank{r}.jsonl,
// one record per (step, block, layer): {"step", "stage", "block", "layer",
// "rank", "num_tokens", "topk", "top_indices": [[k ids] × tokens]}. The rows
// of one step are the same tokens in every layer.

type megatronRecord struct {
	Step       *int64  `json:"step"`
	Stage      string  `json:"stage"`
	Block      string  `json:"block"`
	Layer      *int    `json:"layer"`
	Rank       *int64  `json:"rank"`
	NumTokens  *int    `json:"num_tokens"`
	TopK       *int    `json:"topk"`
	TopIndices [][]int `json:"top_indices"`
}

type megatronStep struct {
	tokens int
	line   int             // first line of the step, for messages
	layers map[int][]int16 // layer -> tokens×k ids
}

// megatronFile is one parsed router_trace_rank{r}.jsonl.
type megatronFile struct {
	name   string
	rank   int64 // from the name, else the records' "rank", else -1
	k      int
	steps  map[int64]*megatronStep
	offset int // LoadOptions.MegatronLayerOffsets of the rank
}

// parseMegatron reads one rank file. experts bounds the ids (0: int16).
func parseMegatron(r io.Reader, file string, rank int64, experts int) (*megatronFile, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	steps := map[int64]*megatronStep{}
	k := 0
	limit := math.MaxInt16 + 1
	if experts > 0 {
		limit = experts
	}
	total := 0
	for lineNo := 1; ; lineNo++ {
		line, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			if errors.Is(err, bufio.ErrBufferFull) {
				return nil, perr(file, lineNo, "", "line longer than %d bytes", maxLineBytes)
			}
			return nil, perr(file, lineNo, "", "read: %v", err)
		}
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
			var rec megatronRecord
			if derr := json.Unmarshal(trimmed, &rec); derr != nil {
				return nil, lineJSONError(file, lineNo, trimmed, derr, "each line must be one router-trace record")
			}
			if rec.Block == "mtp" {
				// Multi-token-prediction layers are not the model's layers.
				goto next
			}
			if rec.Step == nil || rec.Layer == nil || rec.TopIndices == nil {
				return nil, perr(file, lineNo, "", "missing \"step\", \"layer\" or \"top_indices\": not a Megatron router-trace record")
			}
			if *rec.Step < math.MinInt32 || *rec.Step > math.MaxInt32 {
				return nil, perr(file, lineNo, "step", "%d out of int32 range", *rec.Step)
			}
			if *rec.Layer < 0 || *rec.Layer > 1<<20 {
				return nil, perr(file, lineNo, "layer", "%d out of range [0,%d]", *rec.Layer, 1<<20)
			}
			if rec.Rank != nil && rank >= 0 && *rec.Rank != rank {
				return nil, perr(file, lineNo, "rank", "%d, but the file is rank %d's", *rec.Rank, rank)
			}
			T := len(rec.TopIndices)
			if rec.NumTokens != nil && *rec.NumTokens != T {
				return nil, perr(file, lineNo, "num_tokens", "%d, but top_indices has %d rows", *rec.NumTokens, T)
			}
			if T > 0 && k == 0 {
				if k = len(rec.TopIndices[0]); k == 0 {
					return nil, perr(file, lineNo, "top_indices[0]", "no expert ids: each row lists the token's top-k experts")
				}
			}
			if rec.TopK != nil && k > 0 && *rec.TopK != k {
				return nil, perr(file, lineNo, "topk", "%d, but the rows have %d ids", *rec.TopK, k)
			}
			st := steps[*rec.Step]
			if st == nil {
				st = &megatronStep{tokens: T, line: lineNo, layers: map[int][]int16{}}
				steps[*rec.Step] = st
			}
			if _, dup := st.layers[*rec.Layer]; dup {
				return nil, perr(file, lineNo, "layer", "step %d layer %d recorded twice: in training the layer is the index within the model chunk, so virtual-pipeline chunks (--virtual-pipeline-model-parallel-size) reuse it, and so do several micro-batches per step; the file cannot tell them apart: record with one model chunk per stage and one micro-batch per step", *rec.Step, *rec.Layer)
			}
			if T != st.tokens {
				return nil, perr(file, lineNo, "top_indices", "%d tokens at layer %d, but step %d has %d at line %d: a step's rows must be the same tokens in every layer", T, *rec.Layer, *rec.Step, st.tokens, st.line)
			}
			total += T * k
			if total > maxTraceIDs {
				return nil, perr(file, lineNo, "", "trace larger than %d ids: split it", uint64(maxTraceIDs))
			}
			ids := make([]int16, 0, T*k)
			for t, row := range rec.TopIndices {
				if len(row) != k {
					return nil, perr(file, lineNo, fmt.Sprintf("top_indices[%d]", t), "%d ids, want top-k %d like the other rows", len(row), k)
				}
				for j, e := range row {
					if e < 0 || e >= limit {
						return nil, perr(file, lineNo, fmt.Sprintf("top_indices[%d][%d]", t, j), "expert %d out of range [0,%d)", e, limit)
					}
					ids = append(ids, int16(e))
				}
			}
			st.layers[*rec.Layer] = ids
			if rank < 0 && rec.Rank != nil && *rec.Rank >= 0 && *rec.Rank <= math.MaxInt32 {
				rank = *rec.Rank
			}
		}
	next:
		if errors.Is(err, io.EOF) {
			break
		}
	}
	if len(steps) == 0 {
		return nil, perr(file, 0, "", "no decoder records: the file is empty")
	}
	return &megatronFile{name: file, rank: rank, k: k, steps: steps}, nil
}

// Megatron-Core's RouterTracer (megatron/core/transformer/moe/
// router_trace.py, added in c1560d9) numbers a record's "layer" two ways.
// The forward hook of training (and hook-based inference) parses it from
// the router's module name, decoder.layers.N: N indexes the layers of the
// pipeline stage's model chunk, so every stage (and every virtual-pipeline
// chunk) starts again at 0. record_indices, the inference path fed by the
// in-pipeline recorder, stamps the layer ids it is given: the layers'
// layer_number, 1-based and global. moetuner's layer ids are 0-based
// decoder-layer indices: LoadOptions.MegatronLayerOffsets maps stage-local
// ids, and ids that reach the model's num_hidden_layers are taken as
// 1-based.

// addMegatron adds parsed rank files to b: their layer ids shifted by
// LoadOptions.MegatronLayerOffsets, the files of one pipeline (one rank
// per stage, a stage being the files of one layer set) joined step by step
// into whole-model tokens, and
// 1-based ids (an id equal to LoadOptions.ModelLayers) made 0-based. It
// returns notes on what it did.
func addMegatron(files []*megatronFile, b *tokenBuilder, opts LoadOptions) ([]string, error) {
	var notes []string
	stages, err := megatronStages(files, opts.MegatronLayerOffsets)
	if err != nil {
		return nil, err
	}
	if len(stages) > 1 {
		var spans []string
		for _, sg := range stages {
			spans = append(spans, fmt.Sprintf("%d-%d", sg.layers[0], sg.layers[len(sg.layers)-1]))
		}
		notes = append(notes, fmt.Sprintf("Megatron router traces: %d pipeline stages (layer ids %s) joined into %d pipelines, each token's source the rank of its first-stage file", len(stages), strings.Join(spans, ", "), len(stages[0].files)))
	}
	// 1-based ids: record_indices stamps layer_number (1..num_hidden_layers).
	shift := 0
	if opts.ModelLayers > 0 {
		lo, hi := math.MaxInt, -1
		for _, sg := range stages {
			lo, hi = min(lo, sg.layers[0]), max(hi, sg.layers[len(sg.layers)-1])
		}
		switch {
		case hi > opts.ModelLayers:
			return nil, perr(files[0].name, 0, "layer", "%d, but the model has %d decoder layers: the ids are neither 0- nor 1-based decoder layers; check the layer offsets (--pp-layer-offset) and the model", hi, opts.ModelLayers)
		case hi == opts.ModelLayers && lo >= 1:
			shift = -1
			notes = append(notes, fmt.Sprintf("Megatron router traces: layer ids %d..%d are 1-based (record_indices stamps layer_number; the model has %d decoder layers): read as decoder layers %d..%d", lo, hi, opts.ModelLayers, lo-1, hi-1))
		}
	}
	for i, f0 := range stages[0].files {
		k := f0.k
		for _, sg := range stages {
			if f := sg.files[i]; f.k != k {
				return nil, perr(f.name, 0, "topk", "%d, but %s, an earlier stage of the same pipeline, has top-k %d", f.k, f0.name, k)
			}
		}
		for _, step := range slices.Sorted(maps.Keys(f0.steps)) {
			st0 := f0.steps[step]
			// layer id -> ids, over the pipeline's stages
			layers := map[int][]int16{}
			for _, sg := range stages {
				f := sg.files[i]
				st := f.steps[step]
				if st == nil {
					return nil, perr(f.name, 0, "", "step %d is in %s but not here: the files of one pipeline must record the same steps", step, f0.name)
				}
				if st.tokens != st0.tokens {
					return nil, perr(f.name, st.line, "top_indices", "%d tokens at step %d, but %s has %d: the stages of one pipeline see the same tokens (one micro-batch per step)", st.tokens, step, f0.name, st0.tokens)
				}
				for l, ids := range st.layers {
					g := l + f.offset + shift
					if _, dup := layers[g]; dup {
						return nil, perr(f.name, st.line, "layer", "step %d: decoder layer %d recorded by two stages: the layer offsets overlap", step, g)
					}
					layers[g] = ids
				}
			}
			names := slices.Sorted(maps.Keys(layers))
			where := fmt.Sprintf("%s:%d (step %d)", f0.name, st0.line, step)
			if err := b.start(names, 0, k, where); err != nil {
				return nil, perr(f0.name, st0.line, "", "step %d: %v", step, err)
			}
			rows := make([][]int16, len(names))
			for j, l := range names {
				rows[j] = layers[l]
			}
			err := b.add(st0.tokens, int32(f0.rank), int32(step), true,
				func(l, t, j int) int { return int(rows[l][t*k+j]) },
				func(l, t int) string { return fmt.Sprintf("step %d layer %d token %d", step, names[l], t) })
			if err != nil {
				return nil, perr(f0.name, st0.line, "", "%v", err)
			}
		}
	}
	return notes, nil
}

// megatronStage is the rank files that record the same decoder layers
// (their ids plus their offset), sorted by rank.
type megatronStage struct {
	files  []*megatronFile
	layers []int
}

// megatronStages sets each file's layer offset from offsets and groups the
// files by stage, ordered by first layer, checking that the stages record
// disjoint layers with the same number of rank files each.
func megatronStages(files []*megatronFile, offsets map[int]int) ([]*megatronStage, error) {
	offsetOf := func(f *megatronFile) (int, bool) {
		if o, ok := offsets[int(f.rank)]; ok && f.rank >= 0 {
			return o, true
		}
		o, ok := offsets[-1]
		return o, ok
	}
	// Group the files by stage: the files that record the same decoder
	// layers (their ids plus their offset). Data-parallel ranks fall into
	// one stage; pipeline stages record disjoint layers, either because
	// their offsets say so (training) or because the ids are global
	// (record_indices). The i-th file of every stage, by rank, forms
	// pipeline i: Megatron's default rank order (tp-cp-ep-dp-pp) makes the
	// pipeline rank the outermost coordinate.
	byKey := map[string]*megatronStage{}
	for _, f := range files {
		o, ok := offsetOf(f)
		if offsets != nil && !ok {
			return nil, perr(f.name, 0, "", "rank %d has no layer offset: give every rank file its stage's offset (--pp-layer-offset RANK=OFFSET,...), or one offset for all", f.rank)
		}
		if o < 0 || o > 1<<20 {
			return nil, perr(f.name, 0, "", "layer offset %d out of range [0,%d]", o, 1<<20)
		}
		f.offset = o
		set := map[int]bool{}
		for _, st := range f.steps {
			for l := range st.layers {
				set[l+o] = true
			}
		}
		layers := slices.Sorted(maps.Keys(set))
		key := fmt.Sprint(layers)
		if byKey[key] == nil {
			byKey[key] = &megatronStage{layers: layers}
		}
		byKey[key].files = append(byKey[key].files, f)
	}
	var stages []*megatronStage
	for _, key := range slices.Sorted(maps.Keys(byKey)) {
		stages = append(stages, byKey[key])
	}
	slices.SortStableFunc(stages, func(a, c *megatronStage) int { return a.layers[0] - c.layers[0] })
	seen := map[int]*megatronStage{}
	for _, sg := range stages {
		for _, l := range sg.layers {
			if other := seen[l]; other != nil {
				return nil, perr(sg.files[0].name, 0, "layer", "decoder layers %v, but %s has %v: every rank file must route the same layers, or, as pipeline stages, layers no other stage has (check the layer offsets, --pp-layer-offset)", clipInts(sg.layers), other.files[0].name, clipInts(other.layers))
			}
			seen[l] = sg
		}
	}
	for _, sg := range stages {
		slices.SortStableFunc(sg.files, func(a, c *megatronFile) int { return int(a.rank - c.rank) })
		if len(sg.files) != len(stages[0].files) {
			return nil, perr(sg.files[0].name, 0, "", "%d rank files record decoder layers %v but %d record %v: the files are neither data-parallel copies of one layer set nor pipeline stages with the same number of ranks each; check the layer offsets (--pp-layer-offset)", len(sg.files), clipInts(sg.layers), len(stages[0].files), clipInts(stages[0].layers))
		}
	}
	return stages, nil
}
