package routing

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// npyMagic starts every NPY file.
const npyMagic = "\x93NUMPY"

// maxNPYHeader caps the NPY header dictionary length.
const maxNPYHeader = 1 << 20

// ReadNPY reads a trace stored as a NumPy array of expert ids with shape
// [T, L, k] (or [T, L] for top-1) and dtype int16, int32, int64 or uint8,
// C order. experts is Experts, or 0 to use max id + 1. Errors are
// *ParseError; Field names the header key or the element as data[t,l,j].
func ReadNPY(r io.Reader, experts int) (*Trace, error) {
	return readNPY(r, "", experts)
}

type npyHeader struct {
	descr   string
	fortran bool
	shape   []int
	// bytes is the length of the preamble and header: the data starts
	// there.
	bytes int64
}

// readNPYHeader reads an NPY preamble and header and checks the dtype
// (int16, int32, int64 or uint8) and the order (C).
func readNPYHeader(br *bufio.Reader, file string) (h npyHeader, size int, order binary.ByteOrder, err error) {
	var pre [8]byte
	if _, err := io.ReadFull(br, pre[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return h, 0, nil, perr(file, 0, "", "empty file: want a .npy array")
		}
		return h, 0, nil, perr(file, 0, "", "truncated NPY preamble: %s", cutShort)
	}
	if string(pre[:6]) != npyMagic {
		return h, 0, nil, perr(file, 0, "", "not an NPY file (bad magic): save the array with numpy.save")
	}
	var hlen int
	switch pre[6] {
	case 1:
		var b [2]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return h, 0, nil, perr(file, 0, "", "truncated NPY header length: %s", cutShort)
		}
		hlen = int(binary.LittleEndian.Uint16(b[:]))
	case 2, 3:
		var b [4]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return h, 0, nil, perr(file, 0, "", "truncated NPY header length: %s", cutShort)
		}
		hlen = int(binary.LittleEndian.Uint32(b[:]))
	default:
		return h, 0, nil, perr(file, 0, "", "unsupported NPY version %d.%d: save with numpy.save (version 1, 2 or 3)", pre[6], pre[7])
	}
	if hlen > maxNPYHeader {
		return h, 0, nil, perr(file, 0, "", "NPY header of %d bytes exceeds %d: the file is corrupt", hlen, maxNPYHeader)
	}
	hb := make([]byte, hlen)
	if _, err := io.ReadFull(br, hb); err != nil {
		return h, 0, nil, perr(file, 0, "", "truncated NPY header: %s", cutShort)
	}
	h, err = parseNPYHeader(string(hb))
	if err != nil {
		return h, 0, nil, withFile(err, file)
	}
	h.bytes = 8 + int64(hlen)
	if pre[6] == 1 {
		h.bytes += 2
	} else {
		h.bytes += 4
	}
	order = binary.LittleEndian
	d := h.descr
	if len(d) != 3 || !strings.ContainsRune("<>|=", rune(d[0])) {
		return h, 0, nil, perr(file, 0, "descr", "unsupported dtype %q: use int16, int32, int64 or uint8", d)
	}
	if d[0] == '>' {
		order = binary.BigEndian
	}
	switch d[1:] {
	case "i2":
		size = 2
	case "i4":
		size = 4
	case "i8":
		size = 8
	case "u1":
		size = 1
	default:
		return h, 0, nil, perr(file, 0, "descr", "unsupported dtype %q: use int16, int32, int64 or uint8 (cast with arr.astype(np.int16))", d)
	}
	if h.fortran && len(h.shape) > 1 {
		return h, 0, nil, perr(file, 0, "fortran_order", "Fortran-order arrays are not supported: save np.ascontiguousarray(arr)")
	}
	return h, size, order, nil
}

func npyInt(b []byte, size int, order binary.ByteOrder) int64 {
	switch size {
	case 1:
		return int64(b[0])
	case 2:
		return int64(int16(order.Uint16(b)))
	case 4:
		return int64(int32(order.Uint32(b)))
	}
	return int64(order.Uint64(b))
}

// readNPYInts reads a sidecar of per-token source ranks: an integer array
// of shape [tokens], each -1 (unknown) or a rank in [0, 2^31).
func readNPYInts(r io.Reader, file string, tokens int) ([]int32, error) {
	in, err := openNPY(r, file, -1)
	if err != nil {
		return nil, err
	}
	if len(in.h.shape) != 1 || in.h.shape[0] != tokens {
		return nil, perr(file, 0, "shape", "shape %v, want [%d]: one source rank per token of the trace", in.h.shape, tokens)
	}
	if err := in.expect(uint64(tokens)); err != nil {
		return nil, err
	}
	// Read in chunks so that a header that lies about the shape cannot
	// make us allocate more than the file holds.
	var out []int32
	raw := make([]byte, min(tokens, 1<<16)*in.esize)
	for done := 0; done < tokens; {
		n := min(tokens-done, 1<<16)
		if err := in.fill(raw[:n*in.esize]); err != nil {
			return nil, err
		}
		out = append(out, make([]int32, n)...)
		if i := decodeSources(out[done:], raw, in.esize, in.order); i >= 0 {
			v := npyInt(raw[i*in.esize:(i+1)*in.esize], in.esize, in.order)
			return nil, perr(file, 0, fmt.Sprintf("data[%d]", done+i), "source rank %d out of range: want -1 (unknown) or a rank ≥ 0", v)
		}
		done += n
	}
	if err := in.end(); err != nil {
		return nil, err
	}
	return out, nil
}

