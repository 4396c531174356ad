package routing

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// maxStreamIDs caps Tokens×Layers×TopK for traces read with
// LoadOptions.StatsOnly, which never hold the ids (2^40, a 2 TiB int16
// array); traces that are kept are capped at maxTraceIDs.
const maxStreamIDs = 1 << 40

// ReadProgress is what LoadOptions.Progress is told while a file is read.
type ReadProgress struct {
	// File is the file being read (the name given to Read).
	File string
	// Bytes is how many bytes of File have been read so far.
	Bytes int64
	// TotalBytes is File's size; 0 when unknown (Read from a stream).
	TotalBytes int64
	// Tokens is how many tokens of File have been read so far (records
	// for count formats); 0 for formats read in one piece.
	Tokens int64
	// Done is set on the last call for File, once it is read.
	Done bool
}

// progress calls LoadOptions.Progress, when set, for one file.
type progress struct {
	fn func(ReadProgress)
	p  ReadProgress
}

func newProgress(fn func(ReadProgress), file string, size int64) *progress {
	return &progress{fn: fn, p: ReadProgress{File: file, TotalBytes: max(size, 0)}}
}

func (p *progress) update(bytes, tokens int64) {
	if p == nil || p.fn == nil {
		return
	}
	p.p.Bytes, p.p.Tokens = bytes, tokens
	p.fn(p.p)
}

func (p *progress) done(bytes, tokens int64) {
	if p == nil || p.fn == nil {
		return
	}
	p.p.Bytes, p.p.Tokens, p.p.Done = bytes, tokens, true
	p.fn(p.p)
}

// npyInput is an NPY array being read in pieces.
type npyInput struct {
	br    *bufio.Reader
	file  string
	size  int64 // the file's size; -1 when unknown
	h     npyHeader
	esize int
	order binary.ByteOrder
	read  int64 // data bytes read so far
	want  int64 // data bytes the shape needs
}

// openNPY reads r's NPY header; size is r's length in bytes, or -1.
func openNPY(r io.Reader, file string, size int64) (*npyInput, error) {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReaderSize(r, 1<<20)
	}
	h, esize, order, err := readNPYHeader(br, file)
	if err != nil {
		return nil, err
	}
	return &npyInput{br: br, file: file, size: size, h: h, esize: esize, order: order}, nil
}

// expect records that the array holds n elements and, when the file's
// size is known, checks it against the bytes present before anything is
// allocated for them.
func (in *npyInput) expect(n uint64) error {
	in.want = int64(n) * int64(in.esize)
	if in.size < 0 {
		return nil
	}
	switch have := in.size - in.h.bytes; {
	case have < in.want:
		return perr(in.file, 0, "", "truncated data: %d bytes, shape %v of %s needs %d: %s", max(have, 0), in.h.shape, in.h.descr, in.want, cutShort)
	case have > in.want:
		return perr(in.file, 0, "", "trailing bytes after the %v array: the header shape does not match the data; save the array again with numpy.save", in.h.shape)
	}
	return nil
}

// fill reads len(raw) data bytes.
func (in *npyInput) fill(raw []byte) error {
	n, err := io.ReadFull(in.br, raw)
	in.read += int64(n)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return perr(in.file, 0, "", "truncated data: %d bytes, shape %v of %s needs %d: %s", in.read, in.h.shape, in.h.descr, in.want, cutShort)
		}
		return perr(in.file, 0, "", "read: %v", err)
	}
	return nil
}

// end checks that nothing follows the array.
func (in *npyInput) end() error {
	if in.size >= 0 {
		return nil
	}
	if _, err := in.br.ReadByte(); err == nil {
		return perr(in.file, 0, "", "trailing bytes after the %v array: the header shape does not match the data; save the array again with numpy.save", in.h.shape)
	}
	return nil
}

// setChecker finds repeated experts within a token's top-k set in K steps
// per set: seen[e] holds the number of the last set that had e.
type setChecker struct {
	seen []uint32
	set  uint32
}

// decodeIDs decodes raw, sets of K ids, into dst. It returns the largest
// id, the index of the first id outside [0, limit) or repeating an earlier
// id of its set (-1 when none) and whether that one was a repeat.
func (sc *setChecker) decodeIDs(dst []int16, raw []byte, K, esize int, order binary.ByteOrder, limit int64) (maxID int64, bad int, repeat bool) {
	maxID = -1
	if len(sc.seen) < int(limit) {
		sc.seen, sc.set = make([]uint32, limit), 0
	}
	seen := sc.seen[:limit]
	fast := esize == 2 && order == binary.LittleEndian
	for i := 0; i+K <= len(dst); i += K {
		sc.set++
		if sc.set == 0 {
			clear(seen)
			sc.set = 1
		}
		for j := i; j < i+K; j++ {
			var v int64
			if fast {
				v = int64(int16(binary.LittleEndian.Uint16(raw[2*j:])))
			} else {
				v = npyInt(raw[j*esize:(j+1)*esize], esize, order)
			}
			if v < 0 || v >= limit {
				return maxID, j, false
			}
			if seen[v] == sc.set {
				return maxID, j, true
			}
			seen[v] = sc.set
			maxID = max(maxID, v)
			dst[j] = int16(v)
		}
	}
	return maxID, -1, false
}

