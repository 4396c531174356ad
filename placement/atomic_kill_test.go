//go:build unix

package placement

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The writer child: TestAtomicKillWriter re-executes the test binary with
// these variables set and it writes until it is killed.
const (
	killWriterPath = "MOETUNER_TEST_ATOMIC_WRITER_PATH"
	killWriterSize = 8 << 20
)

// killContent is version v of the writer's file: a header naming the
// version and length, a body every byte of which depends on v, and a
// trailer, so any prefix, mix or truncation is detected.
func killContent(v int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "version %d length %d\n", v, killWriterSize)
	for b.Len() < killWriterSize-32 {
		b.WriteByte(byte('a' + (b.Len()*7+v)%26))
	}
	fmt.Fprintf(&b, "\nend %d", v)
	for b.Len() < killWriterSize {
		b.WriteByte('.')
	}
	return b.Bytes()
}

// TestAtomicKillWriterChild is the child process: it does nothing unless
// started by TestAtomicKillWriter.
func TestAtomicKillWriterChild(t *testing.T) {
	path := os.Getenv(killWriterPath)
	if path == "" {
		t.Skip("the writer child of TestAtomicKillWriter")
	}
	// Two versions prepared up front, so the loop spends its time inside
	// WriteFileAtomic, where the kill should land.
	data := [2][]byte{killContent(1), killContent(2)}
	for i := 0; ; i++ {
		if err := WriteFileAtomic(path, data[i%2]); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		if i == 0 {
			fmt.Println("ready")
		}
	}
}

// TestAtomicKillWriter SIGKILLs a process that rewrites an 8 MiB file
// through WriteFileAtomic, at random moments, many times. The target must
// always be the old content or one complete version, and only the killed
// writer's temporary file may remain (the next write removes it). It
// catches a writer that writes in place (os.WriteFile truncates, then a
// kill leaves a prefix), one that renames before the data is complete,
// and one that never removes a killed writer's temporary file.
func TestAtomicKillWriter(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills writer processes")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "plan.json")
	old := []byte("old content\n")
	require.NoError(t, os.WriteFile(path, old, 0o644))
	valid := map[string]bool{string(old): true, string(killContent(1)): true, string(killContent(2)): true}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	midWrite := 0
	const kills = 12
	for k := range kills {
		cmd := exec.Command(os.Args[0], "-test.run=^TestAtomicKillWriterChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), killWriterPath+"="+path)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		line, err := bufio.NewReader(stdout).ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "ready\n", line, "the writer's first write failed")
		time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		err = cmd.Wait()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee)
		assert.Equal(t, syscall.SIGKILL, ee.Sys().(syscall.WaitStatus).Signal())

		got, err := os.ReadFile(path)
		require.NoError(t, err)
		require.True(t, valid[string(got)], "kill %d: target is neither the old content nor a complete version (%d bytes, starts %q)", k, len(got), got[:min(len(got), 40)])
		temps := tempFiles(t, dir)
		require.LessOrEqual(t, len(temps), 1, "kill %d: only the killed writer's temporary file may remain: %v", k, temps)
		for _, name := range temps {
			pid, _, _ := strings.Cut(strings.TrimPrefix(name, ".plan.json.tmp-"), "-")
			assert.Equal(t, strconv.Itoa(cmd.Process.Pid), pid, "kill %d: a temporary file of an earlier writer was not removed", k)
			midWrite++
		}
	}
	t.Logf("%d of %d kills landed inside a write (left a temporary file)", midWrite, kills)
	assert.Positive(t, midWrite, "no kill landed inside a write; the test did not exercise it")
	// The next write cleans up after the last killed writer.
	require.NoError(t, WriteFileAtomic(path, old))
	assert.Equal(t, []string(nil), tempFiles(t, dir))
}

func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, name := range listDir(t, dir) {
		if name != "plan.json" {
			out = append(out, name)
		}
	}
	return out
}

// TestRemoveStaleTemps keeps a live process's temporary file (this
// process's and pid 1's), files that only resemble the pattern, and
// removes a dead process's.
func TestRemoveStaleTemps(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	dead := cmd.Process.Pid   // exited and reaped
	names := map[string]bool{ // name → kept
		fmt.Sprintf(".p.json.tmp-%d-123", os.Getpid()): true,
		".p.json.tmp-1-123":                            true,
		fmt.Sprintf(".p.json.tmp-%d-456", dead):        false,
		".p.json.tmp-987654321":                        true, // no pid field (older names)
		".p.json.tmp-x-1":                              true,
		fmt.Sprintf(".q.json.tmp-%d-1", dead):          true, // another target
	}
	for n := range names {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), nil, 0o644))
	}
	removeStaleTemps(dir, ".p.json.tmp-")
	for n, kept := range names {
		_, err := os.Stat(filepath.Join(dir, n))
		assert.Equal(t, kept, err == nil, n)
	}
}
