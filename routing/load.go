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

	FormatSGLangPT            Format = "sglang-pt"               // SGLang expert-distribution recorder .pt (stat, per_pass, per_token)
	FormatSGLangRoutedExperts Format = "sglang-routed-experts"   // SGLang return_routed_experts responses (base64 int32)
	FormatTRTLLM              Format = "trtllm-expert-statistic" // TensorRT-LLM EXPERT_STATISTIC_PATH .safetensors
	FormatMegatron            Format = "megatron-router-trace"   // Megatron-Core router_trace_rank{r}.jsonl
	FormatVLLMLoadStats       Format = "vllm-eplb-load-stats"    // vLLM eplb_load_stats JSONL
	FormatMoetunerStats       Format = "moetuner-stats"          // moetuner.stats/v1, written by WriteStats
)

// Formats lists every format Load reads, FormatAuto excluded, in the order
// of the package documentation.
var Formats = []Format{FormatJSONL, FormatNPY, FormatFLAME, FormatOLMoE, FormatFiddler, FormatLogicalCount,
	FormatSGLangPT, FormatSGLangRoutedExperts, FormatTRTLLM, FormatMegatron, FormatVLLMLoadStats, FormatMoetunerStats}

// LoadOptions are the optional settings of Load. The zero value detects the
// format, infers Experts and TopK where the file allows it, counts all-pairs
// transitions, keeps patterns and drops all-zero layers of count formats.
type LoadOptions struct {
	// Format forces a format; FormatAuto (the default) detects it.
	Format Format
	// TopK is the routing top-k for count formats that do not state it
	// (logical_count, SGLang stat and per_pass, vLLM; Fiddler defaults to 2)
	// and for SGLang routed_experts, which needs it. 0 = infer or unknown.
	// A file that records another top-k (a per-token trace, OLMoE) is an
	// error.
	TopK int
	// Experts sets the number of (logical) experts per layer for the formats
	// that do not state it (NPY, JSONL without "experts" in its header,
	// SGLang dumps, Megatron, vLLM, routed experts), whose ids may not
	// reach the last expert; 0 = max id + 1. Ids at or above it are
	// errors, and so is a file that states another count.
	Experts int
	// Transitions is the transition convention for per-token traces;
	// default TransitionAllPairs.
	Transitions TransitionMode
	// NoPatterns skips the pattern histogram of per-token traces.
	NoPatterns bool
	// KeepZeroLayers keeps the layers of logical_count and SGLang stat and
	// per_pass dumps that are zero in every step (DeepSeek's 3 dense layers,
	// for example); by default they are dropped and LayerNames keeps the
	// original indices.
	KeepZeroLayers bool
	// MegatronLayerOffsets maps a rank to the number added to the layer
	// ids of its Megatron router-trace file (key -1: every rank without
	// a key of its own). In training a record's layer is the index within
	// the rank's pipeline stage, so a stage's offset is the number of
	// decoder layers before it. Files that then record disjoint layer sets
	// are stages of the same pipelines and are joined step by step (the
	// i-th rank of every stage, by rank, is pipeline i); files of one
	// layer set are data-parallel ranks. Nil: the ids as recorded.
	MegatronLayerOffsets map[int]int
	// ModelLayers is the model's num_hidden_layers, which SGLang's
	// routed_experts payload needs to be cut into layers; 0 = infer it
	// from the response's token counts.
	ModelLayers int
	// StatsOnly leaves Source.Trace nil for per-token formats, for callers
	// that need only the statistics: NPY and moetuner JSONL traces are
	// then read in chunks straight into the counters and never held, and
	// the other per-token formats drop their trace as soon as the stats
	// are built. Default false: the trace is kept (replay and backtest
	// need it).
	StatsOnly bool
	// PathError is StatsOptions.PathError for per-token traces: the target
	// relative standard error of per-token means estimated from the path
	// sample (0: DefaultPathError; negative: keep every path).
	PathError float64
	// SlotExperts is the placement that was serving while a TensorRT-LLM
	// statistics directory was recorded: SlotExperts[l][s] is the logical
	// expert of physical slot s (rank-major, as TensorRT-LLM numbers its
	// slots) of the l-th MoE layer in ascending layer order; nil when
	// unknown. Under a load_balancer config TensorRT-LLM records slot ids,
	// not expert ids, and meta_info.json's num_experts is then num_slots:
	// a directory whose num_experts equals the slots per layer here is
	// folded back to logical experts (Source.Slots says so); one whose
	// num_experts is the placement's expert count is read as it is. Other
	// formats ignore it.
	SlotExperts [][]Expert
	// Progress, when set, is called as a file is read: per chunk of about
	// 8 MiB of ids or 4 MiB of text for the formats read in pieces (NPY,
	// JSONL), and once with Done set when each file is read. It is called
	// from the goroutine that called Load; nil means no reports.
	Progress func(ReadProgress)

	// chunkIDs is StatsOptions.chunkIDs for the readers that count in
	// chunks (tests lower it); 0 means defaultChunkIDs.
	chunkIDs int
}