// decodeSources decodes source ranks, returning the index of the first
// outside [-1, 2^31) or -1.
func decodeSources(dst []int32, raw []byte, esize int, order binary.ByteOrder) int {
	for i := range dst {
		v := npyInt(raw[i*esize:(i+1)*esize], esize, order)
		if v < -1 || v > math.MaxInt32 {
			return i
		}
		dst[i] = int32(v)
	}
	return -1
}

// npyShape returns T, L, K of an id array's header.
func npyShape(in *npyInput, limit uint64) (T, L, K int, err error) {
	h := in.h
	switch len(h.shape) {
	case 2:
		T, L, K = h.shape[0], h.shape[1], 1
	case 3:
		T, L, K = h.shape[0], h.shape[1], h.shape[2]
	default:
		return 0, 0, 0, perr(in.file, 0, "shape", "%d dimensions, want [tokens, layers, top-k] or [tokens, layers]", len(h.shape))
	}
	if L == 0 || K == 0 {
		return 0, 0, 0, perr(in.file, 0, "shape", "shape %v has no layers or no experts per token", h.shape)
	}
	if n := uint64(T) * uint64(L) * uint64(K); n > limit || uint64(L)*uint64(K) > maxTraceIDs {
		return 0, 0, 0, perr(in.file, 0, "shape", "shape %v claims more than %d elements: split the trace", h.shape, limit)
	}
	if T == 0 {
		return 0, 0, 0, perr(in.file, 0, "shape", "no tokens in shape %v", h.shape)
	}
	return T, L, K, nil
}

// ioBuf is a chunk's decoded ids and sources, reused once counted.
type ioBuf struct {
	ids []int16
	src []int32
}

// bufPool hands out at most max buffers, so a reader that runs ahead of
// the counters waits instead of allocating.
type bufPool struct {
	free chan *ioBuf
	made int
}

func newBufPool(n int) *bufPool { return &bufPool{free: make(chan *ioBuf, n)} }

func (p *bufPool) get() *ioBuf {
	select {
	case b := <-p.free:
		return b
	default:
	}
	if p.made < cap(p.free) {
		p.made++
		return &ioBuf{}
	}
	return <-p.free
}

func (p *bufPool) put(b *ioBuf) { p.free <- b }

// readNPYTrace reads an NPY id array [T, L, k] (and, with side, its
// per-token sources [T]) chunk by chunk into the statistics. With keep it
// also returns the trace; without it never holds more than a few chunks.
func readNPYTrace(in, side *npyInput, opts LoadOptions, keep bool) (*Trace, *Stats, error) {
	limitIDs := uint64(maxStreamIDs)
	if keep {
		limitIDs = maxTraceIDs
	}
	T, L, K, err := npyShape(in, limitIDs)
	if err != nil {
		return nil, nil, err
	}
	LK := L * K
	if err := in.expect(uint64(T) * uint64(LK)); err != nil {
		return nil, nil, err
	}
	if err := checkNPYSide(side, T); err != nil {
		return nil, nil, err
	}
	limit := int64(math.MaxInt16 + 1)
	if opts.Experts > 0 {
		limit = int64(opts.Experts)
	}
	per := opts.statsOptions().chunkTokens(L, K)
	// The token count sizes the path sample only when the file's size
	// vouches for it: a stream's header could claim 2^40 tokens.
	known := int64(0)
	if in.size >= 0 {
		known = int64(T)
	}
	b := newStatsBuilder(L, K, opts.Experts, known, (T+per-1)/per, opts.statsOptions())
	var t *Trace
	if keep {
		t = newNPYTrace(in, side, T, L, K)
	}
	pool := newBufPool(b.workers() + 2)
	raw := make([]byte, min(per, T)*LK*in.esize)
	var sraw []byte
	if side != nil {
		sraw = make([]byte, min(per, T)*side.esize)
	}
	prog := newProgress(opts.Progress, in.file, in.size)
	maxID := int64(-1)
	var sc setChecker
	fail := func(err error) (*Trace, *Stats, error) {
		b.abort()
		return nil, nil, err
	}
	for tok := 0; tok < T; tok += per {
		n := min(per, T-tok)
		if err := in.fill(raw[:n*LK*in.esize]); err != nil {
			return fail(err)
		}
		var ids []int16
		var src []int32
		var buf *ioBuf
		if keep && in.size >= 0 {
			ids = t.IDs[tok*LK : (tok+n)*LK]
			if side != nil {
				src = t.Source[tok : tok+n]
			}
		} else {
			buf = pool.get()
			buf.ids = grow(buf.ids, n*LK)
			ids = buf.ids
			if side != nil {
				buf.src = grow(buf.src, n)
				src = buf.src
			}
		}
		mx, bad, repeat := sc.decodeIDs(ids, raw, K, in.esize, in.order, limit)
		if bad >= 0 {
			return fail(npyIDError(in, raw, tok, bad, L, K, repeat, opts.Experts, limit))
		}
		maxID = max(maxID, mx)
		if side != nil {
			if err := side.fill(sraw[:n*side.esize]); err != nil {
				return fail(err)
			}
			if i := decodeSources(src, sraw, side.esize, side.order); i >= 0 {
				v := npyInt(sraw[i*side.esize:(i+1)*side.esize], side.esize, side.order)
				return fail(perr(side.file, 0, fmt.Sprintf("data[%d]", tok+i), "source rank %d out of range: want -1 (unknown) or a rank ≥ 0", v))
			}
		}
		if keep && buf != nil {
			t.IDs = append(t.IDs, ids...)
			if side != nil {
				t.Source = append(t.Source, src...)
			}
		}
		ch := chunk{ids: ids, n: n, src: src, tok0: int64(tok), maxID: int(mx)}
		if buf != nil {
			ch.release = func() { pool.put(buf) }
		}
		b.add(ch)
		prog.update(in.h.bytes+in.read, int64(tok+n))
	}
	if err := in.end(); err != nil {
		return fail(err)
	}
	if side != nil {
		if err := side.end(); err != nil {
			return fail(err)
		}
	}
	E := opts.Experts
	if E == 0 {
		E = int(maxID) + 1
	}
	s := b.stats(E)
	prog.done(in.h.bytes+in.read, int64(T))
	if t != nil {
		t.Experts = E
	}
	return t, s, nil
}

