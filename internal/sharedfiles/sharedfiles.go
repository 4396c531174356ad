// Package sharedfiles finds data kept beside the repository rather than in
// it (the shared traces that state no license), for tests and benchmarks
// that skip when it is absent, and for the experiments harness
// (solver/internal/experiments). Nothing else imports it.
package sharedfiles

import (
	"os"
	"path/filepath"
)

// Find returns the first existing path rel below the working directory or
// one of its parents (rel is slash-separated, e.g.
// "shared/traces/synthetic-deepseek-v3/ds3-prefill4096-32k.npy"), or ""
// when there is none.
func Find(rel string) string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	rel = filepath.FromSlash(rel)
	for {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); err == nil {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}
