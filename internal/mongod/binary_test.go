package mongod

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func writeFakeMongod(t *testing.T, path string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\necho fake mongod\n"), 0o755))
}

func TestBinary(t *testing.T) {
	root := t.TempDir()
	envBin := filepath.Join(root, "env", "my-mongod")
	writeFakeMongod(t, envBin)
	cache := filepath.Join(root, "cache")
	cachedBin := filepath.Join(cache, "disbatch", "mongodb", "6.0.5", "bin", "mongod")
	writeFakeMongod(t, cachedBin)
	pathDir := filepath.Join(root, "path")
	pathBin := filepath.Join(pathDir, "mongod")
	writeFakeMongod(t, pathBin)
	emptyDir := filepath.Join(root, "empty")
	require.NoError(t, os.MkdirAll(emptyDir, 0o755))

	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv("PATH", pathDir)

	// DISBATCH_MONGOD comes first.
	t.Setenv("DISBATCH_MONGOD", envBin)
	got, err := Binary()
	require.NoError(t, err)
	require.Equal(t, envBin, got)

	// A DISBATCH_MONGOD that is not there is an error, not a fallback.
	t.Setenv("DISBATCH_MONGOD", filepath.Join(root, "missing"))
	_, err = Binary()
	require.ErrorContains(t, err, "DISBATCH_MONGOD")

	// Then the cache of `make mongod`.
	t.Setenv("DISBATCH_MONGOD", "")
	got, err = Binary()
	require.NoError(t, err)
	require.Equal(t, cachedBin, got)

	// ... under $HOME/.cache when XDG_CACHE_HOME is unset.
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", root)
	require.NoError(t, os.Rename(cache, filepath.Join(root, ".cache")))
	got, err = Binary()
	require.NoError(t, err)
	require.Equal(t, filepath.Join(root, ".cache", "disbatch", "mongodb", "6.0.5", "bin", "mongod"), got)

	// A cached file that is not executable does not count; then PATH.
	t.Setenv("XDG_CACHE_HOME", cache)
	writeFakeMongod(t, cachedBin)
	require.NoError(t, os.Chmod(cachedBin, 0o644))
	got, err = Binary()
	require.NoError(t, err)
	require.Equal(t, pathBin, got)

	// Nothing at all: the error says what to do.
	t.Setenv("PATH", emptyDir)
	_, err = Binary()
	require.ErrorContains(t, err, "run `make mongod`")
}
