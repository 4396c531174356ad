package stackdispatch

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/internal/pyrand"
)

// sglangCase is one file written by testdata/sglang/gen.py or by
// scripts/sglang_dispatch.py --random.
type sglangCase struct {
	Phy2Log      [][]int32              `json:"phy2log"`
	Experts      int                    `json:"experts"`
	Candidates   [][][]int32            `json:"candidates"`
	NumPhysical  int                    `json:"num_physical"`
	EPSize       int                    `json:"ep_size"`
	GPUsPerNode  int                    `json:"gpus_per_node"`
	Variant      string                 `json:"variant"`
	Init         string                 `json:"init"`
	Table        [][][]int32            `json:"table"`
	Tables       map[string][][][]int32 `json:"tables"`
	physicalSize int
}

func readCase(t *testing.T, path string) sglangCase {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var c sglangCase
	require.NoError(t, json.Unmarshal(b, &c), path)
	return c
}

func (c *sglangCase) cands(t *testing.T) ([][][]int32, int) {
	t.Helper()
	if c.Phy2Log != nil {
		cands, err := CandidatesFromPhy2Log(c.Phy2Log, c.Experts)
		require.NoError(t, err)
		return cands, len(c.Phy2Log[0]) / c.EPSize
	}
	return c.Candidates, c.NumPhysical / c.EPSize
}

func parseInit(t *testing.T, s string) SGLangInit {
	t.Helper()
	switch s {
	case "", "init_by_mapping":
		return SGLangInitByMapping
	case "init_by_eplb":
		return SGLangInitByEPLB
	}
	t.Fatalf("unknown init %q", s)
	return 0
}

// TestSGLangStaticGolden compares SGLangStaticTable with every table
// scripts/sglang_dispatch.py wrote into testdata/sglang (4 ranks on 2 nodes;
// 32 ranks on 4 nodes with 288 slots; copies sharing a GPU; an expert with 30
// copies, so random.sample takes its set branch; explicit candidate lists in
// a non-ascending order), for every variant and init.
func TestSGLangStaticGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "sglang", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		c := readCase(t, f)
		cands, perGPU := c.cands(t)
		require.NotEmpty(t, c.Tables, f)
		for key, want := range c.Tables {
			name, initName, _ := strings.Cut(key, "/")
			t.Run(filepath.Base(f)+"/"+key, func(t *testing.T) {
				v, err := ParseSGLangVariant(name)
				require.NoError(t, err)
				got, err := SGLangStaticTable(cands, c.EPSize, perGPU, c.GPUsPerNode, v, parseInit(t, initName))
				require.NoError(t, err)
				require.Equal(t, want, got)
			})
		}
	}
}

// TestSGLangStaticAgainstPython runs scripts/sglang_dispatch.py --random on
// fresh seeds (shapes, maps, variant and init drawn by the script) and
// compares; it skips without python3.
func TestSGLangStaticAgainstPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not on PATH")
	}
	script := filepath.Join("..", "..", "scripts", "sglang_dispatch.py")
	dir := t.TempDir()
	seeds := 6
	if testing.Short() {
		seeds = 2
	}
	base := rand.Uint64() % 1_000_000
	for i := 0; i < seeds; i++ {
		seed := base + uint64(i)
		out := filepath.Join(dir, fmt.Sprintf("%d.json", seed))
		msg, err := exec.Command(py, script, "--random", fmt.Sprint(seed), out).CombinedOutput()
		require.NoError(t, err, "%s", msg)
		c := readCase(t, out)
		cands, perGPU := c.cands(t)
		v, err := ParseSGLangVariant(c.Variant)
		require.NoError(t, err)
		got, err := SGLangStaticTable(cands, c.EPSize, perGPU, c.GPUsPerNode, v, parseInit(t, c.Init))
		require.NoError(t, err)
		require.Equal(t, c.Table, got, "seed %d (%s, %s, ep %d)", seed, c.Variant, c.Init, c.EPSize)
	}
}

