//go:build !unix

package plugin

import (
	"os"
	"os/exec"
)

// killGroupOnCancel leaves the default cancellation (killing the process
// only): process groups are a Unix notion.
func killGroupOnCancel(*exec.Cmd) {}

// signalled reports nothing: signals are a Unix notion.
func signalled(*os.ProcessState) (int, bool) { return 0, false }
