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
	s := &pickleScan{p: p}
	for s.pos < len(p) {
		op := p[s.pos]
		s.at = s.pos
		s.pos++
		push, stop, err := s.stackOp(op)
		if err != nil {
			return err
		}
		if stop {
			return nil
		}
		s.depth += push
		if push > 0 {
			s.cost += pushCost
		}
		if s.cost > maxDecodeBytes {
			return s.bad(op, "decoding would take more than %d bytes of memory", maxDecodeBytes)
		}
	}
	return errors.New("torchpt: data.pkl ends without STOP (truncated pickle)")
}

// pickleScan is scanPickle's state: the pickle, the read position, the
// stack as seen by the scan, and the estimated decoded size.
type pickleScan struct {
	p       []byte
	pos, at int   // at is the offset of the current opcode
	depth   int   // items above the innermost MARK
	marks   []int // depth below each open MARK
	cost    int64
}

// bad is the error for opcode op at the current offset.
func (s *pickleScan) bad(op byte, format string, args ...any) error {
	return fmt.Errorf("torchpt: data.pkl byte %d (opcode 0x%02x): %s", s.at, op, fmt.Sprintf(format, args...))
}

// need checks that op finds n values above the innermost MARK.
func (s *pickleScan) need(op byte, n int) error {
	if s.depth < n {
		return s.bad(op, "needs %d values on the stack, has %d (malformed pickle)", n, s.depth)
	}
	return nil
}

// popMark closes the innermost MARK.
func (s *pickleScan) popMark(op byte) error {
	if len(s.marks) == 0 {
		return s.bad(op, "no MARK to pop (malformed pickle)")
	}
	s.depth = s.marks[len(s.marks)-1]
	s.marks = s.marks[:len(s.marks)-1]
	return nil
}

// fixed reads an argument of n bytes.
func (s *pickleScan) fixed(op byte, n int) ([]byte, error) {
	if len(s.p)-s.pos < n {
		return nil, s.bad(op, "argument of %d bytes cut short (truncated pickle)", n)
	}
	b := s.p[s.pos : s.pos+n]
	s.pos += n
	return b, nil
}

// line reads an argument ended by a newline.
func (s *pickleScan) line(op byte) (string, error) {
	i := bytes.IndexByte(s.p[s.pos:], '\n')
	if i < 0 {
		return "", s.bad(op, "argument line has no end (truncated pickle)")
	}
	str := string(s.p[s.pos : s.pos+i])
	s.pos += i + 1
	return str, nil
}

// counted skips an argument of as many bytes as its little-endian length
// of width bytes says.
func (s *pickleScan) counted(op byte, width int) error {
	b, err := s.fixed(op, width)
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
	if n > uint64(len(s.p)-s.pos) {
		return s.bad(op, "claims %d bytes, %d left (truncated or corrupt pickle)", n, len(s.p)-s.pos)
	}
	s.pos += int(n)
	return nil
}

// stackOp scans opcode op when it works on the stack or is refused, and
// hands the others, which push a value read from their argument, to
// argOp. It returns the change in depth, and stop at a valid STOP.
func (s *pickleScan) stackOp(op byte) (push int, stop bool, err error) {
	push = 1
	switch op {
	case '(': // MARK
		if len(s.marks) >= maxMarks {
			return 0, false, s.bad(op, "more than %d nested MARKs", maxMarks)
		}
		s.marks = append(s.marks, s.depth)
		s.depth, push = 0, 0
		s.cost += containerCost
	case '.': // STOP
		if err := s.need(op, 1); err != nil {
			return 0, false, err
		}
		return 0, true, nil
	case '0': // POP
		push = -1
		if s.depth == 0 {
			err, push = s.popMark(op), 0
		}
	case '1': // POP_MARK
		err, push = s.popMark(op), 0
	case '2': // DUP
		err = s.need(op, 1)
	case 'N', 0x88, 0x89, '}', ']', ')': // NONE, NEWTRUE, NEWFALSE, EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE
		if op == '}' || op == ']' || op == ')' {
			s.cost += containerCost
		}
	case 0x94: // MEMOIZE
		err, push = s.need(op, 1), 0
	case 'Q': // BINPERSID
		err, push = s.need(op, 1), 0
	case 'R', 'a': // REDUCE, APPEND
		err, push = s.need(op, 2), -1
	case 's': // SETITEM
		err, push = s.need(op, 3), -2
	case 'e': // APPENDS
		if err = s.popMark(op); err == nil {
			err = s.need(op, 1)
		}
		push = 0
	case 'u', 'd': // SETITEMS, DICT
		if s.depth%2 != 0 {
			return 0, false, s.bad(op, "odd number of dict items (malformed pickle)")
		}
		if err = s.popMark(op); err == nil && op == 'u' {
			err, push = s.need(op, 1), 0
		}
		s.cost += containerCost
	case 'l', 't': // LIST, TUPLE
		err = s.popMark(op)
		s.cost += containerCost
	case 0x85, 0x86, 0x87: // TUPLE1, TUPLE2, TUPLE3
		n := int(op-0x85) + 1
		err, push = s.need(op, n), 1-n
		s.cost += containerCost
	case 'P':
		return 0, false, s.bad(op, "text persistent ids are not used by torch.save")
	case 'i', 'o', 0x81, 0x92, 'b', 0x93:
		return 0, false, s.bad(op, "builds an arbitrary object (INST, OBJ, NEWOBJ, BUILD or STACK_GLOBAL): not a tensor-only file; save with torch.save's default pickle protocol 2")
	case 0x82, 0x83, 0x84:
		return 0, false, s.bad(op, "uses the copyreg extension registry: not a tensor-only file")
	case 'B', 'C', 0x8e, 0x96, 0x97, 0x98:
		return 0, false, s.bad(op, "holds bytes or buffers, which this reader does not take")
	case 0x8f, 0x90, 0x91:
		return 0, false, s.bad(op, "holds a set, which this reader does not take")
	default:
		push, err = s.argOp(op)
	}
	return push, false, err
}