// TestSGLangUpstreamExamples checks the plain tree against the expected
// outputs in SGLang's own unit test of compute_logical_to_rank_dispatch_
// physical_map (sgl-project/sglang test/srt/test_expert_location.py@
// 05cc93af7190a9228c3dec3c9fd883b670eb30f1; 4 GPUs, 12 physical experts): the
// identity map, and the identity map with redundant copies of experts 0-3,
// whose answer depends on random.Random(42)'s deal.
func TestSGLangUpstreamExamples(t *testing.T) {
	cases := []struct {
		name  string
		cands [][][]int32
		want  [][][]int32
	}{
		{"identity", [][][]int32{{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}}, [][][]int32{
			{{0, 1, 2, 3, 4, 5, 6, 7}}, {{0, 1, 2, 3, 4, 5, 6, 7}},
			{{0, 1, 2, 3, 4, 5, 6, 7}}, {{0, 1, 2, 3, 4, 5, 6, 7}}}},
		{"redundant", [][][]int32{{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4}, {5}, {6}, {7}}}, [][][]int32{
			{{0, 1, 2, 11, 4, 5, 6, 7}}, {{8, 9, 2, 3, 4, 5, 6, 7}},
			{{8, 1, 10, 3, 4, 5, 6, 7}}, {{0, 9, 10, 11, 4, 5, 6, 7}}}},
	}
	for _, c := range cases {
		got, err := SGLangStaticTable(c.cands, 4, 3, 4, SGLangStaticPlain, SGLangInitByMapping)
		require.NoError(t, err)
		assert.Equal(t, c.want, got, c.name)
	}
}

func TestSGLangNearest(t *testing.T) {
	// 4 GPUs of 2 slots, 2 GPUs per node: node 0 = slots 0-3, node 1 = 4-7.
	cases := []struct {
		name  string
		cands []int32
		rank  int
		want  map[SGLangVariant]int32
	}{
		{"single copy elsewhere", []int32{6}, 0, map[SGLangVariant]int32{
			SGLangStaticPlain: -1, SGLangStaticNode: 6, SGLangStaticNodeNarrow: 6, SGLangStaticGPUOnly: 6}},
		{"own GPU first", []int32{1, 0, 5}, 0, map[SGLangVariant]int32{
			SGLangStaticPlain: 1, SGLangStaticNode: 1, SGLangStaticNodeNarrow: 1, SGLangStaticGPUOnly: 1}},
		{"same node narrows", []int32{2, 6}, 0, map[SGLangVariant]int32{
			SGLangStaticPlain: -1, SGLangStaticNode: 2, SGLangStaticNodeNarrow: 2, SGLangStaticGPUOnly: -1}},
		{"all copies on the node", []int32{3, 2}, 0, map[SGLangVariant]int32{
			SGLangStaticPlain: -1, SGLangStaticNode: 3, SGLangStaticNodeNarrow: -1, SGLangStaticGPUOnly: -1}},
		{"no copy on the node", []int32{4, 7}, 1, map[SGLangVariant]int32{
			SGLangStaticPlain: -1, SGLangStaticNode: -1, SGLangStaticNodeNarrow: -1, SGLangStaticGPUOnly: -1}},
	}
	for _, c := range cases {
		for v, want := range c.want {
			assert.Equal(t, want, SGLangNearest(c.cands, c.rank, 2, 2, v), "%s, %v", c.name, v)
		}
	}
}

func TestParseSGLangVariant(t *testing.T) {
	for _, v := range SGLangVariants() {
		got, err := ParseSGLangVariant(v.String())
		require.NoError(t, err)
		assert.Equal(t, v, got)
	}
	_, err := ParseSGLangVariant("sglang-dynamic")
	assert.ErrorContains(t, err, "sglang-static-node-narrow")
}

