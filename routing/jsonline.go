package routing

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
)

// atLine gives err, a *ParseError of a JSON document reader that put it on
// line 1 for want of better, the line of its Field in data, so that an
// error in a document written over many lines points at the right one.
// The line becomes 0 (none) when the field is not found. Other errors,
// and documents of one line, are returned as they are.
func atLine(data []byte, err error) error {
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Line != 1 || pe.Field == "" || !bytes.Contains(bytes.TrimSpace(data), []byte("\n")) {
		return err
	}
	pe.Line = jsonLine(data, pe.Field)
	return err
}

// jsonLine returns the 1-based line where the value at path starts in the
// JSON document data, or 0 when there is no such value. path is a field as
// the readers name it: keys and indices, "logical_count[1][3]",
// "crosslayer_counts[2][0][1]", "[4][0]" for a bare array.
func jsonLine(data []byte, path string) int {
	segs, ok := parsePath(path)
	if !ok {
		return 0
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var skip json.RawMessage
	for _, s := range segs {
		tok, err := dec.Token()
		if err != nil {
			return 0
		}
		switch {
		case s.key != "" && tok == json.Delim('{'):
			for {
				if !dec.More() {
					return 0
				}
				k, err := dec.Token()
				if err != nil {
					return 0
				}
				if k == s.key {
					break
				}
				if dec.Decode(&skip) != nil {
					return 0
				}
			}
		case s.key == "" && tok == json.Delim('['):
			for range s.index {
				if !dec.More() || dec.Decode(&skip) != nil {
					return 0
				}
			}
			if !dec.More() {
				return 0
			}
		default:
			return 0
		}
	}
	off := dec.InputOffset()
	for off < int64(len(data)) && strings.IndexByte(" \t\r\n,:", data[off]) >= 0 {
		off++
	}
	return lineAt(data, off)
}

// pathSeg is one step of a field path: an object key or an array index.
type pathSeg struct {
	key   string
	index int
}

// parsePath splits "name[1][2]" into its key and indices.
func parsePath(path string) ([]pathSeg, bool) {
	var segs []pathSeg
	key, rest, _ := strings.Cut(path, "[")
	if key != "" {
		segs = append(segs, pathSeg{key: key})
	}
	if rest == "" {
		return segs, len(segs) > 0 && !strings.Contains(path, "[")
	}
	for _, part := range strings.Split(strings.TrimSuffix(rest, "]"), "][") {
		i, err := strconv.Atoi(part)
		if err != nil || i < 0 {
			return nil, false
		}
		segs = append(segs, pathSeg{index: i})
	}
	return segs, true
}
