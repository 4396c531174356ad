package routing

import (
	"cmp"
	"encoding/csv"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
)

// flameLayer is one parsed FLAME CSV file: a single layer of a trace.
type flameLayer struct {
	tokenIDs []int
	tokLines []int // line of each row, for errors
	topK     int
	experts  int
	ids      []int16
	weights  []float32
}

// ReadFLAMECSV reads one FLAME-MoE layer CSV (header
// layer_id,token_id,expert_0,...,expert_{E-1}; one row per token) as a
// one-layer trace. The selected experts are the columns > 0, ordered by
// probability descending (ties by lower id), and Weights are those
// probabilities. layer_id is ignored: FLAME writes 0 in every file. Errors
// are *ParseError with the line and the column name.
func ReadFLAMECSV(r io.Reader) (*Trace, error) {
	fl, err := readFLAMELayer(r, "")
	if err != nil {
		return nil, err
	}
	return flameTrace([]*flameLayer{fl}, nil), nil
}

func readFLAMELayer(r io.Reader, file string) (*flameLayer, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	cr.FieldsPerRecord = -1
	header, err := cr.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, perr(file, 0, "", "empty file: want a CSV with header layer_id,token_id,expert_0,...")
		}
		return nil, csvErr(err, file)
	}
	header = slices.Clone(header)
	if len(header) < 3 || header[0] != "layer_id" || header[1] != "token_id" {
		return nil, perr(file, 1, "", "header does not start with layer_id,token_id,expert_0: not a FLAME-MoE trace CSV")
	}
	E := len(header) - 2
	if E > math.MaxInt16+1 {
		return nil, perr(file, 1, "", "%d expert columns exceed the int16 id range", E)
	}
	for e := range E {
		if header[2+e] != "expert_"+strconv.Itoa(e) {
			return nil, perr(file, 1, header[2+e], "column %d should be expert_%d: expert columns must be in order", 2+e, e)
		}
	}
	fl := &flameLayer{experts: E}
	type pick struct {
		e int
		p float64
	}
	var picks []pick
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, csvErr(err, file)
		}
		line, _ := cr.FieldPos(0)
		if len(rec) != E+2 {
			return nil, perr(file, line, "", "%d fields, want %d like the header: the row is cut short or has extra commas", len(rec), E+2)
		}
		tok, err := strconv.Atoi(rec[1])
		if err != nil {
			return nil, perr(file, line, "token_id", "%q is not an integer", clip(rec[1]))
		}
		picks = picks[:0]
		for e := range E {
			v, err := strconv.ParseFloat(rec[2+e], 64)
			if err != nil {
				return nil, perr(file, line, header[2+e], "%q is not a number", clip(rec[2+e]))
			}
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return nil, perr(file, line, header[2+e], "probability %v must be finite and ≥ 0", v)
			}
			if v > 0 {
				picks = append(picks, pick{e, v})
			}
		}
		if len(picks) == 0 {
			return nil, perr(file, line, "", "no expert column > 0: each row must mark its top-k experts with their probabilities")
		}
		if fl.topK == 0 {
			fl.topK = len(picks)
		} else if len(picks) != fl.topK {
			return nil, perr(file, line, "", "%d experts > 0, but earlier rows have %d: every token must select the same top-k", len(picks), fl.topK)
		}
		if (len(fl.tokenIDs)+1)*fl.topK > maxTraceIDs {
			return nil, perr(file, line, "", "more than %d ids: split the file", maxTraceIDs)
		}
		slices.SortStableFunc(picks, func(a, b pick) int {
			if c := cmp.Compare(b.p, a.p); c != 0 {
				return c
			}
			return cmp.Compare(a.e, b.e)
		})
		for _, p := range picks {
			fl.ids = append(fl.ids, int16(p.e))
			fl.weights = append(fl.weights, float32(p.p))
		}
		fl.tokenIDs = append(fl.tokenIDs, tok)
		fl.tokLines = append(fl.tokLines, line)
	}
	if len(fl.tokenIDs) == 0 {
		return nil, perr(file, 0, "", "no data rows after the header")
	}
	if fl.topK > E {
		return nil, perr(file, 0, "", "top-k %d exceeds %d experts", fl.topK, E)
	}
	return fl, nil
}