func TestSGLangStaticTableErrors(t *testing.T) {
	ok := [][][]int32{{{0}, {1}}}
	cases := []struct {
		name  string
		cands [][][]int32
		ep    int
		node  int
		v     SGLangVariant
		want  string
	}{
		{"unknown variant", ok, 2, 1, 0, "unknown SGLang static dispatch"},
		{"ep size", ok, 0, 1, SGLangStaticPlain, "ep_size 0"},
		{"node size", ok, 2, 3, SGLangStaticNode, "gpus per node 3"},
		{"empty list", [][][]int32{{{0}, {}}}, 2, 1, SGLangStaticPlain, "layer 0 expert 1 has no physical copy"},
		{"id out of range", [][][]int32{{{0}, {2}}}, 2, 1, SGLangStaticPlain, "physical id 2 outside [0,2)"},
		{"ragged layers", [][][]int32{{{0}, {1}}, {{0}}}, 2, 1, SGLangStaticPlain, "layer 1 has 1 experts"},
	}
	for _, c := range cases {
		_, err := SGLangStaticTable(c.cands, c.ep, 1, c.node, c.v, SGLangInitByMapping)
		assert.ErrorContains(t, err, c.want, c.name)
	}
	_, err := CandidatesFromPhy2Log([][]int32{{0, 0}}, 2)
	assert.ErrorContains(t, err, "no copy of logical expert 1")
	_, err = CandidatesFromPhy2Log([][]int32{{0, 2}}, 2)
	assert.ErrorContains(t, err, "layer 0 slot 1: logical expert 2")
}

func TestFairChoices(t *testing.T) {
	// Each position gets floor(k/n) or ceil(k/n) ranks.
	r := pyrand.New(42)
	for n := 1; n < 12; n++ {
		for k := 0; k < 40; k++ {
			got := FairChoices(r, n, k, nil)
			require.Len(t, got, k)
			count := make([]int, n)
			for _, p := range got {
				count[p]++
			}
			for _, c := range count {
				assert.True(t, c == k/n || c == k/n+1, "n=%d k=%d counts %v", n, k, count)
			}
		}
	}
	before := pyrand.New(7)
	after := before.Clone()
	assert.Empty(t, FairChoices(after, 3, 0, nil))
	assert.Equal(t, before.Uint32(), after.Uint32(), "k=0 must draw nothing")
}

// randomPhy2Log draws one layer map: every expert once, the rest random.
func randomPhy2Log(rng *rand.Rand, layers, slots, experts int) [][]int32 {
	out := make([][]int32, layers)
	for l := range out {
		row := make([]int32, slots)
		for p := range row {
			if p < experts {
				row[p] = int32(p)
			} else {
				row[p] = int32(rng.IntN(experts))
			}
		}
		rng.Shuffle(len(row), func(i, j int) { row[i], row[j] = row[j], row[i] })
		out[l] = row
	}
	return out
}

type dealKey struct{ n, k int }

// dealShape returns, per (layer, expert), the (n, k) of its deal and the
// dealt ranks.
func dealShape(cands [][][]int32, ep, perGPU, perNode int, v SGLangVariant) ([][]dealKey, [][][]int32) {
	keys := make([][]dealKey, len(cands))
	dealt := make([][][]int32, len(cands))
	for l := range cands {
		keys[l] = make([]dealKey, len(cands[l]))
		dealt[l] = make([][]int32, len(cands[l]))
		for e, c := range cands[l] {
			d := SGLangDealtRanks(c, ep, perGPU, perNode, v, nil)
			keys[l][e] = dealKey{len(c), len(d)}
			dealt[l][e] = d
		}
	}
	return keys, dealt
}

