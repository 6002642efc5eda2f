//go:build !linux

package jaegertest

import "syscall"

// sysProcAttr has no parent-death signal outside Linux: a jaeger whose test
// binary is killed outright keeps running there.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{}
}
