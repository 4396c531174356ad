package stackdispatch

import (
	"encoding/json"
	"math/bits"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestVLLMReplicaGolden compares VLLMReplica with values numpy (uint32
// arithmetic) and torch (int64, as the Triton kernel) computed
// (scripts/vllm_replica.py), token rows from 0 to 10^12+3.
func TestVLLMReplicaGolden(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "vllm", "golden.json"))
	require.NoError(t, err)
	var doc struct {
		Cases [][3]int64 `json:"cases"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	require.NotEmpty(t, doc.Cases)
	for _, c := range doc.Cases {
		require.Equal(t, int(c[2]), VLLMReplica(c[0], int(c[1])), "token %d, %d copies", c[0], c[1])
	}
}

func TestVLLMReplicaEdges(t *testing.T) {
	assert.Equal(t, 0, VLLMReplica(12345, 0), "copies < 1 acts as 1")
	// The kernel's int64 product overflows for huge rows; its low 32 bits,
	// all that counts, are what math/bits gives.
	tok := int64(1) << 62
	_, lo := bits.Mul64(uint64(tok), vllmKnuth)
	assert.Equal(t, int((lo&0xffffffff)%7), VLLMReplica(tok, 7))
	assert.Equal(t, 5, VLLMReplicaFlat(13, 8))
	assert.Equal(t, 0, VLLMReplicaFlat(13, -2))
}

func TestSGLangDynamicShares(t *testing.T) {
	// n = 3: 65536 = 3*21845 + 1, so copy 0 gets one draw more.
	got := SGLangDynamicShares([]int32{4, 9, 20}, 5, 4, 2, SGLangStaticPlain, SGLangInitByMapping, nil)
	assert.Equal(t, []float64{21846.0 / 65536, 21845.0 / 65536, 21845.0 / 65536}, got)
	// Count the 65536 randint values directly for several n.
	for n := 1; n <= 40; n++ {
		cands := make([]int32, n)
		for i := range cands {
			cands[i] = int32(i)
		}
		hits := make([]float64, n)
		for v := 0; v < 65536; v++ {
			hits[v%n]++
		}
		shares := SGLangDynamicShares(cands, 0, 1, 1, SGLangStaticGPUOnly, SGLangInitByEPLB, nil)
		for i := range hits {
			assert.Equal(t, hits[i]/65536, shares[i], "n=%d copy %d", n, i)
		}
	}
	// Narrowed for the rank (init_by_mapping, newer trees): all on the nearest copy.
	assert.Equal(t, []float64{0, 1, 0}, SGLangDynamicShares([]int32{9, 5, 20}, 1, 4, 2, SGLangStaticNodeNarrow, SGLangInitByMapping, nil))
	// The same rank with init_by_eplb keeps the whole row.
	assert.Len(t, SGLangDynamicShares([]int32{9, 5, 20}, 1, 4, 2, SGLangStaticNodeNarrow, SGLangInitByEPLB, nil), 3)
}

// trtllmKernelSim restates moeComputeRouteKernel thread by thread: the block's
// 1024 entries loaded as thread t, item i -> entry t + 256*i; warp 0 walks
// the 32 chunks of 32 lanes, groups equal expert ids with match_any, lets the
// group's leader add the group's size to the expert's counter and gives each
// lane the old counter plus its rank in the group plus blockIdx (+ epRank).
func trtllmKernelSim(experts []int32, replicas [][]int32, epRank int, offsetByEpRank bool, invalid int32) []int32 {
	const threads, items = 256, 4
	E := len(replicas)
	out := make([]int32, len(experts))
	for block := 0; block*threads*items < len(experts); block++ {
		counter := make([]int, E)
		arb := make([]int, threads*items)
		ids := make([]int, threads*items)
		for tid := 0; tid < threads; tid++ {
			for i := 0; i < items; i++ {
				f := block*threads*items + tid + i*threads
				e := E
				if f < len(experts) && experts[f] >= 0 && int(experts[f]) < E {
					e = int(experts[f])
				}
				ids[tid+i*threads] = e
				a := E
				if e < E && len(replicas[e]) > 1 {
					a = e
				}
				arb[tid+i*threads] = a
			}
		}
		base := block
		if offsetByEpRank {
			base += epRank
		}
		for chunk := 0; chunk < threads*items/32; chunk++ {
			lanes := arb[chunk*32 : chunk*32+32]
			res := make([]int, 32)
			for lane := 0; lane < 32; lane++ {
				leader, size, rank := -1, 0, 0
				for o := 0; o < 32; o++ {
					if lanes[o] == lanes[lane] {
						if leader < 0 {
							leader = o
						}
						size++
						if o < lane {
							rank++
						}
					}
				}
				old := 0
				if lanes[lane] < E {
					old = counter[lanes[lane]]
				}
				res[lane] = old + rank + base
				_ = size
			}
			for lane := 0; lane < 32; lane++ { // the leaders' atomicAdds
				if lanes[lane] < E && firstLane(lanes, lane) {
					counter[lanes[lane]] += count(lanes, lanes[lane])
				}
			}
			copy(lanes, res)
		}
		for j := 0; j < threads*items; j++ {
			f := block*threads*items + j
			if f >= len(experts) {
				continue
			}
			e := ids[j]
			if e >= E {
				out[f] = invalid
				continue
			}
			out[f] = replicas[e][arb[j]%len(replicas[e])]
		}
	}
	return out
}

func firstLane(lanes []int, lane int) bool {
	for o := 0; o < lane; o++ {
		if lanes[o] == lanes[lane] {
			return false
		}
	}
	return true
}

func count(lanes []int, v int) int {
	n := 0
	for _, x := range lanes {
		if x == v {
			n++
		}
	}
	return n
}

// TestTRTLLMRouteMatchesKernel compares TRTLLMRoute with the thread-level
// restatement of the kernel on random batches (several blocks, hot experts,
// invalid ids, with and without the EP-rank offset).
func TestTRTLLMRouteMatchesKernel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := 0; trial < 60; trial++ {
		E := 4 + rng.IntN(40)
		replicas := make([][]int32, E)
		slot := int32(0)
		for e := range replicas {
			c := 1
			if rng.IntN(3) == 0 {
				c = 2 + rng.IntN(5)
			}
			for i := 0; i < c; i++ {
				replicas[e] = append(replicas[e], slot)
				slot++
			}
		}
		n := rng.IntN(5000)
		experts := make([]int32, n)
		for i := range experts {
			switch {
			case rng.IntN(50) == 0:
				experts[i] = int32(E + rng.IntN(3)) // invalid
			case rng.IntN(3) == 0:
				experts[i] = int32(rng.IntN(3)) // hot
			default:
				experts[i] = int32(rng.IntN(E))
			}
		}
		epRank := rng.IntN(8)
		for _, dp := range []bool{false, true} {
			offset := 0
			if dp {
				offset = epRank
			}
			got, err := TRTLLMRoute(experts, replicas, offset, slot, nil)
			require.NoError(t, err)
			require.Equal(t, trtllmKernelSim(experts, replicas, epRank, dp, slot), got, "trial %d dp %v", trial, dp)
		}
	}
	_, err := TRTLLMRoute([]int32{0}, [][]int32{{}}, 0, 9, nil)
	assert.ErrorContains(t, err, "expert 0 has no slot")
}
