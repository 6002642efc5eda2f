package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"syscall"
)

// pidGone reports whether process pid has exited: no such process, or a
// zombie its parent (the node) has not reaped yet. It reads
// /proc/PID/stat, whose state follows the last ')'.
func pidGone(pid int) (bool, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	switch b[i+2] {
	case 'Z', 'X', 'x':
		return true, nil
	}
	return false, nil
}

// killGroup SIGKILLs process group pgid (a process a failed kill left
// alive, so that the node's stop does not wait for it).
func killGroup(pgid int) error { return syscall.Kill(-pgid, syscall.SIGKILL) }
