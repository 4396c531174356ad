package torchpt

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Write writes value as a torch.save archive whose entries live under the
// directory name (torch.save uses the file name without its extension), in
// the layout PyTorch 1.13 writes (plus byteorder "little", as 2.x writes):
// pickle protocol 2, tensors as C-contiguous CPU storages, entries stored
// uncompressed with their data aligned to 64 bytes. value may be nil, bool,
// int, int32, int64, float64, string, []any, []int, []int64, Tuple, *Dict,
// map[string]any (keys sorted) or *Tensor, nested at most 64 deep. The
// output is deterministic: the same value gives the same bytes. Files
// without floats load with torch.load(weights_only=True) in every PyTorch
// since 1.13 (1.13's restricted loader lacks the float opcode; 2.x has it).
func Write(w io.Writer, name string, value any) error {
	if name == "" || bytes.ContainsAny([]byte(name), "/\\") {
		return fmt.Errorf("torchpt: archive name %q must be non-empty and hold no slash", name)
	}
	var e encoder
	e.buf.Write([]byte{0x80, 2})
	if err := e.value(value, 0); err != nil {
		return err
	}
	e.buf.WriteByte('.')

	zw := &zipWriter{w: zip.NewWriter(w)}
	if err := zw.add(name+"/data.pkl", e.buf.Bytes()); err != nil {
		return err
	}
	if err := zw.add(name+"/byteorder", []byte("little")); err != nil {
		return err
	}
	for i, t := range e.tensors {
		data, err := t.Bytes()
		if err != nil {
			return err
		}
		if err := zw.add(name+"/data/"+strconv.Itoa(i), data); err != nil {
			return err
		}
	}
	if err := zw.add(name+"/version", []byte("3\n")); err != nil {
		return err
	}
	return zw.w.Close()
}

// zipWriter adds stored entries with their data 64-byte aligned, as
// PyTorch's writer does, so that readers may map tensors in place.
type zipWriter struct {
	w   *zip.Writer
	off int64
}

func (z *zipWriter) add(name string, data []byte) error {
	const local = 30 // local file header size before the name
	pad := int((64 - (z.off+local+int64(len(name))+4)%64) % 64)
	extra := make([]byte, 4+pad)
	binary.LittleEndian.PutUint16(extra, 0x4246) // "FB", PyTorch's padding field
	binary.LittleEndian.PutUint16(extra[2:], uint16(pad))
	fw, err := z.w.CreateRaw(&zip.FileHeader{
		Name:               name,
		Method:             zip.Store,
		CRC32:              crc32.ChecksumIEEE(data),
		CompressedSize64:   uint64(len(data)),
		UncompressedSize64: uint64(len(data)),
		Extra:              extra,
	})
	if err != nil {
		return fmt.Errorf("torchpt: write %s: %w", name, err)
	}
	if _, err := fw.Write(data); err != nil {
		return fmt.Errorf("torchpt: write %s: %w", name, err)
	}
	z.off += local + int64(len(name)) + int64(len(extra)) + int64(len(data))
	return nil
}

type encoder struct {
	buf     bytes.Buffer
	tensors []*Tensor
}

func (e *encoder) value(v any, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("torchpt: values nested more than %d deep", maxDepth)
	}
	b := &e.buf
	switch x := v.(type) {
	case nil:
		b.WriteByte('N')
	case bool:
		if x {
			b.WriteByte(0x88)
		} else {
			b.WriteByte(0x89)
		}
	case int:
		e.int(int64(x))
	case int32:
		e.int(int64(x))
	case int64:
		e.int(x)
	case float64:
		b.WriteByte('G')
		_ = binary.Write(b, binary.BigEndian, math.Float64bits(x))
	case string:
		if !utf8.ValidString(x) {
			return fmt.Errorf("torchpt: string %q is not valid UTF-8", clipString(x))
		}
		b.WriteByte('X')
		_ = binary.Write(b, binary.LittleEndian, uint32(len(x)))
		b.WriteString(x)
	case []int:
		items := make([]any, len(x))
		for i, n := range x {
			items[i] = n
		}
		return e.list(items, depth)
	case []int64:
		items := make([]any, len(x))
		for i, n := range x {
			items[i] = n
		}
		return e.list(items, depth)
	case []any:
		return e.list(x, depth)
	case Tuple:
		return e.tuple(x, depth)
	case *Dict:
		if x == nil {
			return errors.New("torchpt: nil *Dict")
		}
		if len(x.Keys) != len(x.Values) {
			return fmt.Errorf("torchpt: dict with %d keys and %d values", len(x.Keys), len(x.Values))
		}
		return e.dict(x.Keys, x.Values, depth)
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		ks, vs := make([]any, len(keys)), make([]any, len(keys))
		for i, k := range keys {
			ks[i], vs[i] = k, x[k]
		}
		return e.dict(ks, vs, depth)
	case *Tensor:
		return e.tensor(x)
	default:
		return fmt.Errorf("torchpt: cannot write a %T: want nil, bool, int, float64, string, a list, Tuple, *Dict, map[string]any or *Tensor", v)
	}
	return nil
}

