package routing

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Format names a routing file format.
type Format string

// The formats that Load reads; see the package documentation for each one.
const (
	FormatAuto         Format = ""              // detect from the extension and the first bytes
	FormatJSONL        Format = "jsonl"         // moetuner per-token JSONL
	FormatNPY          Format = "npy"           // NumPy int array [T, L, k] or [T, L]
	FormatFLAME        Format = "flame-csv"     // FLAME-MoE per-layer probability CSV
	FormatOLMoE        Format = "olmoe-json"    // OLMoE routing-analysis counts
	FormatFiddler      Format = "fiddler-json"  // Fiddler expert_popularity counts
	FormatLogicalCount Format = "logical-count" // EPLB/SGLang logical_count
)

// LoadOptions are the optional settings of Load. The zero value detects the
// format, infers Experts and TopK where the file allows it, counts all-pairs
// transitions, keeps patterns and drops all-zero layers of count formats.
type LoadOptions struct {
	// Format forces a format; FormatAuto (the default) detects it.
	Format Format
	// TopK is the routing top-k for count formats that do not state it
	// (logical_count; Fiddler defaults to 2). 0 = infer or unknown.
	TopK int
	// Experts sets the number of experts per layer for NPY traces, whose ids
	// may not reach the last expert; 0 = max id + 1.
	Experts int
	// Transitions is the transition convention for per-token traces;
	// default TransitionAllPairs.
	Transitions TransitionMode
	// NoPatterns skips the pattern histogram of per-token traces.
	NoPatterns bool
	// KeepZeroLayers keeps logical_count layers that are zero in every step
	// (DeepSeek's 3 dense layers, for example); by default they are dropped
	// and LayerNames keeps the original indices.
	KeepZeroLayers bool
}

// Source is what Load read from one path.
type Source struct {
	Path   string
	Format Format
	// Trace is the per-token trace; nil for count-only formats and for a
	// directory of several trace files (their Stats are merged).
	Trace *Trace
	// Stats are the aggregated statistics; never nil on success.
	Stats *Stats
	// OLMoE is the full OLMoE file (with its skip-layer pair counts) when
	// Format is FormatOLMoE, else nil.
	OLMoE *OLMoEFile
}

// Load reads path, a file or a directory. A directory of FLAME CSV files
// (.csv) is read as one trace with a layer per file; any other directory has
// its .jsonl, .json and .npy files read one by one (sorted by name) and their
// stats merged with Merge. Other files in a directory are ignored. Errors
// are *ParseError naming the file, except merge errors.
func Load(path string, opts LoadOptions) (*Source, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, &ParseError{File: path, Err: err}
	}
	if !fi.IsDir() {
		src, err := loadFile(path, opts)
		if err != nil {
			return nil, withFile(err, path)
		}
		return src, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, &ParseError{File: path, Err: err}
	}
	var csvs, others []string
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(path, e.Name())
		switch strings.ToLower(filepath.Ext(e.Name())) {
		case ".csv":
			csvs = append(csvs, p)
		case ".jsonl", ".json", ".npy":
			others = append(others, p)
		}
	}
	switch {
	case len(csvs) > 0 && len(others) > 0:
		return nil, perr(path, 0, "", "mixes .csv layer files with other trace files: keep FLAME layer CSVs in a directory of their own")
	case len(csvs) > 0:
		if opts.Format != FormatAuto && opts.Format != FormatFLAME {
			return nil, perr(path, 0, "", "directory of .csv files but format %q was requested", opts.Format)
		}
		t, err := loadFLAMEDir(csvs)
		if err != nil {
			return nil, err
		}
		return traceSource(path, FormatFLAME, t, opts), nil
	case len(others) == 0:
		return nil, perr(path, 0, "", "no trace files (.jsonl, .json, .npy, .csv) in the directory")
	}
	slices.Sort(others)
	if len(others) == 1 {
		return Load(others[0], opts)
	}
	out := &Source{Path: path, Stats: &Stats{}}
	for i, p := range others {
		src, err := Load(p, opts)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			out.Format = src.Format
		} else if src.Format != out.Format {
			out.Format = FormatAuto
		}
		if err := out.Stats.Merge(src.Stats); err != nil {
			return nil, fmt.Errorf("routing: %s: merging into the files before it: %w", p, err)
		}
	}
	return out, nil
}

// LoadAll loads every path with Load and merges their stats in order. It
// returns the merged stats and the sources; the first error stops it, and
// no paths is an error.
func LoadAll(paths []string, opts LoadOptions) (*Stats, []*Source, error) {
	if len(paths) == 0 {
		return nil, nil, fmt.Errorf("routing: no paths to load")
	}
	total := &Stats{}
	var srcs []*Source
	for _, p := range paths {
		src, err := Load(p, opts)
		if err != nil {
			return nil, nil, err
		}
		if err := total.Merge(src.Stats); err != nil {
			return nil, nil, fmt.Errorf("routing: %s: merging into the paths before it: %w", p, err)
		}
		srcs = append(srcs, src)
	}
	return total, srcs, nil
}

