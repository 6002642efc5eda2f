package main

import "syscall"

// childSysProcAttr makes the kernel kill the node process when this one
// dies, so that no node outlives an interrupted run.
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
