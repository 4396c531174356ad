package torchpt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// DType is a tensor's element type.
type DType uint8

// The element types of PyTorch's typed storages.
const (
	Invalid  DType = iota // the zero value; no tensor has it
	Bool                  // torch.bool, BoolStorage, 1 byte
	Uint8                 // torch.uint8, ByteStorage
	Int8                  // torch.int8, CharStorage
	Int16                 // torch.int16, ShortStorage
	Int32                 // torch.int32, IntStorage
	Int64                 // torch.int64, LongStorage
	Float16               // torch.float16, HalfStorage
	BFloat16              // torch.bfloat16, BFloat16Storage
	Float32               // torch.float32, FloatStorage
	Float64               // torch.float64, DoubleStorage
)

var dtypeInfo = [...]struct {
	name, storage string
	size          int
}{
	Invalid:  {"invalid", "", 0},
	Bool:     {"bool", "BoolStorage", 1},
	Uint8:    {"uint8", "ByteStorage", 1},
	Int8:     {"int8", "CharStorage", 1},
	Int16:    {"int16", "ShortStorage", 2},
	Int32:    {"int32", "IntStorage", 4},
	Int64:    {"int64", "LongStorage", 8},
	Float16:  {"float16", "HalfStorage", 2},
	BFloat16: {"bfloat16", "BFloat16Storage", 2},
	Float32:  {"float32", "FloatStorage", 4},
	Float64:  {"float64", "DoubleStorage", 8},
}

// String returns the torch name of d ("int64", "float32", ...).
func (d DType) String() string {
	if int(d) < len(dtypeInfo) {
		return dtypeInfo[d].name
	}
	return fmt.Sprintf("DType(%d)", int(d))
}

// Size returns the number of bytes of one element, 0 for Invalid.
func (d DType) Size() int {
	if int(d) < len(dtypeInfo) {
		return dtypeInfo[d].size
	}
	return 0
}

// IsInteger reports whether d holds integers (Bool counts as 0/1).
func (d DType) IsInteger() bool { return d >= Bool && d <= Int64 }

// storageDType maps "LongStorage" and the like to their DType.
func storageDType(name string) (DType, bool) {
	for d := Bool; d <= Float64; d++ {
		if dtypeInfo[d].storage == name {
			return d, true
		}
	}
	return Invalid, false
}

// maxDims bounds a tensor's rank; PyTorch itself allows 64.
const maxDims = 64

// Tensor is a dense tensor: its element type, its shape and its elements in
// C (row-major) order. A tensor read by Open refers to its file and reads
// its data only when asked (Bytes, Int64s, Float64s); one made by NewInt64
// or NewInt32 holds its data in memory.
type Tensor struct {
	DType DType
	Shape []int

	data []byte // in-memory tensors: C order, little-endian

	st     *storage // tensors read from a file
	offset int      // in elements, into st
	stride []int    // in elements
}

// Len returns the number of elements, the product of Shape (1 for a
// scalar tensor).
func (t *Tensor) Len() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// StorageKey returns the key of the storage a tensor read from a file lives
// in ("" for an in-memory tensor). Two tensors with the same key share
// their data.
func (t *Tensor) StorageKey() string {
	if t.st == nil {
		return ""
	}
	return t.st.key
}

// NewInt64 returns an int64 tensor of the given shape holding v (copied) in
// C order. It fails when a dimension is negative or len(v) does not match
// the shape.
func NewInt64(shape []int, v []int64) (*Tensor, error) {
	t, err := newTensor(Int64, shape, len(v))
	if err != nil {
		return nil, err
	}
	for i, x := range v {
		binary.LittleEndian.PutUint64(t.data[8*i:], uint64(x))
	}
	return t, nil
}

// NewInt32 returns an int32 tensor of the given shape holding v (copied) in
// C order. It fails when a dimension is negative or len(v) does not match
// the shape.
func NewInt32(shape []int, v []int32) (*Tensor, error) {
	t, err := newTensor(Int32, shape, len(v))
	if err != nil {
		return nil, err
	}
	for i, x := range v {
		binary.LittleEndian.PutUint32(t.data[4*i:], uint32(x))
	}
	return t, nil
}

