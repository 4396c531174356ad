package torchpt

import (
	"archive/zip"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/big"
	"strings"

	"github.com/nlpodyssey/gopickle/pickle"
	"github.com/nlpodyssey/gopickle/types"
)

// Tuple is a Python tuple.
type Tuple []any

// Dict is a Python dict or OrderedDict: keys and values in insertion order.
// Keys are nil, bool, int64, float64 or string; a key set twice keeps its
// first position and its last value, as in Python. A Dict built as a
// literal works; Set keeps an index so that building large dicts stays
// linear.
type Dict struct {
	Keys   []any
	Values []any

	index map[any]int
}

// Get returns the value of key and whether it is present.
func (d *Dict) Get(key any) (any, bool) {
	if d == nil {
		return nil, false
	}
	if i, ok := d.find(key); ok {
		return d.Values[i], true
	}
	return nil, false
}

func (d *Dict) find(key any) (int, bool) {
	if d.index != nil && len(d.index) == len(d.Keys) {
		i, ok := d.index[key]
		return i, ok
	}
	for i, k := range d.Keys {
		if k == key {
			return i, true
		}
	}
	return 0, false
}

// Set sets key to v, appending the key when it is new. key must be
// comparable.
func (d *Dict) Set(key, v any) {
	if i, ok := d.find(key); ok {
		d.Values[i] = v
		return
	}
	if len(d.Keys) >= 8 && (d.index == nil || len(d.index) != len(d.Keys)) {
		d.index = make(map[any]int, 2*len(d.Keys))
		for i, k := range d.Keys {
			if _, dup := d.index[k]; !dup {
				d.index[k] = i
			}
		}
	}
	if d.index != nil {
		d.index[key] = len(d.Keys)
	}
	d.Keys = append(d.Keys, key)
	d.Values = append(d.Values, v)
}

// Options are the limits of Open. The zero value uses the defaults.
type Options struct {
	// MaxPickleBytes caps data.pkl; default 64 MiB.
	MaxPickleBytes int64
	// MaxTensorBytes caps one storage (and so one tensor); default 2 GiB.
	MaxTensorBytes int64
	// MaxReadBytes caps the bytes all tensor reads of the file may return
	// together; default 4 × the archive size + 64 MiB. Reading each tensor
	// once stays far below it; a file whose tensors repeat or expand one
	// storage many times (a decompression bomb) hits it.
	MaxReadBytes int64
}

const (
	defaultMaxPickle = 64 << 20
	defaultMaxTensor = 2 << 30
	// maxEntries caps the archive's entries (one per storage plus three).
	maxEntries = 1 << 20
	// maxDepth caps the nesting of lists, tuples and dicts.
	maxDepth = 64
)

// File is an opened torch.save archive.
type File struct {
	// Name is the archive's top-level directory (torch.save uses the file
	// name without its extension).
	Name string
	// Root is the saved object.
	Root any

	r         io.ReaderAt
	size      int64
	bigEndian bool
	entries   map[string]*zip.File // by name inside NAME/
	storages  map[string]*storage
	maxTensor int64
	readLeft  int64 // what is left of Options.MaxReadBytes
}

type storage struct {
	file  *File
	key   string
	dtype DType
	numel int64
	zf    *zip.File
}