// statsOptions are the StatsOptions that o implies.
func (o LoadOptions) statsOptions() StatsOptions {
	return StatsOptions{Transitions: o.Transitions, NoPatterns: o.NoPatterns, PathError: o.PathError, chunkIDs: o.chunkIDs}
}

// Source is what Load read from one path.
type Source struct {
	Path   string
	Format Format
	// Trace is the per-token trace; nil for count-only formats, with
	// LoadOptions.StatsOnly, and for a directory of several independent
	// trace files (their Stats are merged). A directory of one stack's per-rank files (SGLang per_token,
	// Megatron, TensorRT-LLM token files) is one trace.
	Trace *Trace
	// Stats are the aggregated statistics; never nil on success.
	Stats *Stats
	// Deployment is what the file records about the deployment it was
	// recorded on (vLLM's eplb_load_meta); nil when it records nothing.
	Deployment *Deployment
	// Slots is the number of physical slots per layer that a TensorRT-LLM
	// directory counted under the load balancer and that were folded back
	// to logical experts through LoadOptions.SlotExperts; 0 when the files
	// counted logical experts.
	Slots int
	// OLMoE is the full OLMoE file (with its skip-layer pair counts) when
	// Format is FormatOLMoE, else nil.
	OLMoE *OLMoEFile
}

// Load reads path, a file or a directory. A directory is one trace when it
// holds one stack's per-rank dump (see the package documentation): FLAME
// layer CSVs (.csv), TensorRT-LLM's meta_info.json with rank{r}.safetensors,
// Megatron's router_trace_rank{r}.jsonl, or SGLang recorder dumps (.pt);
// per-rank files are merged keeping each token's rank as its source. Any
// other directory has its .jsonl, .json and .npy files read one by one
// (sorted by name) and their stats merged with Merge. Other files in a
// directory are ignored. Errors are *ParseError naming the file, except
// merge errors.
func Load(path string, opts LoadOptions) (*Source, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, &ParseError{File: path, Err: err}
	}
	var src *Source
	if fi.IsDir() {
		src, err = loadDir(path, opts)
	} else {
		src, err = loadFile(path, opts)
		err = withFile(err, path)
	}
	if err != nil {
		return nil, err
	}
	if err := checkAgainstOptions(src, opts); err != nil {
		return nil, err
	}
	return src, nil
}

// megatronSidecar reports whether name is a file Megatron-Core's
// RouterTracer writes beside router_trace_rank{r}.jsonl
// (megatron/core/transformer/moe/router_trace.py): router_state_rank{r}.pt
// (--moe-routing-trace-dump-weights), hidden_states_rank{r}.bin and
// logits_rank{r}.bin.
func megatronSidecar(name string) bool {
	return rankOf(name, "router_state_rank", ".pt") >= 0 || rankOf(name, "hidden_states_rank", ".bin") >= 0 || rankOf(name, "logits_rank", ".bin") >= 0
}

// clipNames keeps the first 4 names and says how many more there are.
func clipNames(names []string) []string {
	if len(names) <= 4 {
		return names
	}
	return append(slices.Clone(names[:4]), fmt.Sprintf("%d more", len(names)-4))
}

