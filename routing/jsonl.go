package routing

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
)

// maxLineBytes caps one JSONL line; longer lines are refused rather than
// buffered without bound.
const maxLineBytes = 16 << 20

// maxTraceIDs caps Tokens×Layers×TopK for traces read from JSONL, NPY and
// CSV (2^32 ids, 8 GiB as int16).
const maxTraceIDs = 1 << 32

type jsonlLine struct {
	MoetunerTrace *int        `json:"moetuner_trace"`
	Experts       *int        `json:"experts"`
	TopK          *int        `json:"top_k"`
	LayerNames    []int       `json:"layer_names"`
	Layers        [][]int     `json:"layers"`
	Weights       [][]float64 `json:"weights"`
	Source        *int64      `json:"source"`
	Step          *int64      `json:"step"`
}

// ReadJSONL reads a trace in moetuner's canonical JSONL format (see the
// package documentation). Errors are *ParseError with the 1-based line.
func ReadJSONL(r io.Reader) (*Trace, error) {
	return readJSONL(r, "")
}

func readJSONL(r io.Reader, file string) (*Trace, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	t := &Trace{}
	var (
		headerExperts int
		headerTopK    int
		haveHeader    bool
		maxID         = -1
		hasWeights    bool
		hasSource     bool
		hasStep       bool
		lineNo        int
	)
	for {
		line, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			if errors.Is(err, bufio.ErrBufferFull) {
				return nil, perr(file, lineNo+1, "", "line longer than %d bytes: split the trace into one token per line", maxLineBytes)
			}
			return nil, perr(file, lineNo+1, "", "read: %v", err)
		}
		if len(line) == 0 && errors.Is(err, io.EOF) {
			break
		}
		lineNo++
		trimmed := bytes.TrimSpace(line)
		if len(trimmed) > 0 {
			var rec jsonlLine
			dec := json.NewDecoder(bytes.NewReader(trimmed))
			if derr := dec.Decode(&rec); derr != nil {
				return nil, perr(file, lineNo, jsonField(derr), "malformed JSON (%v): each line must be one JSON object", jsonMsg(derr))
			}
			if dec.More() {
				return nil, perr(file, lineNo, "", "more than one JSON value on the line: put one record per line")
			}
			if rec.MoetunerTrace != nil {
				if t.Tokens > 0 || haveHeader {
					return nil, perr(file, lineNo, "moetuner_trace", "header after the first record: the header must be the first line")
				}
				if *rec.MoetunerTrace != 1 {
					return nil, perr(file, lineNo, "moetuner_trace", "unsupported version %d: this reader knows version 1", *rec.MoetunerTrace)
				}
				haveHeader = true
				if rec.Experts != nil {
					if *rec.Experts <= 0 || *rec.Experts > math.MaxInt16+1 {
						return nil, perr(file, lineNo, "experts", "%d out of range [1,%d]: give the number of experts per layer", *rec.Experts, math.MaxInt16+1)
					}
					headerExperts = *rec.Experts
				}
				if rec.TopK != nil {
					if *rec.TopK <= 0 {
						return nil, perr(file, lineNo, "top_k", "%d must be positive", *rec.TopK)
					}
					headerTopK = *rec.TopK
				}
				t.LayerNames = rec.LayerNames
				continue
			}
			if err := addJSONLRecord(t, &rec, file, lineNo, headerExperts, headerTopK, &maxID); err != nil {
				return nil, err
			}
			if t.Tokens == 1 {
				hasWeights, hasSource, hasStep = rec.Weights != nil, rec.Source != nil, rec.Step != nil
				if t.LayerNames != nil && len(t.LayerNames) != t.Layers {
					return nil, perr(file, lineNo, "layers", "%d layers but the header lists %d layer_names: make them agree", t.Layers, len(t.LayerNames))
				}
			}
			if (rec.Weights != nil) != hasWeights {
				return nil, perr(file, lineNo, "weights", "present in some records but not others: give weights for every token or for none")
			}
			if (rec.Step != nil) != hasStep {
				return nil, perr(file, lineNo, "step", "present in some records but not others: give a step for every token or for none")
			}
			if rec.Weights != nil {
				for l, ws := range rec.Weights {
					if l >= t.Layers || len(ws) != t.TopK {
						return nil, perr(file, lineNo, "weights", "shape does not match layers: want %d layers × %d weights", t.Layers, t.TopK)
					}
				}
				if len(rec.Weights) != t.Layers {
					return nil, perr(file, lineNo, "weights", "%d layers of weights, want %d like \"layers\"", len(rec.Weights), t.Layers)
				}
				for l, ws := range rec.Weights {
					for j, w := range ws {
						if math.IsInf(float64(float32(w)), 0) {
							return nil, perr(file, lineNo, fmt.Sprintf("weights[%d][%d]", l, j), "%v overflows float32", w)
						}
						t.Weights = append(t.Weights, float32(w))
					}
				}
			}
			if rec.Source != nil {
				if !hasSource {
					t.Source = make([]int32, t.Tokens-1, t.Tokens)
					for i := range t.Source {
						t.Source[i] = -1
					}
					hasSource = true
				}
				if *rec.Source < -1 || *rec.Source > math.MaxInt32 {
					return nil, perr(file, lineNo, "source", "%d out of range: give a rank ≥ 0, or -1 or no field for unknown", *rec.Source)
				}
				t.Source = append(t.Source, int32(*rec.Source))
			} else if hasSource {
				t.Source = append(t.Source, -1)
			}
			if rec.Step != nil {
				if *rec.Step < math.MinInt32 || *rec.Step > math.MaxInt32 {
					return nil, perr(file, lineNo, "step", "%d out of int32 range", *rec.Step)
				}
				t.Step = append(t.Step, int32(*rec.Step))
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	if t.Tokens == 0 {
		return nil, perr(file, 0, "", "no records: the file is empty or holds only a header; write one JSON object per token")
	}
	if t.Source != nil && !hasSource {
		t.Source = nil
	}
	t.Experts = headerExperts
	if t.Experts == 0 {
		t.Experts = maxID + 1
	}
	if t.TopK > t.Experts {
		return nil, perr(file, 0, "experts", "top-k %d exceeds %d experts: set \"experts\" in the header", t.TopK, t.Experts)
	}
	if err := t.Validate(); err != nil {
		return nil, perr(file, 0, "", "%v", err)
	}
	return t, nil
}

func addJSONLRecord(t *Trace, rec *jsonlLine, file string, lineNo, headerExperts, headerTopK int, maxID *int) error {
	if len(rec.Layers) == 0 {
		return perr(file, lineNo, "layers", "missing or empty: each record needs \"layers\": [[expert ids...], ...]")
	}
	k := len(rec.Layers[0])
	if k == 0 {
		return perr(file, lineNo, "layers[0]", "no experts: each layer needs its top-k ids")
	}
	if t.Tokens == 0 {
		if headerTopK != 0 && k != headerTopK {
			return perr(file, lineNo, "layers[0]", "%d experts but the header says top_k %d: fix the header or the record", k, headerTopK)
		}
		t.Layers, t.TopK = len(rec.Layers), k
	} else if len(rec.Layers) != t.Layers {
		return perr(file, lineNo, "layers", "%d layers, but earlier records have %d: every record must cover the same layers", len(rec.Layers), t.Layers)
	}
	if (t.Tokens+1)*t.Layers*t.TopK > maxTraceIDs {
		return perr(file, lineNo, "", "trace larger than %d ids: split it into several files", maxTraceIDs)
	}
	limit := math.MaxInt16 + 1
	if headerExperts > 0 {
		limit = headerExperts
	}
	for l, set := range rec.Layers {
		if len(set) != t.TopK {
			return perr(file, lineNo, fmt.Sprintf("layers[%d]", l), "%d experts, want top-k %d like the other layers and records", len(set), t.TopK)
		}
		for j, e := range set {
			field := fmt.Sprintf("layers[%d][%d]", l, j)
			if e < 0 || e >= limit {
				if headerExperts > 0 {
					return perr(file, lineNo, field, "expert %d out of range [0,%d): set \"experts\" in the header or fix the id", e, limit)
				}
				return perr(file, lineNo, field, "expert %d out of range [0,%d): ids must be non-negative int16", e, limit)
			}
			for _, prev := range set[:j] {
				if prev == e {
					return perr(file, lineNo, field, "expert %d appears twice in this token's top-k: list each selected expert once", e)
				}
			}
			*maxID = max(*maxID, e)
			t.IDs = append(t.IDs, int16(e))
		}
	}
	t.Tokens++
	return nil
}

// readLine returns the next line without its newline, failing with
// bufio.ErrBufferFull past maxLineBytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		frag, err := br.ReadSlice('\n')
		buf = append(buf, frag...)
		if len(buf) > maxLineBytes {
			return nil, bufio.ErrBufferFull
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimSuffix(buf, []byte("\n")), err
	}
}

// jsonField names the field of a JSON type error, if any.
func jsonField(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return te.Field
	}
	return ""
}

