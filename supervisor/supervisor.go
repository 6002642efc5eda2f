package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/disbatch-go/disbatch/plugin/proc"
)

// Main is `disbatchd supervise DIR ID`: it runs the task whose spec its
// node sends on the first connection (kept in <DIR>/<ID>.spec) and returns
// the exit code. Its log goes to stderr (the
// node points it at <DIR>/<ID>.log).
func Main(args []string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if len(args) != 2 {
		log.Error("usage: disbatchd supervise DIR TASK_ID (started by disbatchd, not by hand)")
		return 2
	}
	// SIGTERM or SIGINT (an operator, a test's cleanup, a machine going
	// down) kills the task's process group and exits without a finish:
	// the task is then recovered as its node's.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := Run(ctx, args[0], args[1], log); err != nil {
		log.Error("supervisor failed", "task_id", args[1], "error", err)
		return 1
	}
	return 0
}

// fenceCheck is how often a supervisor compares its clock with the fence.
const fenceCheck = 100 * time.Millisecond

// Killed is the cause a supervisor cancels its plugin with.
type Killed struct {
	Reason string // task control's reason, or ""
	Text   string
}

func (k *Killed) Error() string { return k.Text }

// sup is one supervisor's state.
type sup struct {
	dir, id string
	spec    Spec
	log     *slog.Logger

	mu       sync.Mutex
	alive    time.Time // send time of the node's last acknowledged heartbeat
	conn     net.Conn  // the node connected now, or nil
	done     bool      // the result file is written
	acked    chan struct{}
	ackOnce  sync.Once
	gone     chan struct{} // closed and remade when the connected node goes
	kill     context.CancelCauseFunc
	fenced   bool
	stopping bool
	assigned bool // an idle supervisor was given its task
}

// warm has an idle supervisor do once, before its task comes, what a cold
// process does slowly the first time (encoding/json builds its codecs of
// each type on first use; the code's pages fault in): about half a
// millisecond off its task's start.
func warm() {
	b, _ := json.Marshal(Spec{Command: proc.Command{Path: "bash", Args: []string{"-c", ":"}, Env: []string{"A=b"}, Stdin: []byte{1}}})
	_ = json.Unmarshal(b, &Spec{})
	b, _ = json.Marshal(message{Op: opAlive, Sent: 1})
	_ = json.Unmarshal(b, &message{})
	_, _ = json.Marshal(Outcome{Proc: proc.Result{Stdout: []byte{1}, Killed: &proc.Cause{}}})
}

// watchNode makes an idle supervisor exit when its node goes before
// giving it a task: the node's pipe (nodeEnv) reads EOF.
func (s *sup) watchNode(ln net.Listener) {
	fd, err := strconv.Atoi(os.Getenv(nodeEnv))
	_ = os.Unsetenv(nodeEnv) // not the plugin's
	if err != nil {
		return // started by hand: it waits
	}
	syscall.CloseOnExec(fd)
	f := os.NewFile(uintptr(fd), "node")
	go func() {
		_, _ = io.Copy(io.Discard, f)
		_ = f.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.assigned {
			_ = ln.Close()
		}
	}()
}

// readTask reads the node's first message: the task's spec (its TaskID
// names the task, and the supervisor's files).
func readTask(c net.Conn, in *bufio.Reader) (Spec, error) {
	_ = c.SetReadDeadline(time.Now().Add(startWait))
	defer c.SetReadDeadline(time.Time{})
	line, err := in.ReadBytes('\n')
	if err != nil {
		return Spec{}, err
	}
	var m message
	if err := json.Unmarshal(line, &m); err != nil || m.Op != opTask || m.Spec == nil || m.Spec.TaskID == "" || strings.ContainsAny(m.Spec.TaskID, "/.") {
		return Spec{}, fmt.Errorf("want a task, got %.200q", line)
	}
	return *m.Spec, nil
}