func newTensor(d DType, shape []int, n int) (*Tensor, error) {
	if len(shape) > maxDims {
		return nil, fmt.Errorf("torchpt: %d dimensions, at most %d", len(shape), maxDims)
	}
	want := 1
	for _, s := range shape {
		if s < 0 {
			return nil, fmt.Errorf("torchpt: shape %v has a negative dimension", shape)
		}
		if s > 0 && want > math.MaxInt32/s {
			return nil, fmt.Errorf("torchpt: shape %v is too large", shape)
		}
		want *= s
	}
	if n != want {
		return nil, fmt.Errorf("torchpt: %d values for shape %v, want %d", n, shape, want)
	}
	return &Tensor{DType: d, Shape: append([]int{}, shape...), data: make([]byte, n*d.Size())}, nil
}

// Bytes returns the elements of t in C order, little-endian, DType.Size()
// bytes each, in a new slice. For a tensor read from a file it reads the
// storage from the archive; the error says when the entry cannot be read.
func (t *Tensor) Bytes() ([]byte, error) {
	if t.st == nil {
		return append([]byte{}, t.data...), nil
	}
	size := t.DType.Size()
	n := t.Len()
	raw, err := t.st.read(int64(n) * int64(size))
	if err != nil {
		return nil, err
	}
	out := make([]byte, n*size)
	if n == 0 {
		return out, nil
	}
	big := t.st.file.bigEndian && size > 1
	idx := make([]int, len(t.Shape))
	src := t.offset
	for i := range n {
		copy(out[i*size:(i+1)*size], raw[src*size:(src+1)*size])
		if big {
			b := out[i*size : (i+1)*size]
			for a, z := 0, size-1; a < z; a, z = a+1, z-1 {
				b[a], b[z] = b[z], b[a]
			}
		}
		// Advance the multi-index in C order, moving src by the strides.
		for d := len(idx) - 1; d >= 0; d-- {
			idx[d]++
			src += t.stride[d]
			if idx[d] < t.Shape[d] {
				break
			}
			src -= idx[d] * t.stride[d]
			idx[d] = 0
		}
	}
	return out, nil
}

// errNotInteger is returned by Int64s for floating tensors.
var errNotInteger = errors.New("not an integer tensor")

// Int64s returns the elements of an integer or bool tensor in C order. It
// fails for floating-point tensors.
func (t *Tensor) Int64s() ([]int64, error) {
	if !t.DType.IsInteger() {
		return nil, fmt.Errorf("torchpt: %s tensor: %w", t.DType, errNotInteger)
	}
	b, err := t.Bytes()
	if err != nil {
		return nil, err
	}
	out := make([]int64, t.Len())
	for i := range out {
		switch t.DType {
		case Bool, Uint8:
			out[i] = int64(b[i])
		case Int8:
			out[i] = int64(int8(b[i]))
		case Int16:
			out[i] = int64(int16(binary.LittleEndian.Uint16(b[2*i:])))
		case Int32:
			out[i] = int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
		case Int64:
			out[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
		}
	}
	return out, nil
}

// Float64s returns the elements of t in C order as float64, for every
// DType (integers converted exactly up to 2^53).
func (t *Tensor) Float64s() ([]float64, error) {
	if t.DType.IsInteger() {
		v, err := t.Int64s()
		if err != nil {
			return nil, err
		}
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = float64(x)
		}
		return out, nil
	}
	b, err := t.Bytes()
	if err != nil {
		return nil, err
	}
	out := make([]float64, t.Len())
	for i := range out {
		switch t.DType {
		case Float16:
			out[i] = halfToFloat(binary.LittleEndian.Uint16(b[2*i:]))
		case BFloat16:
			out[i] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16))
		case Float32:
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		case Float64:
			out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
		}
	}
	return out, nil
}

// halfToFloat converts an IEEE 754 binary16 value.
func halfToFloat(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	frac := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(frac, -24)
	case 0x1f:
		if frac == 0 {
			return math.Inf(int(sign))
		}
		return math.NaN()
	}
	return sign * math.Ldexp(1+frac/1024, exp-15)
}
