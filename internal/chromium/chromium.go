// Package chromium finds the browser the dashboard's tests and benchmark
// drive: $DISBATCH_CHROMIUM, else Debian's chromium (apt-get install
// chromium, as .ci/run does) or another Chrome on the PATH.
package chromium

import (
	"errors"
	"os"
	"os/exec"
)

// EnvPath names a Chrome or Chromium binary to use.
const EnvPath = "DISBATCH_CHROMIUM"

// ErrMissing says how to get a browser.
var ErrMissing = errors.New("no Chromium: install Debian's chromium (apt-get install -y chromium, as .ci/run does) or set " + EnvPath + " to a Chrome or Chromium binary")

// Path returns the browser's path, or ErrMissing.
func Path() (string, error) {
	if p := os.Getenv(EnvPath); p != "" {
		return p, nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", ErrMissing
}
