package routing

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
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
	t, _, err := readJSONLTrace(r, file, -1, LoadOptions{}, true)
	return t, err
}

// jsonlProgressEvery is how many bytes of JSONL are read between calls of
// LoadOptions.Progress.
const jsonlProgressEvery = 4 << 20

// jsonlReader holds the state of a JSONL trace being read: the trace
// itself when it is kept, else a chunk of tokens on its way to the
// counters.
type jsonlReader struct {
	file          string
	keep          bool
	t             *Trace // the trace (keep) or its shape and layer names
	headerExperts int
	headerTopK    int
	haveHeader    bool
	maxID         int
	hasWeights    bool
	hasSource     bool
	hasStep       bool
	tokens        int

	// Streaming: the chunk being filled and where it goes.
	opts      LoadOptions
	b         *statsBuilder
	per       int
	ids       []int16
	src, step []int32
	knownSrc  bool // some token of the chunk has a source
	chunkMax  int
	chunkTok0 int
}

// readJSONLTrace reads a JSONL trace of size bytes (-1: unknown). With keep
// it returns the trace (and no stats: the caller builds them); without it
// the records go in chunks to the counters and only the stats are
// returned.
func readJSONLTrace(r io.Reader, file string, size int64, opts LoadOptions, keep bool) (*Trace, *Stats, error) {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReaderSize(r, 64<<10)
	}
	jr := &jsonlReader{file: file, keep: keep, t: &Trace{}, maxID: -1, opts: opts, chunkMax: -1}
	prog := newProgress(opts.Progress, file, size)
	var lineNo int
	var read, reported int64
	// One record, reused by the fast path from line to line.
	var rec jsonlLine
	fail := func(err error) (*Trace, *Stats, error) {
		if jr.b != nil {
			jr.b.abort()
		}
		return nil, nil, err
	}
	for {
		line, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			if errors.Is(err, bufio.ErrBufferFull) {
				return fail(perr(file, lineNo+1, "", "line longer than %d bytes: split the trace into one token per line", maxLineBytes))
			}
			return fail(perr(file, lineNo+1, "", "read: %v", err))
		}
		if len(line) == 0 && errors.Is(err, io.EOF) {
			break
		}
		lineNo++
		read += int64(len(line)) + 1
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
			if !fastLine(trimmed, &rec) {
				rec = jsonlLine{}
				dec := json.NewDecoder(bytes.NewReader(trimmed))
				if derr := dec.Decode(&rec); derr != nil {
					if errors.Is(derr, io.ErrUnexpectedEOF) {
						return fail(perr(file, lineNo, "", "truncated record: %s", cutShort))
					}
					return fail(lineJSONError(file, lineNo, trimmed, derr, "each line must be one JSON object"))
				}
				if dec.More() {
					return fail(perr(file, lineNo, "", "more than one JSON value on the line: put one record per line"))
				}
			}
			if err := jr.record(&rec, lineNo); err != nil {
				return fail(err)
			}
		}
		if read-reported >= jsonlProgressEvery {
			prog.update(read, int64(jr.tokens))
			reported = read
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	t := jr.t
	if jr.tokens == 0 {
		return fail(perr(file, 0, "", "no records: the file is empty or holds only a header; write one JSON object per token"))
	}
	if t.Source != nil && !jr.hasSource {
		t.Source = nil
	}
	t.Experts = jr.experts()
	if t.Experts == 0 {
		t.Experts = jr.maxID + 1
	}
	if t.TopK > t.Experts {
		return fail(perr(file, 0, "experts", "top-k %d exceeds %d experts: set \"experts\" in the header", t.TopK, t.Experts))
	}
	if !keep {
		jr.flush()
		s := jr.b.stats(t.Experts)
		s.LayerNames = slices.Clone(t.LayerNames)
		prog.done(read, int64(jr.tokens))
		return nil, s, nil
	}
	if err := t.Validate(); err != nil {
		return nil, nil, perr(file, 0, "", "%v", err)
	}
	prog.done(read, int64(jr.tokens))
	return t, nil, nil
}

// experts is the number of experts per layer the header or LoadOptions
// gives, 0 when neither does.
func (jr *jsonlReader) experts() int {
	if jr.headerExperts > 0 {
		return jr.headerExperts
	}
	return jr.opts.Experts
}

