package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/baseline"
	"github.com/moetuner/moetuner/costmodel"
	"github.com/moetuner/moetuner/placement"
	"github.com/moetuner/moetuner/routing"
)

// eplbDealCase is the input scripts/sglang_dispatch.py reads (candidate
// lists for every decoder row, init_by_eplb) and the table it writes.
type eplbDealCase struct {
	Candidates  [][][]int32 `json:"candidates"`
	NumPhysical int         `json:"num_physical"`
	EPSize      int         `json:"ep_size"`
	GPUsPerNode int         `json:"gpus_per_node"`
	Variant     string      `json:"variant"`
	Init        string      `json:"init"`
	Table       [][][]int32 `json:"table,omitempty"`
}

// stackCandidates is what SGLang's init_by_eplb holds for plan (with
// Plan.StackEPLB) under layout: per decoder row, the algorithm's log2phy
// (Unrouted for the rows of no MoE layer).
func stackCandidates(plan *placement.Plan, layout placement.Layout) [][][]int32 {
	out := make([][][]int32, layout.ModelLayers)
	for r := range out {
		out[r] = plan.StackEPLB.Unrouted
	}
	for l, r := range layout.LayerIDs {
		out[r] = plan.StackEPLB.Log2Phy[l]
	}
	return out
}

// checkSplitAgainstTable requires the splitter NewSplitter binds to plan
// under dispatch d to send every rank's tokens of every (layer, expert)
// whole to the GPU of table[rank][row][expert].
func checkSplitAgainstTable(t *testing.T, d placement.Dispatch, plan *placement.Plan, layout placement.Layout, G, perNode int, table [][][]int32) {
	t.Helper()
	sp, err := costmodel.NewSplitter(d, plan, G, perNode, layout)
	require.NoError(t, err)
	S := int32(len(plan.Layers[0].SlotExpert) / G)
	for l, row := range layout.LayerIDs {
		for e := range plan.Experts {
			var gpus, slots []int32
			for s, x := range plan.Layers[l].SlotExpert {
				if int(x) != e {
					continue
				}
				g := int32(plan.Layers[l].SlotGPU[s])
				if i := slices.Index(gpus, g); i >= 0 {
					slots[i]++
				} else {
					gpus, slots = append(gpus, g), append(slots, 1)
				}
			}
			frac := make([]float64, G*len(gpus))
			require.True(t, sp.Split(l, e, gpus, slots, frac), "layer %d expert %d: the bound plan's split is exact", l, e)
			for h := range G {
				want := slices.Index(gpus, table[h][row][e]/S)
				require.GreaterOrEqual(t, want, 0, "rank %d layer %d expert %d: table names GPU %d, no copy there", h, l, e, table[h][row][e]/S)
				require.Equal(t, 1.0, frac[h*len(gpus)+want], "rank %d layer %d (row %d) expert %d: %s init_by_eplb", h, l, row, e, d)
			}
		}
	}
}

// runDealScript runs scripts/sglang_dispatch.py on c and returns its table.
func runDealScript(t *testing.T, py string, c eplbDealCase) [][][]int32 {
	t.Helper()
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.json"), filepath.Join(dir, "out.json")
	b, err := json.Marshal(c)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(in, b, 0o644))
	msg, err := exec.Command(py, filepath.Join("..", "..", "scripts", "sglang_dispatch.py"), in, out).CombinedOutput()
	require.NoError(t, err, "%s", msg)
	var got eplbDealCase
	b, err = os.ReadFile(out)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &got))
	return got.Table
}

