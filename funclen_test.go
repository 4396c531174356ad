package moetuner

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// maxFuncLines is the longest a non-test function may be, from its func
// keyword to its closing brace.
const maxFuncLines = 120

// longFuncs are the functions known to be longer, each with its length
// when it was listed: shorten one and take it off; the test fails on a
// new long function, on one that grew, and on an entry that no longer
// needs its place.
var longFuncs = map[string]int{}

// TestFunctionLength keeps non-test functions short enough to read
// (at most maxFuncLines lines) outside the known exceptions in longFuncs.
func TestFunctionLength(t *testing.T) {
	got, err := funcLengths(".")
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for name, n := range got {
		if n <= maxFuncLines {
			continue
		}
		if was, ok := longFuncs[name]; !ok || n > was {
			bad = append(bad, fmt.Sprintf("%s: %d lines", name, n))
		}
	}
	for name := range longFuncs {
		if got[name] <= maxFuncLines {
			bad = append(bad, fmt.Sprintf("%s: listed in longFuncs but %d lines now (take it off)", name, got[name]))
		}
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Errorf("%s (at most %d)", b, maxFuncLines)
	}
}

// maxFileLines is the longest a non-test Go file may be.
const maxFileLines = 700

// TestFileLength keeps every non-test Go file at most maxFileLines long.
func TestFileLength(t *testing.T) {
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") || d.Name() == "shared") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if n := bytes.Count(b, []byte("\n")); n > maxFileLines {
			t.Errorf("%s: %d lines (at most %d): split it by what its parts do", filepath.ToSlash(path), n, maxFileLines)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// funcLengths returns the length in lines of every function and method
// in the non-test Go files under root, keyed "dir/file.go:Recv.Name".
func funcLengths(root string) (map[string]int, error) {
	out := map[string]int{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") || d.Name() == "shared") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			name := fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) > 0 {
				typ := fd.Recv.List[0].Type
				if s, ok := typ.(*ast.StarExpr); ok {
					typ = s.X
				}
				if ix, ok := typ.(*ast.IndexExpr); ok {
					typ = ix.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					name = id.Name + "." + name
				}
			}
			out[filepath.ToSlash(path)+":"+name] = fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
		}
		return nil
	})
	return out, err
}
