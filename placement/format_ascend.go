package placement

import (
	"errors"
	"fmt"
)

type ascendDoc struct {
	MoELayerCount *int          `json:"moe_layer_count"`
	LayerList     []ascendLayer `json:"layer_list"`
}

type ascendLayer struct {
	LayerID     *int           `json:"layer_id"`
	DeviceCount *int           `json:"device_count"`
	DeviceList  []ascendDevice `json:"device_list"`
}

type ascendDevice struct {
	DeviceID     *int  `json:"device_id"`
	DeviceExpert []int `json:"device_expert"`
}

// encodeAscend writes the vllm-ascend / MindIE device-list JSON, one line
// per MoE layer. vllm-ascend (main after #5533) reads it from
// additional_config["eplb_config"]["expert_map_path"]: init_eplb_config and
// expert_file_to_tensor (vllm_ascend/eplb/core/eplb_utils.py) take
// layer_list by position for each MoE layer, device_list[r] as rank r's
// slots stacked into one tensor (the same count on every device), and the
// redundant count as the slots minus the experts, which
// eplb_config.num_redundant_experts must match.
func encodeAscend(p *Plan) ([]byte, error) {
	rows, err := rankMajor(p, "vllm-ascend", "vllm-ascend")
	if err != nil {
		return nil, err
	}
	per := len(rows[0]) / p.GPUs
	b := fmt.Appendf(nil, "{\n  \"moe_layer_count\": %d,\n  \"layer_list\": [\n", len(rows))
	for l, row := range rows {
		b = fmt.Appendf(b, "    {\"layer_id\": %d, \"device_count\": %d, \"device_list\": [", l, p.GPUs)
		for g := range p.GPUs {
			if g > 0 {
				b = append(b, ", "...)
			}
			b = fmt.Appendf(b, "{\"device_id\": %d, \"device_expert\": ", g)
			b = appendInts(b, row[g*per:(g+1)*per])
			b = append(b, '}')
		}
		b = append(b, "]}"...)
		b = appendRowEnd(b, l, len(rows))
	}
	return append(b, "  ]\n}\n"...), nil
}

// decodeAscend reads the device-list JSON as vllm-ascend does: layers in
// list order (layer_id is not used), devices in list order (device_id,
// where given, must be the position), every device the same number of
// slots in every layer (vllm-ascend stacks the lists into one tensor).
func decodeAscend(data []byte, l Layout) (*Plan, error) {
	var d ascendDoc
	if err := strictJSON(data, &d); err != nil {
		return nil, fmt.Errorf("placement: vllm-ascend: %v; want {\"moe_layer_count\": L, \"layer_list\": [{\"layer_id\", \"device_count\", \"device_list\": [{\"device_id\", \"device_expert\": [...]}]}]}", err)
	}
	switch {
	case d.MoELayerCount == nil:
		return nil, errors.New("placement: vllm-ascend: missing \"moe_layer_count\"; add the number of MoE layers")
	case len(d.LayerList) == 0:
		return nil, errors.New("placement: vllm-ascend: missing or empty \"layer_list\"; add one entry per MoE layer")
	case *d.MoELayerCount != len(d.LayerList):
		return nil, fmt.Errorf("placement: vllm-ascend: moe_layer_count is %d but layer_list has %d layers; make them agree", *d.MoELayerCount, len(d.LayerList))
	}
	gpus, per := 0, -1
	var rows [][]int
	for i, layer := range d.LayerList {
		switch {
		case layer.DeviceCount == nil:
			return nil, fmt.Errorf("placement: vllm-ascend: layer_list[%d]: missing \"device_count\"; add the number of devices (EP ranks)", i)
		case *layer.DeviceCount != len(layer.DeviceList):
			return nil, fmt.Errorf("placement: vllm-ascend: layer_list[%d]: device_count is %d but device_list has %d devices; make them agree", i, *layer.DeviceCount, len(layer.DeviceList))
		case i == 0:
			gpus = *layer.DeviceCount
			if gpus < 1 || gpus > MaxGPUs {
				return nil, fmt.Errorf("placement: vllm-ascend: layer_list[0]: device_count is %d; need the number of devices, in [1,%d]", gpus, MaxGPUs)
			}
			if l.GPUs != 0 && gpus != l.GPUs {
				return nil, &GPUCountError{Format: FormatVLLMAscend, Field: "device_count", File: gpus, Given: l.GPUs}
			}
		case *layer.DeviceCount != gpus:
			return nil, fmt.Errorf("placement: vllm-ascend: layer_list[%d]: device_count is %d but layer_list[0] has %d; every layer needs the same devices", i, *layer.DeviceCount, gpus)
		}
		row := make([]int, 0, gpus*max(per, 0))
		for g, dev := range layer.DeviceList {
			switch {
			case dev.DeviceID != nil && *dev.DeviceID != g:
				return nil, fmt.Errorf("placement: vllm-ascend: layer_list[%d].device_list[%d] has device_id %d; vllm-ascend takes devices in list order, so list them by device_id 0..%d", i, g, *dev.DeviceID, gpus-1)
			case dev.DeviceExpert == nil:
				return nil, fmt.Errorf("placement: vllm-ascend: layer_list[%d].device_list[%d]: missing \"device_expert\"; add the logical experts of the device's slots", i, g)
			case per < 0:
				per = len(dev.DeviceExpert)
				if per == 0 {
					return nil, fmt.Errorf("placement: vllm-ascend: layer_list[%d].device_list[%d]: device_expert is empty; give every device at least one expert", i, g)
				}
			case len(dev.DeviceExpert) != per:
				return nil, fmt.Errorf("placement: vllm-ascend: layer_list[%d].device_list[%d] holds %d experts but layer_list[0].device_list[0] holds %d; vllm-ascend needs the same number on every device in every layer", i, g, len(dev.DeviceExpert), per)
			}
			row = append(row, dev.DeviceExpert...)
		}
		rows = append(rows, row)
	}
	return buildValid(rows, gpus, l.Experts, rowSpec{
		format: "vllm-ascend", stack: "vllm-ascend",
		cell: func(i, s int) string {
			return fmt.Sprintf("layer_list[%d].device_list[%d].device_expert[%d]", i, s/per, s%per)
		},
		list: func(i int) string { return fmt.Sprintf("layer_list[%d]", i) },
	})
}
