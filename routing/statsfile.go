package routing

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
)

// StatsFormat names a file format WriteStats writes.
type StatsFormat string

// The formats of WriteStats; see the package documentation.
const (
	// StatsMoetuner is moetuner's own aggregated-statistics file
	// ("moetuner.stats/v1"), which Load reads back and which adds up.
	StatsMoetuner StatsFormat = "moetuner"
	// StatsLogicalCount is {"logical_count": [L_all][E]}, the expert
	// distribution SGLang (--init-expert-location) and EPLB take.
	StatsLogicalCount StatsFormat = "logical-count"
)

// statsSchema tags moetuner's statistics files.
const statsSchema = "moetuner.stats/v1"

const (
	// maxStatsFileBytes caps a moetuner.stats file read back.
	maxStatsFileBytes = 1 << 30
)

// maxFilePatternIDs caps the pattern ids WriteStats writes; past it the
// patterns are thinned to a weighted sample that fits (see thinPatterns).
// Tests lower it through writeStatsCapped.
const maxFilePatternIDs = 1 << 26

// countsBesidesPatterns is the number of counts s's file holds apart from
// the pattern ids.
func countsBesidesPatterns(s *Stats) int {
	n := len(s.Load)*s.Experts + len(s.Transitions)*s.Experts*s.Experts + len(s.CoActivation)*s.Experts*s.Experts
	return n + (len(s.StepLoad)+len(s.SourceLoad))*s.Layers*s.Experts
}

func patternIDs(s *Stats) int { return len(s.Patterns) * s.Layers * s.TopK }

// fitFile returns s, or a copy whose patterns are thinned so that the file
// holds at most maxPatternIDs pattern ids and maxCountEntries numbers in
// all (PathSample and Notes then say so).
func fitFile(s *Stats, maxPatternIDs int) *Stats {
	budget := min(maxPatternIDs, maxCountEntries-countsBesidesPatterns(s))
	if s.Patterns == nil || patternIDs(s) <= budget {
		return s
	}
	lk := max(s.Layers*s.TopK, 1)
	if budget < lk {
		c := *s
		c.Patterns, c.PathSample = nil, PathSample{}
		c.Notes = append(mergeNotes(s.Notes, nil), "patterns left out of the moetuner.stats file: the other counts fill it; the cost model then counts each (token, expert) pair on its own (an upper bound on all-to-all traffic)")
		return &c
	}
	return thinStats(s, budget/lk)
}

// WriteStats writes s in format f with fixed formatting (one line per
// layer, shortest exact decimals), so equal stats give equal bytes. The
// moetuner format thins Patterns to a weighted sample when they hold more
// than 2^26 ids, or more than the 2^26 numbers a file may hold besides the
// other counts (PathSample and Notes in the file then say so), and refuses
// stats of more than 2^26 other counts, which it could not read back. It returns s.Validate's error for invalid stats and an error for
// an unknown format.
func WriteStats(w io.Writer, s *Stats, f StatsFormat) error {
	return writeStatsCapped(w, s, f, maxFilePatternIDs)
}

// writeStatsCapped is WriteStats with maxPatternIDs in place of
// maxFilePatternIDs (tests lower it).
func writeStatsCapped(w io.Writer, s *Stats, f StatsFormat, maxPatternIDs int) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if f != StatsLogicalCount {
		if n := countsBesidesPatterns(s); n > maxCountEntries {
			return fmt.Errorf("routing: %d counts are too many for a moetuner.stats file (at most %d): drop StepLoad or split the trace", n, maxCountEntries)
		}
		s = fitFile(s, maxPatternIDs)
	}
	bw := bufio.NewWriter(w)
	var err error
	switch f {
	case StatsMoetuner, "":
		err = writeMoetunerStats(bw, s)
	case StatsLogicalCount:
		err = writeLogicalCount(bw, s)
	default:
		return fmt.Errorf("routing: unknown stats format %q: want moetuner or logical-count", f)
	}
	if err != nil {
		return err
	}
	return bw.Flush()
}

// LogicalCountRows returns the decoder-layer row of each of s's layers in a
// logical_count file and the number of rows: with ModelLayers known, rows
// 0..ModelLayers-1 and the layers at their LayerNames; else with LayerNames,
// rows 0..max(LayerNames); else one row per layer, in order.
func LogicalCountRows(s *Stats) (rows []int, n int) {
	rows = make([]int, s.Layers)
	for l := range rows {
		rows[l] = l
		if s.LayerNames != nil {
			rows[l] = s.LayerNames[l]
		}
	}
	switch {
	case s.ModelLayers > 0:
		n = s.ModelLayers
	case s.LayerNames != nil:
		n = slices.Max(s.LayerNames) + 1
	default:
		n = s.Layers
	}
	return rows, n
}

