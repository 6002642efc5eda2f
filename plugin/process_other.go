//go:build !unix

package plugin

import "os/exec"

// killGroupOnCancel leaves the default cancellation (killing the process
// only): process groups are a Unix notion.
func killGroupOnCancel(*exec.Cmd) {}
