package placement

import (
	"errors"
	"fmt"
)

// Layout is what a placement file may not record about the deployment it
// is for: the expert-parallel size, the number of logical experts, and
// where the plan's layers (one per MoE layer) sit among the model's
// decoder layers. Readers take from it what the file lacks and check it
// against what the file records; writers of files indexed by decoder layer
// (FormatSGLang, FormatTRTLLM) need the layer fields. The zero value knows
// nothing: it is enough for the formats that record everything
// (FormatJSON, FormatYAML, FormatEPLB with num_gpus, FormatVLLMAscend).
type Layout struct {
	// GPUs is the expert-parallel size (ep_size). Readers use it for files
	// that do not record it and fail with a *GPUCountError when a file
	// records another; 0 means unknown, and reading a file that does not
	// record it then fails with an error wrapping ErrNeedGPUs. Writers
	// ignore it.
	GPUs int
	// Experts is the number of logical experts per layer; 0 means unknown.
	// Readers of files that do not record it (SGLang and vLLM maps,
	// TensorRT-LLM) use it, else take the largest expert id plus one;
	// readers and writers check plans against it.
	Experts int
	// Layers is the number of MoE layers (plan layers); 0 means
	// len(LayerIDs) when LayerIDs is set, else ModelLayers (every decoder
	// layer is a MoE layer), else unknown.
	Layers int
	// LayerIDs[l] is the decoder-layer index of plan layer l, strictly
	// ascending (routing.Stats.LayerNames of a trace); nil means plan layer
	// l is decoder layer l, which is known only when ModelLayers is set
	// and Layers is 0 or equal to it.
	LayerIDs []int
	// ModelLayers is the model's number of decoder layers, dense ones
	// included (num_hidden_layers, SGLang's L_all); 0 means unknown.
	ModelLayers int
}

// ErrNeedGPUs is wrapped by the errors of readers that were not given the
// GPU count (Layout.GPUs) for a file that does not record it.
var ErrNeedGPUs = errors.New("placement: the file does not record the GPU count; set Layout.GPUs")

// ErrNeedLayers is wrapped by the errors of readers and writers that need
// to know where the plan's layers sit among the model's decoder layers
// (Layout.LayerIDs, Layout.ModelLayers or Layout.Layers) and were not told.
var ErrNeedLayers = errors.New("placement: the layout does not say which decoder layers are MoE layers")

// needError is an ErrNeedGPUs or ErrNeedLayers with a message for one
// format.
type needError struct {
	msg string
	err error
}

func (e *needError) Error() string { return e.msg }
func (e *needError) Unwrap() error { return e.err }

func needGPUs(format, what string) error {
	return &needError{fmt.Sprintf("placement: %s: %s does not record the GPU count; set Layout.GPUs to the expert-parallel size", format, what), ErrNeedGPUs}
}

func needLayers(format, msg string, args ...any) error {
	return &needError{fmt.Sprintf("placement: "+format+": "+msg, args...), ErrNeedLayers}
}

// GPUCountError reports a file that records an expert-parallel size other
// than Layout.GPUs.
type GPUCountError struct {
	// Format is the file's format and Field where the file records the
	// count ("gpus", "num_gpus", "device_count", "ep_size").
	Format Format
	Field  string
	// File is the count in the file, Given Layout.GPUs.
	File, Given int
}

// Error names both counts.
func (e *GPUCountError) Error() string {
	return fmt.Sprintf("placement: %s: the file records %d GPUs (%s) but Layout.GPUs is %d; read it for the expert-parallel size it was written for", e.Format, e.File, e.Field, e.Given)
}

// maxLayers bounds the layer counts a Layout may ask readers to build
// (Layers, ModelLayers): far above any model, low enough that a map
// repeated for every layer cannot exhaust memory.
const maxLayers = 1 << 12

// check reports a Layout that contradicts itself.
func (l Layout) check() error {
	switch {
	case l.GPUs < 0 || l.GPUs > MaxGPUs:
		return fmt.Errorf("placement: Layout.GPUs is %d; want the expert-parallel size in [1,%d], or 0 when unknown", l.GPUs, MaxGPUs)
	case l.Experts < 0 || l.Experts > MaxExperts:
		return fmt.Errorf("placement: Layout.Experts is %d; want the logical experts per layer in [1,%d], or 0 when unknown", l.Experts, MaxExperts)
	case l.Layers < 0 || l.Layers > maxLayers:
		return fmt.Errorf("placement: Layout.Layers is %d; want the MoE layers in [1,%d], or 0 when unknown", l.Layers, maxLayers)
	case l.ModelLayers < 0 || l.ModelLayers > maxLayers:
		return fmt.Errorf("placement: Layout.ModelLayers is %d; want the decoder layers in [1,%d], or 0 when unknown", l.ModelLayers, maxLayers)
	case l.LayerIDs != nil && len(l.LayerIDs) == 0:
		return errors.New("placement: Layout.LayerIDs is empty; list the decoder-layer index of every MoE layer, or leave it nil")
	case l.LayerIDs != nil && l.Layers != 0 && l.Layers != len(l.LayerIDs):
		return fmt.Errorf("placement: Layout.Layers is %d but Layout.LayerIDs lists %d layers; make them agree", l.Layers, len(l.LayerIDs))
	case l.ModelLayers != 0 && l.Layers > l.ModelLayers:
		return fmt.Errorf("placement: Layout.Layers is %d but Layout.ModelLayers is %d; a model has at least as many decoder layers as MoE layers", l.Layers, l.ModelLayers)
	}
	for i, id := range l.LayerIDs {
		if id < 0 || (i > 0 && id <= l.LayerIDs[i-1]) || (l.ModelLayers > 0 && id >= l.ModelLayers) || id >= maxLayers {
			top := l.ModelLayers
			if top == 0 {
				top = maxLayers
			}
			return fmt.Errorf("placement: Layout.LayerIDs[%d] is %d; want strictly ascending decoder-layer indices in [0,%d)", i, id, top)
		}
	}
	return nil
}