// TestSGLangStreamConsumption proves the rule SGLangStaticTable documents: a
// swap of two slots that leaves every deal's (n, k) and dealt ranks as they
// were leaves every other (layer, expert)'s entries unchanged for every rank;
// a swap that changes a deal's k shifts the stream, so later entries change
// (until the shifted stream falls back in step: see SGLangStaticTable).
func TestSGLangStreamConsumption(t *testing.T) {
	const ep, perGPU, perNode, experts, layers = 16, 3, 4, 32, 4
	rng := rand.New(rand.NewPCG(1, 2))
	for _, v := range SGLangVariants() {
		for _, init := range []SGLangInit{SGLangInitByMapping, SGLangInitByEPLB} {
			t.Run(v.String()+"/"+init.String(), func(t *testing.T) {
				same, shifted, moved, resynced := 0, 0, 0, 0
				for trial := 0; trial < 600 && (same < 5 || moved < 3); trial++ {
					phy := randomPhy2Log(rng, layers, ep*perGPU, experts)
					cands, err := CandidatesFromPhy2Log(phy, experts)
					require.NoError(t, err)
					before, err := SGLangStaticTable(cands, ep, perGPU, perNode, v, init)
					require.NoError(t, err)
					keys0, dealt0 := dealShape(cands, ep, perGPU, perNode, v)
					// swap two slots of one early layer holding different experts
					l := rng.IntN(2)
					p1, p2 := rng.IntN(ep*perGPU), rng.IntN(ep*perGPU)
					x, y := phy[l][p1], phy[l][p2]
					if x == y {
						continue
					}
					phy[l][p1], phy[l][p2] = y, x
					cands2, err := CandidatesFromPhy2Log(phy, experts)
					require.NoError(t, err)
					after, err := SGLangStaticTable(cands2, ep, perGPU, perNode, v, init)
					require.NoError(t, err)
					keys1, dealt1 := dealShape(cands2, ep, perGPU, perNode, v)
					unchanged := keys0[l][x] == keys1[l][x] && keys0[l][y] == keys1[l][y] &&
						fmt.Sprint(dealt0[l][x], dealt0[l][y]) == fmt.Sprint(dealt1[l][x], dealt1[l][y])
					if unchanged {
						same++
						for r := 0; r < ep; r++ {
							for ll := 0; ll < layers; ll++ {
								for e := 0; e < experts; e++ {
									if ll == l && (e == int(x) || e == int(y)) {
										continue
									}
									require.Equal(t, before[r][ll][e], after[r][ll][e], "rank %d layer %d expert %d", r, ll, e)
								}
							}
						}
						continue
					}
					if keys0[l][x].k == keys1[l][x].k && keys0[l][y].k == keys1[l][y].k {
						continue // the same counts, other ranks dealt: not the case under test
					}
					shifted++
					later := false
					for r := 0; r < ep && !later; r++ {
						for ll := l; ll < layers && !later; ll++ {
							for e := 0; e < experts; e++ {
								if ll == l && e <= int(max(x, y)) {
									continue
								}
								if before[r][ll][e] != after[r][ll][e] {
									later = true
									break
								}
							}
						}
					}
					if later {
						moved++
					} else {
						resynced++
					}
				}
				assert.GreaterOrEqual(t, same, 5, "too few count-preserving swaps drawn")
				assert.GreaterOrEqual(t, moved, 3, "a changed deal count must shift later deals (%d of %d count-changing swaps did)", moved, shifted)
				t.Logf("%d count-preserving swaps; %d count-changing, of which %d moved later deals and %d re-aligned before any", same, shifted, moved, resynced)
			})
		}
	}
}

func BenchmarkSGLangStaticTable(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	phy := randomPhy2Log(rng, 58, 288, 256)
	cands, err := CandidatesFromPhy2Log(phy, 256)
	require.NoError(b, err)
	for _, v := range []SGLangVariant{SGLangStaticPlain, SGLangStaticNodeNarrow} {
		b.Run(v.String(), func(b *testing.B) {
			for b.Loop() {
				if _, err := SGLangStaticTable(cands, 32, 9, 8, v, SGLangInitByMapping); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
