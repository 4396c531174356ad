package placement

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidate(t *testing.T) {
	good := func() *Plan { return replicated() }
	cases := []struct {
		name   string
		edit   func(p *Plan)
		opts   ValidateOptions
		want   *ValidationError // nil: valid; Reason matched as substring
		plain  bool             // a non-ValidationError error
		substr string
	}{
		{name: "valid", edit: func(*Plan) {}},
		{name: "valid equal slots layer0 only", edit: func(p *Plan) { p.Layers = p.Layers[:1] }, opts: ValidateOptions{EqualSlots: true}},
		{name: "zero gpus", edit: func(p *Plan) { p.GPUs = 0 }, want: &ValidationError{Layer: -1, Slot: -1, GPU: -1, Expert: -1}, substr: "gpus is 0"},
		{name: "too many gpus", edit: func(p *Plan) { p.GPUs = MaxGPUs + 1 }, want: &ValidationError{Layer: -1, Slot: -1, GPU: -1, Expert: -1}, substr: "gpus is"},
		{name: "zero experts", edit: func(p *Plan) { p.Experts = 0 }, want: &ValidationError{Layer: -1, Slot: -1, GPU: -1, Expert: -1}, substr: "experts is 0"},
		{name: "experts mismatch", edit: func(*Plan) {}, opts: ValidateOptions{Experts: 4}, want: &ValidationError{Layer: -1, Slot: -1, GPU: -1, Expert: -1}, substr: "plan has 3 experts per layer but ValidateOptions.Experts is 4"},
		{name: "layers mismatch", edit: func(*Plan) {}, opts: ValidateOptions{Layers: 3}, want: &ValidationError{Layer: -1, Slot: -1, GPU: -1, Expert: -1}, substr: "plan has 2 layers"},
		{name: "length mismatch", edit: func(p *Plan) { p.Layers[1].SlotGPU = p.Layers[1].SlotGPU[:3] }, want: &ValidationError{Layer: 1, Slot: -1, GPU: -1, Expert: -1}, substr: "slot_expert has 4 slots but slot_gpu has 3"},
		{name: "expert out of range", edit: func(p *Plan) { p.Layers[0].SlotExpert[2] = 3 }, want: &ValidationError{Layer: 0, Slot: 2, GPU: 1, Expert: 3}, substr: "slot 2: expert 3 out of range [0,3)"},
		{name: "negative expert", edit: func(p *Plan) { p.Layers[0].SlotExpert[1] = -1 }, want: &ValidationError{Layer: 0, Slot: 1, GPU: 0, Expert: -1}, substr: "expert -1 out of range"},
		{name: "gpu out of range", edit: func(p *Plan) { p.Layers[1].SlotGPU[3] = 2 }, want: &ValidationError{Layer: 1, Slot: 3, GPU: 2, Expert: 1}, substr: "slot 3: GPU 2 out of range [0,2)"},
		{name: "negative gpu", edit: func(p *Plan) { p.Layers[1].SlotGPU[0] = -1 }, want: &ValidationError{Layer: 1, Slot: 0, GPU: -1, Expert: 1}, substr: "GPU -1 out of range"},
		{name: "two copies on one gpu", edit: func(p *Plan) { p.Layers[0].SlotGPU[3] = 0 }, want: &ValidationError{Layer: 0, Slot: 3, GPU: 0, Expert: 0}, substr: "expert 0 has two copies on GPU 0 (slot 3); remove one"},
		{name: "expert missing", edit: func(p *Plan) {
			p.Layers[1].SlotExpert[1] = 1
			p.Layers[1].SlotGPU[1] = 1
			p.Layers[1].SlotExpert[0] = 0
		}, want: &ValidationError{Layer: 1, Slot: -1, GPU: -1, Expert: 2}, substr: "expert 2 has no slot; place it on at least one GPU"},
		{name: "empty layer", edit: func(p *Plan) { p.Layers[0] = LayerPlan{} }, want: &ValidationError{Layer: 0, Slot: -1, GPU: -1, Expert: 0}, substr: "expert 0 has no slot"},
		{name: "capacity", edit: func(*Plan) {}, opts: ValidateOptions{SlotsPerGPU: []int{2, 2}}, want: &ValidationError{Layer: 1, Slot: -1, GPU: 0, Expert: -1}, substr: "GPU 0 holds 3 slots, capacity 2; move 1 to another GPU"},
		{name: "capacity ok", edit: func(*Plan) {}, opts: ValidateOptions{SlotsPerGPU: []int{3, 2}}},
		{name: "equal slots", edit: func(*Plan) {}, opts: ValidateOptions{EqualSlots: true}, want: &ValidationError{Layer: 1, Slot: -1, GPU: 1, Expert: -1}, substr: "GPU 1 holds 1 slots but GPU 0 holds 3"},
		{name: "equal slots gpu 0 empty", edit: func(p *Plan) {
			*p = Plan{GPUs: 3, Experts: 2, Layers: []LayerPlan{{SlotExpert: ex(0, 1), SlotGPU: gp(1, 2)}}}
		}, opts: ValidateOptions{EqualSlots: true}, want: &ValidationError{Layer: 0, Slot: -1, GPU: 1, Expert: -1}, substr: "GPU 1 holds 1 slots but GPU 0 holds 0"},
		{name: "equal slots gap", edit: func(p *Plan) {
			*p = Plan{GPUs: 3, Experts: 2, Layers: []LayerPlan{{SlotExpert: ex(0, 1), SlotGPU: gp(0, 2)}}}
		}, opts: ValidateOptions{EqualSlots: true}, want: &ValidationError{Layer: 0, Slot: -1, GPU: 1, Expert: -1}, substr: "GPU 1 holds 0 slots but GPU 0 holds 1"},
		{name: "equal slots trailing empty", edit: func(p *Plan) {
			*p = Plan{GPUs: 3, Experts: 2, Layers: []LayerPlan{{SlotExpert: ex(0, 1), SlotGPU: gp(0, 1)}}}
		}, opts: ValidateOptions{EqualSlots: true}, want: &ValidationError{Layer: 0, Slot: -1, GPU: 2, Expert: -1}, substr: "GPU 2 holds 0 slots but GPU 0 holds 1"},
		{name: "equal slots ok", edit: func(p *Plan) {
			*p = Plan{GPUs: 2, Experts: 2, Layers: []LayerPlan{{SlotExpert: ex(1, 0, 0, 1), SlotGPU: gp(1, 1, 0, 0)}}}
		}, opts: ValidateOptions{EqualSlots: true}},
		{name: "negative capacity", edit: func(*Plan) {}, opts: ValidateOptions{SlotsPerGPU: []int{-1, 2}}, plain: true, substr: "SlotsPerGPU[0] is -1"},
		{name: "zero capacity", edit: func(p *Plan) {
			*p = Plan{GPUs: 2, Experts: 1, Layers: []LayerPlan{{SlotExpert: ex(0), SlotGPU: gp(1)}}}
		}, opts: ValidateOptions{SlotsPerGPU: []int{1, 0}}, want: &ValidationError{Layer: 0, Slot: -1, GPU: 1, Expert: -1}, substr: "GPU 1 holds 1 slots, capacity 0"},
		{name: "total memory", edit: func(*Plan) {}, opts: ValidateOptions{TotalExpertsPerGPU: []int{4, 4}}, want: &ValidationError{Layer: -1, Slot: -1, GPU: 0, Expert: -1}, substr: "GPU 0 holds 5 expert copies over all layers, memory for 4; move 1"},
		{name: "total memory ok", edit: func(*Plan) {}, opts: ValidateOptions{TotalExpertsPerGPU: []int{5, 3}}},
		{name: "slots option length", edit: func(*Plan) {}, opts: ValidateOptions{SlotsPerGPU: []int{1}}, plain: true, substr: "SlotsPerGPU has 1 entries for 2 GPUs"},
		{name: "total option length", edit: func(*Plan) {}, opts: ValidateOptions{TotalExpertsPerGPU: []int{1, 2, 3}}, plain: true, substr: "TotalExpertsPerGPU has 3 entries for 2 GPUs"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := good()
			tc.edit(p)
			err := p.Validate(tc.opts)
			if tc.want == nil && !tc.plain {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.substr)
			assert.Regexp(t, `^placement: `, err.Error())
			var ve *ValidationError
			if tc.plain {
				assert.False(t, errors.As(err, &ve))
				return
			}
			require.ErrorAs(t, err, &ve)
			got := *ve
			got.Reason = ""
			assert.Equal(t, *tc.want, got)
		})
	}
}

func TestValidationErrorMessage(t *testing.T) {
	e := &ValidationError{Layer: 3, Slot: -1, GPU: 2, Expert: 5, Reason: "expert 5 has two copies on GPU 2; remove one"}
	assert.Equal(t, "placement: layer 3: expert 5 has two copies on GPU 2; remove one", e.Error())
	e.Layer = -1
	assert.Equal(t, "placement: expert 5 has two copies on GPU 2; remove one", e.Error())
	var p *Plan
	assert.Error(t, p.Validate(ValidateOptions{}))
}
