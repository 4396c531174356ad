package routing

import (
	"bufio"
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "regenerate testdata/ from ../shared/traces")

// repoRoot walks up from the working directory to the directory with go.mod.
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// sharedTraces returns ../shared/traces relative to the repository root, or
// skips the test when it is absent.
func sharedTraces(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "..", "shared", "traces")
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("shared traces not present at %s", dir)
	}
	return dir
}

func testdataPath(t testing.TB, elem ...string) string {
	return filepath.Join(append([]string{repoRoot(t), "testdata"}, elem...)...)
}

// TestRegenerateTestdata rebuilds the vendored testdata from the shared
// traces; run with go test ./routing -run TestRegenerateTestdata -update.
func TestRegenerateTestdata(t *testing.T) {
	if !*update {
		t.Skip("run with -update to regenerate testdata")
	}
	shared := sharedTraces(t)

	flameDir := filepath.Join(shared, "flame-moe-290m")
	src, err := Load(flameDir, LoadOptions{})
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, WriteJSONL(&buf, src.Trace))
	out := testdataPath(t, "flame-moe-290m")
	require.NoError(t, os.MkdirAll(filepath.Join(out, "csv-sample"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(out, "trace.jsonl"), buf.Bytes(), 0o644))
	for _, l := range []string{"2", "3"} {
		name := "flame-moe-290m_runid31066_epoch5473_layer" + l + "_shard0-0_to_0-0_encoder_32seqs_2048tokens.csv"
		f, err := os.Open(filepath.Join(flameDir, name))
		require.NoError(t, err)
		var b bytes.Buffer
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for i := 0; i < 65 && sc.Scan(); i++ {
			b.WriteString(sc.Text() + "\n")
		}
		require.NoError(t, sc.Err())
		f.Close()
		require.NoError(t, os.WriteFile(filepath.Join(out, "csv-sample", name), b.Bytes(), 0o644))
	}

	copyDir := func(from, to string, names []string) {
		require.NoError(t, os.MkdirAll(to, 0o755))
		for _, n := range names {
			b, err := os.ReadFile(filepath.Join(from, n))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(to, filepath.Base(n)), b, 0o644))
		}
	}
	fid, err := filepath.Glob(filepath.Join(shared, "fiddler-mixtral-popularity", "mixtral_8x7b_original", "expert_popularity_*.json"))
	require.NoError(t, err)
	require.Len(t, fid, 7)
	for i := range fid {
		fid[i] = filepath.Base(fid[i])
	}
	copyDir(filepath.Join(shared, "fiddler-mixtral-popularity", "mixtral_8x7b_original"), testdataPath(t, "mixtral-8x7b", "fiddler"), fid)
	olmoe := testdataPath(t, "olmoe-routing-analysis")
	copyDir(filepath.Join(shared, "olmoe-routing-analysis", "mixtral-8x7b"), filepath.Join(olmoe, "mixtral-8x7b"), []string{"arxiv.json"})
	copyDir(filepath.Join(shared, "olmoe-routing-analysis", "olmoe-1b-7b"), filepath.Join(olmoe, "olmoe-1b-7b"), []string{"c4.json"})
}