func writeLogicalCount(w *bufio.Writer, s *Stats) error {
	rows, n := LogicalCountRows(s)
	byRow := make(map[int]int, len(rows))
	for l, r := range rows {
		if _, dup := byRow[r]; dup {
			return fmt.Errorf("routing: layer name %d appears twice: cannot place it in logical_count", r)
		}
		byRow[r] = l
	}
	zero := make([]float64, s.Experts)
	w.WriteString("{\"logical_count\": [\n")
	for r := range n {
		row := zero
		if l, ok := byRow[r]; ok {
			row = s.Load[l]
		}
		w.WriteString("  ")
		writeFloats(w, row)
		if r < n-1 {
			w.WriteByte(',')
		}
		w.WriteByte('\n')
	}
	_, err := w.WriteString("]}\n")
	return err
}

func writeFloats(w *bufio.Writer, v []float64) {
	b := make([]byte, 0, 8*len(v)+2)
	b = append(b, '[')
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendFloat(b, x, 'f', -1, 64)
	}
	b = append(b, ']')
	w.Write(b)
}

// writeMatrices writes key: [[row], ...] with one row per line; nil writes
// nothing.
func writeMatrix(w *bufio.Writer, key string, m [][]float64) {
	if m == nil {
		return
	}
	fmt.Fprintf(w, ",\n %q: [", key)
	for i, row := range m {
		if i > 0 {
			w.WriteByte(',')
		}
		w.WriteString("\n  ")
		writeFloats(w, row)
	}
	w.WriteString("\n ]")
}

func writeMatrices(w *bufio.Writer, key string, ms [][][]float64) {
	if ms == nil {
		return
	}
	fmt.Fprintf(w, ",\n %q: [", key)
	for i, m := range ms {
		if i > 0 {
			w.WriteByte(',')
		}
		w.WriteString("\n  [")
		for j, row := range m {
			if j > 0 {
				w.WriteString(",\n   ")
			}
			writeFloats(w, row)
		}
		w.WriteByte(']')
	}
	w.WriteString("\n ]")
}

func writeMoetunerStats(w *bufio.Writer, s *Stats) error {
	fmt.Fprintf(w, "{\"schema\": %q,\n \"experts\": %d,\n \"top_k\": %d,\n \"tokens\": %s",
		statsSchema, s.Experts, s.TopK, strconv.FormatFloat(s.Tokens, 'f', -1, 64))
	names := s.LayerNames
	if names == nil {
		names = make([]int, s.Layers)
		for l := range names {
			names[l] = l
		}
	}
	w.WriteString(",\n \"layers\": ")
	w.Write(appendInts(nil, names))
	if s.ModelLayers > 0 {
		fmt.Fprintf(w, ",\n \"model_layers\": %d", s.ModelLayers)
	}
	writeMatrix(w, "load", s.Load)
	if s.Transitions != nil {
		fmt.Fprintf(w, ",\n \"transition_mode\": %q", s.TransitionMode.String())
		writeMatrix(w, "transitions", s.Transitions)
	}
	writeMatrix(w, "coactivation", s.CoActivation)
	writeMatrices(w, "step_load", s.StepLoad)
	if s.StepLoad != nil && s.StepsUnordered {
		w.WriteString(",\n \"steps_unordered\": true")
	}
	writeMatrices(w, "source_load", s.SourceLoad)
	if s.Patterns != nil {
		if s.PathSample != (PathSample{}) {
			fmt.Fprintf(w, ",\n \"path_sample\": {\"tokens\": %d, \"kept\": %d, \"rel_std_err\": %s}",
				s.PathSample.Tokens, s.PathSample.Kept, strconv.FormatFloat(s.PathSample.RelStdErr, 'g', -1, 64))
		}
		w.WriteString(",\n \"patterns\": [")
		for i, p := range s.Patterns {
			if i > 0 {
				w.WriteByte(',')
			}
			ids := make([]int, len(p.Experts))
			for j, e := range p.Experts {
				ids[j] = int(e)
			}
			fmt.Fprintf(w, "\n  {\"source\": %d, \"count\": %s, \"experts\": ", p.Source, strconv.FormatFloat(p.Count, 'f', -1, 64))
			w.Write(appendInts(nil, ids))
			w.WriteByte('}')
		}
		w.WriteString("\n ]")
	}
	if s.Notes != nil {
		w.WriteString(",\n \"notes\": [")
		for i, n := range s.Notes {
			if i > 0 {
				w.WriteByte(',')
			}
			b, _ := json.Marshal(n)
			w.WriteString("\n  ")
			w.Write(b)
		}
		w.WriteString("\n ]")
	}
	_, err := w.WriteString("\n}\n")
	return err
}

