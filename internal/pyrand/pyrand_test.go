package pyrand

import (
	"encoding/json"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type goldenCase struct {
	Seed      json.Number `json:"seed"`
	Uint32    []uint32    `json:"uint32"`
	Bits      [][2]any    `json:"bits"`
	RandBelow [][2]uint64 `json:"randbelow"`
	Sample    [][3]any    `json:"sample"`
	Shuffle   [][2]any    `json:"shuffle"`
	After     uint32      `json:"after"`
}

func loadGolden(t *testing.T, path string) []goldenCase {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.UseNumber()
	var doc struct {
		Cases []goldenCase `json:"cases"`
	}
	require.NoError(t, dec.Decode(&doc))
	require.NotEmpty(t, doc.Cases)
	return doc.Cases
}

// seedOf turns the golden seed (any Python int) into the state Python makes.
func seedOf(t *testing.T, s json.Number) *Random {
	t.Helper()
	b, ok := new(big.Int).SetString(string(s), 10)
	require.True(t, ok, "seed %s", s)
	if b.IsInt64() {
		return New(b.Int64())
	}
	b.Abs(b)
	var key []uint32
	for b.Sign() > 0 {
		key = append(key, uint32(new(big.Int).And(b, big.NewInt(0xffffffff)).Uint64()))
		b.Rsh(b, 32)
	}
	return NewFromKey(key)
}

func ints(t *testing.T, v any) []int32 {
	t.Helper()
	raw, ok := v.([]any)
	require.True(t, ok, "%v is not a list", v)
	out := make([]int32, len(raw))
	for i, x := range raw {
		n, err := x.(json.Number).Int64()
		require.NoError(t, err)
		out[i] = int32(n)
	}
	return out
}

func num(t *testing.T, v any) int {
	t.Helper()
	n, err := v.(json.Number).Int64()
	require.NoError(t, err)
	return int(n)
}

// checkCase replays the golden script of calls on one seeded state and
// compares every value; the calls share one stream, so a method that draws a
// word too many or too few also breaks every later value.
func checkCase(t *testing.T, c goldenCase) {
	r := seedOf(t, c.Seed)
	for i, want := range c.Uint32 {
		require.Equal(t, want, uint32(r.GetRandBits(32)), "getrandbits(32) #%d", i)
	}
	for _, b := range c.Bits {
		k := num(t, b[0])
		want, ok := new(big.Int).SetString(b[1].(string), 10)
		require.True(t, ok)
		if k <= 64 {
			require.Equal(t, want.Uint64(), r.GetRandBits(k), "getrandbits(%d)", k)
			continue
		}
		words := r.GetRandBitsWords(k, nil)
		got := new(big.Int)
		for i := len(words) - 1; i >= 0; i-- {
			got.Lsh(got, 32).Or(got, big.NewInt(int64(words[i])))
		}
		require.Equal(t, want.String(), got.String(), "getrandbits(%d)", k)
	}
	for _, rb := range c.RandBelow {
		require.Equal(t, int(rb[1]), r.RandBelow(int(rb[0])), "randbelow(%d)", rb[0])
	}
	for _, s := range c.Sample {
		n, k := num(t, s[0]), num(t, s[1])
		got, ok := r.Sample(n, k, nil)
		require.True(t, ok)
		want := ints(t, s[2])
		if len(want) == 0 {
			want = nil
		}
		require.Equal(t, want, got, "sample(range(%d), %d)", n, k)
	}
	for _, s := range c.Shuffle {
		m := num(t, s[0])
		x := make([]int32, m)
		for i := range x {
			x[i] = int32(i)
		}
		Shuffle(r, x)
		require.Equal(t, ints(t, s[1]), x, "shuffle of %d", m)
	}
	assert.Equal(t, c.After, r.Uint32(), "first word after the script")
}

// TestGolden checks the port against values CPython wrote
// (testdata/gen.py): seeds 42, 0, 1, negative, two-word and math.MinInt64;
// 700 words (crossing a twist), getrandbits for k on both sides of 32 and 64,
// randbelow for n from 1 to 2**63-1 (powers of two included), sample in both
// the pool and the set branch, and shuffles.
func TestGolden(t *testing.T) {
	for _, c := range loadGolden(t, filepath.Join("testdata", "golden.json")) {
		t.Run("seed="+string(c.Seed), func(t *testing.T) { checkCase(t, c) })
	}
}

// TestAgainstPython reruns the generator with the python3 on PATH and
// compares the port with what it writes now; it skips without python3.
func TestAgainstPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not on PATH")
	}
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join("testdata", "gen.py"))
	require.NoError(t, err)
	gen := filepath.Join(dir, "gen.py")
	require.NoError(t, os.WriteFile(gen, src, 0o644))
	out, err := exec.Command(py, gen).CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, c := range loadGolden(t, filepath.Join(dir, "golden.json")) {
		t.Run("seed="+string(c.Seed), func(t *testing.T) { checkCase(t, c) })
	}
}