func (e *encoder) int(x int64) {
	b := &e.buf
	switch {
	case x >= 0 && x < 1<<8:
		b.Write([]byte{'K', byte(x)})
	case x >= 0 && x < 1<<16:
		b.Write([]byte{'M', byte(x), byte(x >> 8)})
	case x >= math.MinInt32 && x <= math.MaxInt32:
		b.WriteByte('J')
		_ = binary.Write(b, binary.LittleEndian, int32(x))
	default:
		// LONG1: minimal little-endian two's complement.
		var le [8]byte
		binary.LittleEndian.PutUint64(le[:], uint64(x))
		n := 8
		for n > 1 && ((le[n-1] == 0 && le[n-2]&0x80 == 0) || (le[n-1] == 0xff && le[n-2]&0x80 != 0)) {
			n--
		}
		b.Write([]byte{0x8a, byte(n)})
		b.Write(le[:n])
	}
}

func (e *encoder) list(items []any, depth int) error {
	e.buf.WriteByte(']')
	if len(items) == 0 {
		return nil
	}
	e.buf.WriteByte('(')
	for _, it := range items {
		if err := e.value(it, depth+1); err != nil {
			return err
		}
	}
	e.buf.WriteByte('e')
	return nil
}

func (e *encoder) tuple(items []any, depth int) error {
	if len(items) == 0 {
		e.buf.WriteByte(')')
		return nil
	}
	if len(items) > 3 {
		e.buf.WriteByte('(')
	}
	for _, it := range items {
		if err := e.value(it, depth+1); err != nil {
			return err
		}
	}
	switch len(items) {
	case 1, 2, 3:
		e.buf.WriteByte(0x84 + byte(len(items)))
	default:
		e.buf.WriteByte('t')
	}
	return nil
}

func (e *encoder) dict(keys, vals []any, depth int) error {
	e.buf.WriteByte('}')
	if len(keys) == 0 {
		return nil
	}
	e.buf.WriteByte('(')
	for i := range keys {
		switch keys[i].(type) {
		case nil, bool, int, int32, int64, float64, string:
		default:
			return fmt.Errorf("torchpt: dict key of type %T: want a number, string, bool or nil", keys[i])
		}
		if err := e.value(keys[i], depth+1); err != nil {
			return err
		}
		if err := e.value(vals[i], depth+1); err != nil {
			return err
		}
	}
	e.buf.WriteByte('u')
	return nil
}

func (e *encoder) tensor(t *Tensor) error {
	if t == nil {
		return errors.New("torchpt: nil *Tensor")
	}
	if t.DType == Invalid || int(t.DType) >= len(dtypeInfo) {
		return fmt.Errorf("torchpt: tensor of %s elements", t.DType)
	}
	if t.st == nil && len(t.data) != t.Len()*t.DType.Size() {
		return fmt.Errorf("torchpt: tensor of shape %v holds %d bytes, want %d", t.Shape, len(t.data), t.Len()*t.DType.Size())
	}
	key := strconv.Itoa(len(e.tensors))
	e.tensors = append(e.tensors, t)
	b := &e.buf
	b.WriteString("ctorch._utils\n_rebuild_tensor_v2\n(")
	// Persistent id ('storage', torch.XStorage, key, 'cpu', numel).
	b.WriteByte('(')
	_ = e.value("storage", 0)
	b.WriteString("ctorch\n" + dtypeInfo[t.DType].storage + "\n")
	_ = e.value(key, 0)
	_ = e.value("cpu", 0)
	e.int(int64(t.Len()))
	b.WriteString("tQ")
	e.int(0) // storage offset
	shape := make([]any, len(t.Shape))
	stride := make([]any, len(t.Shape))
	s := 1
	for i := len(t.Shape) - 1; i >= 0; i-- {
		shape[i], stride[i] = t.Shape[i], s
		s *= max(t.Shape[i], 1)
	}
	if err := e.tuple(shape, 1); err != nil {
		return err
	}
	if err := e.tuple(stride, 1); err != nil {
		return err
	}
	b.WriteByte(0x89) // requires_grad False
	b.WriteString("ccollections\nOrderedDict\n)R")
	b.WriteString("tR")
	return nil
}
