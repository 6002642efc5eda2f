package mongod

import "syscall"

// mongodSysProcAttr makes the kernel SIGKILL mongod when the program that
// started it dies. (Strictly: when the thread that started it exits; Go only
// ends threads that are locked to a goroutine, which this package never
// does. The watchdog, if any, covers the rest.)
func mongodSysProcAttr() *syscall.SysProcAttr {
	if noPdeathsig {
		return &syscall.SysProcAttr{}
	}
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
