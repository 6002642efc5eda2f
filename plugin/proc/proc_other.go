//go:build !unix

package proc

import (
	"os"
	"os/exec"
)

// KillGroupOnCancel leaves the default cancellation (killing the process
// only): process groups are a Unix notion.
func KillGroupOnCancel(*exec.Cmd) {}

// KillGroup does nothing: process groups are a Unix notion.
func KillGroup(*exec.Cmd) {}

// signalled reports nothing: signals are a Unix notion.
func signalled(*os.ProcessState) (int, bool) { return 0, false }