// flameStackEPLB is EPLB's plan of the bundled FLAME trace (8 MoE layers at
// decoder layers 2-9 of 10, 64 experts, 8 GPUs on 2 nodes, 16 redundant
// slots) as the stack computes it itself, hierarchical (4 groups) or not.
func flameStackEPLB(t *testing.T, hier bool) (*placement.Plan, placement.Layout) {
	t.Helper()
	src, err := routing.Load(filepath.Join("..", "..", "testdata", "flame-moe-290m", "trace.jsonl"), routing.LoadOptions{NoPatterns: true})
	require.NoError(t, err)
	opts := baseline.EPLBOptions{RedundantSlots: 16, Nodes: 2, FixDuplicates: true, StackEPLB: true}
	if hier {
		opts.Groups = 4
	}
	plan, err := baseline.EPLB(src.Stats, 8, opts)
	require.NoError(t, err)
	require.NotNil(t, plan.StackEPLB)
	layout := placement.Layout{GPUs: 8, Experts: 64, ModelLayers: 10, LayerIDs: []int{2, 3, 4, 5, 6, 7, 8, 9}}
	return plan, layout
}

// stackEPLBGolden is the table scripts/sglang_dispatch.py wrote for the
// FLAME plan of flameStackEPLB(hier=true) under sglang-static-node-narrow;
// regenerate with MOETUNER_WRITE_GOLDEN=1 (needs python3).
const stackEPLBGolden = "testdata/stack_eplb_flame_node_narrow.json"

// TestStackEPLBDealGolden: the deal NewSplitter uses for a plan the stack
// computed itself (init_by_eplb) equals the table Python's own random
// wrote for that plan's log2phy, kept in testdata so that it runs without
// python; and the golden's input is still what baseline.EPLB gives.
func TestStackEPLBDealGolden(t *testing.T) {
	plan, layout := flameStackEPLB(t, true)
	c := eplbDealCase{Candidates: stackCandidates(plan, layout), NumPhysical: 80, EPSize: 8, GPUsPerNode: 4, Variant: "sglang-static-node-narrow", Init: "init_by_eplb"}
	if os.Getenv("MOETUNER_WRITE_GOLDEN") != "" {
		py, err := exec.LookPath("python3")
		require.NoError(t, err)
		c.Table = runDealScript(t, py, c)
		b, err := json.Marshal(c)
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(stackEPLBGolden, append(b, '\n'), 0o644))
	}
	b, err := os.ReadFile(stackEPLBGolden)
	require.NoError(t, err)
	var want eplbDealCase
	require.NoError(t, json.Unmarshal(b, &want))
	require.Equal(t, c.Candidates, want.Candidates, "baseline.EPLB's log2phy changed; regenerate %s", stackEPLBGolden)
	checkSplitAgainstTable(t, placement.DispatchSGLangStaticNarrow, plan, layout, 8, 4, want.Table)
}

// TestStackEPLBDealAgainstPython compares the init_by_eplb deal with
// scripts/sglang_dispatch.py (Python's own random) under every tree of
// SGLang's static table, on EPLB's plans of the bundled FLAME trace
// (global and hierarchical, dense rows before the MoE rows) and on random
// plans with a random replica order; it skips without python3.
func TestStackEPLBDealAgainstPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not on PATH")
	}
	type tcase struct {
		name   string
		plan   *placement.Plan
		layout placement.Layout
	}
	var cases []tcase
	for _, hier := range []bool{false, true} {
		plan, layout := flameStackEPLB(t, hier)
		cases = append(cases, tcase{fmt.Sprintf("flame-hier=%v", hier), plan, layout})
	}
	seed := rand.Uint64()
	for i := range 3 {
		plan, layout := randomStackEPLB(seed + uint64(i))
		cases = append(cases, tcase{fmt.Sprintf("random-%d", seed+uint64(i)), plan, layout})
	}
	for _, tc := range cases {
		for _, d := range sglangStaticTrees {
			disp, err := placement.ParseDispatch(d)
			require.NoError(t, err)
			G := tc.layout.GPUs
			c := eplbDealCase{Candidates: stackCandidates(tc.plan, tc.layout), NumPhysical: len(tc.plan.Layers[0].SlotExpert),
				EPSize: G, GPUsPerNode: G / 2, Variant: d, Init: "init_by_eplb"}
			table := runDealScript(t, py, c)
			t.Run(tc.name+"/"+d, func(t *testing.T) {
				checkSplitAgainstTable(t, disp, tc.plan, tc.layout, G, G/2, table)
			})
		}
	}
}

