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

// readMegatron adds one rank file to b. rank is the file's rank from its
// name, or -1 to take each record's "rank".
func readMegatron(r io.Reader, file string, rank int64, b *tokenBuilder) error {
	br := bufio.NewReaderSize(r, 64<<10)
	steps := map[int64]*megatronStep{}
	k := 0
	limit := math.MaxInt16 + 1
	if b.experts > 0 {
		limit = b.experts
	}
	total := 0
	for lineNo := 1; ; lineNo++ {
		line, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			if errors.Is(err, bufio.ErrBufferFull) {
				return perr(file, lineNo, "", "line longer than %d bytes", maxLineBytes)
			}
			return perr(file, lineNo, "", "read: %v", err)
		}
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
			var rec megatronRecord
			if derr := json.Unmarshal(trimmed, &rec); derr != nil {
				return lineJSONError(file, lineNo, trimmed, derr, "each line must be one router-trace record")
			}
			if rec.Block == "mtp" {
				// Multi-token-prediction layers are not the model's layers.
				goto next
			}
			if rec.Step == nil || rec.Layer == nil || rec.TopIndices == nil {
				return perr(file, lineNo, "", "missing \"step\", \"layer\" or \"top_indices\": not a Megatron router-trace record")
			}
			if *rec.Step < math.MinInt32 || *rec.Step > math.MaxInt32 {
				return perr(file, lineNo, "step", "%d out of int32 range", *rec.Step)
			}
			if *rec.Layer < 0 || *rec.Layer > 1<<20 {
				return perr(file, lineNo, "layer", "%d out of range [0,%d]", *rec.Layer, 1<<20)
			}
			if rec.Rank != nil && rank >= 0 && *rec.Rank != rank {
				return perr(file, lineNo, "rank", "%d, but the file is rank %d's", *rec.Rank, rank)
			}
			T := len(rec.TopIndices)
			if rec.NumTokens != nil && *rec.NumTokens != T {
				return perr(file, lineNo, "num_tokens", "%d, but top_indices has %d rows", *rec.NumTokens, T)
			}
			if T > 0 && k == 0 {
				if k = len(rec.TopIndices[0]); k == 0 {
					return perr(file, lineNo, "top_indices[0]", "no expert ids: each row lists the token's top-k experts")
				}
			}
			if rec.TopK != nil && k > 0 && *rec.TopK != k {
				return perr(file, lineNo, "topk", "%d, but the rows have %d ids", *rec.TopK, k)
			}
			st := steps[*rec.Step]
			if st == nil {
				st = &megatronStep{tokens: T, line: lineNo, layers: map[int][]int16{}}
				steps[*rec.Step] = st
			}
			if _, dup := st.layers[*rec.Layer]; dup {
				return perr(file, lineNo, "layer", "step %d layer %d recorded twice", *rec.Step, *rec.Layer)
			}
			if T != st.tokens {
				return perr(file, lineNo, "top_indices", "%d tokens at layer %d, but step %d has %d at line %d: a step's rows must be the same tokens in every layer", T, *rec.Layer, *rec.Step, st.tokens, st.line)
			}
			total += T * k
			if total > maxTraceIDs {
				return perr(file, lineNo, "", "trace larger than %d ids: split it", uint64(maxTraceIDs))
			}
			ids := make([]int16, 0, T*k)
			for t, row := range rec.TopIndices {
				if len(row) != k {
					return perr(file, lineNo, fmt.Sprintf("top_indices[%d]", t), "%d ids, want top-k %d like the other rows", len(row), k)
				}
				for j, e := range row {
					if e < 0 || e >= limit {
						return perr(file, lineNo, fmt.Sprintf("top_indices[%d][%d]", t, j), "expert %d out of range [0,%d)", e, limit)
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
		return perr(file, 0, "", "no decoder records: the file is empty")
	}
	for _, step := range slices.Sorted(maps.Keys(steps)) {
		st := steps[step]
		names := slices.Sorted(maps.Keys(st.layers))
		where := fmt.Sprintf("%s:%d (step %d)", file, st.line, step)
		if err := b.start(names, 0, k, where); err != nil {
			return perr(file, st.line, "", "step %d: %v", step, err)
		}
		rows := make([][]int16, len(names))
		for i, l := range names {
			rows[i] = st.layers[l]
		}
		err := b.add(st.tokens, int32(rank), int32(step), true,
			func(l, t, j int) int { return int(rows[l][t*k+j]) },
			func(l, t int) string { return fmt.Sprintf("step %d layer %d token %d", step, names[l], t) })
		if err != nil {
			return perr(file, st.line, "", "%v", err)
		}
	}
	return nil
}
