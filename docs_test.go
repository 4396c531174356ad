package moetuner

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docFiles are the Markdown files a newcomer reads: the README, the
// benchmarks and everything under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "BENCHMARKS.md"}
	more, err := filepath.Glob(filepath.Join("docs", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, more, "docs/*.md")
	return append(files, more...)
}

// mdLink matches an inline Markdown link or image: [text](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocLinks checks that every relative link in the README, BENCHMARKS.md
// and docs/ names a file of the repository and, where it has a #fragment,
// a heading of that file (as GitHub makes anchors from headings).
func TestDocLinks(t *testing.T) {
	for _, file := range docFiles(t) {
		for lineNo, line := range readLines(t, file) {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, frag, _ := strings.Cut(target, "#")
				resolved := file
				if path != "" {
					resolved = filepath.Join(filepath.Dir(file), path)
					if _, err := os.Stat(resolved); err != nil {
						t.Errorf("%s:%d: link %q: %v", file, lineNo+1, target, err)
						continue
					}
				}
				if frag != "" && strings.HasSuffix(resolved, ".md") {
					assert.Contains(t, anchors(t, resolved), frag, "%s:%d: link %q: no such heading in %s", file, lineNo+1, target, resolved)
				}
			}
		}
	}
}

// TestDocSizes keeps the README and the benchmarks short enough to read
// (issue 35: at most 150 and 400 lines).
func TestDocSizes(t *testing.T) {
	assert.LessOrEqual(t, len(readLines(t, "README.md")), 150, "README.md lines")
	assert.LessOrEqual(t, len(readLines(t, "BENCHMARKS.md")), 400, "BENCHMARKS.md lines")
}

// TestReadmeTestCommandInCI checks that .ci/run runs the test command the
// README gives, exactly.
func TestReadmeTestCommandInCI(t *testing.T) {
	var cmd string
	for _, line := range readLines(t, "README.md") {
		if strings.HasPrefix(line, "go test ") {
			cmd, _, _ = strings.Cut(line, "#")
			cmd = strings.TrimSpace(cmd)
			break
		}
	}
	require.NotEmpty(t, cmd, "README.md: no line starting with 'go test '")
	assert.Contains(t, readLines(t, filepath.Join(".ci", "run")), cmd, ".ci/run lacks the README's %q", cmd)
}

// TestReadmeLibraryIsExample checks that every line of the README's Go
// snippet is a line of solver's Example_readme, which go test compiles and
// runs, so the snippet cannot rot. The example reads the trace from the
// package directory and writes into a temporary one; nothing else differs.
func TestReadmeLibraryIsExample(t *testing.T) {
	example := map[string]bool{}
	for _, line := range readLines(t, filepath.Join("solver", "example_test.go")) {
		example[strings.TrimSpace(line)] = true
	}
	inGo, n := false, 0
	for i, line := range readLines(t, "README.md") {
		switch {
		case line == "```go":
			inGo = true
		case line == "```":
			inGo = false
		case inGo && strings.TrimSpace(line) != "":
			n++
			want := strings.TrimSpace(line)
			want = strings.ReplaceAll(want, `"testdata/`, `"../testdata/`)
			want = strings.ReplaceAll(want, `WriteFileWith("flame.sglang.json",`, `WriteFileWith(out,`)
			assert.True(t, example[want], "README.md:%d: %q is not in solver/example_test.go", i+1, want)
		}
	}
	assert.Positive(t, n, "README.md has no Go snippet")
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	require.NoError(t, sc.Err())
	return lines
}

// anchors returns the fragment ids GitHub gives the headings of a Markdown
// file: lower case, spaces to hyphens, punctuation other than '-' and '_'
// dropped, duplicates numbered.
func anchors(t *testing.T, path string) []string {
	t.Helper()
	var ids []string
	seen := map[string]int{}
	inCode := false
	for _, line := range readLines(t, path) {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		id := b.String()
		if k := seen[id]; k > 0 {
			seen[id]++
			id = id + "-" + string(rune('0'+k))
		} else {
			seen[id] = 1
		}
		ids = append(ids, id)
	}
	return ids
}
