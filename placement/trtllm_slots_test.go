package placement

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadTRTLLMSlots reads a load-balancer YAML in TensorRT-LLM's slot
// order, keeping two copies of one expert on one rank as two slots (the
// Plan merges them), with no GPU count needed.
func TestReadTRTLLMSlots(t *testing.T) {
	doc := "num_slots: 4\ninitial_global_assignments:\n  5: [2, 1, 0, 2]\n  3: [0, 0, 1, 2]\nlayer_updates_per_iter: 0\n"
	layers, slots, err := ReadTRTLLMSlots(strings.NewReader(doc))
	require.NoError(t, err)
	assert.Equal(t, []int{3, 5}, layers)
	assert.Equal(t, [][]int{{0, 0, 1, 2}, {2, 1, 0, 2}}, slots)
	p, err := ReadWith(strings.NewReader(doc), FormatTRTLLM, Layout{GPUs: 2})
	require.NoError(t, err)
	assert.Equal(t, 3, p.Slots(0), "the plan merges the two copies on rank 0")

	for _, tc := range []struct{ doc, msg string }{
		{"num_slots: 4\ninitial_global_assignments:\n  3: [0, 1, 2]\n", "initial_global_assignments[3] has 3 entries, want num_slots 4"},
		{"num_slots: 2\ninitial_global_assignments:\n  3: [0, -1]\n", "initial_global_assignments[3][1] is -1"},
		{"num_slots: 2\nep_sizes: 2\ninitial_global_assignments:\n  3: [0, 1]\n", "field ep_sizes not found"},
		{"num_slots: 0\ninitial_global_assignments:\n  3: []\n", "num_slots"},
	} {
		_, _, err := ReadTRTLLMSlots(strings.NewReader(tc.doc))
		require.Error(t, err, tc.doc)
		assert.Contains(t, err.Error(), tc.msg)
	}
}

// FuzzReadTRTLLMSlots: whatever ReadTRTLLMSlots accepts has one ascending,
// non-negative layer per list and num_slots non-negative ids in each, and
// every file it accepts with a divisor of num_slots as GPU count reads as
// a plan with no more slots (a Plan merges same-rank copies).
func FuzzReadTRTLLMSlots(f *testing.F) {
	f.Add([]byte("num_slots: 6\ninitial_global_assignments:\n  5: [0, 0, 1, 2, 0, 3]\nlayer_updates_per_iter: 0\n"))
	f.Add([]byte("num_slots: 4\nep_size: 2\ninitial_global_assignments:\n  1: [0, 1, 2, 0]\n  3: [2, 0, 1, 0]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxFuzzBytes {
			t.Skip("input too large")
		}
		layers, slots, err := ReadTRTLLMSlots(bytes.NewReader(data))
		if err != nil {
			require.Nil(t, slots)
			return
		}
		require.Len(t, slots, len(layers))
		require.NotEmpty(t, slots)
		for i, row := range slots {
			require.Len(t, row, len(slots[0]))
			require.GreaterOrEqual(t, layers[i], 0)
			if i > 0 {
				require.Less(t, layers[i-1], layers[i])
			}
			for _, e := range row {
				require.GreaterOrEqual(t, e, 0)
			}
		}
		if p, err := ReadWith(bytes.NewReader(data), FormatTRTLLM, Layout{GPUs: 1}); err == nil {
			require.Len(t, p.Layers, len(slots))
			require.LessOrEqual(t, p.Slots(0), len(slots[0]))
		}
	})
}
