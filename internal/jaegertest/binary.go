package jaegertest

import (
	"errors"
	"fmt"
	"os"

	"github.com/disbatch-go/disbatch/internal/toolcache"
)

// Version is the Jaeger version that scripts/fetch-jaeger.sh builds (and so
// the one Binary finds in the cache).
const Version = "1.76.0"

// howTo tells a developer how to get a jaeger binary.
const howTo = "run `make jaeger` (or set DISBATCH_JAEGER to a Jaeger v2 binary)"

// CachedBinary is where scripts/fetch-jaeger.sh puts jaeger:
// ${XDG_CACHE_HOME:-$HOME/.cache}/disbatch/jaeger/1.76.0/jaeger. It returns
// "" when neither XDG_CACHE_HOME nor HOME is set.
func CachedBinary() string {
	return toolcache.Path("jaeger", Version, "jaeger")
}

// isExecutable reports whether path is a regular file with an execute bit.
func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// Binary returns the Jaeger v2 binary to run: $DISBATCH_JAEGER if set, else
// the copy cached by `make jaeger` (see CachedBinary). If there is none, the
// error says to run `make jaeger`.
func Binary() (string, error) {
	if p := os.Getenv("DISBATCH_JAEGER"); p != "" {
		if !isExecutable(p) {
			return "", fmt.Errorf("DISBATCH_JAEGER=%s is not an executable file; %s", p, howTo)
		}
		return p, nil
	}
	where := CachedBinary()
	if where == "" {
		return "", errors.New("no jaeger binary: DISBATCH_JAEGER is unset and so are XDG_CACHE_HOME and HOME; " + howTo)
	}
	if !isExecutable(where) {
		return "", fmt.Errorf("no jaeger binary: DISBATCH_JAEGER is unset and %s is not an executable file; %s", where, howTo)
	}
	return where, nil
}