// readNPY reads a whole NPY trace from r.
func readNPY(r io.Reader, file string, experts int) (*Trace, error) {
	in, err := openNPY(r, file, -1)
	if err != nil {
		return nil, err
	}
	t, _, err := readNPYTrace(in, nil, LoadOptions{Experts: experts, NoPatterns: true}, true)
	return t, err
}

// parseNPYHeader parses the Python dict literal of an NPY header, e.g.
// {'descr': '<i2', 'fortran_order': False, 'shape': (10, 8, 6), }.
func parseNPYHeader(s string) (npyHeader, error) {
	var h npyHeader
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "{") || !strings.HasSuffix(s, "}") {
		return h, perr("", 0, "", "malformed NPY header %q: want a Python dict", clip(s))
	}
	body := s[1 : len(s)-1]
	seen := map[string]bool{}
	for len(strings.TrimSpace(body)) > 0 {
		body = strings.TrimSpace(body)
		key, rest, ok := pyString(body)
		if !ok {
			return h, perr("", 0, "", "malformed NPY header key near %q", clip(body))
		}
		rest = strings.TrimSpace(rest)
		if !strings.HasPrefix(rest, ":") {
			return h, perr("", 0, key, "missing ':' in NPY header")
		}
		rest = strings.TrimSpace(rest[1:])
		switch key {
		case "descr":
			v, r2, ok := pyString(rest)
			if !ok {
				return h, perr("", 0, key, "want a dtype string such as '<i2'")
			}
			h.descr, rest = v, r2
		case "fortran_order":
			switch {
			case strings.HasPrefix(rest, "False"):
				h.fortran, rest = false, rest[5:]
			case strings.HasPrefix(rest, "True"):
				h.fortran, rest = true, rest[4:]
			default:
				return h, perr("", 0, key, "want True or False")
			}
		case "shape":
			if !strings.HasPrefix(rest, "(") {
				return h, perr("", 0, key, "want a tuple of integers")
			}
			end := strings.IndexByte(rest, ')')
			if end < 0 {
				return h, perr("", 0, key, "unterminated tuple")
			}
			for tok := range strings.SplitSeq(rest[1:end], ",") {
				tok = strings.TrimSpace(tok)
				if tok == "" {
					continue
				}
				tok = strings.TrimSuffix(tok, "L")
				v, err := strconv.Atoi(tok)
				if err != nil || v < 0 || v > maxTraceIDs {
					return h, perr("", 0, key, "bad dimension %q: want an integer in [0,%d]; the header is corrupt, or the array too large for one file: save it again with numpy.save, split into several files", clip(tok), uint64(maxTraceIDs))
				}
				h.shape = append(h.shape, v)
			}
			rest = rest[end+1:]
		default:
			return h, perr("", 0, key, "unknown NPY header key")
		}
		seen[key] = true
		rest = strings.TrimSpace(rest)
		rest = strings.TrimPrefix(rest, ",")
		body = rest
	}
	for _, k := range []string{"descr", "fortran_order", "shape"} {
		if !seen[k] {
			return h, perr("", 0, k, "missing from the NPY header")
		}
	}
	return h, nil
}

// pyString reads a single- or double-quoted Python string at the start of s.
func pyString(s string) (val, rest string, ok bool) {
	if len(s) < 2 || (s[0] != '\'' && s[0] != '"') {
		return "", s, false
	}
	end := strings.IndexByte(s[1:], s[0])
	if end < 0 {
		return "", s, false
	}
	return s[1 : 1+end], s[2+end:], true
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// WriteNPY writes the expert ids of t as a C-order int16 NumPy array of
// shape [Tokens, Layers, TopK] (NPY version 1.0, header padded to 64 bytes
// as numpy does). Weights, Source, Step and LayerNames are not stored. It
// returns t.Validate's error for an invalid trace.
func WriteNPY(w io.Writer, t *Trace) error {
	if err := t.Validate(); err != nil {
		return err
	}
	dict := fmt.Sprintf("{'descr': '<i2', 'fortran_order': False, 'shape': (%d, %d, %d), }", t.Tokens, t.Layers, t.TopK)
	total := len(npyMagic) + 4 + len(dict) + 1
	pad := (64 - total%64) % 64
	var hdr bytes.Buffer
	hdr.WriteString(npyMagic)
	hdr.Write([]byte{1, 0})
	hlen := len(dict) + pad + 1
	hdr.Write([]byte{byte(hlen), byte(hlen >> 8)})
	hdr.WriteString(dict)
	hdr.WriteString(strings.Repeat(" ", pad))
	hdr.WriteByte('\n')
	if _, err := w.Write(hdr.Bytes()); err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	var b [2]byte
	for _, id := range t.IDs {
		binary.LittleEndian.PutUint16(b[:], uint16(id))
		if _, err := bw.Write(b[:]); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// cutShort says what to do about a file that ends too early.
const cutShort = "the file is cut short (an interrupted write or copy); write or copy it again"
