package placement

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/moetuner/moetuner/routing"
)

// EncodeLogicalCount returns the {"logical_count": [L_all][E]} JSON that
// SGLang's --init-expert-location also takes: per decoder layer (dense
// ones included, as zero rows) the load of every logical expert, from
// which SGLang runs its own EPLB at startup. Row l.LayerIDs[i] (decoder
// layer) holds s.Load[i]; l must know the decoder layers as for
// FormatSGLang (Layout.ModelLayers, and Layout.LayerIDs unless every layer
// is a MoE layer), else the error wraps ErrNeedLayers. Counts are written
// as integers when they are whole, else in shortest float form.
func EncodeLogicalCount(s *routing.Stats, l Layout) ([]byte, error) {
	if s == nil || s.Layers < 1 || s.Experts < 1 || len(s.Load) != s.Layers {
		return nil, errors.New("placement: logical_count: the statistics have no load; read a trace first")
	}
	if err := l.check(); err != nil {
		return nil, err
	}
	if err := sglangLayoutError(l, "logical_count", "logical_count"); err != nil {
		return nil, err
	}
	ids := l.decoderIDs()
	if len(ids) != s.Layers {
		return nil, fmt.Errorf("placement: logical_count: the statistics have %d MoE layers but the layout places %d; set Layout.LayerIDs to the trace's layers", s.Layers, len(ids))
	}
	if l.Experts != 0 && l.Experts != s.Experts {
		return nil, fmt.Errorf("placement: logical_count: the statistics have %d experts but Layout.Experts is %d", s.Experts, l.Experts)
	}
	rowOf := make([]int, l.ModelLayers)
	for r := range rowOf {
		rowOf[r] = -1
	}
	for i, id := range ids {
		rowOf[id] = i
	}
	b := []byte("{\n  \"logical_count\": [\n")
	for r, i := range rowOf {
		b = append(b, "    ["...)
		for e := range s.Experts {
			if e > 0 {
				b = append(b, ',')
			}
			if i < 0 {
				b = append(b, '0')
				continue
			}
			if len(s.Load[i]) != s.Experts {
				return nil, fmt.Errorf("placement: logical_count: load row %d has %d experts, want %d", i, len(s.Load[i]), s.Experts)
			}
			v := s.Load[i][e]
			switch {
			case math.IsNaN(v) || math.IsInf(v, 0) || v < 0:
				return nil, fmt.Errorf("placement: logical_count: load[%d][%d] is %v; counts must be finite and non-negative", i, e, v)
			case v == math.Trunc(v) && v < 1<<53:
				b = strconv.AppendInt(b, int64(v), 10)
			default:
				b = strconv.AppendFloat(b, v, 'g', -1, 64)
			}
		}
		b = append(b, ']')
		b = appendRowEnd(b, r, len(rowOf))
	}
	return append(b, "  ]\n}\n"...), nil
}

// WriteLogicalCountFile writes EncodeLogicalCount(s, l) to path through
// WriteFileAtomic; nothing is written when encoding fails.
func WriteLogicalCountFile(path string, s *routing.Stats, l Layout) error {
	data, err := EncodeLogicalCount(s, l)
	if err != nil {
		return err
	}
	return WriteFileAtomic(path, data)
}