// keepSpec writes the spec to <id>.spec: a restarted node reads the
// outcome with it, and the finish command writes from it.
func (s *sup) keepSpec() error {
	if err := writeFile(specPath(s.dir, s.id), s.spec); err != nil {
		return fmt.Errorf("write the spec: %w", err)
	}
	return nil
}

// firstWait bounds how long a supervisor waits for its node's first
// connection; without one it exits and runs nothing.
const firstWait = 10 * time.Second

// Run supervises one task until its result is handed over or written.
func Run(ctx context.Context, dir, id string, log *slog.Logger) error {
	s := &sup{dir: dir, id: id, log: log.With("task_id", id), acked: make(chan struct{}), gone: make(chan struct{})}
	ln, err := listen(dir, id)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer s.cleanup(ln)
	// A signal (ctx) ends every wait, not only the task's run: the wait
	// for the node's first connection, and for its acknowledgement.
	defer context.AfterFunc(ctx, func() { _ = ln.Close() })()
	// The node may start the supervisor before the task is marked running
	// (Launcher.Launch): its first connection says go, and carries the
	// spec. Without it, nothing runs: the node gave the task up. An
	// idle one (Launcher.Pool) waits for as long as its node lives.
	pooled := strings.HasPrefix(id, poolPrefix)
	if pooled {
		s.watchNode(ln)
		warm()
	} else if ul, ok := ln.(*net.UnixListener); ok {
		_ = ul.SetDeadline(time.Now().Add(firstWait))
	}
	first, err := ln.Accept()
	if err != nil {
		if pooled { // idle until its node went: nothing to tell
			_ = os.Remove(logPath(dir, id))
			return nil
		}
		s.log.Info("no node connected: exiting without running a task", "error", err)
		return nil
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		_ = ul.SetDeadline(time.Time{})
	}
	// The first message is the task and its spec. An idle supervisor's
	// files are the task's now (renamed by the node).
	in := bufio.NewReader(first)
	spec, err := readTask(first, in)
	s.mu.Lock()
	s.assigned = true
	if err == nil {
		s.id, s.log, s.spec = spec.TaskID, log.With("task_id", spec.TaskID), spec
	}
	s.mu.Unlock()
	if err != nil {
		_ = first.Close()
		return fmt.Errorf("the node's first message: %w", err)
	}
	s.alive = s.spec.Alive
	runCtx, kill := context.WithCancelCause(ctx)
	defer kill(nil)
	s.kill = kill
	if !s.spec.Deadline.IsZero() {
		t := time.AfterFunc(time.Until(s.spec.Deadline), func() {
			kill(&Killed{Reason: s.spec.TimeoutReason, Text: s.spec.TimeoutText})
		})
		defer t.Stop()
	}
	if late := time.Since(s.alive); late > s.spec.FenceAfter {
		// The node went silent before the task could start: it must not
		// start now, other nodes may recover it soon.
		s.log.Warn("fencing before the start: no acknowledged heartbeat of the node for fence-after", "node", s.spec.Node, "silence", late.Round(time.Millisecond))
		s.fenced = true
		if err := s.keepSpec(); err != nil {
			return err
		}
		s.adopt(first, in)
		go s.accept(ln)
		return s.handOver(ctx, Outcome{Fenced: true,
			Failure: fmt.Sprintf("task killed: supervisor fenced before the start: no acknowledged heartbeat of node %s for %s\n", s.spec.Node, late.Round(time.Millisecond))})
	}
	procCtx := runCtx
	if s.spec.PluginTimeout > 0 {
		var cancel context.CancelFunc
		procCtx, cancel = proc.WithTimeout(runCtx, s.spec.PluginTimeout)
		defer cancel()
	}
	// The process first; the spec's file (for a restarted node and the
	// finish command) and the hello after it, off the task's start.
	results := make(chan proc.Result, 1)
	go func() { results <- s.spec.Command.Run(procCtx) }()
	if err := s.keepSpec(); err != nil {
		kill(&Killed{Text: "supervisor: " + err.Error()})
		<-results
		return err
	}
	s.adopt(first, in)
	go s.accept(ln)
	watch := time.NewTicker(fenceCheck)
	defer watch.Stop()
	s.log.Info("supervising", "pid", os.Getpid(), "command", s.spec.Command.Path, "fence_after", s.spec.FenceAfter)
	var res proc.Result
	for running := true; running; {
		select {
		case res = <-results:
			running = false
		case <-watch.C:
			s.mu.Lock()
			silence := time.Since(s.alive)
			fence := !s.fenced && silence > s.spec.FenceAfter
			if fence {
				s.fenced = true
			}
			s.mu.Unlock()
			if fence {
				s.log.Warn("fencing: no acknowledged heartbeat of the node for fence-after; killing the task before other nodes may recover it",
					"node", s.spec.Node, "silence", silence.Round(time.Millisecond), "fence_after", s.spec.FenceAfter)
				kill(&Killed{Text: fmt.Sprintf("supervisor fenced: no acknowledged heartbeat of node %s for %s", s.spec.Node, silence.Round(time.Millisecond))})
			}
		}
	}
	if ctx.Err() != nil {
		s.log.Warn("supervisor terminated by a signal: the task was killed; its finish is left to its node's recovery")
		return nil
	}
	o := Outcome{Proc: res}
	var k *Killed
	if errors.As(context.Cause(runCtx), &k) && res.Killed != nil {
		o.Reason = k.Reason
	}
	s.mu.Lock()
	o.Fenced = s.fenced
	s.mu.Unlock()
	if err := s.handOver(ctx, o); err != nil {
		return err
	}
	if !o.Fenced {
		_ = os.Remove(logPath(s.dir, s.id)) // kept only when something went wrong
	}
	return nil
}