// record adds one parsed line: the header or a token.
func (jr *jsonlReader) record(rec *jsonlLine, lineNo int) error {
	file, t := jr.file, jr.t
	if rec.MoetunerTrace != nil {
		if jr.tokens > 0 || jr.haveHeader {
			return perr(file, lineNo, "moetuner_trace", "header after the first record: the header must be the first line")
		}
		if *rec.MoetunerTrace != 1 {
			return perr(file, lineNo, "moetuner_trace", "unsupported version %d: this reader knows version 1", *rec.MoetunerTrace)
		}
		jr.haveHeader = true
		if rec.Experts != nil {
			if *rec.Experts <= 0 || *rec.Experts > math.MaxInt16+1 {
				return perr(file, lineNo, "experts", "%d out of range [1,%d]: give the number of experts per layer", *rec.Experts, math.MaxInt16+1)
			}
			if jr.opts.Experts > 0 && *rec.Experts != jr.opts.Experts {
				return perr(file, lineNo, "experts", "the header says %d experts, but LoadOptions.Experts is %d: set LoadOptions.Experts to the model's experts per layer, or fix the header", *rec.Experts, jr.opts.Experts)
			}
			jr.headerExperts = *rec.Experts
		}
		if rec.TopK != nil {
			if *rec.TopK <= 0 {
				return perr(file, lineNo, "top_k", "%d must be positive", *rec.TopK)
			}
			jr.headerTopK = *rec.TopK
		}
		t.LayerNames = rec.LayerNames
		return nil
	}
	if err := jr.addIDs(rec, lineNo); err != nil {
		return err
	}
	if jr.tokens == 1 {
		jr.hasWeights, jr.hasStep = rec.Weights != nil, rec.Step != nil
		if t.LayerNames != nil && len(t.LayerNames) != t.Layers {
			return perr(file, lineNo, "layers", "%d layers but the header lists %d layer_names: make them agree", t.Layers, len(t.LayerNames))
		}
		if !jr.keep {
			jr.per = jr.opts.statsOptions().chunkTokens(t.Layers, t.TopK)
			jr.b = newStatsBuilder(t.Layers, t.TopK, jr.experts(), 0, 0, jr.opts.statsOptions())
		}
	}
	if (rec.Weights != nil) != jr.hasWeights {
		return perr(file, lineNo, "weights", "present in some records but not others: give weights for every token or for none")
	}
	if (rec.Step != nil) != jr.hasStep {
		return perr(file, lineNo, "step", "present in some records but not others: give a step for every token or for none")
	}
	if rec.Weights != nil {
		for l, ws := range rec.Weights {
			if l >= t.Layers || len(ws) != t.TopK {
				return perr(file, lineNo, "weights", "shape does not match layers: want %d layers × %d weights", t.Layers, t.TopK)
			}
		}
		if len(rec.Weights) != t.Layers {
			return perr(file, lineNo, "weights", "%d layers of weights, want %d like \"layers\"", len(rec.Weights), t.Layers)
		}
		for l, ws := range rec.Weights {
			for j, w := range ws {
				if math.IsInf(float64(float32(w)), 0) {
					return perr(file, lineNo, fmt.Sprintf("weights[%d][%d]", l, j), "%v overflows float32", w)
				}
				if jr.keep {
					t.Weights = append(t.Weights, float32(w))
				}
			}
		}
	}
	src := int32(-1)
	if rec.Source != nil {
		if *rec.Source < -1 || *rec.Source > math.MaxInt32 {
			return perr(file, lineNo, "source", "%d out of range: give a rank ≥ 0, or -1 or no field for unknown", *rec.Source)
		}
		src = int32(*rec.Source)
		if jr.keep && !jr.hasSource {
			t.Source = make([]int32, jr.tokens-1, jr.tokens)
			for i := range t.Source {
				t.Source[i] = -1
			}
		}
		jr.hasSource = true
	}
	var step int32
	if rec.Step != nil {
		if *rec.Step < math.MinInt32 || *rec.Step > math.MaxInt32 {
			return perr(file, lineNo, "step", "%d out of int32 range", *rec.Step)
		}
		step = int32(*rec.Step)
	}
	if jr.keep {
		if jr.hasSource {
			t.Source = append(t.Source, src)
		}
		if rec.Step != nil {
			t.Step = append(t.Step, step)
		}
		return nil
	}
	jr.src = append(jr.src, src)
	jr.knownSrc = jr.knownSrc || src >= 0
	if rec.Step != nil {
		jr.step = append(jr.step, step)
	}
	if len(jr.src) == jr.per {
		jr.flush()
	}
	return nil
}