type statsFile struct {
	Schema         string          `json:"schema"`
	Experts        int             `json:"experts"`
	TopK           int             `json:"top_k"`
	Tokens         float64         `json:"tokens"`
	Layers         []int           `json:"layers"`
	ModelLayers    int             `json:"model_layers"`
	Load           [][]float64     `json:"load"`
	TransitionMode string          `json:"transition_mode"`
	Transitions    [][]float64     `json:"transitions"`
	CoActivation   [][]float64     `json:"coactivation"`
	StepLoad       [][][]float64   `json:"step_load"`
	StepsUnordered bool            `json:"steps_unordered"`
	SourceLoad     [][][]float64   `json:"source_load"`
	Patterns       json.RawMessage `json:"patterns"`
	PathSample     *struct {
		Tokens    int64   `json:"tokens"`
		Kept      int64   `json:"kept"`
		RelStdErr float64 `json:"rel_std_err"`
	} `json:"path_sample"`
	Notes []string `json:"notes"`
}

// parseMoetunerStats reads a "moetuner.stats/v1" file back into Stats.
func parseMoetunerStats(data []byte, file string) (*Stats, error) {
	// Decoding allocates 8 bytes per number; count them before.
	if n := bytes.Count(data, []byte(",")); n > maxCountEntries+1<<20 {
		return nil, perr(file, 0, "", "%d numbers, more than %d: the file is too large", n, maxCountEntries)
	}
	var f statsFile
	if err := decodeJSON(data, file, &f); err != nil {
		return nil, err
	}
	if f.Schema != statsSchema {
		return nil, perr(file, 1, "schema", "%q, want %q", clip(f.Schema), statsSchema)
	}
	if f.Experts <= 0 || f.Experts > math.MaxInt16+1 {
		return nil, perr(file, 1, "experts", "%d out of range [1,%d]", f.Experts, math.MaxInt16+1)
	}
	L := len(f.Load)
	if L == 0 {
		return nil, perr(file, 1, "load", "missing or empty: want [layers][experts] counts")
	}
	if len(f.Layers) != L {
		return nil, perr(file, 1, "layers", "%d layer ids for %d rows of load", len(f.Layers), L)
	}
	n := L * f.Experts * (1 + len(f.StepLoad) + len(f.SourceLoad))
	if f.Transitions != nil || f.CoActivation != nil {
		n += 2 * L * f.Experts * f.Experts
	}
	if n > maxCountEntries {
		return nil, perr(file, 1, "", "more than %d counts: the file is too large", maxCountEntries)
	}
	s := &Stats{
		Layers: L, Experts: f.Experts, TopK: f.TopK, Tokens: f.Tokens,
		Load: f.Load, Transitions: f.Transitions, CoActivation: f.CoActivation,
		StepLoad: f.StepLoad, StepsUnordered: f.StepsUnordered && f.StepLoad != nil, SourceLoad: f.SourceLoad,
		LayerNames: f.Layers, ModelLayers: f.ModelLayers,
	}
	switch f.TransitionMode {
	case "", "all-pairs":
	case "top1":
		s.TransitionMode = TransitionTop1
	default:
		return nil, perr(file, 1, "transition_mode", "%q, want all-pairs or top1", clip(f.TransitionMode))
	}
	if f.Transitions != nil && f.TransitionMode == "" {
		return nil, perr(file, 1, "transition_mode", "missing: transitions need their counting mode")
	}
	if len(f.Patterns) > 0 && !bytes.Equal(bytes.TrimSpace(f.Patterns), []byte("null")) {
		var pats []struct {
			Source  int32   `json:"source"`
			Count   float64 `json:"count"`
			Experts []int16 `json:"experts"`
		}
		if err := json.Unmarshal(f.Patterns, &pats); err != nil {
			return nil, perr(file, 1, "patterns", "want [{\"source\", \"count\", \"experts\"}]: %s", jsonMsg(err))
		}
		if len(pats) > MaxPatterns {
			return nil, perr(file, 1, "patterns", "%d patterns, at most %d", len(pats), MaxPatterns)
		}
		s.Patterns = make([]Pattern, len(pats))
		for i, p := range pats {
			s.Patterns[i] = Pattern{Source: p.Source, Count: p.Count, Experts: p.Experts}
		}
	}
	if ps := f.PathSample; ps != nil {
		if s.Patterns == nil {
			return nil, perr(file, 1, "path_sample", "given without patterns: drop it or add the patterns")
		}
		s.PathSample = PathSample{Tokens: ps.Tokens, Kept: ps.Kept, RelStdErr: ps.RelStdErr}
	} else if s.Patterns != nil {
		t := int64(math.Round(s.Tokens))
		s.PathSample = PathSample{Tokens: t, Kept: t}
	}
	s.Notes = f.Notes
	if err := s.Validate(); err != nil {
		return nil, perr(file, 1, "", "%v", err)
	}
	return s, nil
}
