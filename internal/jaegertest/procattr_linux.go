package jaegertest

import "syscall"

// sysProcAttr makes the kernel SIGKILL jaeger when the thread that started
// it exits. Start forks from a goroutine locked to its OS thread until jaeger
// has exited, so that thread lives exactly as long as the test binary needs
// it to (Go may otherwise end a thread a locked goroutine leaves behind).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