// addIDs checks a record's "layers" and appends its ids to the trace or
// the chunk.
func (jr *jsonlReader) addIDs(rec *jsonlLine, lineNo int) error {
	file, t := jr.file, jr.t
	if len(rec.Layers) == 0 {
		return perr(file, lineNo, "layers", "missing or empty: each record needs \"layers\": [[expert ids...], ...]")
	}
	k := len(rec.Layers[0])
	if k == 0 {
		return perr(file, lineNo, "layers[0]", "no experts: each layer needs its top-k ids")
	}
	if jr.tokens == 0 {
		if jr.headerTopK != 0 && k != jr.headerTopK {
			return perr(file, lineNo, "layers[0]", "%d experts but the header says top_k %d: fix the header or the record", k, jr.headerTopK)
		}
		t.Layers, t.TopK = len(rec.Layers), k
	} else if len(rec.Layers) != t.Layers {
		return perr(file, lineNo, "layers", "%d layers, but earlier records have %d: every record must cover the same layers", len(rec.Layers), t.Layers)
	}
	limitIDs := uint64(maxTraceIDs)
	if !jr.keep {
		limitIDs = maxStreamIDs
	}
	if uint64(jr.tokens+1)*uint64(t.Layers)*uint64(t.TopK) > limitIDs {
		return perr(file, lineNo, "", "trace larger than %d ids: split it into several files", limitIDs)
	}
	limit := math.MaxInt16 + 1
	if e := jr.experts(); e > 0 {
		limit = e
	}
	ids := &jr.ids
	if jr.keep {
		ids = &t.IDs
	}
	for l, set := range rec.Layers {
		if len(set) != t.TopK {
			return perr(file, lineNo, fmt.Sprintf("layers[%d]", l), "%d experts, want top-k %d like the other layers and records", len(set), t.TopK)
		}
		for j, e := range set {
			field := func() string { return fmt.Sprintf("layers[%d][%d]", l, j) }
			if e < 0 || e >= limit {
				switch {
				case jr.headerExperts > 0:
					return perr(file, lineNo, field(), "expert %d out of range [0,%d): set \"experts\" in the header or fix the id", e, limit)
				case jr.opts.Experts > 0:
					return perr(file, lineNo, field(), "expert %d out of range [0,%d): fix the id, or set LoadOptions.Experts to the model's experts per layer", e, limit)
				}
				return perr(file, lineNo, field(), "expert %d out of range [0,%d): ids must be non-negative int16", e, limit)
			}
			for _, prev := range set[:j] {
				if prev == e {
					return perr(file, lineNo, field(), "expert %d appears twice in this token's top-k: list each selected expert once", e)
				}
			}
			jr.maxID = max(jr.maxID, e)
			jr.chunkMax = max(jr.chunkMax, e)
			*ids = append(*ids, int16(e))
		}
	}
	jr.tokens++
	t.Tokens = jr.tokens
	return nil
}

// flush sends the chunk to the counters. The builder counts it before
// flush returns when it has no workers; otherwise the chunk's slices go
// with it and fresh ones are started.
func (jr *jsonlReader) flush() {
	n := len(jr.src)
	if n == 0 {
		return
	}
	ch := chunk{ids: jr.ids, n: n, tok0: int64(jr.chunkTok0), maxID: jr.chunkMax}
	if jr.knownSrc {
		ch.src = jr.src
	}
	if jr.hasStep {
		ch.step = jr.step
	}
	inline := jr.b.workers() == 1 && jr.b.inline != nil
	jr.b.add(ch)
	if inline {
		jr.ids, jr.src, jr.step = jr.ids[:0], jr.src[:0], jr.step[:0]
	} else {
		jr.ids, jr.src, jr.step = nil, nil, nil
	}
	jr.chunkTok0 += n
	jr.knownSrc, jr.chunkMax = false, -1
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

// nonFinite names the NaN or Infinity literal that made err, a syntax
// error in data, or returns "". Python's json.dump writes them for
// float('nan') and float('inf'), but they are not JSON.
func nonFinite(data []byte, err error) string {
	var se *json.SyntaxError
	if !errors.As(err, &se) || se.Offset < 1 || se.Offset > int64(len(data)) {
		return ""
	}
	at := data[se.Offset-1:]
	for _, lit := range []string{"NaN", "Infinity"} {
		if bytes.HasPrefix(at, []byte(lit)) {
			if lit == "Infinity" && se.Offset >= 2 && data[se.Offset-2] == '-' {
				lit = "-Infinity"
			}
			return lit
		}
	}
	return ""
}

// jsonMsgIn is jsonMsg for an error in data, naming NaN and Infinity.
func jsonMsgIn(data []byte, err error) string {
	if lit := nonFinite(data, err); lit != "" {
		return nonFiniteMsg(lit)
	}
	return jsonMsg(err)
}

// nonFiniteMsg says what is wrong with a NaN or Infinity literal.
func nonFiniteMsg(lit string) string {
	return lit + " is not a JSON number (Python's json.dump writes it for a float nan or inf): replace it with a finite number"
}

// lineJSONError is the error for a line of a JSON-lines file that does not
// decode: a NaN or Infinity literal, or else malformed JSON (say is what
// each line must be).
func lineJSONError(file string, lineNo int, line []byte, err error, say string) *ParseError {
	if lit := nonFinite(line, err); lit != "" {
		return perr(file, lineNo, "", "%s", nonFiniteMsg(lit))
	}
	return perr(file, lineNo, jsonField(err), "malformed JSON (%v): %s", jsonMsg(err), say)
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
