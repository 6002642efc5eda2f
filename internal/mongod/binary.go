package mongod

import (
	"errors"
	"fmt"
	"os"
	"os/exec"

	"github.com/disbatch-go/disbatch/internal/toolcache"
)

// Version is the MongoDB version that scripts/fetch-mongod.sh installs (and
// so the one Binary finds in the cache).
const Version = "6.0.5"

// howTo tells a developer how to get a mongod binary.
const howTo = "run `make mongod` (or set DISBATCH_MONGOD to a mongod binary)"

// cachedBinary is where scripts/fetch-mongod.sh puts mongod:
// ${XDG_CACHE_HOME:-$HOME/.cache}/disbatch/mongodb/6.0.5/bin/mongod.
// It returns "" when neither XDG_CACHE_HOME nor HOME is set.
func cachedBinary() string {
	return toolcache.Path("mongodb", Version, "bin", "mongod")
}

// isExecutable reports whether path is a regular file with an execute bit.
func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// Binary returns the mongod binary to run: $DISBATCH_MONGOD if set, else the
// copy cached by `make mongod` (scripts/fetch-mongod.sh) if it is executable,
// else mongod on PATH. If there is none, the error says to run `make mongod`.
func Binary() (string, error) {
	if p := os.Getenv("DISBATCH_MONGOD"); p != "" {
		if !isExecutable(p) {
			return "", fmt.Errorf("DISBATCH_MONGOD=%s is not an executable file", p)
		}
		return p, nil
	}
	if p := cachedBinary(); p != "" && isExecutable(p) {
		return p, nil
	}
	if p, err := exec.LookPath("mongod"); err == nil {
		return p, nil
	}
	where := cachedBinary()
	if where == "" {
		where = "the cache ($XDG_CACHE_HOME and $HOME are unset)"
	}
	return "", errors.New("no mongod binary: not in $DISBATCH_MONGOD, " + where + " or PATH; " + howTo)
}
