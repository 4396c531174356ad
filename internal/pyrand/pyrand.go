// Package pyrand reproduces, bit for bit, the parts of CPython's random.Random
// that serving stacks use to make deterministic choices: seeding with an
// integer, the Mersenne Twister's 32-bit output, getrandbits, the rejection
// sampler behind randrange (_randbelow_with_getrandbits), sample and shuffle.
//
// The generator follows python/cpython Modules/_randommodule.c (MT19937 of
// Matsumoto and Nishimura, init_genrand/init_by_array/genrand_uint32,
// random_seed, _random_Random_getrandbits_impl) and the methods follow
// python/cpython Lib/random.py@49b5fcaf948df1340bf456dce529895cf95785c5.
// CPython 3.10, 3.11, 3.12 and 3.13 give the same stream for every call made
// here: the only difference between them in these methods is that 3.10's
// _randbelow_with_getrandbits returns 0 for n == 0 without drawing (3.11 on
// call getrandbits(0), which also draws nothing and returns 0), and 3.10's
// shuffle still accepted a deprecated random= argument (unused when None).
// The methods return positions (indices into the population) where Python
// returns elements, so a caller maps them onto its own slice.
//
// getrandbits(k > 32) assembles its words least significant first, as CPython
// does on a little-endian machine (x86-64, arm64); a big-endian CPython fills
// them in the other order and so gives other values for k > 32.
package pyrand

import (
	"sync"
	"sync/atomic"
)

const (
	n         = 624
	m         = 397
	matrixA   = 0x9908b0df
	upperMask = 0x80000000
	lowerMask = 0x7fffffff
)

// Random is one CPython random.Random state. The zero value is not seeded;
// make one with New or NewFromKey.
type Random struct {
	mt  [n]uint32
	mti int
	// tape, when set, is the stream this reader reads at pos instead of
	// running its own generator (see Tape).
	tape *Tape
	pos  int
}

// New returns the state of random.Random(seed): CPython seeds an int with
// init_by_array over the 32-bit words of abs(seed), least significant first
// (one word for 0).
func New(seed int64) *Random {
	u := uint64(seed)
	if seed < 0 {
		u = -u // two's complement: abs, also right for math.MinInt64
	}
	key := []uint32{uint32(u)}
	if hi := uint32(u >> 32); hi != 0 {
		key = append(key, hi)
	}
	return NewFromKey(key)
}

// NewFromKey returns the state CPython's init_by_array makes from key: what
// random.Random(x) does for a non-negative int x whose 32-bit words, least
// significant first, are key. An empty key is treated as the one word 0, as
// CPython does for x == 0.
func NewFromKey(key []uint32) *Random {
	if len(key) == 0 {
		key = []uint32{0}
	}
	r := &Random{}
	r.initByArray(key)
	return r
}

func (r *Random) initGenrand(s uint32) {
	r.mt[0] = s
	for i := 1; i < n; i++ {
		r.mt[i] = 1812433253*(r.mt[i-1]^(r.mt[i-1]>>30)) + uint32(i)
	}
	r.mti = n
}

func (r *Random) initByArray(key []uint32) {
	r.initGenrand(19650218)
	i, j := 1, 0
	k := max(n, len(key))
	for ; k > 0; k-- {
		r.mt[i] = (r.mt[i] ^ ((r.mt[i-1] ^ (r.mt[i-1] >> 30)) * 1664525)) + key[j] + uint32(j)
		i++
		j++
		if i >= n {
			r.mt[0] = r.mt[n-1]
			i = 1
		}
		if j >= len(key) {
			j = 0
		}
	}
	for k = n - 1; k > 0; k-- {
		r.mt[i] = (r.mt[i] ^ ((r.mt[i-1] ^ (r.mt[i-1] >> 30)) * 1566083941)) - uint32(i)
		i++
		if i >= n {
			r.mt[0] = r.mt[n-1]
			i = 1
		}
	}
	r.mt[0] = 0x80000000 // MSB is 1, assuring a non-zero initial array
	r.mti = n
}