// loadDir is Load of a directory.
func loadDir(path string, opts LoadOptions) (*Source, error) {
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, &ParseError{File: path, Err: err}
	}
	var csvs, others, pts, ranks, megatron, sidecars []string
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(path, e.Name())
		if megatronSidecar(e.Name()) {
			sidecars = append(sidecars, e.Name())
			continue
		}
		switch {
		case megatronRank(e.Name()) >= 0:
			megatron = append(megatron, p)
		case strings.HasSuffix(e.Name(), ".safetensors"):
			ranks = append(ranks, p)
		}
		switch strings.ToLower(filepath.Ext(e.Name())) {
		case ".csv":
			csvs = append(csvs, p)
		case ".pt":
			pts = append(pts, p)
		case ".jsonl", ".json", ".npy":
			if e.Name() != "meta_info.json" && megatronRank(e.Name()) < 0 && !strings.HasSuffix(e.Name(), ".source.npy") {
				others = append(others, p)
			}
		}
	}
	kinds := 0
	for _, n := range [][]string{csvs, pts, megatron, ranks, others} {
		if len(n) > 0 {
			kinds++
		}
	}
	if kinds > 1 {
		return nil, perr(path, 0, "", "mixes trace files of several kinds (.csv, .pt, router_trace_rank*.jsonl, .safetensors, .json/.jsonl/.npy): keep one stack's dump in a directory of its own")
	}
	want := func(f Format) error {
		if opts.Format != FormatAuto && opts.Format != f {
			return perr(path, 0, "", "directory of %s files but format %q was requested", f, opts.Format)
		}
		return nil
	}
	switch {
	case len(csvs) > 0:
		if err := want(FormatFLAME); err != nil {
			return nil, err
		}
		t, err := loadFLAMEDir(csvs, opts)
		if err != nil {
			return nil, err
		}
		return traceSource(path, FormatFLAME, t, opts), nil
	case len(pts) > 0:
		if err := want(FormatSGLangPT); err != nil {
			return nil, err
		}
		return loadSGLangFiles(path, pts, opts)
	case len(megatron) > 0:
		if err := want(FormatMegatron); err != nil {
			return nil, err
		}
		src, err := loadMegatronFiles(path, megatron, opts)
		if err == nil && len(sidecars) > 0 {
			src.Stats.Notes = append(src.Stats.Notes, fmt.Sprintf("skipped %d Megatron router-trace sidecar files (%s): router weights, hidden states and logits are not routing decisions", len(sidecars), strings.Join(clipNames(sidecars), ", ")))
		}
		return src, err
	case len(ranks) > 0:
		if err := want(FormatTRTLLM); err != nil {
			return nil, err
		}
		return loadTRTLLMDir(path, opts)
	case len(others) == 0:
		return nil, perr(path, 0, "", "no trace files (.jsonl, .json, .npy, .csv, .pt, .safetensors) in the directory")
	}
	slices.Sort(others)
	if len(others) == 1 {
		return Load(others[0], opts)
	}
	out := &Source{Path: path, Stats: &Stats{}}
	var first *Source
	for i, p := range others {
		src, err := Load(p, opts)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			out.Format, first = src.Format, src
		} else if src.Format != out.Format {
			out.Format = FormatAuto
		}
		if err := sameShape(first, src); err != nil {
			return nil, err
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
		if len(srcs) > 0 {
			if err := sameShape(srcs[0], src); err != nil {
				return nil, nil, err
			}
		}
		if err := total.Merge(src.Stats); err != nil {
			return nil, nil, fmt.Errorf("routing: %s: merging into the paths before it: %w", p, err)
		}
		srcs = append(srcs, src)
	}
	return total, srcs, nil
}

// sameShape reports, naming both paths, a source whose layers, experts or
// top-k differ from the first's: traces added up must come from one model.
func sameShape(first, src *Source) error {
	a, b := first.Stats, src.Stats
	fix := "traces added up must come from one model; load the others separately"
	switch {
	case a.Layers != b.Layers:
		return perr(src.Path, 0, "", "%d MoE layers, but %s has %d: %s", b.Layers, first.Path, a.Layers, fix)
	case a.Experts != b.Experts:
		return perr(src.Path, 0, "", "%d experts per layer, but %s has %d: %s (a per-token trace that does not state its experts counts the largest id + 1: set LoadOptions.Experts to the model's experts per layer)", b.Experts, first.Path, a.Experts, fix)
	case a.TopK != 0 && b.TopK != 0 && a.TopK != b.TopK:
		return perr(src.Path, 0, "", "top-k %d, but %s has top-k %d: %s", b.TopK, first.Path, a.TopK, fix)
	case a.LayerNames != nil && b.LayerNames != nil && !slices.Equal(a.LayerNames, b.LayerNames):
		return perr(src.Path, 0, "", "MoE layers at decoder layers %v, but %s has them at %v: %s", clipInts(b.LayerNames), first.Path, clipInts(a.LayerNames), fix)
	case a.ModelLayers != 0 && b.ModelLayers != 0 && a.ModelLayers != b.ModelLayers:
		return perr(src.Path, 0, "", "a model of %d decoder layers, but %s is of one of %d: %s", b.ModelLayers, first.Path, a.ModelLayers, fix)
	}
	return nil
}