func loadFile(path string, opts LoadOptions) (*Source, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &ParseError{File: path, Err: err}
	}
	defer f.Close()
	return read(f, path, opts)
}

// Read reads one file's contents from r, detecting the format from name's
// extension and the first bytes unless opts.Format is set. name is used for
// detection, for a FLAME file's layer number ("layer<N>") and in errors, and
// may be empty. It is Load of a single file without the file system.
func Read(r io.Reader, name string, opts LoadOptions) (*Source, error) {
	return read(r, name, opts)
}

func read(r io.Reader, name string, opts LoadOptions) (*Source, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	format := opts.Format
	if format == FormatAuto {
		head, _ := br.Peek(8 << 10)
		var err error
		if format, err = Detect(name, head); err != nil {
			return nil, err
		}
	}
	switch format {
	case FormatJSONL:
		t, err := readJSONL(br, name)
		if err != nil {
			return nil, err
		}
		return traceSource(name, format, t, opts), nil
	case FormatNPY:
		t, err := readNPY(br, name, opts.Experts)
		if err != nil {
			return nil, err
		}
		return traceSource(name, format, t, opts), nil
	case FormatFLAME:
		fl, err := readFLAMELayer(br, name)
		if err != nil {
			return nil, err
		}
		var names []int
		if n, ok := flameLayerNumber(name); ok {
			names = []int{n}
		}
		return traceSource(name, format, flameTrace([]*flameLayer{fl}, names), opts), nil
	}
	data, err := readCapped(br, name)
	if err != nil {
		return nil, err
	}
	var s *Stats
	src := &Source{Path: name, Format: format}
	switch format {
	case FormatOLMoE:
		f, err := parseOLMoE(data, name)
		if err != nil {
			return nil, err
		}
		src.OLMoE, s = f, f.Stats()
	case FormatFiddler:
		if s, err = parseFiddler(data, name, opts.TopK); err != nil {
			return nil, err
		}
	case FormatLogicalCount:
		if s, err = parseLogicalCount(data, name, opts.TopK, opts.KeepZeroLayers); err != nil {
			return nil, err
		}
	default:
		return nil, perr(name, 0, "", "unknown format %q: use one of jsonl, npy, flame-csv, olmoe-json, fiddler-json, logical-count", format)
	}
	if name != "" {
		s.Sources = []string{name}
	}
	if err := s.Validate(); err != nil {
		return nil, perr(name, 0, "", "%v", err)
	}
	src.Stats = s
	return src, nil
}

func traceSource(name string, format Format, t *Trace, opts LoadOptions) *Source {
	s := t.Stats(StatsOptions{Transitions: opts.Transitions, NoPatterns: opts.NoPatterns})
	if name != "" {
		s.Sources = []string{name}
	}
	return &Source{Path: name, Format: format, Trace: t, Stats: s}
}

// Detect guesses the format of a file from its name and its first bytes:
// the NPY magic or .npy; a CSV header starting layer_id,token_id or .csv;
// a JSON object with "logical_count" (or a bare JSON array), with
// "expert_popularity", with "expert_counts" and "num_experts", or with
// "moetuner_trace" or "layers" (JSONL, also for .jsonl). It returns a
// *ParseError when nothing matches.
func Detect(name string, head []byte) (Format, error) {
	ext := strings.ToLower(filepath.Ext(name))
	trimmed := bytes.TrimLeft(head, " \t\r\n\ufeff")
	switch {
	case bytes.HasPrefix(head, []byte(npyMagic)) || ext == ".npy":
		return FormatNPY, nil
	case bytes.HasPrefix(trimmed, []byte("layer_id,token_id")) || ext == ".csv":
		return FormatFLAME, nil
	case ext == ".jsonl":
		return FormatJSONL, nil
	case len(trimmed) > 0 && trimmed[0] == '[':
		return FormatLogicalCount, nil
	case len(trimmed) > 0 && trimmed[0] == '{':
		has := func(k string) bool { return bytes.Contains(trimmed, []byte(`"`+k+`"`)) }
		switch {
		case has("logical_count"):
			return FormatLogicalCount, nil
		case has("expert_popularity"):
			return FormatFiddler, nil
		case has("expert_counts") && has("num_experts"):
			return FormatOLMoE, nil
		case has("moetuner_trace") || has("layers"):
			return FormatJSONL, nil
		}
	case len(trimmed) == 0:
		return FormatAuto, perr(name, 0, "", "empty file: nothing to read")
	}
	return FormatAuto, perr(name, 0, "", "cannot detect the format: set LoadOptions.Format (jsonl, npy, flame-csv, olmoe-json, fiddler-json, logical-count)")
}
