package routing

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/moetuner/moetuner/internal/torchpt"
)

// randomFile is a file read with random access (.pt, .safetensors).
type randomFile struct {
	name string
	r    io.ReaderAt
	size int64
}

// openRandom opens paths for random access; the returned function closes
// them.
func openRandom(paths []string) ([]randomFile, func(), error) {
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	var out []randomFile
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			closeAll()
			return nil, nil, &ParseError{File: p, Err: err}
		}
		files = append(files, f)
		fi, err := f.Stat()
		if err != nil {
			closeAll()
			return nil, nil, &ParseError{File: p, Err: err}
		}
		out = append(out, randomFile{p, f, fi.Size()})
	}
	return out, closeAll, nil
}

func loadSGLangFiles(name string, paths []string, opts LoadOptions) (*Source, error) {
	slices.Sort(paths)
	files, done, err := openRandom(paths)
	if err != nil {
		return nil, err
	}
	defer done()
	return readSGLang(name, files, opts)
}

// readSGLang reads SGLang recorder dumps of one mode: per_token files
// become one trace (each token's source is its record's rank), per_pass
// files one set of counts, stat files stats merged in order.
func readSGLang(name string, files []randomFile, opts LoadOptions) (*Source, error) {
	var dumps []*sglangFile
	for _, f := range files {
		pt, err := torchpt.Open(f.r, f.size, torchpt.Options{})
		if err != nil {
			return nil, perr(f.name, 0, "", "%s", strings.TrimPrefix(err.Error(), "torchpt: "))
		}
		d, err := openSGLang(pt, f.name)
		if err != nil {
			return nil, err
		}
		if len(dumps) > 0 && d.mode != dumps[0].mode {
			return nil, perr(f.name, 0, "", "a %s dump, but %s is a %s dump: keep one recorder mode per directory", d.mode, dumps[0].name, dumps[0].mode)
		}
		dumps = append(dumps, d)
	}
	switch dumps[0].mode {
	case sglangStat:
		total := &Stats{}
		for i, d := range dumps {
			s, err := d.readStat(opts)
			if err != nil {
				return nil, withFile(err, d.name)
			}
			fileDone(opts, d.name, files[i].size, s.Tokens)
			s.Sources = []string{d.name}
			if err := total.Merge(s); err != nil {
				return nil, fmt.Errorf("routing: %s: merging into the files before it: %w", d.name, err)
			}
		}
		return statsSource(name, FormatSGLangPT, total)
	case sglangPerPass:
		var c *countBuilder
		for i, d := range dumps {
			if err := d.addPerPass(&c, opts); err != nil {
				return nil, err
			}
			fileDone(opts, d.name, files[i].size, 0)
		}
		s, err := c.stats(opts.TopK, opts.KeepZeroLayers)
		if err != nil {
			return nil, perr(name, 0, "", "%v", err)
		}
		s.Sources = paths(files)
		return statsSource(name, FormatSGLangPT, s)
	}
	b := newTokenBuilder(opts, opts.Experts)
	defer b.close()
	for i, d := range dumps {
		if err := d.addPerToken(b, opts); err != nil {
			return nil, err
		}
		fileDone(opts, d.name, files[i].size, float64(b.tokens))
	}
	src, err := builtTrace(name, FormatSGLangPT, b, opts)
	if err != nil {
		return nil, err
	}
	src.Stats.Sources = paths(files)
	return src, nil
}

func paths(files []randomFile) []string {
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = f.name
	}
	return out
}

// megatronRank returns N of "router_trace_rank<N>.jsonl", or -1.
func megatronRank(base string) int {
	return rankOf(base, "router_trace_rank", ".jsonl")
}

// rankOf returns N of prefix<N>suffix, or -1.
func rankOf(base, prefix, suffix string) int {
	mid, ok := strings.CutPrefix(base, prefix)
	if !ok {
		return -1
	}
	mid, ok = strings.CutSuffix(mid, suffix)
	if !ok || mid == "" || len(mid) > 7 {
		return -1
	}
	n, err := strconv.Atoi(mid)
	if err != nil || n < 0 || strconv.Itoa(n) != mid {
		return -1
	}
	return n
}

// loadMegatronFiles reads router_trace_rank{r}.jsonl files (sorted by rank)
// into one trace whose token sources are the file ranks.
func loadMegatronFiles(name string, files []string, opts LoadOptions) (*Source, error) {
	slices.SortFunc(files, func(a, b string) int {
		return megatronRank(filepath.Base(a)) - megatronRank(filepath.Base(b))
	})
	b := newTokenBuilder(opts, opts.Experts)
	defer b.close()
	var parsed []*megatronFile
	for _, p := range files {
		f, err := os.Open(p)
		if err != nil {
			return nil, &ParseError{File: p, Err: err}
		}
		mf, err := parseMegatron(bufio.NewReader(f), p, int64(megatronRank(filepath.Base(p))), b.experts)
		fi, serr := f.Stat()
		f.Close()
		if err != nil {
			return nil, err
		}
		parsed = append(parsed, mf)
		if serr == nil {
			tokens := 0
			for _, st := range mf.steps {
				tokens += st.tokens
			}
			fileDone(opts, p, fi.Size(), float64(tokens))
		}
	}
	notes, err := addMegatron(parsed, b, opts)
	if err != nil {
		return nil, err
	}
	src, err := builtTrace(name, FormatMegatron, b, opts)
	if err != nil {
		return nil, err
	}
	src.Stats.Sources = files
	src.Stats.Notes = append(src.Stats.Notes, notes...)
	return src, nil
}