// clipInts shortens a long list of layer ids for a message.
func clipInts(v []int) string {
	if len(v) <= 8 {
		return fmt.Sprint(v)
	}
	return fmt.Sprintf("%v … (%d)", v[:8], len(v))
}

// checkAgainstOptions reports a file whose top-k or expert count differs
// from the one LoadOptions gives: TopK is for the formats that do not
// state it, and Experts checks the ids, so a file that states another is
// for another model.
func checkAgainstOptions(src *Source, opts LoadOptions) error {
	s := src.Stats
	switch {
	case opts.TopK > 0 && s.TopK > 0 && s.TopK != opts.TopK:
		return perr(src.Path, 0, "", "the file routes each token to %d experts per layer, but LoadOptions.TopK is %d: leave LoadOptions.TopK 0 for a file that records its top-k, or give the model's", s.TopK, opts.TopK)
	case opts.Experts > 0 && s.Experts != opts.Experts:
		return perr(src.Path, 0, "", "the file has %d experts per layer, but LoadOptions.Experts is %d: set LoadOptions.Experts to the model's experts per layer", s.Experts, opts.Experts)
	}
	return nil
}

func loadFile(path string, opts LoadOptions) (*Source, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &ParseError{File: path, Err: err}
	}
	defer f.Close()
	format := opts.Format
	if format == FormatAuto {
		head := make([]byte, 8<<10)
		n, _ := io.ReadFull(f, head)
		if format, err = Detect(path, head[:n]); err != nil {
			return nil, err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return nil, &ParseError{File: path, Err: err}
		}
	}
	switch format {
	case FormatSGLangPT:
		return loadSGLangFiles(path, []string{path}, opts)
	case FormatTRTLLM:
		return loadTRTLLMFiles(path, filepath.Dir(path), []string{path}, opts)
	case FormatMegatron:
		return loadMegatronFiles(path, []string{path}, opts)
	case FormatNPY:
		return loadNPY(f, path, opts)
	}
	opts.Format = format
	fi, err := f.Stat()
	if err != nil {
		return nil, &ParseError{File: path, Err: err}
	}
	return read(f, path, fi.Size(), opts)
}

// fileDone reports a file read in one piece to LoadOptions.Progress.
func fileDone(opts LoadOptions, path string, size int64, tokens float64) {
	newProgress(opts.Progress, path, size).done(size, int64(tokens))
}

// Read reads one file's contents from r, detecting the format from name's
// extension and the first bytes unless opts.Format is set. name is used for
// detection, for a FLAME file's layer number ("layer<N>"), for a Megatron
// file's rank ("router_trace_rank<N>.jsonl") and in errors, and may be
// empty. It is Load of a single file without the file system: an NPY
// trace's .source.npy and a TensorRT-LLM rank file's meta_info.json are not
// looked for. Formats that need random access (.pt, .safetensors) are read
// into memory, up to 4 GiB.
func Read(r io.Reader, name string, opts LoadOptions) (*Source, error) {
	src, err := read(r, name, -1, opts)
	if err != nil {
		return nil, err
	}
	if err := checkAgainstOptions(src, opts); err != nil {
		return nil, err
	}
	return src, nil
}