func jsonMsg(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return "got JSON " + te.Value + ", want " + te.Type.String()
	}
	return err.Error()
}

// WriteJSONL writes t in the canonical JSONL format: a header line with
// experts, top_k and layer_names (when set), then one record per token with
// "layers", and "weights", "source" and "step" when t has them (a source of
// -1 is left out). Weights use the shortest decimal that reads back as the
// same float32, so the output is byte-for-byte deterministic. It returns
// t.Validate's error for an invalid trace.
func WriteJSONL(w io.Writer, t *Trace) error {
	if err := t.Validate(); err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	b := make([]byte, 0, 1024)
	b = append(b, `{"moetuner_trace":1,"experts":`...)
	b = strconv.AppendInt(b, int64(t.Experts), 10)
	b = append(b, `,"top_k":`...)
	b = strconv.AppendInt(b, int64(t.TopK), 10)
	if t.LayerNames != nil {
		b = append(b, `,"layer_names":`...)
		b = appendInts(b, t.LayerNames)
	}
	b = append(b, "}\n"...)
	if _, err := bw.Write(b); err != nil {
		return err
	}
	L, K := t.Layers, t.TopK
	for tok := range t.Tokens {
		b = b[:0]
		b = append(b, `{"layers":[`...)
		for l := range L {
			if l > 0 {
				b = append(b, ',')
			}
			b = append(b, '[')
			for j := range K {
				if j > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendInt(b, int64(t.IDs[(tok*L+l)*K+j]), 10)
			}
			b = append(b, ']')
		}
		b = append(b, ']')
		if t.Weights != nil {
			b = append(b, `,"weights":[`...)
			for l := range L {
				if l > 0 {
					b = append(b, ',')
				}
				b = append(b, '[')
				for j := range K {
					if j > 0 {
						b = append(b, ',')
					}
					b = strconv.AppendFloat(b, float64(t.Weights[(tok*L+l)*K+j]), 'f', -1, 32)
				}
				b = append(b, ']')
			}
			b = append(b, ']')
		}
		if t.Source != nil && t.Source[tok] >= 0 {
			b = append(b, `,"source":`...)
			b = strconv.AppendInt(b, int64(t.Source[tok]), 10)
		}
		if t.Step != nil {
			b = append(b, `,"step":`...)
			b = strconv.AppendInt(b, int64(t.Step[tok]), 10)
		}
		b = append(b, "}\n"...)
		if _, err := bw.Write(b); err != nil {
			return err
		}
	}
	return bw.Flush()
}

func appendInts(b []byte, v []int) []byte {
	b = append(b, '[')
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return append(b, ']')
}
