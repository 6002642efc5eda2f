//go:build !linux

package mongotest

import "syscall"

// mongodSysProcAttr has no parent-death signal outside Linux; the watchdog
// alone cleans up after a crashed test binary.
func mongodSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{}
}
