package mongod

import "syscall"

// mongodSysProcAttr makes the kernel SIGKILL mongod when the program that
// started it dies. (Strictly: when the thread that started it exits; Go only
// ends threads that are locked to a goroutine, which this package never
// does. The watchdog, if any, covers the rest.) mongod gets a process group
// of its own: a Ctrl-C in the terminal (SIGINT to the foreground group)
// reaches the program, which stops what uses the replica set first and
// mongod last, rather than mongod at once under a node still stopping
// (make run's node then fenced itself and took 26 s to stop).
func mongodSysProcAttr() *syscall.SysProcAttr {
	if noPdeathsig {
		return &syscall.SysProcAttr{Setpgid: true}
	}
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