// read reads r, of size bytes (-1: unknown), and tells LoadOptions.Progress
// when it is done.
func read(r io.Reader, name string, size int64, opts LoadOptions) (*Source, error) {
	cr := &countingReader{r: r}
	src, err := readFormat(cr, name, size, opts)
	if err == nil && src.Format != FormatJSONL && src.Format != FormatNPY && src.Format != FormatSGLangPT && src.Format != FormatTRTLLM {
		// The streaming readers and the stacks report their own files.
		fileDone(opts, name, max(size, cr.n), src.Stats.Tokens)
	}
	return src, err
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func readFormat(r io.Reader, name string, size int64, opts LoadOptions) (*Source, error) {
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
		t, s, err := readJSONLTrace(br, name, size, opts, !opts.StatsOnly)
		if err != nil {
			return nil, err
		}
		if t != nil {
			return traceSource(name, format, t, opts), nil
		}
		return streamedSource(name, format, nil, s), nil
	case FormatNPY:
		in, err := openNPY(br, name, -1)
		if err != nil {
			return nil, err
		}
		t, s, err := readNPYTrace(in, nil, opts, !opts.StatsOnly)
		if err != nil {
			return nil, err
		}
		return streamedSource(name, format, t, s), nil
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
	case FormatMegatron:
		b := newTokenBuilder(opts, opts.Experts)
		defer b.close()
		f, err := parseMegatron(br, name, int64(megatronRank(filepath.Base(name))), b.experts)
		if err != nil {
			return nil, err
		}
		notes, err := addMegatron([]*megatronFile{f}, b, opts)
		if err != nil {
			return nil, err
		}
		src, err := builtTrace(name, format, b, opts)
		if err != nil {
			return nil, err
		}
		src.Stats.Notes = append(src.Stats.Notes, notes...)
		return src, nil
	case FormatVLLMLoadStats:
		s, d, err := readVLLMLoadStats(br, name, opts)
		if err != nil {
			return nil, err
		}
		return statsSource(name, format, s, &Source{Path: name, Format: format, Deployment: d})
	case FormatSGLangPT, FormatTRTLLM:
		data, err := io.ReadAll(io.LimitReader(br, maxRandomAccessBytes+1))
		if err != nil {
			return nil, perr(name, 0, "", "read: %v", err)
		}
		if len(data) > maxRandomAccessBytes {
			return nil, perr(name, 0, "", "larger than %d bytes: load it from a file (Load) instead", maxRandomAccessBytes)
		}
		ra := bytes.NewReader(data)
		if format == FormatSGLangPT {
			return readSGLang(name, []randomFile{{name, ra, int64(len(data))}}, opts)
		}
		return readTRTLLM(name, nil, []randomFile{{name, ra, int64(len(data))}}, opts)
	}
	limit := int64(maxJSONBytes)
	if format == FormatMoetunerStats {
		limit = maxStatsFileBytes
	}
	data, err := readCappedAt(br, name, limit)
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
	case FormatMoetunerStats:
		if s, err = parseMoetunerStats(data, name); err != nil {
			return nil, err
		}
	case FormatSGLangRoutedExperts:
		b := newTokenBuilder(opts, opts.Experts)
		defer b.close()
		if err := parseRoutedExperts(data, name, opts, b); err != nil {
			return nil, err
		}
		return builtTrace(name, format, b, opts)
	default:
		return nil, perr(name, 0, "", "unknown format %q: use one of %s", format, formatList())
	}
	src.Stats = s
	return statsSource(name, format, s, src)
}

// maxRandomAccessBytes caps a .pt or .safetensors file read through Read.
const maxRandomAccessBytes = 4 << 30

func formatList() string {
	names := make([]string, len(Formats))
	for i, f := range Formats {
		names[i] = string(f)
	}
	return strings.Join(names, ", ")
}

// statsSource validates count-only stats and wraps them in a Source; src,
// when given, is the Source to fill.
func statsSource(name string, format Format, s *Stats, src ...*Source) (*Source, error) {
	if name != "" && s.Sources == nil {
		s.Sources = []string{name}
	}
	if err := s.Validate(); err != nil {
		return nil, perr(name, 0, "", "%v", err)
	}
	if len(src) > 0 {
		src[0].Stats = s
		return src[0], nil
	}
	return &Source{Path: name, Format: format, Stats: s}, nil
}

