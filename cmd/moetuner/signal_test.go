package main

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moetuner/moetuner/placement"
)

// buildBinary builds the command into a temporary directory once per test.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "moetuner")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// TestSignalDuringPlan sends SIGINT or SIGTERM to a real process in the
// middle of a 60 s solve. It must stop within seconds, and either write a
// valid plan and exit 0 (the solver returned its best plan) or write
// nothing and exit 128 + the signal number with a message saying so. It
// catches a SIGTERM left to Go's default handler (the process dies by the
// signal, status -1, no message), a cancelled plan that is lost although
// the solver returned one, and an interrupted run that exits 0 without a
// file or leaves a partial one.
func TestSignalDuringPlan(t *testing.T) {
	if testing.Short() || runtime.GOOS == "windows" {
		t.Skip("builds the binary and runs a solve; needs Unix signals")
	}
	bin := buildBinary(t)
	wd, err := os.Getwd()
	require.NoError(t, err)
	root := filepath.Join(wd, "..", "..")
	for _, tc := range []struct {
		sig    syscall.Signal
		name   string
		status int
	}{
		{syscall.SIGTERM, "SIGTERM", 143},
		{syscall.SIGINT, "SIGINT", 130},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "plan.json")
			cmd := exec.Command(bin, "plan", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--nodes", "2", "--gpus-per-node", "4",
				"--time-limit", "60s", "--out", out)
			cmd.Dir = root
			stderr, err := cmd.StderrPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			// Wait for the first progress line: the solve is under way.
			lines := make(chan string, 100)
			go func() {
				sc := bufio.NewScanner(stderr)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
			var log []string
			select {
			case l := <-lines:
				log = append(log, l)
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				t.Fatal("no progress line within 30 s")
			}
			time.Sleep(time.Second)
			start := time.Now()
			require.NoError(t, cmd.Process.Signal(tc.sig))
			for l := range lines {
				log = append(log, l)
			}
			err = cmd.Wait()
			took := time.Since(start)
			msg := strings.Join(log, "\n")
			assert.Less(t, took, 20*time.Second, "stopped %v after the signal", took)
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			}
			if code == 0 {
				// The solver returned its best plan: it must be written whole.
				plan, err := placement.ReadFile(out)
				require.NoError(t, err, msg)
				assert.Equal(t, 8, plan.GPUs)
				assert.NoError(t, plan.Validate(placement.ValidateOptions{Experts: 64, Layers: 8}))
				assert.Contains(t, msg, "interrupted by "+tc.name+"; writing the best plan found so far")
				return
			}
			assert.Equal(t, tc.status, code, msg)
			assert.Contains(t, msg, "moetuner plan: interrupted by "+tc.name+" before a result was ready; nothing written")
			_, err = os.Stat(out)
			assert.ErrorIs(t, err, os.ErrNotExist, "an interrupted plan with a failing exit status must not leave a file")
			assert.Equal(t, []string(nil), dirNames(t, filepath.Dir(out)), "no temporary files left")
		})
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestInterruptedExitStatus checks the exit statuses run gives a command
// cancelled before it had a result: 128 + the signal number when a signal
// cancelled it, 1 for a context cancelled otherwise (a library caller's
// own cancel is an ordinary error).
func TestInterruptedExitStatus(t *testing.T) {
	chdirRoot(t)
	args := []string{"replay", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--plan", "testdata/plans/flame-joint.json"}
	for _, tc := range []struct {
		name  string
		cause error
		code  int
		want  string
	}{
		{"SIGTERM", &interruptError{sig: syscall.SIGTERM}, 143, "moetuner replay: interrupted by SIGTERM before a result was ready; nothing written (context canceled)"},
		{"SIGINT", &interruptError{sig: os.Interrupt}, 130, "interrupted by SIGINT"},
		{"plain cancel", nil, 1, "moetuner: context canceled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			cancel(tc.cause)
			var out, errb strings.Builder
			code := run(ctx, args, strings.NewReader(""), &out, &errb)
			assert.Equal(t, tc.code, code, errb.String())
			assert.Contains(t, errb.String(), tc.want)
		})
	}
}