// Open reads the archive r of size bytes: the zip directory and the
// pickle, checking every storage against its entry. Tensor data stays in r
// and is read by the tensors' methods, so r must stay readable while the
// tensors are used. Errors start with "torchpt: " and say what is wrong.
func Open(r io.ReaderAt, size int64, opts Options) (*File, error) {
	if opts.MaxPickleBytes <= 0 {
		opts.MaxPickleBytes = defaultMaxPickle
	}
	if opts.MaxTensorBytes <= 0 {
		opts.MaxTensorBytes = defaultMaxTensor
	}
	if opts.MaxReadBytes <= 0 {
		opts.MaxReadBytes = 4*size + 64<<20
	}
	var magic [4]byte
	if n, _ := r.ReadAt(magic[:], 0); n < 4 || string(magic[:]) != "PK\x03\x04" {
		if n >= 2 && magic[0] == 0x80 && magic[1] <= 5 {
			return nil, errors.New("torchpt: a bare pickle, not a zip archive: this is the legacy format of PyTorch < 1.6 or _use_new_zipfile_serialization=False; re-save it with torch.save")
		}
		return nil, errors.New("torchpt: not a torch.save file (no zip header)")
	}
	zr, err := zip.NewReader(r, size)
	if err != nil {
		return nil, fmt.Errorf("torchpt: reading the zip archive: %v (the file is truncated or not a torch.save file)", err)
	}
	if len(zr.File) == 0 {
		return nil, errors.New("torchpt: empty zip archive")
	}
	if len(zr.File) > maxEntries {
		return nil, fmt.Errorf("torchpt: %d zip entries, at most %d", len(zr.File), maxEntries)
	}
	prefix, _, ok := strings.Cut(zr.File[0].Name, "/")
	if !ok || prefix == "" {
		return nil, fmt.Errorf("torchpt: zip entry %q is not inside a top-level directory as torch.save writes", zr.File[0].Name)
	}
	f := &File{Name: prefix, r: r, size: size, entries: map[string]*zip.File{}, storages: map[string]*storage{}, maxTensor: opts.MaxTensorBytes, readLeft: opts.MaxReadBytes}
	for _, zf := range zr.File {
		rest, ok := strings.CutPrefix(zf.Name, prefix+"/")
		if !ok {
			return nil, fmt.Errorf("torchpt: zip entry %q is outside the archive directory %q", zf.Name, prefix)
		}
		f.entries[rest] = zf
	}
	if bo, ok := f.entries["byteorder"]; ok {
		b, err := readEntry(bo, 16, size)
		if err != nil {
			return nil, err
		}
		switch strings.TrimSpace(string(b)) {
		case "little":
		case "big":
			f.bigEndian = true
		default:
			return nil, fmt.Errorf("torchpt: byteorder %q, want little or big", clipString(string(b)))
		}
	}
	pz, ok := f.entries["data.pkl"]
	if !ok {
		return nil, fmt.Errorf("torchpt: no %s/data.pkl in the archive: not a torch.save file", prefix)
	}
	pkl, err := readEntry(pz, opts.MaxPickleBytes, size)
	if err != nil {
		return nil, err
	}
	if err := scanPickle(pkl); err != nil {
		return nil, err
	}
	root, err := f.unpickle(pkl)
	if err != nil {
		return nil, err
	}
	f.Root = root
	return f, nil
}

