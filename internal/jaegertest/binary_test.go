package jaegertest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func writeFakeJaeger(t *testing.T, path string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\necho fake jaeger\n"), 0o755))
}

func TestBinary(t *testing.T) {
	root := t.TempDir()
	envBin := filepath.Join(root, "env", "my-jaeger")
	writeFakeJaeger(t, envBin)
	cache := filepath.Join(root, "cache")
	cachedBin := filepath.Join(cache, "disbatch", "jaeger", Version, "jaeger")

	t.Setenv("XDG_CACHE_HOME", cache)

	// Nothing anywhere: the error says what to do.
	t.Setenv("DISBATCH_JAEGER", "")
	_, err := Binary()
	require.ErrorContains(t, err, "make jaeger")
	require.ErrorContains(t, err, cachedBin)

	// The cached copy.
	writeFakeJaeger(t, cachedBin)
	require.Equal(t, cachedBin, CachedBinary())
	got, err := Binary()
	require.NoError(t, err)
	require.Equal(t, cachedBin, got)

	// DISBATCH_JAEGER comes first.
	t.Setenv("DISBATCH_JAEGER", envBin)
	got, err = Binary()
	require.NoError(t, err)
	require.Equal(t, envBin, got)

	// A DISBATCH_JAEGER that is not there is an error, not a fallback.
	t.Setenv("DISBATCH_JAEGER", filepath.Join(root, "missing"))
	_, err = Binary()
	require.ErrorContains(t, err, "DISBATCH_JAEGER")
	require.ErrorContains(t, err, "make jaeger")

	// Without XDG_CACHE_HOME, the cache is under $HOME/.cache.
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", root)
	require.Equal(t, filepath.Join(root, ".cache", "disbatch", "jaeger", Version, "jaeger"), CachedBinary())
}
