package routing

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseError reports a problem in a routing input file: where it is (File,
// Line, Field) and what is wrong together with what would fix it (Err).
// Every reader in this package returns its errors as *ParseError; use
// errors.As to get at the evidence. Line is 1-based and 0 when the format has
// no lines (NPY) or the problem concerns the whole file.
type ParseError struct {
	File  string // path of the file; empty when reading from an io.Reader
	Line  int    // 1-based line, 0 when not applicable
	Field string // the offending field, e.g. "layers[3][1]" or "expert_12"
	Err   error  // what is wrong and how to fix it
}

// Error formats the error as "routing: FILE:LINE: field: message", leaving
// out the parts that are empty.
func (e *ParseError) Error() string {
	var b strings.Builder
	b.WriteString("routing: ")
	switch {
	case e.File != "" && e.Line > 0:
		b.WriteString(e.File + ":" + strconv.Itoa(e.Line) + ": ")
	case e.File != "":
		b.WriteString(e.File + ": ")
	case e.Line > 0:
		b.WriteString("line " + strconv.Itoa(e.Line) + ": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("invalid input")
	}
	return b.String()
}

// Unwrap returns Err.
func (e *ParseError) Unwrap() error { return e.Err }

// perr builds a *ParseError with a formatted message.
func perr(file string, line int, field, format string, args ...any) *ParseError {
	return &ParseError{File: file, Line: line, Field: field, Err: fmt.Errorf(format, args...)}
}

// withFile sets File on err when it is a *ParseError without one.
func withFile(err error, file string) error {
	if pe, ok := err.(*ParseError); ok && pe.File == "" {
		pe.File = file
	}
	return err
}
