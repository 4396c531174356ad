//go:build !unix

package placement

// processExists reports true: without kill(pid, 0) there is no cheap,
// safe test, so temporary files of killed writers are left alone.
func processExists(int) bool { return true }
