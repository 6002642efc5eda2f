//go:build !linux

package integration

import "syscall"

func childSysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
