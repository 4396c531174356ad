package routing

import "strconv"

// fastLine parses the records WriteJSONL writes, and any with only the keys
// "layers", "weights", "source" and "step", each once, holding integer
// ids, numbers and integers, into rec, reusing rec's slices. It returns
// false, leaving rec to be reset, for anything else (a header, another
// key, null, a string, an escape, a number an int cannot hold, trailing
// bytes): encoding/json then reads the line and reports any error, so the
// fast path only ever accepts lines that encoding/json decodes to the same
// record. FuzzJSONLFastPath checks that.
func fastLine(line []byte, rec *jsonlLine) bool {
	p := fastParser{b: line}
	if !p.byte('{') {
		return false
	}
	layers, weights := rec.Layers[:0], rec.Weights[:0]
	if layers == nil {
		layers = make([][]int, 0, 64)
	}
	var seen [4]bool
	var source, step int64
	first := true
	for {
		p.space()
		if first && p.byte('}') {
			break
		}
		if !first && !p.byte(',') {
			if p.byte('}') {
				break
			}
			return false
		}
		first = false
		p.space()
		key, ok := p.key()
		if !ok {
			return false
		}
		p.space()
		if !p.byte(':') {
			return false
		}
		p.space()
		var k int
		switch key {
		case "layers":
			if layers = p.intRows(layers); layers == nil {
				return false
			}
		case "weights":
			if weights == nil {
				weights = make([][]float64, 0, 64)
			}
			k, weights = 1, p.floatRows(weights)
			if weights == nil {
				return false
			}
		case "source":
			k = 2
			if source, ok = p.int(); !ok {
				return false
			}
		case "step":
			k = 3
			if step, ok = p.int(); !ok {
				return false
			}
		default:
			return false
		}
		if seen[k] {
			return false
		}
		seen[k] = true
	}
	p.space()
	if p.i != len(p.b) {
		return false
	}
	// Keep the rows for the next line even when this one has none.
	*rec = jsonlLine{Layers: layers, Weights: weights}
	if !seen[0] {
		rec.Layers = nil
	}
	if !seen[1] {
		rec.Weights = nil
	}
	if seen[2] {
		rec.Source = &source
	}
	if seen[3] {
		rec.Step = &step
	}
	return true
}

// fastParser scans JSON without allocating.
type fastParser struct {
	b []byte
	i int
}

func (p *fastParser) space() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\n' || p.b[p.i] == '\r') {
		p.i++
	}
}

func (p *fastParser) byte(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// key reads a string of plain ASCII letters and underscores.
func (p *fastParser) key() (string, bool) {
	if !p.byte('"') {
		return "", false
	}
	start := p.i
	for p.i < len(p.b) && (p.b[p.i] >= 'a' && p.b[p.i] <= 'z' || p.b[p.i] == '_') {
		p.i++
	}
	k := string(p.b[start:p.i])
	return k, p.byte('"')
}

// int reads an integer literal of at most 18 digits (no overflow).
func (p *fastParser) int() (int64, bool) {
	neg := p.byte('-')
	digits := p.i
	var v int64
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		v = v*10 + int64(p.b[p.i]-'0')
		p.i++
	}
	n := p.i - digits
	if n == 0 || n > 18 || (n > 1 && p.b[digits] == '0') {
		return 0, false
	}
	// A fraction or exponent makes it a number an int cannot hold.
	if p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		return 0, false
	}
	if neg {
		v = -v
	}
	return v, true
}

// number reads a JSON number as strconv.ParseFloat does for
// encoding/json.
func (p *fastParser) number() (float64, bool) {
	start := p.i
	p.byte('-')
	d := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	if p.i == d || (p.i-d > 1 && p.b[d] == '0') {
		return 0, false
	}
	if p.byte('.') {
		f := p.i
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
		}
		if p.i == f {
			return 0, false
		}
	}
	if p.byte('e') || p.byte('E') {
		if !p.byte('+') {
			p.byte('-')
		}
		e := p.i
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
		}
		if p.i == e {
			return 0, false
		}
	}
	v, err := strconv.ParseFloat(string(p.b[start:p.i]), 64)
	return v, err == nil
}

// list reads [item, item, ...] calling item for each element; false on
// malformed input.
func (p *fastParser) list(item func() bool) bool {
	if !p.byte('[') {
		return false
	}
	p.space()
	if p.byte(']') {
		return true
	}
	for {
		p.space()
		if !item() {
			return false
		}
		p.space()
		if p.byte(']') {
			return true
		}
		if !p.byte(',') {
			return false
		}
	}
}

// intRows reads [[int...]...] into rows (reused), nil on failure; a value
// past int's range is left out of its row (the caller's row checks catch
// the short row).
func (p *fastParser) intRows(rows [][]int) [][]int {
	return readRows(p, rows, func(row []int) ([]int, bool) {
		v, ok := p.int()
		if ok && int64(int(v)) == v {
			row = append(row, int(v))
		}
		return row, ok
	})
}

// floatRows reads [[number...]...] into rows (reused), nil on failure.
func (p *fastParser) floatRows(rows [][]float64) [][]float64 {
	return readRows(p, rows, func(row []float64) ([]float64, bool) {
		v, ok := p.number()
		return append(row, v), ok
	})
}

// readRows reads a list of lists into rows, reusing their backing arrays,
// each element through item (which appends it to the row); nil on failure.
func readRows[T any](p *fastParser, rows [][]T, item func(row []T) ([]T, bool)) [][]T {
	ok := p.list(func() bool {
		var row []T
		if len(rows) < cap(rows) {
			row = rows[:len(rows)+1][len(rows)][:0]
		}
		if row == nil {
			row = make([]T, 0, 8)
		}
		good := p.list(func() bool {
			var ok bool
			row, ok = item(row)
			return ok
		})
		rows = append(rows, row)
		return good
	})
	if !ok {
		return nil
	}
	return rows
}
