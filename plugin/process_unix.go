//go:build unix

package plugin

import (
	"os/exec"
	"syscall"
)

// killGroupOnCancel starts cmd as the leader of a new process group and
// makes cancellation SIGKILL the whole group, so the command's children die
// with it.
func killGroupOnCancel(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
			return cmd.Process.Kill()
		}
		return nil
	}
}