// readEntry reads a whole zip entry, refusing more than limit bytes and
// entries whose stored size exceeds the archive.
func readEntry(zf *zip.File, limit, archive int64) ([]byte, error) {
	if zf.UncompressedSize64 > uint64(limit) {
		return nil, fmt.Errorf("torchpt: entry %s is %d bytes, more than the limit of %d", zf.Name, zf.UncompressedSize64, limit)
	}
	off, err := zf.DataOffset()
	if err != nil {
		return nil, fmt.Errorf("torchpt: entry %s: %v (the file is truncated)", zf.Name, err)
	}
	if zf.CompressedSize64 > uint64(archive) || off+int64(zf.CompressedSize64) > archive {
		return nil, fmt.Errorf("torchpt: entry %s claims %d bytes past the end of the file (the file is truncated)", zf.Name, zf.CompressedSize64)
	}
	rc, err := zf.Open()
	if err != nil {
		return nil, fmt.Errorf("torchpt: entry %s: %v", zf.Name, err)
	}
	defer rc.Close()
	var b []byte
	if zf.Method == zip.Store {
		if zf.CompressedSize64 != zf.UncompressedSize64 {
			return nil, fmt.Errorf("torchpt: stored entry %s declares %d bytes stored and %d uncompressed (the file is corrupt)", zf.Name, zf.CompressedSize64, zf.UncompressedSize64)
		}
		b = make([]byte, zf.UncompressedSize64)
		_, err = io.ReadFull(rc, b)
		if err == nil {
			// Reading to EOF lets archive/zip verify the CRC.
			_, err = rc.Read(make([]byte, 1))
			if err == io.EOF {
				err = nil
			}
		}
	} else {
		// A compressed entry grows with the data actually inflated.
		b, err = io.ReadAll(io.LimitReader(rc, int64(zf.UncompressedSize64)+1))
		if err == nil && uint64(len(b)) != zf.UncompressedSize64 {
			err = fmt.Errorf("inflates to %d bytes, not the %d declared", len(b), zf.UncompressedSize64)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("torchpt: entry %s: %v (the file is truncated or corrupt)", zf.Name, err)
	}
	return b, nil
}

// read returns the storage's bytes, charging them and the tensor's own
// size (want) to the file's read budget first.
func (s *storage) read(want int64) ([]byte, error) {
	f := s.file
	cost := want + s.numel*int64(s.dtype.Size())
	if cost > f.readLeft {
		return nil, fmt.Errorf("torchpt: reading storage %q: the file's tensors add up to more than Options.MaxReadBytes; they repeat or expand one storage far beyond the file's size", clipString(s.key))
	}
	f.readLeft -= cost
	return readEntry(s.zf, f.maxTensor, f.size)
}

// Marker types the unpickler pushes for allowed globals.
type (
	storageClass struct{ dtype DType }
	rebuildFunc  struct {
		f  *File
		v2 bool
	}
)

func (f *File) unpickle(pkl []byte) (root any, err error) {
	// The scan rules out every input known to make gopickle panic; this is
	// the last line of defence, and its message lets fuzzing tell it apart.
	defer func() {
		if p := recover(); p != nil {
			root, err = nil, fmt.Errorf("torchpt: internal error decoding the pickle: %v", p)
		}
	}()
	u := pickle.NewUnpickler(bytes.NewReader(pkl))
	u.FindClass = func(module, name string) (any, error) {
		switch {
		case module == "torch._utils" && name == "_rebuild_tensor_v2":
			return &rebuildFunc{f: f, v2: true}, nil
		case module == "torch._utils" && name == "_rebuild_tensor":
			return &rebuildFunc{f: f}, nil
		case module == "torch":
			if d, ok := storageDType(name); ok {
				return &storageClass{d}, nil
			}
		}
		return nil, errCalls(module, name)
	}
	u.PersistentLoad = f.persistentLoad
	v, err := u.Load()
	if err != nil {
		if strings.HasPrefix(err.Error(), "torchpt: ") {
			return nil, err
		}
		return nil, fmt.Errorf("torchpt: decoding data.pkl: %v", err)
	}
	c := converter{seen: map[any]any{}, open: map[any]bool{}}
	return c.convert(v, 0)
}

func errCalls(module, name string) error {
	return fmt.Errorf("torchpt: pickle calls %s.%s: not a tensor-only file", clipString(module), clipString(name))
}

// persistentLoad resolves ('storage', torch.XStorage, key, location, numel).
func (f *File) persistentLoad(pid any) (any, error) {
	t, ok := pid.(*types.Tuple)
	if !ok || t.Len() != 5 {
		return nil, fmt.Errorf("torchpt: persistent id %s, want ('storage', type, key, location, numel)", describe(pid))
	}
	if tag, _ := t.Get(0).(string); tag != "storage" {
		return nil, fmt.Errorf("torchpt: persistent id tagged %s, want 'storage'", describe(t.Get(0)))
	}
	sc, ok := t.Get(1).(*storageClass)
	if !ok {
		return nil, fmt.Errorf("torchpt: storage type %s, want a torch.<Type>Storage", describe(t.Get(1)))
	}
	key, ok := t.Get(2).(string)
	if !ok {
		return nil, fmt.Errorf("torchpt: storage key %s, want a string", describe(t.Get(2)))
	}
	if _, ok := t.Get(3).(string); !ok {
		return nil, fmt.Errorf("torchpt: storage %q: location %s, want a string such as 'cpu'", clipString(key), describe(t.Get(3)))
	}
	numel, ok := t.Get(4).(int)
	if !ok || numel < 0 {
		return nil, fmt.Errorf("torchpt: storage %q: element count %s, want a non-negative integer", clipString(key), describe(t.Get(4)))
	}
	if s, ok := f.storages[key]; ok {
		if s.dtype != sc.dtype || s.numel != int64(numel) {
			return nil, fmt.Errorf("torchpt: storage %q declared twice, as %d %s and as %d %s", key, s.numel, s.dtype, numel, sc.dtype)
		}
		return s, nil
	}
	size := int64(sc.dtype.Size())
	if int64(numel) > f.maxTensor/size {
		return nil, fmt.Errorf("torchpt: storage %q: %d %s elements exceed the limit of %d bytes", key, numel, sc.dtype, f.maxTensor)
	}
	zf, ok := f.entries["data/"+key]
	if !ok {
		return nil, fmt.Errorf("torchpt: storage %q has no entry %s/data/%s (the file is truncated or corrupt)", clipString(key), f.Name, clipString(key))
	}
	if want := uint64(numel) * uint64(size); zf.UncompressedSize64 != want {
		return nil, fmt.Errorf("torchpt: storage %q: entry holds %d bytes, but %d %s elements need %d", key, zf.UncompressedSize64, numel, sc.dtype, want)
	}
	s := &storage{file: f, key: key, dtype: sc.dtype, numel: int64(numel), zf: zf}
	f.storages[key] = s
	return s, nil
}

// Call rebuilds a tensor: (storage, offset, size, stride, requires_grad,
// backward_hooks[, metadata]) for _rebuild_tensor_v2, (storage, offset,
// size, stride) for _rebuild_tensor.
func (r *rebuildFunc) Call(args ...any) (any, error) {
	want := "4"
	if r.v2 {
		want = "6 or 7"
	}
	if (r.v2 && len(args) != 6 && len(args) != 7) || (!r.v2 && len(args) != 4) {
		return nil, fmt.Errorf("torchpt: tensor rebuilt with %d arguments, want %s", len(args), want)
	}
	st, ok := args[0].(*storage)
	if !ok {
		return nil, fmt.Errorf("torchpt: tensor storage is %s, want a persistent storage", describe(args[0]))
	}
	offset, ok := args[1].(int)
	if !ok || offset < 0 {
		return nil, fmt.Errorf("torchpt: tensor storage offset %s, want a non-negative integer", describe(args[1]))
	}
	shape, err := intTuple(args[2], "size")
	if err != nil {
		return nil, err
	}
	stride, err := intTuple(args[3], "stride")
	if err != nil {
		return nil, err
	}
	if len(stride) != len(shape) {
		return nil, fmt.Errorf("torchpt: tensor size %v with stride %v: want one stride per dimension", shape, stride)
	}
	// The tensor may be larger than its storage (an expanded view has
	// stride 0), so its own size is capped too. Every term added to last is
	// below 2^62 and last stays below numel ≤ 2^31, so nothing overflows.
	if hasZero(shape) {
		return &Tensor{DType: st.dtype, Shape: shape, st: st, offset: offset, stride: stride}, nil
	}
	if int64(offset) >= st.numel {
		return nil, fmt.Errorf("torchpt: tensor offset %d is past storage %q of %d elements", offset, clipString(st.key), st.numel)
	}
	limit := r.f.maxTensor / int64(st.dtype.Size())
	n, last := int64(1), int64(offset)
	for i, d := range shape {
		if int64(d) > limit/n {
			return nil, fmt.Errorf("torchpt: tensor size %v exceeds the limit of %d bytes", shape, r.f.maxTensor)
		}
		n *= int64(d)
		if d == 1 {
			continue
		}
		if int64(stride[i]) > st.numel {
			return nil, fmt.Errorf("torchpt: tensor size %v, stride %v: stride %d exceeds storage %q of %d elements", shape, stride, stride[i], clipString(st.key), st.numel)
		}
		last += int64(d-1) * int64(stride[i])
		if last >= st.numel {
			break
		}
	}
	if last >= st.numel {
		return nil, fmt.Errorf("torchpt: tensor size %v, stride %v, offset %d reach past storage %q of %d elements", shape, stride, offset, clipString(st.key), st.numel)
	}
	return &Tensor{DType: st.dtype, Shape: shape, st: st, offset: offset, stride: stride}, nil
}

func hasZero(shape []int) bool {
	for _, d := range shape {
		if d == 0 {
			return true
		}
	}
	return false
}

func intTuple(v any, what string) ([]int, error) {
	t, ok := v.(*types.Tuple)
	if !ok {
		return nil, fmt.Errorf("torchpt: tensor %s is %s, want a tuple of integers", what, describe(v))
	}
	if t.Len() > maxDims {
		return nil, fmt.Errorf("torchpt: tensor %s has %d dimensions, at most %d", what, t.Len(), maxDims)
	}
	out := make([]int, t.Len())
	for i := range out {
		x, ok := t.Get(i).(int)
		if !ok || x < 0 {
			return nil, fmt.Errorf("torchpt: tensor %s[%d] is %s, want a non-negative integer", what, i, describe(t.Get(i)))
		}
		out[i] = x
	}
	return out, nil
}

// converter turns gopickle's values into ours, keeping shared subtrees
// shared (so the work is linear in the pickle) and refusing cycles.
type converter struct {
	seen map[any]any
	open map[any]bool
}

func (c *converter) convert(v any, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("torchpt: values nested more than %d deep", maxDepth)
	}
	switch x := v.(type) {
	case nil, bool, float64, string, *Tensor:
		return x, nil
	case int:
		return int64(x), nil
	case *big.Int:
		return nil, fmt.Errorf("torchpt: integer %s does not fit in int64", clipString(x.String()))
	case *types.List, *types.Tuple, *types.Dict, *types.OrderedDict:
	default:
		return nil, fmt.Errorf("torchpt: the pickle holds %s: not a tensor-only value", describe(v))
	}
	if out, ok := c.seen[v]; ok {
		return out, nil
	}
	if c.open[v] {
		return nil, errors.New("torchpt: a container contains itself: not a tensor-only file")
	}
	c.open[v] = true
	defer delete(c.open, v)
	var out any
	var err error
	switch x := v.(type) {
	case *types.List:
		out, err = c.items(*x, depth)
	case *types.Tuple:
		var items []any
		items, err = c.items(*x, depth)
		out = Tuple(items)
	case *types.Dict:
		d := &Dict{}
		for _, e := range *x {
			if err = c.setItem(d, e.Key, e.Value, depth); err != nil {
				break
			}
		}
		out = d
	case *types.OrderedDict:
		d := &Dict{}
		for el := x.List.Front(); el != nil; el = el.Next() {
			e := el.Value.(*types.OrderedDictEntry)
			if err = c.setItem(d, e.Key, e.Value, depth); err != nil {
				break
			}
		}
		out = d
	}
	if err != nil {
		return nil, err
	}
	c.seen[v] = out
	return out, nil
}