// handOver gives the outcome to a node, or writes the finish itself when
// no node is there to.
func (s *sup) handOver(ctx context.Context, o Outcome) error {
	if err := writeFile(resultPath(s.dir, s.id), o); err != nil {
		return fmt.Errorf("write the result: %w", err)
	}
	for {
		// A node that acknowledged and then closed makes both acked and
		// gone ready: the ack wins, or the finish would be written again.
		select {
		case <-s.acked:
			s.log.Info("result handed to the node")
			return nil
		default:
		}
		s.mu.Lock()
		s.done = true
		conn, gone := s.conn, s.gone
		s.mu.Unlock()
		if conn != nil {
			_ = send(conn, message{Op: opDone})
			select {
			case <-s.acked:
				s.log.Info("result handed to the node")
				return nil
			case <-gone: // the node went before it acknowledged: again
				continue
			case <-ctx.Done():
				s.log.Warn("supervisor terminated by a signal before the node acknowledged the result: its finish is left to its node (which has the result, or recovers the task)")
				return nil
			}
		}
		if o.Fenced {
			// The task is whoever recovers it: wait a while for the node.
			select {
			case <-s.acked:
				return nil
			case <-gone:
				continue
			case <-time.After(s.spec.DeadAfter):
				s.log.Warn("fenced and not adopted: exiting without writing a finish (the task is recovered as its node's)")
				return nil
			case <-ctx.Done():
				return nil
			}
		}
		if ctx.Err() != nil {
			s.log.Warn("supervisor terminated by a signal: its finish is left to its node's recovery")
			return nil
		}
		return s.writeFinish(ctx, o)
	}
}