func TestSampleSetSize(t *testing.T) {
	// 21 + 4**ceil(log(3k, 4)) for k > 5, as CPython computes it.
	for k, want := range map[int]int{0: 21, 5: 21, 6: 21 + 64, 21: 21 + 64, 22: 21 + 256, 85: 21 + 256, 86: 21 + 1024} {
		assert.Equal(t, want, SampleSetSize(k), "k=%d", k)
	}
}

func TestSampleRejectsBadK(t *testing.T) {
	r := New(42)
	want := New(42).Uint32()
	_, ok := r.Sample(3, 4, nil)
	assert.False(t, ok)
	_, ok = r.Sample(3, -1, nil)
	assert.False(t, ok)
	assert.Equal(t, want, r.Uint32(), "a refused sample must draw nothing")
}

func TestFirstWordsOfSeed42(t *testing.T) {
	// random.Random(42).getrandbits(32), three times: written here as well as
	// in the golden file so the seeding is pinned without reading JSON.
	r := New(42)
	assert.Equal(t, []uint32{2746317213, 478163327, 107420369}, []uint32{r.Uint32(), r.Uint32(), r.Uint32()})
}

func TestClone(t *testing.T) {
	r := New(42)
	r.Uint32()
	c := r.Clone()
	assert.Equal(t, r.Uint32(), c.Uint32())
	c.Uint32()
	assert.NotEqual(t, r.Uint32(), c.Uint32(), "a clone must not share state")
}

// A tape reader at any position draws what the generator draws after that
// many words, across the tape's growth, and concurrent readers agree.
func TestTapeReaderFollowsTheGenerator(t *testing.T) {
	tape := NewTape(42)
	g := New(42)
	var ref []uint32
	for range 20000 {
		ref = append(ref, g.Uint32())
	}
	for _, pos := range []int{0, 1, 623, 624, 4095, 4096, 9000, 19000} {
		r := tape.Reader(pos)
		for i := pos; i < min(pos+900, len(ref)); i++ {
			if w := r.Uint32(); w != ref[i] {
				t.Fatalf("reader from %d: word %d is %d, the generator's is %d", pos, i, w, ref[i])
			}
		}
		if want := min(pos+900, len(ref)); r.Pos() != want {
			t.Fatalf("reader from %d ends at %d, want %d", pos, r.Pos(), want)
		}
	}
	// Shuffles through a reader equal shuffles through a generator that
	// skipped the same words.
	g2 := New(42)
	for range 777 {
		g2.Uint32()
	}
	r := tape.Reader(777)
	a, b := make([]int, 50), make([]int, 50)
	for i := range a {
		a[i], b[i] = i, i
	}
	Shuffle(g2, a)
	Shuffle(r, b)
	if !slices.Equal(a, b) {
		t.Fatalf("shuffle through the tape %v differs from the generator's %v", b, a)
	}
	c := r.Clone()
	r.Seek(3)
	if c.Pos() == 3 || r.Pos() != 3 {
		t.Fatalf("Seek moved the clone (clone at %d, reader at %d)", c.Pos(), r.Pos())
	}
	tape2 := NewTape(42)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rd := tape2.Reader(w * 3000)
			for i := w * 3000; i < len(ref); i++ {
				if x := rd.Uint32(); x != ref[i] {
					t.Errorf("concurrent reader %d: word %d differs", w, i)
					return
				}
			}
		}()
	}
	wg.Wait()
}