func (c *converter) items(in []any, depth int) ([]any, error) {
	out := make([]any, len(in))
	for i, e := range in {
		var err error
		if out[i], err = c.convert(e, depth+1); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (c *converter) setItem(d *Dict, k, v any, depth int) error {
	key, err := c.convert(k, depth+1)
	if err != nil {
		return err
	}
	switch key.(type) {
	case nil, bool, int64, float64, string:
	default:
		return fmt.Errorf("torchpt: dict key %s: want a number, string, bool or None", describe(k))
	}
	val, err := c.convert(v, depth+1)
	if err != nil {
		return err
	}
	d.Set(key, val)
	return nil
}

// describe names a pickle value's kind for error messages.
func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case string:
		return fmt.Sprintf("%q", clipString(x))
	case int, bool, float64:
		return fmt.Sprint(x)
	case *types.Tuple:
		return fmt.Sprintf("a tuple of %d", x.Len())
	case *types.List:
		return fmt.Sprintf("a list of %d", x.Len())
	case *types.Dict, *types.OrderedDict:
		return "a dict"
	case *storageClass:
		return "torch." + dtypeInfo[x.dtype].storage
	case *rebuildFunc:
		return "torch._utils._rebuild_tensor_v2"
	case *storage:
		return "a storage"
	case *Tensor:
		return "a tensor"
	case *types.OrderedDictClass:
		return "collections.OrderedDict"
	}
	return fmt.Sprintf("a %T", v)
}

func clipString(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}
