//go:build unix

package proc

import (
	"os"
	"os/exec"
	"syscall"
)

// KillGroupOnCancel starts cmd as the leader of a new process group and
// makes cancellation SIGKILL the whole group, so the command's children die
// with it.
func KillGroupOnCancel(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
			return cmd.Process.Kill()
		}
		return nil
	}
}

// KillGroup kills what is left of the process group of cmd, which has been
// waited for: whatever the command started in the background (sleep &, a
// daemon) dies with its task rather than outliving it, a retry beside it.
// The group's id stays taken while any member lives, so it is not another
// group's; one with no member left is ESRCH, ignored.
func KillGroup(cmd *exec.Cmd) {
	if cmd.Process != nil && cmd.SysProcAttr != nil && cmd.SysProcAttr.Setpgid {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// signalled reports the signal that ended the process, if one did.
func signalled(st *os.ProcessState) (int, bool) {
	ws, ok := st.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return 0, false
	}
	return int(ws.Signal()), true
}