// argOp scans opcode op when it reads an argument from the pickle (a
// value, a memo index, the protocol, a frame or a global), and refuses an
// unknown one. It returns the change in depth.
func (s *pickleScan) argOp(op byte) (push int, err error) {
	push = 1
	switch op {
	case 'I', 'L', 'F', 'g': // INT, LONG, FLOAT, GET
		// Decimal big integers cost quadratic time to parse.
		var str string
		if str, err = s.line(op); err == nil && len(str) > maxNumberText {
			err = s.bad(op, "a number written with %d characters, at most %d", len(str), maxNumberText)
		}
	case 'S', 'V': // STRING, UNICODE
		_, err = s.line(op)
	case 'p': // PUT
		_, err = s.line(op)
		if err == nil {
			err, push = s.need(op, 1), 0
		}
	case 'J', 'j': // BININT, LONG_BINGET
		_, err = s.fixed(op, 4)
	case 'K', 'h': // BININT1, BINGET
		_, err = s.fixed(op, 1)
	case 'M': // BININT2
		_, err = s.fixed(op, 2)
	case 'G': // BINFLOAT
		_, err = s.fixed(op, 8)
	case 'q', 'r': // BINPUT, LONG_BINPUT
		width := 1
		if op == 'r' {
			width = 4
		}
		_, err = s.fixed(op, width)
		if err == nil {
			err, push = s.need(op, 1), 0
		}
	case 'T', 'X': // BINSTRING, BINUNICODE
		err = s.counted(op, 4)
	case 'U', 0x8c: // SHORT_BINSTRING, SHORT_BINUNICODE
		err = s.counted(op, 1)
	case 0x8d: // BINUNICODE8
		err = s.counted(op, 8)
	case 0x8a, 0x8b: // LONG1, LONG4
		start := s.pos
		width := 1
		if op == 0x8b {
			width = 4
		}
		err = s.counted(op, width)
		switch n := s.pos - start - width; {
		case err != nil:
		case n == 0:
			err = s.bad(op, "a long integer with no bytes (malformed pickle)")
		case n > maxLongBytes:
			// gopickle decodes long integers in quadratic time.
			err = s.bad(op, "a %d-byte integer: values must fit in int64", n)
		}
	case 0x80: // PROTO
		var b []byte
		b, err = s.fixed(op, 1)
		if err == nil && b[0] > 5 {
			err = s.bad(op, "pickle protocol %d, at most 5", b[0])
		}
		push = 0
	case 0x95: // FRAME
		var b []byte
		b, err = s.fixed(op, 8)
		if err == nil && binary.LittleEndian.Uint64(b) > uint64(len(s.p)-s.pos) {
			err = s.bad(op, "frame of %d bytes, %d left (truncated pickle)", binary.LittleEndian.Uint64(b), len(s.p)-s.pos)
		}
		push = 0
	case 'c': // GLOBAL
		var module, name string
		if module, err = s.line(op); err == nil {
			if name, err = s.line(op); err == nil && !allowedGlobal(module, name) {
				return 0, errCalls(module, name)
			}
		}
	default:
		return 0, s.bad(op, "unknown opcode (not a pickle, or a corrupt one)")
	}
	return push, err
}
