package torchpt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// Limits of the pickle scan.
const (
	// maxMarks caps open MARKs; torch.save nests them as deep as the data.
	maxMarks = 1024
	// maxDecodeBytes caps the memory gopickle is estimated to need
	// (containerCost per container, pushCost per other value).
	maxDecodeBytes = 1 << 30
	containerCost  = 128
	pushCost       = 32
	// maxNumberText caps a text number (INT, LONG, FLOAT, GET); int64 and
	// float64 need fewer than 32 characters.
	maxNumberText = 64
	// maxLongBytes caps LONG1/LONG4; int64 needs at most 8.
	maxLongBytes = 16
)

// allowedGlobals are the only GLOBAL operands a tensor-only pickle names.
func allowedGlobal(module, name string) bool {
	switch module {
	case "torch._utils":
		return name == "_rebuild_tensor_v2" || name == "_rebuild_tensor"
	case "torch":
		_, ok := storageDType(name)
		return ok
	case "collections":
		return name == "OrderedDict"
	}
	return false
}

// scanPickle checks p before gopickle decodes it: only known, data-only
// opcodes; every argument inside p; lengths that fit; a stack that never
// underflows, even item counts for dicts; globals from the allow-list; and
// an estimate of the decoded size below maxDecodeBytes. It is what keeps
// hostile pickles from panicking gopickle or making it allocate without
// bound.
func scanPickle(p []byte) error {
	pos, at := 0, 0 // at is the offset of the current opcode
	depth := 0      // items above the innermost MARK
	var marks []int // depth below each open MARK
	var cost int64
	bad := func(op byte, format string, args ...any) error {
		return fmt.Errorf("torchpt: data.pkl byte %d (opcode 0x%02x): %s", at, op, fmt.Sprintf(format, args...))
	}
	need := func(op byte, n int) error {
		if depth < n {
			return bad(op, "needs %d values on the stack, has %d (malformed pickle)", n, depth)
		}
		return nil
	}
	popMark := func(op byte) error {
		if len(marks) == 0 {
			return bad(op, "no MARK to pop (malformed pickle)")
		}
		depth = marks[len(marks)-1]
		marks = marks[:len(marks)-1]
		return nil
	}
	fixed := func(op byte, n int) ([]byte, error) {
		if len(p)-pos < n {
			return nil, bad(op, "argument of %d bytes cut short (truncated pickle)", n)
		}
		b := p[pos : pos+n]
		pos += n
		return b, nil
	}
	line := func(op byte) (string, error) {
		i := bytes.IndexByte(p[pos:], '\n')
		if i < 0 {
			return "", bad(op, "argument line has no end (truncated pickle)")
		}
		s := string(p[pos : pos+i])
		pos += i + 1
		return s, nil
	}
	counted := func(op byte, width int) error {
		b, err := fixed(op, width)
		if err != nil {
			return err
		}
		var n uint64
		switch width {
		case 1:
			n = uint64(b[0])
		case 4:
			n = uint64(binary.LittleEndian.Uint32(b))
		case 8:
			n = binary.LittleEndian.Uint64(b)
		}
		if n > uint64(len(p)-pos) {
			return bad(op, "claims %d bytes, %d left (truncated or corrupt pickle)", n, len(p)-pos)
		}
		pos += int(n)
		return nil
	}
	for pos < len(p) {
		op := p[pos]
		at = pos
		pos++
		var err error
		push := 1
		switch op {
		case '(': // MARK
			if len(marks) >= maxMarks {
				return bad(op, "more than %d nested MARKs", maxMarks)
			}
			marks = append(marks, depth)
			depth, push = 0, 0
			cost += containerCost
		case '.': // STOP
			if err := need(op, 1); err != nil {
				return err
			}
			return nil
		case '0': // POP
			push = -1
			if depth == 0 {
				err, push = popMark(op), 0
			}
		case '1': // POP_MARK
			err, push = popMark(op), 0
		case '2': // DUP
			err = need(op, 1)
		case 'N', 0x88, 0x89, '}', ']', ')': // NONE, NEWTRUE, NEWFALSE, EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE
			if op == '}' || op == ']' || op == ')' {
				cost += containerCost
			}
		case 'I', 'L', 'F', 'g': // INT, LONG, FLOAT, GET
			// Decimal big integers cost quadratic time to parse.
			var s string
			if s, err = line(op); err == nil && len(s) > maxNumberText {
				err = bad(op, "a number written with %d characters, at most %d", len(s), maxNumberText)
			}
		case 'S', 'V': // STRING, UNICODE
			_, err = line(op)
		case 'p': // PUT
			_, err = line(op)
			if err == nil {
				err, push = need(op, 1), 0
			}
		case 'J', 'j': // BININT, LONG_BINGET
			_, err = fixed(op, 4)
		case 'K', 'h': // BININT1, BINGET
			_, err = fixed(op, 1)
		case 'M': // BININT2
			_, err = fixed(op, 2)
		case 'G': // BINFLOAT
			_, err = fixed(op, 8)
		case 'q', 'r': // BINPUT, LONG_BINPUT
			width := 1
			if op == 'r' {
				width = 4
			}
			_, err = fixed(op, width)
			if err == nil {
				err, push = need(op, 1), 0
			}
		case 0x94: // MEMOIZE
			err, push = need(op, 1), 0
		case 'T', 'X': // BINSTRING, BINUNICODE
			err = counted(op, 4)
		case 'U', 0x8c: // SHORT_BINSTRING, SHORT_BINUNICODE
			err = counted(op, 1)
		case 0x8d: // BINUNICODE8
			err = counted(op, 8)
		case 0x8a, 0x8b: // LONG1, LONG4
			start := pos
			width := 1
			if op == 0x8b {
				width = 4
			}
			err = counted(op, width)
			switch n := pos - start - width; {
			case err != nil:
			case n == 0:
				err = bad(op, "a long integer with no bytes (malformed pickle)")
			case n > maxLongBytes:
				// gopickle decodes long integers in quadratic time.
				err = bad(op, "a %d-byte integer: values must fit in int64", n)
			}
		case 0x80: // PROTO
			var b []byte
			b, err = fixed(op, 1)
			if err == nil && b[0] > 5 {
				err = bad(op, "pickle protocol %d, at most 5", b[0])
			}
			push = 0
		case 0x95: // FRAME
			var b []byte
			b, err = fixed(op, 8)
			if err == nil && binary.LittleEndian.Uint64(b) > uint64(len(p)-pos) {
				err = bad(op, "frame of %d bytes, %d left (truncated pickle)", binary.LittleEndian.Uint64(b), len(p)-pos)
			}
			push = 0
		case 'c': // GLOBAL
			var module, name string
			if module, err = line(op); err == nil {
				if name, err = line(op); err == nil && !allowedGlobal(module, name) {
					return errCalls(module, name)
				}
			}
		case 'Q': // BINPERSID
			err, push = need(op, 1), 0
		case 'R', 'a': // REDUCE, APPEND
			err, push = need(op, 2), -1
		case 's': // SETITEM
			err, push = need(op, 3), -2
		case 'e': // APPENDS
			if err = popMark(op); err == nil {
				err = need(op, 1)
			}
			push = 0
		case 'u', 'd': // SETITEMS, DICT
			if depth%2 != 0 {
				return bad(op, "odd number of dict items (malformed pickle)")
			}
			if err = popMark(op); err == nil && op == 'u' {
				err, push = need(op, 1), 0
			}
			cost += containerCost
		case 'l', 't': // LIST, TUPLE
			err = popMark(op)
			cost += containerCost
		case 0x85, 0x86, 0x87: // TUPLE1, TUPLE2, TUPLE3
			n := int(op-0x85) + 1
			err, push = need(op, n), 1-n
			cost += containerCost
		case 'P':
			return bad(op, "text persistent ids are not used by torch.save")
		case 'i', 'o', 0x81, 0x92, 'b', 0x93:
			return bad(op, "builds an arbitrary object (INST, OBJ, NEWOBJ, BUILD or STACK_GLOBAL): not a tensor-only file; save with torch.save's default pickle protocol 2")
		case 0x82, 0x83, 0x84:
			return bad(op, "uses the copyreg extension registry: not a tensor-only file")
		case 'B', 'C', 0x8e, 0x96, 0x97, 0x98:
			return bad(op, "holds bytes or buffers, which this reader does not take")
		case 0x8f, 0x90, 0x91:
			return bad(op, "holds a set, which this reader does not take")
		default:
			return bad(op, "unknown opcode (not a pickle, or a corrupt one)")
		}
		if err != nil {
			return err
		}
		depth += push
		if push > 0 {
			cost += pushCost
		}
		if cost > maxDecodeBytes {
			return bad(op, "decoding would take more than %d bytes of memory", maxDecodeBytes)
		}
	}
	return errors.New("torchpt: data.pkl ends without STOP (truncated pickle)")
}