// builtTrace validates the trace a tokenBuilder assembled, or takes the
// stats a streaming one counted.
func builtTrace(name string, format Format, b *tokenBuilder, opts LoadOptions) (*Source, error) {
	if b.stream {
		s := b.stats()
		if s == nil {
			return nil, perr(name, 0, "", "no tokens recorded")
		}
		return streamedSource(name, format, nil, s), nil
	}
	t := b.trace()
	if t == nil {
		return nil, perr(name, 0, "", "no tokens recorded")
	}
	if err := t.Validate(); err != nil {
		return nil, perr(name, 0, "", "%v", err)
	}
	return traceSource(name, format, t, opts), nil
}

// traceSource builds the stats of a trace read whole; with
// LoadOptions.StatsOnly the trace is then let go.
func traceSource(name string, format Format, t *Trace, opts LoadOptions) *Source {
	s := t.Stats(opts.statsOptions())
	if name != "" {
		s.Sources = []string{name}
	}
	if opts.StatsOnly {
		t = nil
	}
	return &Source{Path: name, Format: format, Trace: t, Stats: s}
}

// Detect guesses the format of a file from its name and its first bytes:
// the NPY magic or .npy; a zip header or .pt (SGLang recorder dump);
// .safetensors (TensorRT-LLM); a CSV header starting layer_id,token_id or
// .csv; router_trace_rank<N>.jsonl or a first line with "top_indices"
// (Megatron); "eplb_load_stats" or a first "eplb_initial_mapping" or
// "eplb_load_meta" record
// (vLLM); a JSON object
// with "schema" "moetuner.stats/...", with "routed_experts", with
// "logical_count" (or a bare JSON array), with "expert_popularity", with
// "expert_counts" and "num_experts", or with "moetuner_trace" or "layers"
// (JSONL, also for .jsonl). It returns a *ParseError when nothing matches.
func Detect(name string, head []byte) (Format, error) {
	ext := strings.ToLower(filepath.Ext(name))
	trimmed := bytes.TrimLeft(head, " \t\r\n\ufeff")
	first := trimmed
	if i := bytes.IndexByte(first, '\n'); i >= 0 {
		first = first[:i]
	}
	has := func(b []byte, k string) bool { return bytes.Contains(b, []byte(`"`+k+`"`)) }
	switch {
	case bytes.HasPrefix(head, []byte(npyMagic)) || ext == ".npy":
		return FormatNPY, nil
	case bytes.HasPrefix(head, []byte("PK\x03\x04")) || ext == ".pt" || ext == ".pth":
		return FormatSGLangPT, nil
	case ext == ".safetensors":
		return FormatTRTLLM, nil
	case bytes.HasPrefix(trimmed, []byte("layer_id,token_id")) || ext == ".csv":
		return FormatFLAME, nil
	case megatronRank(filepath.Base(name)) >= 0 || (len(first) > 0 && first[0] == '{' && has(first, "top_indices")):
		return FormatMegatron, nil
	case len(first) > 0 && first[0] == '{' && (bytes.Contains(trimmed, []byte(`"eplb_load_stats"`)) || bytes.Contains(first, []byte(`"eplb_initial_mapping"`)) || bytes.Contains(first, []byte(`"eplb_load_meta"`))):
		return FormatVLLMLoadStats, nil
	case len(trimmed) > 0 && trimmed[0] == '{' && has(trimmed, "schema") && bytes.Contains(trimmed, []byte(`"moetuner.stats/`)):
		return FormatMoetunerStats, nil
	case len(trimmed) > 0 && (trimmed[0] == '{' || trimmed[0] == '[') && has(trimmed, "routed_experts"):
		return FormatSGLangRoutedExperts, nil
	case ext == ".jsonl":
		return FormatJSONL, nil
	case len(trimmed) > 0 && trimmed[0] == '[':
		return FormatLogicalCount, nil
	case len(trimmed) > 0 && trimmed[0] == '{':
		switch {
		case has(trimmed, "logical_count"):
			return FormatLogicalCount, nil
		case has(trimmed, "expert_popularity"):
			return FormatFiddler, nil
		case has(trimmed, "expert_counts") && has(trimmed, "num_experts"):
			return FormatOLMoE, nil
		case has(trimmed, "moetuner_trace") || has(trimmed, "layers"):
			return FormatJSONL, nil
		}
	case len(trimmed) == 0:
		return FormatAuto, perr(name, 0, "", "empty file: nothing to read")
	}
	return FormatAuto, perr(name, 0, "", "cannot detect the format: set LoadOptions.Format (%s)", formatList())
}