// writeFinish has the finish the node would have written, guarded by
// {_id, node, status: 0}, written by the spec's FinishCommand (package
// supervisor/finish: it links the MongoDB driver, which this process does
// not, to stay small).
func (s *sup) writeFinish(ctx context.Context, o Outcome) error {
	if len(s.spec.FinishCommand) == 0 {
		return errors.New("no finish command in the spec: the result stays in the state directory")
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.spec.FinishCommand[0], append(append([]string{}, s.spec.FinishCommand[1:]...), s.dir, s.id)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ee.ExitCode() == FinishLost:
		s.log.Warn("the task is no longer this node's: its finish was not written")
		return nil
	case err != nil:
		return fmt.Errorf("write the finish (%s): %w", strings.Join(s.spec.FinishCommand, " "), err)
	}
	s.log.Info("finish written by the supervisor (no node connected)")
	// A node that connected meanwhile learns it is written.
	s.mu.Lock()
	conn := s.conn
	s.mu.Unlock()
	if conn != nil {
		_ = send(conn, message{Op: opDone})
	}
	return nil
}

// FinishLost is the finish command's exit code when the guard did not
// match: the task is no longer the node's.
const FinishLost = 3

// cleanup removes the supervisor's files, then closes the node's
// connection: a node's Ack waits for that close before it lets the task go,
// so that these removals, by the task's name, never reach the files of a
// supervisor of its next attempt.
func (s *sup) cleanup(ln net.Listener) {
	s.mu.Lock()
	s.stopping = true
	conn := s.conn
	s.mu.Unlock()
	_ = ln.Close()
	for _, p := range []string{sockPath(s.dir, s.id), specPath(s.dir, s.id), resultPath(s.dir, s.id)} {
		_ = os.Remove(p)
	}
	if conn != nil {
		_ = conn.Close()
	}
}

// accept serves node connections, one at a time: a new one replaces the
// old (a restarted node).
func (s *sup) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if !s.adopt(c, bufio.NewReader(c)) {
			return
		}
	}
}

// adopt makes c the node's connection, says hello and serves it; false
// when the supervisor is stopping.
func (s *sup) adopt(c net.Conn, in *bufio.Reader) bool {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		_ = c.Close()
		return false
	}
	if s.conn != nil {
		_ = s.conn.Close()
	}
	s.conn = c
	done := s.done
	s.mu.Unlock()
	_ = send(c, message{Op: opHello, Task: s.id, PID: os.Getpid(), Version: protocolVersion, Done: done, Node: s.spec.Node, Database: s.spec.Mongo.Database})
	go s.serve(c, in)
	return true
}

func (s *sup) serve(c net.Conn, in *bufio.Reader) {
	defer func() {
		s.mu.Lock()
		if s.conn == c {
			s.conn = nil
			close(s.gone)
			s.gone = make(chan struct{})
		}
		s.mu.Unlock()
		_ = c.Close()
	}()
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			return
		}
		var m message
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		switch m.Op {
		case opAlive:
			t := time.Unix(0, m.Sent)
			s.mu.Lock()
			if t.After(s.alive) {
				s.alive = t
			}
			s.mu.Unlock()
		case opKill:
			s.mu.Lock()
			kill := s.kill
			s.mu.Unlock()
			s.log.Info("kill from the node", "why", m.Text)
			kill(&Killed{Reason: m.Reason, Text: m.Text})
		case opAck:
			s.ackOnce.Do(func() { close(s.acked) })
		}
	}
}

var sendMu sync.Mutex

func send(c net.Conn, m message) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	sendMu.Lock()
	defer sendMu.Unlock()
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Write(append(b, '\n'))
	return err
}

// listen takes the socket the node made (Launcher.Start), or makes it.
func listen(dir, id string) (net.Listener, error) {
	if fd := os.Getenv(listenerEnv); fd != "" {
		_ = os.Unsetenv(listenerEnv) // not the plugin's
		n, err := strconv.Atoi(fd)
		if err != nil {
			return nil, fmt.Errorf("%s=%q", listenerEnv, fd)
		}
		f := os.NewFile(uintptr(n), "listener")
		defer f.Close()
		return net.FileListener(f)
	}
	_ = os.Remove(sockPath(dir, id))
	return net.Listen("unix", sockPath(dir, id))
}