func csvErr(err error, file string) error {
	var ce *csv.ParseError
	if errors.As(err, &ce) {
		return perr(file, ce.Line, "", "malformed CSV: %v", ce.Err)
	}
	return perr(file, 0, "", "read: %v", err)
}

// flameTrace joins layers that have already been checked to agree.
func flameTrace(layers []*flameLayer, names []int) *Trace {
	T, K := len(layers[0].tokenIDs), layers[0].topK
	L := len(layers)
	t := &Trace{Tokens: T, Layers: L, TopK: K, Experts: layers[0].experts, LayerNames: names,
		IDs: make([]int16, T*L*K), Weights: make([]float32, T*L*K)}
	for l, fl := range layers {
		for tok := range T {
			copy(t.IDs[(tok*L+l)*K:(tok*L+l+1)*K], fl.ids[tok*K:(tok+1)*K])
			copy(t.Weights[(tok*L+l)*K:(tok*L+l+1)*K], fl.weights[tok*K:(tok+1)*K])
		}
	}
	return t
}

var flameLayerRe = regexp.MustCompile(`(?:^|[^a-zA-Z])layer(\d+)`)

// flameLayerNumber extracts N from "...layer<N>..." in a file name.
func flameLayerNumber(name string) (int, bool) {
	m := flameLayerRe.FindStringSubmatch(filepath.Base(name))
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	return n, err == nil
}

// loadFLAMEDir reads FLAME layer CSV files (one per layer, the layer number
// taken from "layer<N>" in the file name), sorts them by N and joins the
// rows on token_id, which must list the same tokens in the same order in
// every file. Each file read is reported to opts.Progress (without a token
// count: the files share their tokens).
func loadFLAMEDir(files []string, opts LoadOptions) (*Trace, error) {
	type named struct {
		n    int
		file string
	}
	var nf []named
	for _, f := range files {
		n, ok := flameLayerNumber(f)
		if !ok {
			return nil, perr(f, 0, "", "no layer<N> in the file name: FLAME layer files must be named ..._layer<N>_...csv")
		}
		nf = append(nf, named{n, f})
	}
	slices.SortFunc(nf, func(a, b named) int { return cmp.Compare(a.n, b.n) })
	var layers []*flameLayer
	var names []int
	for i, x := range nf {
		if i > 0 && nf[i-1].n == x.n {
			return nil, perr(x.file, 0, "", "layer %d also in %s: keep one file per layer", x.n, nf[i-1].file)
		}
		fl, size, err := readFLAMEFile(x.file)
		if err != nil {
			return nil, err
		}
		fileDone(opts, x.file, size, 0)
		if i > 0 {
			first := layers[0]
			if fl.experts != first.experts {
				return nil, perr(x.file, 1, "", "%d expert columns but %s has %d: all layer files must have the same experts", fl.experts, nf[0].file, first.experts)
			}
			if fl.topK != first.topK {
				return nil, perr(x.file, fl.tokLines[0], "", "top-%d rows but %s has top-%d: all layers must select the same number of experts", fl.topK, nf[0].file, first.topK)
			}
			for r := range min(len(fl.tokenIDs), len(first.tokenIDs)) {
				if fl.tokenIDs[r] != first.tokenIDs[r] {
					return nil, perr(x.file, fl.tokLines[r], "token_id", "%d, but row %d of %s has token_id %d: all layer files must list the same tokens in the same order",
						fl.tokenIDs[r], r+1, filepath.Base(nf[0].file), first.tokenIDs[r])
				}
			}
			if len(fl.tokenIDs) != len(first.tokenIDs) {
				return nil, perr(x.file, 0, "token_id", "%d rows, but %s has %d: all layer files must list the same tokens", len(fl.tokenIDs), filepath.Base(nf[0].file), len(first.tokenIDs))
			}
		}
		layers = append(layers, fl)
		names = append(names, x.n)
	}
	if len(layers) == 0 {
		return nil, perr("", 0, "", "no FLAME CSV files")
	}
	return flameTrace(layers, names), nil
}

func readFLAMEFile(path string) (*flameLayer, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, &ParseError{File: path, Err: err}
	}
	defer f.Close()
	cr := &countingReader{r: f}
	fl, err := readFLAMELayer(cr, path)
	return fl, cr.n, err
}
