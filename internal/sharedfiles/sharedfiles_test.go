package sharedfiles

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Find walks up from the working directory: it finds a file two levels
// above, prefers the nearest, and returns "" for a path nowhere above. A
// Find that looked only in the working directory, or returned rel as it
// is, fails.
func TestFind(t *testing.T) {
	root := t.TempDir()
	deep := filepath.Join(root, "a", "b")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "shared", "x"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(deep, "near"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "shared", "x", "f.npy"), nil, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "a", "near.txt"), nil, 0o644))
	t.Chdir(deep)
	assert.Equal(t, filepath.Join(root, "shared", "x", "f.npy"), Find("shared/x/f.npy"))
	assert.Equal(t, filepath.Join(root, "a", "near.txt"), Find("near.txt"))
	assert.Equal(t, filepath.Join(deep, "near"), Find("near"))
	assert.Equal(t, "", Find("shared/nowhere.npy"))
}
