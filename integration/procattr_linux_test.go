package integration

import "syscall"

// childSysProcAttr makes the kernel kill a child when the test binary dies,
// so that no disbatchd or mongod outlives a crashed test.
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
