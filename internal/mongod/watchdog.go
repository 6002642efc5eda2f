package mongod

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// watchdogScript runs detached from the program that started the replica set
// ($1 is its pid, $2 the replica set's directory). Once that program is gone,
// it kills the pids in $2/m*/pid (kept current by Member: written at start,
// removed once the process is reaped), waits briefly for them to die and
// removes $2.
const watchdogScript = `
parent=$1 dir=$2
while kill -0 "$parent" 2>/dev/null; do sleep 0.5; done
pids=
for f in "$dir"/m*/pid; do
	[ -f "$f" ] && read -r pid <"$f" 2>/dev/null && pids="$pids $pid"
done
alive() { # is any of $pids still running? (a zombie is not)
	for p in $pids; do
		kill -0 "$p" 2>/dev/null || continue
		[ -r "/proc/$p/stat" ] || return 0
		read -r stat <"/proc/$p/stat" 2>/dev/null || continue
		state=${stat##*) }
		case $state in Z* | X*) ;; *) return 0 ;; esac
	done
	return 1
}
if [ -n "$pids" ]; then
	kill -9 $pids 2>/dev/null
	i=0
	while [ $i -lt 20 ] && alive; do sleep 0.1; i=$((i+1)); done
fi
rm -rf "$dir" 2>/dev/null || { sleep 0.5; rm -rf "$dir"; }
`

// startWatchdog starts the replica set's watchdog in a session of its own,
// so that signals to the program's process group do not reach it.
func (rs *ReplicaSet) startWatchdog() error {
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "disbatch-mongod-watchdog",
		strconv.Itoa(os.Getpid()), rs.dir)
	// Stdin, Stdout and Stderr stay nil (/dev/null): the watchdog must not
	// hold the program's output pipes open (a test's, say). Its PATH (for
	// sleep and rm) must not depend on what the program did to the
	// environment.
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start watchdog: %w", err)
	}
	rs.watchdog = cmd
	return nil
}

// stopWatchdog kills the watchdog's process group (the shell and its sleep)
// and reaps it.
func (rs *ReplicaSet) stopWatchdog() error {
	if rs.watchdog == nil {
		return nil
	}
	pid := rs.watchdog.Process.Pid
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill watchdog %d: %w", pid, err)
	}
	_ = rs.watchdog.Wait() // "signal: killed"
	return nil
}
