package supervisor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Launcher starts supervisors for a node.
type Launcher struct {
	// Dir is the node's state directory (made 0700 when missing). It must
	// be the same across the node's restarts for them to adopt its tasks,
	// and short enough for socket paths (about 75 bytes).
	Dir string
	// Command runs a supervisor with DIR and ID appended:
	// disbatch-supervisor (small), or the node's own binary and
	// "supervise". FinishCommand writes a finish for a supervisor whose
	// node is away (`disbatchd supervise-finish`).
	Command       []string
	FinishCommand []string
	// Pool is how many supervisors wait ready, forked ahead of need, so
	// that a task's start costs no fork and exec (0: each is forked for
	// its task). Each waits as a small idle process until it is given a
	// task, or until the node stops or dies.
	Pool int

	mu      sync.Mutex
	idle    []*Pending
	filling int
	closed  bool
	fills   sync.WaitGroup
	seq     int
	// nodeR and nodeW are a pipe whose write end only the node holds:
	// idle supervisors, given the read end, exit at its EOF (the node
	// stopped or died) instead of waiting for a task for ever.
	nodeR, nodeW *os.File
}

// maxSocketPath is the longest unix socket path Linux takes (108 with
// the NUL).
const maxSocketPath = 107

// Check makes the directory and checks that its socket paths fit.
func (l *Launcher) Check() error {
	if len(l.Command) == 0 {
		return errors.New("supervisor: no command")
	}
	if n := len(sockPath(l.Dir, strings.Repeat("0", 24))); n > maxSocketPath {
		return fmt.Errorf("state directory %s is too long for its sockets (%d bytes of %d): choose a shorter --state-dir", l.Dir, n, maxSocketPath)
	}
	if err := os.MkdirAll(l.Dir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	return checkPrivate(l.Dir)
}

// startWait bounds how long Start waits for a new supervisor's socket.
const startWait = 10 * time.Second

// Start starts (or takes from the pool) a supervisor in a session of its
// own (a signal to the node's process group does not reach it), connects
// and sends it the spec: Launch, then Pending.Run.
func (l *Launcher) Start(spec Spec) (*Handle, error) {
	p, err := l.Launch(spec.TaskID)
	if err != nil {
		return nil, err
	}
	return p.Run(spec)
}

// Pending is a supervisor started and waiting for its spec and go.
type Pending struct {
	l   *Launcher
	id  string
	cmd *exec.Cmd
	// pooled: it waits for a task id on its first connection (it was
	// started as pool-*, and its files renamed to id's).
	pooled bool
	exited atomic.Bool
}

// Launch gives the supervisor of task id, which waits for Run before it
// does anything (a fresh one up to 10 s): an idle one from the pool, or
// one forked now. The node launches it while the task's start is being
// written, so the fork costs no time of the task's.
func (l *Launcher) Launch(id string) (*Pending, error) {
	if p := l.takeIdle(id); p != nil {
		return p, nil
	}
	return l.fork(id, false)
}

// DefaultPool is disbatchd's Pool: enough for a burst of starts between
// two refills (a fork each, about a millisecond), at about 4 MiB each.
const DefaultPool = 2

// refillAfter delays the refill after a take, so that its fork and the new
// supervisor's start do not compete with the task's own start.
const refillAfter = 5 * time.Millisecond

// poolPrefix starts the name of an idle supervisor (its files and the
// ID argument) until it is given a task.
const poolPrefix = "pool-"

// Warm (re)opens the pool and fills it (when Pool > 0) in the background:
// a node calls it at each start, Close at each stop.
func (l *Launcher) Warm() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = false
	l.refillLocked()
}

// refill tops the pool up, unless it is closed.
func (l *Launcher) refill() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refillLocked()
}

// refillLocked forks, in the background, as many idle supervisors as
// the pool lacks.
func (l *Launcher) refillLocked() {
	if l.closed || l.Pool <= 0 || len(l.idle)+l.filling >= l.Pool {
		return
	}
	if l.nodeW == nil {
		r, w, err := os.Pipe()
		if err != nil {
			return
		}
		l.nodeR, l.nodeW = r, w
	}
	n := l.Pool - len(l.idle) - l.filling
	l.filling += n
	l.fills.Add(1)
	go func() {
		defer l.fills.Done()
		for i := range n {
			l.mu.Lock()
			l.seq++
			name := fmt.Sprintf("%s%d-%d", poolPrefix, os.Getpid(), l.seq)
			l.mu.Unlock()
			p, err := l.fork(name, true)
			l.mu.Lock()
			l.filling--
			switch {
			case err != nil:
				l.filling -= n - i - 1 // tried again at the next take
				l.mu.Unlock()
				return
			case l.closed:
				l.mu.Unlock()
				p.Cancel()
				continue
			}
			l.idle = append(l.idle, p)
			l.mu.Unlock()
		}
	}()
}

