package torchpt

import (
	"archive/zip"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// maxFuzzInput caps fuzz inputs so each run stays fast.
const maxFuzzInput = 256 << 10

// checkOpen opens data and, on success, reads every tensor in the tree:
// errors must be ours ("torchpt: ..."), never the recover() safety net.
func checkOpen(t *testing.T, data []byte) {
	if len(data) > maxFuzzInput {
		t.Skip()
	}
	f, err := Open(bytes.NewReader(data), int64(len(data)), Options{MaxTensorBytes: 1 << 20})
	if err != nil {
		require.True(t, strings.HasPrefix(err.Error(), "torchpt: "), err.Error())
		require.NotContains(t, err.Error(), "internal error")
		require.Nil(t, f)
		return
	}
	var walk func(v any, depth int)
	walk = func(v any, depth int) {
		require.LessOrEqual(t, depth, maxDepth+1)
		switch x := v.(type) {
		case *Tensor:
			b, err := x.Bytes()
			if err != nil {
				require.True(t, strings.HasPrefix(err.Error(), "torchpt: "), err.Error())
				return
			}
			require.Len(t, b, x.Len()*x.DType.Size())
		case []any:
			for _, e := range x {
				walk(e, depth+1)
			}
		case Tuple:
			for _, e := range x {
				walk(e, depth+1)
			}
		case *Dict:
			require.Len(t, x.Values, len(x.Keys))
			for _, e := range x.Values {
				walk(e, depth+1)
			}
		case nil, bool, int64, float64, string:
		default:
			t.Fatalf("unexpected value type %T", v)
		}
	}
	walk(f.Root, 0)
}

// FuzzOpen feeds whole archives.
func FuzzOpen(f *testing.F) {
	for _, name := range []string{"mixed.pt", "init_expert_location.pt"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		require.NoError(f, err)
		f.Add(b)
	}
	var buf bytes.Buffer
	t64, _ := NewInt64([]int{2, 2}, []int64{1, 2, 3, 4})
	require.NoError(f, Write(&buf, "w", map[string]any{"m": t64, "l": []int{1, 2}}))
	f.Add(buf.Bytes())
	f.Fuzz(checkOpen)
}

// FuzzPickle feeds data.pkl inside an otherwise valid archive that holds
// storages "0" (8 int64s) and "1" (4 int32s), so mutations reach the
// pickle scanner, gopickle and the tensor checks rather than the zip layer.
func FuzzPickle(f *testing.F) {
	f.Add(tensorPickle("LongStorage", 8, []int{2, 4}, []int{4, 1}, 0))
	f.Add(tensorPickle("LongStorage", 8, []int{4, 2}, []int{1, 4}, 0))
	f.Add(tensorPickle("IntStorage", 4, []int{3}, []int{1}, 1))
	for _, name := range []string{"mixed.pt", "init_expert_location.pt"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		require.NoError(f, err)
		zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
		require.NoError(f, err)
		for _, zf := range zr.File {
			if strings.HasSuffix(zf.Name, "/data.pkl") {
				p, err := readEntry(zf, 1<<20, int64(len(b)))
				require.NoError(f, err)
				f.Add(p)
			}
		}
	}
	f.Fuzz(func(t *testing.T, pkl []byte) {
		if len(pkl) > maxFuzzInput {
			t.Skip()
		}
		checkOpen(t, archive(t,
			entry{name: "data.pkl", data: pkl},
			entry{name: "data/0", data: le64(0, 1, 2, 3, 4, 5, 6, 7)},
			entry{name: "data/1", data: le64(1, 2)},
			entry{name: "version", data: []byte("3\n")},
		))
	})
}