// Uint32 returns the next 32-bit output of the generator (CPython's
// genrand_uint32); every other method is built on it.
func (r *Random) Uint32() uint32 {
	if r.tape != nil {
		w := r.tape.word(r.pos)
		r.pos++
		return w
	}
	if r.mti >= n {
		mag := [2]uint32{0, matrixA}
		var kk int
		for kk = 0; kk < n-m; kk++ {
			y := (r.mt[kk] & upperMask) | (r.mt[kk+1] & lowerMask)
			r.mt[kk] = r.mt[kk+m] ^ (y >> 1) ^ mag[y&1]
		}
		for ; kk < n-1; kk++ {
			y := (r.mt[kk] & upperMask) | (r.mt[kk+1] & lowerMask)
			r.mt[kk] = r.mt[kk+(m-n)] ^ (y >> 1) ^ mag[y&1]
		}
		y := (r.mt[n-1] & upperMask) | (r.mt[0] & lowerMask)
		r.mt[n-1] = r.mt[m-1] ^ (y >> 1) ^ mag[y&1]
		r.mti = 0
	}
	y := r.mt[r.mti]
	r.mti++
	y ^= y >> 11
	y ^= (y << 7) & 0x9d2c5680
	y ^= (y << 15) & 0xefc60000
	y ^= y >> 18
	return y
}

// GetRandBits returns random.getrandbits(k) for 0 <= k <= 64: nothing is drawn
// for k == 0, one word shifted right by 32-k for k <= 32, and for k > 32 one
// word per 32 bits, least significant word first, the last one shifted right
// so that exactly k bits remain. For k > 64 it draws what getrandbits(k)
// draws and returns the low 64 bits; for k < 0 (CPython raises ValueError) it
// draws nothing and returns 0.
func (r *Random) GetRandBits(k int) uint64 {
	switch {
	case k <= 0:
		return 0
	case k <= 32:
		return uint64(r.Uint32() >> (32 - k))
	case k <= 64:
		var w [2]uint32
		r.GetRandBitsWords(k, w[:0])
		return uint64(w[0]) | uint64(w[1])<<32
	}
	w := r.GetRandBitsWords(k, nil)
	return uint64(w[0]) | uint64(w[1])<<32
}

// GetRandBitsWords appends random.getrandbits(k) for any k >= 0 to dst as
// 32-bit words, least significant first, (k+31)/32 of them, and returns the
// extended slice. A negative k appends nothing.
func (r *Random) GetRandBitsWords(k int, dst []uint32) []uint32 {
	if k <= 0 {
		return dst
	}
	if k <= 32 {
		return append(dst, r.Uint32()>>(32-k))
	}
	for ; k > 0; k -= 32 {
		w := r.Uint32()
		if k < 32 {
			w >>= 32 - k // CPython drops the least significant bits
		}
		dst = append(dst, w)
	}
	return dst
}

// RandBelow returns Random._randbelow_with_getrandbits(n): with k =
// n.bit_length() (not that of n-1, so a power of two needs k+1 bits), draw
// getrandbits(k) until the value is below n. It returns 0 without drawing for
// n <= 0 (CPython 3.10 does that for n == 0; later versions call
// getrandbits(0), which also draws nothing).
func (r *Random) RandBelow(n int) int {
	if n <= 0 {
		return 0
	}
	k := bitLen(uint64(n))
	v := r.GetRandBits(k)
	for v >= uint64(n) {
		v = r.GetRandBits(k)
	}
	return int(v)
}

func bitLen(u uint64) int {
	k := 0
	for ; u != 0; u >>= 1 {
		k++
	}
	return k
}

// SampleSetSize returns the setsize that Random.sample compares the
// population size with: 21, plus 4**ceil(log(3k, 4)) when k > 5. CPython
// computes the logarithm in floating point; 3k is never a power of four, so
// the exponent is exactly the smallest e with 4**e > 3k, computed here in
// integers.
func SampleSetSize(k int) int {
	size := 21
	if k > 5 {
		p := 1
		for p <= 3*k {
			p *= 4
		}
		size += p
	}
	return size
}

