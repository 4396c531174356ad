package placement

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// WriteFileAtomic writes data to path so that path holds either its old
// content or all of data, never a part: it writes a temporary file in the
// same directory, syncs it, renames it over path and syncs the directory.
// On any failure the temporary file is removed and an existing file at
// path is left as it was. Every file moetuner writes goes through it.
//
// A writer killed outright (SIGKILL, power loss) cannot remove its
// temporary file, named "."+base(path)+".tmp-<pid>-<random>"; the target is
// still intact. The next successful write of the same path removes such
// files whose process no longer exists (on Unix; elsewhere they stay). A
// temporary file of a live process, or of a process in another PID
// namespace writing the same directory, is never mistaken for stale while
// its process runs here; in the second case the other writer's rename
// fails with an error and its target stays intact.
func WriteFileAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	prefix := "." + filepath.Base(path) + ".tmp-"
	f, err := os.CreateTemp(dir, prefix+strconv.Itoa(os.Getpid())+"-*")
	if err != nil {
		return fmt.Errorf("placement: write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
			err = fmt.Errorf("placement: write %s: %w", path, err)
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	// Make the rename itself durable; a failure here leaves a complete file
	// in place, so it is not reported.
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		d.Close()
	}
	removeStaleTemps(dir, prefix)
	return nil
}

// removeStaleTemps removes the temporary files prefix<pid>-* in dir that
// writers killed before their rename left behind: those whose pid is not
// this process and names no running process. Failures are ignored: the
// files are litter, not state.
func removeStaleTemps(dir, prefix string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	self := os.Getpid()
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 || pid == self || processExists(pid) {
			continue
		}
		os.Remove(filepath.Join(dir, e.Name()))
	}
}
