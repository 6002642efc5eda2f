// Package toolcache locates the cache outside the repository where the
// project keeps the programs it fetches or builds for itself (mongod,
// jaeger): ${XDG_CACHE_HOME:-$HOME/.cache}/disbatch. The scripts behind
// `make mongod` and `make jaeger` use the same directory.
package toolcache

import (
	"os"
	"path/filepath"
)

// Path joins elem to the cache directory. It returns "" when neither
// XDG_CACHE_HOME nor HOME is set.
func Path(elem ...string) string {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home := os.Getenv("HOME")
		if home == "" {
			return ""
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(append([]string{cache, "disbatch"}, elem...)...)
}