// randomStackEPLB is a random GPU-major plan (2 nodes of 2 or 4 GPUs, 2-4
// slots per GPU, 1-3 layers after one or two dense rows) with a random
// replica order of every expert's copies and random dense-row lists.
func randomStackEPLB(seed uint64) (*placement.Plan, placement.Layout) {
	r := rand.New(rand.NewPCG(seed, 36))
	G := 2 * (2 + 2*r.IntN(2))
	S := 2 + r.IntN(3)
	P := G * S
	E := P/2 + r.IntN(P/2)
	L, dense := 1+r.IntN(3), 1+r.IntN(2)
	randomRow := func() ([]int, [][]int32) {
		row := make([]int, P)
		for p := range row {
			row[p] = p % E
			if p >= E {
				row[p] = r.IntN(E)
			}
		}
		r.Shuffle(P, func(i, j int) { row[i], row[j] = row[j], row[i] })
		log2phy := make([][]int32, E)
		for p, e := range row {
			log2phy[e] = append(log2phy[e], int32(p))
		}
		for _, c := range log2phy {
			r.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
		}
		return row, log2phy
	}
	plan := &placement.Plan{GPUs: G, Experts: E, Layers: make([]placement.LayerPlan, L), StackEPLB: &placement.StackEPLB{}}
	for l := range L {
		row, log2phy := randomRow()
		lp := placement.LayerPlan{}
		for p, e := range row {
			lp.SlotExpert = append(lp.SlotExpert, routing.Expert(e))
			lp.SlotGPU = append(lp.SlotGPU, placement.GPU(p/S))
		}
		plan.Layers[l] = lp
		plan.StackEPLB.Log2Phy = append(plan.StackEPLB.Log2Phy, log2phy)
	}
	_, plan.StackEPLB.Unrouted = randomRow()
	layout := placement.Layout{GPUs: G, Experts: E, ModelLayers: dense + L}
	for l := range L {
		layout.LayerIDs = append(layout.LayerIDs, dense+l)
	}
	return plan, layout
}

// TestStackEPLBCompareRecount: compare's EPLB row under SGLang's static
// table, dealt as init_by_eplb, has the busiest/mean (mean over layers and
// worst layer) of an independent recount (scripts/recount_plan.py --init
// init_by_eplb: the table built with Python's own random from EPLB's
// log2phy for every decoder row, every token sent whole to its rank's
// entry); it skips without python3.
func TestStackEPLBCompareRecount(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not on PATH")
	}
	const nodes, perNode, experts, k, layers, decoder, tokens, redundant = 2, 4, 32, 4, 3, 5, 3000, 8
	gpus := nodes * perNode
	dir, err := filepath.Abs(t.TempDir())
	require.NoError(t, err)
	trace := recountTrace(t, dir, 17, tokens, layers, k, experts, gpus)
	model := filepath.Join(dir, "model.yaml")
	require.NoError(t, os.WriteFile(model, fmt.Appendf(nil,
		"name: tiny\nlayers: %d\ndecoder_layers: %d\nexperts: %d\ntop_k: %d\nhidden: 1024\nffn: 512\nbytes_per_activation: 2\n",
		layers, decoder, experts, k), 0o644))
	// The plan compare builds, with the log2phy SGLang holds after
	// init_by_eplb, written as the recount reads it.
	src, err := routing.Load(trace, routing.LoadOptions{})
	require.NoError(t, err)
	plan, err := baseline.EPLB(src.Stats, gpus, baseline.EPLBOptions{RedundantSlots: redundant, Nodes: nodes, FixDuplicates: true, StackEPLB: true})
	require.NoError(t, err)
	layout := placement.Layout{GPUs: gpus, Experts: experts, ModelLayers: decoder, LayerIDs: []int{2, 3, 4}}
	cands := stackCandidates(plan, layout)
	phy2log := make([][]int, decoder)
	for r, rows := range cands {
		phy2log[r] = make([]int, experts+redundant)
		for e, slots := range rows {
			for _, s := range slots {
				phy2log[r][s] = e
			}
		}
	}
	planPath := filepath.Join(dir, "eplb-stack.json")
	b, err := json.Marshal(map[string]any{"physical_to_logical_map": phy2log, "logical_to_all_physical_map": cands})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(planPath, b, 0o644))
	for _, d := range []string{"sglang-static", "sglang-static-node-narrow"} {
		t.Run(d, func(t *testing.T) {
			out := filepath.Join(dir, d+".json")
			code, _, stderr := runCLI(t, "compare", "--trace", trace, "--model", model, "--nodes", fmt.Sprint(nodes), "--gpus-per-node", fmt.Sprint(perNode),
				"--dispatch", d, "--redundant-slots", fmt.Sprint(redundant), "--strategies", "eplb", "--json", out, "--quiet")
			require.Equal(t, 0, code, stderr)
			var cmp struct {
				Results []struct {
					Strategy string  `json:"strategy"`
					Init     string  `json:"sglang_init"`
					Mean     float64 `json:"mean_balance"`
					Max      float64 `json:"max_balance"`
				} `json:"results"`
			}
			b, err := os.ReadFile(out)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(b, &cmp))
			require.Len(t, cmp.Results, 1)
			got := cmp.Results[0]
			require.Equal(t, "init_by_eplb", got.Init)
			msg, err := exec.Command(py, filepath.Join("..", "..", "scripts", "recount_plan.py"), trace, planPath,
				"--gpus", fmt.Sprint(gpus), "--gpus-per-node", fmt.Sprint(perNode), "--dispatch", d, "--init", "init_by_eplb", "--json").Output()
			require.NoError(t, err, "%s", msg)
			var want recount
			require.NoError(t, json.Unmarshal(msg, &want), "%s", msg)
			t.Logf("%s: compare %.6f / %.6f, recount %.6f / %.6f", d, got.Mean, got.Max, want.Mean, want.Max)
			require.InEpsilon(t, want.Mean, got.Mean, 1e-9, "mean busiest/mean, compare vs recount")
			require.InEpsilon(t, want.Max, got.Max, 1e-9, "worst layer busiest/mean, compare vs recount")
		})
	}
}

