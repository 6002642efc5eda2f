//go:build !linux

package main

import "syscall"

// childSysProcAttr: elsewhere the node process stops when its stdin closes.
func childSysProcAttr() *syscall.SysProcAttr { return nil }