// Sample appends to out the positions that random.sample(population, k)
// selects from a population of n items, in selection order, and returns the
// extended slice. Like CPython it tracks a pool of the n positions when n <=
// SampleSetSize(k), drawing randbelow(n-i) and moving the last unselected
// position into the hole, and otherwise draws randbelow(n) and redraws
// positions already selected. It returns out unchanged and false when k is
// outside [0, n] (CPython raises ValueError there, before drawing).
func (r *Random) Sample(n, k int, out []int32) ([]int32, bool) {
	if k < 0 || k > n {
		return out, false
	}
	if n <= SampleSetSize(k) {
		pool := make([]int32, n)
		for i := range pool {
			pool[i] = int32(i)
		}
		for i := 0; i < k; i++ {
			j := r.RandBelow(n - i)
			out = append(out, pool[j])
			pool[j] = pool[n-i-1]
		}
		return out, true
	}
	selected := make(map[int]struct{}, k)
	for i := 0; i < k; i++ {
		j := r.RandBelow(n)
		for {
			if _, dup := selected[j]; !dup {
				break
			}
			j = r.RandBelow(n)
		}
		selected[j] = struct{}{}
		out = append(out, int32(j))
	}
	return out, true
}

// Shuffle permutes x in place as random.shuffle does: for i from len(x)-1
// down to 1, swap x[i] with x[randbelow(i+1)]. It draws nothing for fewer
// than two items.
func Shuffle[T any](r *Random, x []T) {
	for i := len(x) - 1; i > 0; i-- {
		j := r.RandBelow(i + 1)
		x[i], x[j] = x[j], x[i]
	}
}

// Clone returns an independent copy of r: both then produce the same stream.
// The dispatch models use it where a stack seeds one generator per rank with
// the same seed and the ranks' streams part later.
func (r *Random) Clone() *Random {
	c := *r
	return &c
}

// Tape is the output of one generator, kept as it is drawn so that a reader
// can start at any position of it: random.Random(seed)'s stream after pos
// words is the tape's Reader(pos). Readers of one tape are the one way to
// follow many states of one seed that part and meet again (a stack that
// seeds one generator per rank with the same seed): a state is a position,
// copied and compared as an int. A Tape is safe for concurrent use; it grows
// as far as its readers read.
type Tape struct {
	mu    sync.Mutex
	gen   *Random
	words atomic.Pointer[[]uint32]
}

// NewTape returns the tape of random.Random(seed).
func NewTape(seed int64) *Tape {
	t := &Tape{gen: New(seed)}
	w := make([]uint32, 0)
	t.words.Store(&w)
	return t
}

func (t *Tape) word(i int) uint32 {
	if w := *t.words.Load(); i < len(w) {
		return w[i]
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	w := *t.words.Load()
	if i < len(w) {
		return w[i]
	}
	grown := make([]uint32, len(w), max(2*len(w), i+1, 4096))
	copy(grown, w)
	for len(grown) <= i || len(grown) < cap(grown) {
		grown = append(grown, t.gen.Uint32())
	}
	t.words.Store(&grown)
	return grown[i]
}

// Reader returns a generator that reads t from position pos (the number of
// 32-bit words drawn before it): every method of Random then returns what
// random.Random(seed) returns after those words. Clone copies the position.
func (t *Tape) Reader(pos int) *Random {
	return &Random{tape: t, pos: pos}
}

// Pos returns how many words a tape reader has drawn from its tape's start
// (0 for a generator that is not a tape reader).
func (r *Random) Pos() int { return r.pos }

// Seek moves a tape reader to position pos; it does nothing to a generator
// that is not a tape reader.
func (r *Random) Seek(pos int) {
	if r.tape != nil {
		r.pos = pos
	}
}