// TestStackEPLBRowsMarked: under SGLang's static table compare deals the
// stack's own algorithms (eplb, deepseek-vec) as init_by_eplb and flashlb
// as a loaded map; under a dispatch that deals no table no row says
// either.
func TestStackEPLBRowsMarked(t *testing.T) {
	dir, err := filepath.Abs(t.TempDir())
	require.NoError(t, err)
	trace := recountTrace(t, dir, 5, 400, 2, 4, 32, 8)
	model := filepath.Join(dir, "model.yaml")
	require.NoError(t, os.WriteFile(model, []byte("name: tiny\nlayers: 2\ndecoder_layers: 3\nexperts: 32\ntop_k: 4\nhidden: 1024\nffn: 512\nbytes_per_activation: 2\n"), 0o644))
	want := map[string]map[string]string{
		"sglang-static": {"eplb": "init_by_eplb", "deepseek-vec": "init_by_eplb", "flashlb": "init_by_mapping"},
		"even":          {"eplb": "", "deepseek-vec": "", "flashlb": ""},
	}
	for d, rows := range want {
		out := filepath.Join(dir, d+".json")
		code, stdout, stderr := runCLI(t, "compare", "--trace", trace, "--model", model, "--nodes", "2", "--gpus-per-node", "4",
			"--dispatch", d, "--redundant-slots", "8", "--strategies", "eplb,deepseek-vec,flashlb", "--json", out)
		require.Equal(t, 0, code, stderr)
		var cmp struct {
			Results []struct {
				Strategy string `json:"strategy"`
				Init     string `json:"sglang_init"`
			} `json:"results"`
		}
		b, err := os.ReadFile(out)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &cmp))
		got := map[string]string{}
		for _, r := range cmp.Results {
			got[r.Strategy] = r.Init
		}
		require.Equal(t, rows, got, d)
		if d == "even" {
			require.NotContains(t, stdout, "init_by_eplb", d)
		} else {
			require.Contains(t, stdout, "deepseek-vec [init_by_eplb]", d)
		}
	}
}