// takeIdle gives an idle supervisor the name id (its socket and log
// renamed), or nil when none is ready.
func (l *Launcher) takeIdle(id string) *Pending {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.idle) > 0 {
		// Refilled a moment later, so that the fork and the new
		// supervisor's start do not compete with the task's own start;
		// whatever becomes of the one taken (run, or cancelled unrun).
		time.AfterFunc(refillAfter, l.refill)
	}
	for len(l.idle) > 0 {
		p := l.idle[0]
		l.idle = l.idle[1:]
		if p.exited.Load() {
			p.Cancel()
			continue
		}
		if err := os.Rename(sockPath(l.Dir, p.id), sockPath(l.Dir, id)); err != nil {
			p.Cancel()
			continue
		}
		_ = os.Rename(logPath(l.Dir, p.id), logPath(l.Dir, id))
		p.id = id
		return p
	}
	return nil
}

// Close stops the idle supervisors (the node is stopping); those given a
// task are not touched. Launch forks each supervisor afterwards.
func (l *Launcher) Close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.fills.Wait()
	l.mu.Lock()
	idle := l.idle
	l.idle = nil
	if l.nodeW != nil {
		_ = l.nodeW.Close()
		_ = l.nodeR.Close()
		l.nodeR, l.nodeW = nil, nil
	}
	l.mu.Unlock()
	for _, p := range idle {
		p.Cancel()
	}
}

