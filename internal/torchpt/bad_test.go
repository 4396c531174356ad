package torchpt

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type entry struct {
	name string
	data []byte
	// claim, when > 0, is the size the zip directory declares instead of
	// len(data).
	claim uint64
}

// archive builds a stored zip; entries go under x/ unless named "=NAME".
func archive(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range entries {
		name, raw := strings.CutPrefix(e.name, "=")
		if !raw {
			name = "x/" + name
		}
		size := uint64(len(e.data))
		if e.claim > 0 {
			size = e.claim
		}
		w, err := zw.CreateRaw(&zip.FileHeader{Name: name, Method: zip.Store, CRC32: crc32.ChecksumIEEE(e.data), CompressedSize64: size, UncompressedSize64: size})
		require.NoError(t, err)
		_, err = w.Write(e.data)
		require.NoError(t, err)
	}
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

// tensorPickle is the pickle of one tensor on storage "0".
func tensorPickle(storageType string, numel int64, shape, stride []int, offset int) []byte {
	var e encoder
	b := &e.buf
	b.Write([]byte{0x80, 2})
	b.WriteString("ctorch._utils\n_rebuild_tensor_v2\n((")
	_ = e.value("storage", 0)
	b.WriteString("ctorch\n" + storageType + "\n")
	_ = e.value("0", 0)
	_ = e.value("cuda:0", 0)
	e.int(numel)
	b.WriteString("tQ")
	e.int(int64(offset))
	sh, st := make([]any, len(shape)), make([]any, len(stride))
	for i := range shape {
		sh[i] = shape[i]
	}
	for i := range stride {
		st[i] = stride[i]
	}
	_ = e.tuple(sh, 1)
	_ = e.tuple(st, 1)
	b.WriteString("\x89ccollections\nOrderedDict\n)RtR.")
	return b.Bytes()
}

func le64(v ...int64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return b
}

// TestOpenBadInput checks that hostile and broken files get the exact
// error, never a panic or a large allocation (the huge-shape cases would
// allocate terabytes if a size were trusted).
func TestOpenBadInput(t *testing.T) {
	good, err := os.ReadFile(filepath.Join("testdata", "mixed.pt"))
	require.NoError(t, err)
	pkl := func(p string) []byte { return archive(t, entry{name: "data.pkl", data: []byte(p)}) }
	deep := "\x80\x02" + strings.Repeat("]", 100) + strings.Repeat("a", 99) + "."
	marks := "\x80\x02" + strings.Repeat("(", 2000) + "."
	for _, c := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "torchpt: not a torch.save file (no zip header)"},
		{"text", []byte("hello world"), "torchpt: not a torch.save file (no zip header)"},
		{"legacy pickle", []byte("\x80\x02}q\x00."), "torchpt: a bare pickle, not a zip archive: this is the legacy format of PyTorch < 1.6"},
		{"truncated zip", good[:len(good)/2], "torchpt: reading the zip archive: zip: not a valid zip file (the file is truncated or not a torch.save file)"},
		{"truncated tail", good[:len(good)-10], "torchpt: reading the zip archive: zip: not a valid zip file"},
		{"no directory", archive(t, entry{name: "=/data.pkl", data: []byte("\x80\x02N.")}), "torchpt: zip entry \"/data.pkl\" is not inside a top-level directory"},
		{"two directories", archive(t, entry{name: "data.pkl", data: []byte("\x80\x02N.")}, entry{name: "=y/version", data: []byte("3")}), "torchpt: zip entry \"y/version\" is outside the archive directory \"x\""},
		{"no data.pkl", archive(t, entry{name: "version", data: []byte("3\n")}), "torchpt: no x/data.pkl in the archive: not a torch.save file"},
		{"bad byteorder", archive(t, entry{name: "byteorder", data: []byte("middle")}, entry{name: "data.pkl", data: []byte("\x80\x02N.")}), "torchpt: byteorder \"middle\", want little or big"},
		{"os.system", pkl("\x80\x02cposix\nsystem\nX\x02\x00\x00\x00ls\x85R."), "torchpt: pickle calls posix.system: not a tensor-only file"},
		{"builtins.eval", pkl("\x80\x02c__builtin__\neval\nX\x01\x00\x00\x001\x85R."), "torchpt: pickle calls __builtin__.eval: not a tensor-only file"},
		{"copyreg reconstructor", pkl("\x80\x02ccopy_reg\n_reconstructor\n."), "torchpt: pickle calls copy_reg._reconstructor: not a tensor-only file"},
		{"stack global", pkl("\x80\x04\x8c\x02os\x8c\x06system\x93."), "torchpt: data.pkl byte 14 (opcode 0x93): builds an arbitrary object"},
		{"inst", pkl("\x80\x02(ios\nsystem\n."), "torchpt: data.pkl byte 3 (opcode 0x69): builds an arbitrary object"},
		{"complex storage", archive(t, entry{name: "data.pkl", data: tensorPickle("ComplexFloatStorage", 1, []int{1}, []int{1}, 0)}), "torchpt: pickle calls torch.ComplexFloatStorage: not a tensor-only file"},
		{"huge storage", archive(t, entry{name: "data.pkl", data: tensorPickle("LongStorage", 1<<40, []int{1 << 40}, []int{1}, 0)}, entry{name: "data/0", data: le64(1)}), "torchpt: storage \"0\": 1099511627776 int64 elements exceed the limit of 2147483648 bytes"},
		{"huge shape on small storage", archive(t, entry{name: "data.pkl", data: tensorPickle("LongStorage", 1, []int{1 << 20, 1 << 20}, []int{0, 0}, 0)}, entry{name: "data/0", data: le64(1)}), "torchpt: tensor size [1048576 1048576] exceeds the limit of 2147483648 bytes"},
		{"storage size mismatch", archive(t, entry{name: "data.pkl", data: tensorPickle("LongStorage", 3, []int{3}, []int{1}, 0)}, entry{name: "data/0", data: le64(1, 2)}), "torchpt: storage \"0\": entry holds 16 bytes, but 3 int64 elements need 24"},
		{"storage missing", archive(t, entry{name: "data.pkl", data: tensorPickle("IntStorage", 2, []int{2}, []int{1}, 0)}), "torchpt: storage \"0\" has no entry x/data/0 (the file is truncated or corrupt)"},
		{"view past storage", archive(t, entry{name: "data.pkl", data: tensorPickle("LongStorage", 2, []int{3}, []int{1}, 0)}, entry{name: "data/0", data: le64(1, 2)}), "torchpt: tensor size [3], stride [1], offset 0 reach past storage \"0\" of 2 elements"},
		{"offset past storage", archive(t, entry{name: "data.pkl", data: tensorPickle("LongStorage", 2, []int{1}, []int{1}, 5)}, entry{name: "data/0", data: le64(1, 2)}), "torchpt: tensor offset 5 is past storage \"0\" of 2 elements"},
		{"stride past storage", archive(t, entry{name: "data.pkl", data: tensorPickle("LongStorage", 2, []int{2}, []int{1 << 40}, 0)}, entry{name: "data/0", data: le64(1, 2)}), "torchpt: tensor size [2], stride [1099511627776]: stride 1099511627776 exceeds storage \"0\" of 2 elements"},
		{"stride rank", archive(t, entry{name: "data.pkl", data: tensorPickle("LongStorage", 2, []int{2}, []int{1, 1}, 0)}, entry{name: "data/0", data: le64(1, 2)}), "torchpt: tensor size [2] with stride [1 1]: want one stride per dimension"},
		{"pickle past the file", archive(t, entry{name: "data.pkl", data: []byte("\x80\x02N."), claim: 1 << 20}), "torchpt: entry x/data.pkl claims 1048576 bytes past the end of the file (the file is truncated)"},
		{"pickle over the cap", archive(t, entry{name: "data.pkl", data: []byte("\x80\x02N."), claim: 1 << 30}), "torchpt: entry x/data.pkl is 1073741824 bytes, more than the limit of 67108864"},
		{"stored sizes disagree", func() []byte {
			var buf bytes.Buffer
			zw := zip.NewWriter(&buf)
			w, err := zw.CreateRaw(&zip.FileHeader{Name: "x/data.pkl", Method: zip.Store, CRC32: crc32.ChecksumIEEE([]byte("\x80\x02N.")), CompressedSize64: 4, UncompressedSize64: 1 << 25})
			require.NoError(t, err)
			_, err = w.Write([]byte("\x80\x02N."))
			require.NoError(t, err)
			require.NoError(t, zw.Close())
			return buf.Bytes()
		}(), "torchpt: stored entry x/data.pkl declares 4 bytes stored and 33554432 uncompressed (the file is corrupt)"},
		{"nested too deep", pkl(deep), "torchpt: values nested more than 64 deep"},
		{"too many marks", pkl(marks), "torchpt: data.pkl byte 1026 (opcode 0x28): more than 1024 nested MARKs"},
		{"cycle", pkl("\x80\x02]q\x00h\x00a."), "torchpt: a container contains itself: not a tensor-only file"},
		{"odd dict", pkl("\x80\x02}(K\x01u."), "torchpt: data.pkl byte 6 (opcode 0x75): odd number of dict items (malformed pickle)"},
		{"stack underflow", pkl("\x80\x02a."), "torchpt: data.pkl byte 2 (opcode 0x61): needs 2 values on the stack, has 0 (malformed pickle)"},
		{"unknown opcode", pkl("\x80\x02\xff."), "torchpt: data.pkl byte 2 (opcode 0xff): unknown opcode"},
		{"huge string", pkl("\x80\x02X\xff\xff\xff\x7f."), "torchpt: data.pkl byte 2 (opcode 0x58): claims 2147483647 bytes, 1 left (truncated or corrupt pickle)"},
		{"huge unicode8", pkl("\x80\x02\x8d\xff\xff\xff\xff\xff\xff\xff\xff."), "torchpt: data.pkl byte 2 (opcode 0x8d): claims 18446744073709551615 bytes, 1 left"},
		{"huge frame", pkl("\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7fN."), "torchpt: data.pkl byte 2 (opcode 0x95): frame of 9223372036854775807 bytes, 2 left (truncated pickle)"},
		{"empty long", pkl("\x80\x02\x8a\x00."), "torchpt: data.pkl byte 2 (opcode 0x8a): a long integer with no bytes (malformed pickle)"},
		{"big int", pkl("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01."), "torchpt: integer 18446744073709551616 does not fit in int64"},
		{"bytes", pkl("\x80\x03C\x01a."), "torchpt: data.pkl byte 2 (opcode 0x43): holds bytes or buffers, which this reader does not take"},
		{"set", pkl("\x80\x04\x8f."), "torchpt: data.pkl byte 2 (opcode 0x8f): holds a set, which this reader does not take"},
		{"no stop", pkl("\x80\x02N"), "torchpt: data.pkl ends without STOP (truncated pickle)"},
		{"cut line", pkl("\x80\x02ctorch"), "torchpt: data.pkl byte 2 (opcode 0x63): argument line has no end (truncated pickle)"},
		{"storage class called", pkl("\x80\x02ctorch\nLongStorage\n)R."), "torchpt: decoding data.pkl: REDUCE requires a Callable object"},
		{"persistent id not storage", pkl("\x80\x02X\x01\x00\x00\x00aQ."), "torchpt: persistent id \"a\", want ('storage', type, key, location, numel)"},
		{"tensor args", pkl("\x80\x02ctorch._utils\n_rebuild_tensor_v2\n)R."), "torchpt: tensor rebuilt with 0 arguments, want 6 or 7"},
		{"dict key list", pkl("\x80\x02}(]K\x01u."), "torchpt: dict key a list of 0: want a number, string, bool or None"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := openBytes(t, c.data)
			require.Error(t, err)
			assert.Nil(t, f)
			assert.Contains(t, err.Error(), c.want)
			assert.NotContains(t, err.Error(), "internal error")
		})
	}
}

// TestTensorDataErrors covers problems found only when a tensor's data is
// read: a storage whose bytes are cut short or corrupt.
func TestTensorDataErrors(t *testing.T) {
	a := archive(t, entry{name: "data.pkl", data: tensorPickle("LongStorage", 2, []int{2}, []int{1}, 0)}, entry{name: "data/0", data: le64(1, 2)})
	f, err := openBytes(t, a)
	require.NoError(t, err)
	v, err := f.Root.(*Tensor).Int64s()
	require.NoError(t, err, "the intact file reads")
	assert.Equal(t, []int64{1, 2}, v)
	// Flip a data byte: the CRC no longer matches.
	i := bytes.Index(a, le64(1, 2))
	require.Positive(t, i)
	bad := bytes.Clone(a)
	bad[i] ^= 0xff
	f, err = openBytes(t, bad)
	require.NoError(t, err, "the pickle is intact")
	_, err = f.Root.(*Tensor).Int64s()
	assert.ErrorContains(t, err, "torchpt: entry x/data/0: zip: checksum error (the file is truncated or corrupt)")
}
