//go:build !linux

package mongod

import "syscall"

// mongodSysProcAttr has no parent-death signal outside Linux; only the
// watchdog (not used with Options.Dir) cleans up after a crashed program.
func mongodSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{}
}