// moeLayers returns the number of MoE layers l describes, 0 when unknown.
func (l Layout) moeLayers() int {
	switch {
	case l.LayerIDs != nil:
		return len(l.LayerIDs)
	case l.Layers > 0:
		return l.Layers
	}
	return l.ModelLayers
}

// decoderIDs returns the decoder-layer index of every MoE layer, or nil
// when l does not say.
func (l Layout) decoderIDs() []int {
	if l.LayerIDs != nil {
		return l.LayerIDs
	}
	if l.ModelLayers > 0 && (l.Layers == 0 || l.Layers == l.ModelLayers) {
		ids := make([]int, l.ModelLayers)
		for i := range ids {
			ids[i] = i
		}
		return ids
	}
	return nil
}

// CheckLayout reports whether a plan of l.Layers layers (when set) can be
// written in format f with layout l, before any plan exists: it returns the
// error the writer would return for the layout (wrapping ErrNeedLayers
// where the layout lacks what f needs), or nil. Use it to fail before a
// long solve.
func CheckLayout(f Format, l Layout) error {
	if err := l.check(); err != nil {
		return err
	}
	switch f {
	case FormatSGLang:
		return sglangLayoutError(l, "sglang", "physical_to_logical_map")
	case FormatSGLangPT:
		return sglangLayoutError(l, "sglang-pt", "physical_to_logical_map")
	case FormatTRTLLM:
		if l.decoderIDs() == nil {
			return needLayers("trtllm", "initial_global_assignments is keyed by decoder-layer index, and the layout does not say which decoder layers the MoE layers are; set Layout.LayerIDs, or Layout.ModelLayers when every decoder layer is a MoE layer")
		}
	case FormatJSON, FormatYAML, FormatEPLB, FormatVLLM, FormatVLLMMap, FormatVLLMMapping, FormatVLLMAscend:
	default:
		return unknownFormat(f)
	}
	return nil
}

// CountError reports a plan, or a file, whose count of MoE layers,
// decoder layers or experts differs from the Layout's: the plan is for
// another model (or the Layout is).
type CountError struct {
	// Format is the file's format, empty for a plan checked on its own.
	Format Format
	// Subject is what has the count: "the plan", or a format's own field
	// ("physical_to_logical_map", whose rows are decoder layers).
	Subject string
	// What is counted: "MoE layers", "decoder layers" or "experts per
	// layer".
	What string
	// LayoutField is the Layout field the count was checked against:
	// "Layout.Layers", "Layout.LayerIDs" (its length), "Layout.ModelLayers"
	// or "Layout.Experts".
	LayoutField string
	// File is the count of the file or plan, Given the Layout's.
	File, Given int
}

// Error names both counts and the Layout field.
func (e *CountError) Error() string {
	prefix := "placement: "
	if e.Format != "" {
		prefix += string(e.Format) + ": "
	}
	given := e.LayoutField + " is"
	if e.LayoutField == "Layout.LayerIDs" {
		given = e.LayoutField + " lists"
	}
	return fmt.Sprintf("%s%s has %d %s but %s %d; use the Layout of the model the plan is for, or make a plan for this one", prefix, e.Subject, e.File, e.What, given, e.Given)
}

// checkPlanLayout checks p, read or to be written in format f, against
// what l knows: its layer and expert counts (a *CountError), then the
// structural rules.
func checkPlanLayout(p *Plan, f Format, l Layout) error {
	if l.Experts != 0 && p.Experts != l.Experts {
		return &CountError{Format: f, Subject: "the plan", What: "experts per layer", LayoutField: "Layout.Experts", File: p.Experts, Given: l.Experts}
	}
	if n := l.moeLayers(); n != 0 && len(p.Layers) != n {
		return &CountError{Format: f, Subject: "the plan", What: "MoE layers", LayoutField: l.layersField(), File: len(p.Layers), Given: n}
	}
	return p.Validate(ValidateOptions{})
}

// layersField names the field moeLayers takes its count from.
func (l Layout) layersField() string {
	switch {
	case l.LayerIDs != nil:
		return "Layout.LayerIDs"
	case l.Layers > 0:
		return "Layout.Layers"
	}
	return "Layout.ModelLayers"
}
