//go:build !linux

package main

import "errors"

var errNoProc = errors.New("the kill latency figure reads /proc/PID/stat: Linux only")

func pidGone(int) (bool, error) { return false, errNoProc }

func killGroup(int) error { return errNoProc }