// fork starts the supervisor named name, in a session of its own (a
// signal to the node's process group does not reach it); pooled ones wait
// for their task without a time limit, until the node goes.
func (l *Launcher) fork(name string, pooled bool) (*Pending, error) {
	logf, err := os.OpenFile(logPath(l.Dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	// The node makes the socket and hands it to the supervisor (fd 3), so
	// it can connect at once instead of waiting for the supervisor to
	// listen: the connection waits in the backlog until it accepts.
	path := sockPath(l.Dir, name)
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("the supervisor's socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	lf, err := ln.File()
	_ = ln.Close()
	if err != nil {
		return nil, fmt.Errorf("the supervisor's socket: %w", err)
	}
	defer lf.Close()
	cmd := exec.Command(l.Command[0], append(append([]string{}, l.Command[1:]...), l.Dir, name)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{lf}
	cmd.Env = append(os.Environ(), listenerEnv+"=3")
	if pooled {
		l.mu.Lock()
		nodeR := l.nodeR
		l.mu.Unlock()
		if nodeR == nil {
			_ = os.Remove(path)
			return nil, errors.New("the launcher is closed")
		}
		cmd.ExtraFiles = append(cmd.ExtraFiles, nodeR)
		cmd.Env = append(cmd.Env, nodeEnv+"=4")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("start the supervisor: %w", err)
	}
	p := &Pending{l: l, id: name, cmd: cmd, pooled: pooled}
	go func() { // reaped while the node lives
		_ = cmd.Wait()
		p.exited.Store(true)
	}()
	return p, nil
}

// Run gives the supervisor its task and spec: it starts the task, then
// keeps the spec in <dir>/<id>.spec.
func (p *Pending) Run(spec Spec) (*Handle, error) {
	spec.TaskID, spec.FinishCommand = p.id, p.l.FinishCommand
	h, err := attach(p.l.Dir, p.id, startWait, &message{Op: opTask, Spec: &spec})
	if err != nil {
		p.Cancel()
		b, _ := os.ReadFile(logPath(p.l.Dir, p.id))
		return nil, fmt.Errorf("the supervisor did not answer: %w: %s", err, strings.TrimSpace(string(b)))
	}
	return h, nil
}

// Cancel stops a supervisor that was not given its task, and removes its
// files.
func (p *Pending) Cancel() {
	_ = p.cmd.Process.Kill()
	for _, f := range []string{sockPath(p.l.Dir, p.id), specPath(p.l.Dir, p.id), logPath(p.l.Dir, p.id)} {
		_ = os.Remove(f)
	}
}

// listenerEnv names the supervisor's inherited listening socket, nodeEnv
// an idle one's end of the node's pipe.
const (
	listenerEnv = "DISBATCH_SUPERVISOR_LISTENER_FD"
	nodeEnv     = "DISBATCH_SUPERVISOR_NODE_FD"
)

// List returns the task ids of the supervisors in dir (by their sockets).
func List(dir string) ([]string, error) {
	m, err := filepath.Glob(filepath.Join(dir, "*.sock"))
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(m))
	for _, p := range m {
		ids = append(ids, strings.TrimSuffix(filepath.Base(p), ".sock"))
	}
	return ids, nil
}

// RemoveSocket removes the socket of task id's supervisor in dir: for one
// that nothing listens on any more.
func RemoveSocket(dir, id string) error { return os.Remove(sockPath(dir, id)) }

// Handle is the node's connection to one supervisor.
type Handle struct {
	dir, id string
	conn    net.Conn
	PID     int
	// Node and Database are whose task it is.
	Node, Database string
	mu             sync.Mutex
	done           chan struct{}
	out            Outcome
	err            error
	closed         bool
}

// Attach connects to the supervisor of task id in dir.
func Attach(dir, id string) (*Handle, error) { return attach(dir, id, 5*time.Second, nil) }

// attach connects; first, when given, is the task for a new supervisor.
func attach(dir, id string, helloWait time.Duration, first *message) (*Handle, error) {
	c, err := net.DialTimeout("unix", sockPath(dir, id), time.Second)
	if err != nil {
		return nil, err
	}
	if first != nil {
		if err := send(c, *first); err != nil {
			c.Close()
			return nil, fmt.Errorf("supervisor of %s: give it its task: %w", id, err)
		}
	}
	h := &Handle{dir: dir, id: id, conn: c, done: make(chan struct{})}
	sc := bufio.NewScanner(c)
	_ = c.SetReadDeadline(time.Now().Add(helloWait))
	if !sc.Scan() {
		c.Close()
		return nil, fmt.Errorf("supervisor of %s: no hello: %v", id, sc.Err())
	}
	var hello message
	if err := json.Unmarshal(sc.Bytes(), &hello); err != nil || hello.Op != opHello {
		c.Close()
		return nil, fmt.Errorf("supervisor of %s: bad hello %q", id, sc.Text())
	}
	if hello.Version != protocolVersion {
		c.Close()
		return nil, fmt.Errorf("supervisor of %s speaks protocol %d, this node %d", id, hello.Version, protocolVersion)
	}
	_ = c.SetReadDeadline(time.Time{})
	h.PID, h.Node, h.Database = hello.PID, hello.Node, hello.Database
	if hello.Done {
		h.finish()
	} else {
		go h.read(sc)
	}
	return h, nil
}

func (h *Handle) read(sc *bufio.Scanner) {
	for sc.Scan() {
		var m message
		if json.Unmarshal(sc.Bytes(), &m) == nil && m.Op == opDone {
			h.finish()
			return
		}
	}
	h.mu.Lock()
	closed := h.closed
	h.mu.Unlock()
	if !closed {
		h.fail(errors.New("the supervisor went away before its result"))
	}
}

func (h *Handle) finish() {
	var o Outcome
	err := readFile(resultPath(h.dir, h.id), &o)
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.done:
		return
	default:
	}
	h.out, h.err = o, err
	close(h.done)
}

func (h *Handle) fail(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.done:
		return
	default:
	}
	h.err = err
	close(h.done)
}

// Done is closed when the outcome is known.
func (h *Handle) Done() <-chan struct{} { return h.done }

// Outcome is the run's outcome, once Done; an error when the supervisor
// went away without one.
func (h *Handle) Outcome() (Outcome, error) {
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.out, h.err
}

// Alive tells the supervisor that a heartbeat sent at sent was
// acknowledged.
func (h *Handle) Alive(sent time.Time) error {
	return send(h.conn, message{Op: opAlive, Sent: sent.UnixNano()})
}

// Kill asks the supervisor to kill the plugin; reason is task control's
// reason, or "".
func (h *Handle) Kill(reason, text string) error {
	return send(h.conn, message{Op: opKill, Reason: reason, Text: text})
}

// ackWait bounds how long Ack waits for the supervisor to be gone.
const ackWait = 5 * time.Second

// Ack tells the supervisor its result is taken care of, and lets go once
// the supervisor has removed its files and closed the connection (at most
// ackWait): the files are named by the task, and a supervisor of the
// task's next attempt, here, must not find the last one removing them.
func (h *Handle) Ack() {
	if send(h.conn, message{Op: opAck}) == nil {
		_ = h.conn.SetReadDeadline(time.Now().Add(ackWait))
		_, _ = io.Copy(io.Discard, h.conn) // until it closes
	}
	h.Close()
}

// Close lets go of the supervisor without a word: the task runs on, and
// the supervisor fences it unless a node attaches again in time.
func (h *Handle) Close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	_ = h.conn.Close()
}

// Processes splits the supervisors of PIDs(dir) into those running (or
// finishing) a task and the pools' idle ones: an idle one's pool-* socket
// is still its own (the node renames it to the task's when it gives it
// one; its command line keeps the pool-* name).
func Processes(dir string) (busy, idle []int) {
	for _, pid := range PIDs(dir) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) < 2 {
			continue
		}
		own, name := args[len(args)-2], args[len(args)-1]
		if _, err := os.Stat(sockPath(own, name)); err == nil && strings.HasPrefix(name, poolPrefix) {
			idle = append(idle, pid)
		} else {
			busy = append(busy, pid)
		}
	}
	return busy, idle
}

// PIDs returns the supervisor processes of state directory dir (those
// whose command line names a supervisor and dir), read from Linux's /proc;
// none elsewhere. For operators' tools, tests and benchmarks.
func PIDs(dir string) []int {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []int
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte("supervis")) || !bytes.Contains(b, []byte(dir)) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}