// checkNPYSide checks that the source-rank file side, if any, holds one
// rank per token of a T-token trace.
func checkNPYSide(side *npyInput, T int) error {
	if side == nil {
		return nil
	}
	if len(side.h.shape) != 1 || side.h.shape[0] != T {
		return perr(side.file, 0, "shape", "shape %v, want [%d]: one source rank per token of the trace", side.h.shape, T)
	}
	return side.expect(uint64(T))
}

// newNPYTrace returns the Trace that readNPYTrace fills: when the file's
// size is known, with its ids (and sources, given side) allocated up front.
func newNPYTrace(in, side *npyInput, T, L, K int) *Trace {
	t := &Trace{Tokens: T, Layers: L, TopK: K}
	if in.size >= 0 {
		// expect checked that the file holds every id.
		t.IDs = make([]int16, T*L*K)
		if side != nil {
			t.Source = make([]int32, T)
		}
	}
	return t
}

// npyIDError is the error for the bad id at element bad of raw, the chunk
// starting at token tok: a repeat in a token's top-k at one layer, or an
// id out of [0,limit).
func npyIDError(in *npyInput, raw []byte, tok, bad, L, K int, repeat bool, experts int, limit int64) error {
	v := npyInt(raw[bad*in.esize:(bad+1)*in.esize], in.esize, in.order)
	field := npyField(tok, bad, L, K)
	switch {
	case repeat:
		return perr(in.file, 0, field, "expert %d appears twice in the token's top-k at that layer: list each selected expert once", v)
	case experts > 0:
		return perr(in.file, 0, field, "expert %d out of range [0,%d): fix the id, or set LoadOptions.Experts to the model's experts per layer", v, limit)
	}
	return perr(in.file, 0, field, "expert %d out of range [0,%d): ids must be non-negative int16", v, limit)
}

// npyField names element i of the chunk starting at token tok.
func npyField(tok, i, L, K int) string {
	return fmt.Sprintf("data[%d,%d,%d]", tok+i/(L*K), i/K%L, i%K)
}

// grow returns s resized to n, reusing its memory when it is large enough.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// loadNPY reads path and its NAME.source.npy sibling, when present.
func loadNPY(f *os.File, path string, opts LoadOptions) (*Source, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, &ParseError{File: path, Err: err}
	}
	in, err := openNPY(f, path, fi.Size())
	if err != nil {
		return nil, err
	}
	sidePath := strings.TrimSuffix(path, filepath.Ext(path)) + ".source.npy"
	var side *npyInput
	sf, err := os.Open(sidePath)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, &ParseError{File: sidePath, Err: err}
	default:
		defer sf.Close()
		sfi, err := sf.Stat()
		if err != nil {
			return nil, &ParseError{File: sidePath, Err: err}
		}
		if side, err = openNPY(sf, sidePath, sfi.Size()); err != nil {
			return nil, err
		}
	}
	t, s, err := readNPYTrace(in, side, opts, !opts.StatsOnly)
	if err != nil {
		return nil, err
	}
	return streamedSource(path, FormatNPY, t, s), nil
}

// streamedSource wraps what a streaming reader returned.
func streamedSource(name string, format Format, t *Trace, s *Stats) *Source {
	if name != "" {
		s.Sources = []string{name}
	}
	return &Source{Path: name, Format: format, Trace: t, Stats: s}
}
