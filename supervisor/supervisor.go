package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// Main is `disbatchd supervise DIR ID`: it runs the task whose spec is
// <DIR>/<ID>.spec and returns the exit code. Its log goes to stderr (the
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
	// The node may start the supervisor before the task is marked running
	// (Launcher.Launch): its first connection says go, with the spec
	// written. Without it, nothing runs: the node gave the task up.
	if ul, ok := ln.(*net.UnixListener); ok {
		_ = ul.SetDeadline(time.Now().Add(firstWait))
	}
	first, err := ln.Accept()
	if err != nil {
		s.log.Info("no node connected: exiting without running the task", "waited", firstWait, "error", err)
		return nil
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		_ = ul.SetDeadline(time.Time{})
	}
	if err := readFile(specPath(dir, id), &s.spec); err != nil {
		_ = first.Close()
		return fmt.Errorf("read the spec: %w", err)
	}
	s.alive = s.spec.Alive
	runCtx, kill := context.WithCancelCause(ctx)
	defer kill(nil)
	s.kill = kill
	s.adopt(first)
	go s.accept(ln)
	if !s.spec.Deadline.IsZero() {
		t := time.AfterFunc(time.Until(s.spec.Deadline), func() {
			kill(&Killed{Reason: s.spec.TimeoutReason, Text: s.spec.TimeoutText})
		})
		defer t.Stop()
	}
	s.mu.Lock()
	late := time.Since(s.alive)
	s.mu.Unlock()
	if late > s.spec.FenceAfter {
		// The node went silent before the task could start: it must not
		// start now, other nodes may recover it soon.
		s.log.Warn("fencing before the start: no acknowledged heartbeat of the node for fence-after", "node", s.spec.Node, "silence", late.Round(time.Millisecond))
		s.fenced = true
		return s.handOver(Outcome{Fenced: true,
			Failure: fmt.Sprintf("task killed: supervisor fenced before the start: no acknowledged heartbeat of node %s for %s\n", s.spec.Node, late.Round(time.Millisecond))})
	}
	watch := time.NewTicker(fenceCheck)
	defer watch.Stop()
	procCtx := runCtx
	if s.spec.PluginTimeout > 0 {
		var cancel context.CancelFunc
		procCtx, cancel = context.WithTimeoutCause(runCtx, s.spec.PluginTimeout, fmt.Errorf("%w of %v", proc.ErrTimeout, s.spec.PluginTimeout))
		defer cancel()
	}
	results := make(chan proc.Result, 1)
	go func() { results <- s.spec.Command.Run(procCtx) }()
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
	if err := s.handOver(o); err != nil {
		return err
	}
	if !o.Fenced {
		_ = os.Remove(logPath(s.dir, s.id)) // kept only when something went wrong
	}
	return nil
}

// handOver gives the outcome to a node, or writes the finish itself when
// no node is there to.
func (s *sup) handOver(o Outcome) error {
	if err := writeFile(resultPath(s.dir, s.id), o); err != nil {
		return fmt.Errorf("write the result: %w", err)
	}
	for {
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
			}
		}
		return s.writeFinish(o)
	}
}

// writeFinish has the finish the node would have written, guarded by
// {_id, node, status: 0}, written by the spec's FinishCommand (package
// supervisor/finish: it links the MongoDB driver, which this process does
// not, to stay small).
func (s *sup) writeFinish(o Outcome) error {
	if len(s.spec.FinishCommand) == 0 {
		return errors.New("no finish command in the spec: the result stays in the state directory")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
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

func (s *sup) cleanup(ln net.Listener) {
	s.mu.Lock()
	s.stopping = true
	if s.conn != nil {
		_ = s.conn.Close()
	}
	s.mu.Unlock()
	_ = ln.Close()
	for _, p := range []string{sockPath(s.dir, s.id), specPath(s.dir, s.id), resultPath(s.dir, s.id)} {
		_ = os.Remove(p)
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
		if !s.adopt(c) {
			return
		}
	}
}

// adopt makes c the node's connection, says hello and serves it; false
// when the supervisor is stopping.
func (s *sup) adopt(c net.Conn) bool {
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
	go s.serve(c)
	return true
}

func (s *sup) serve(c net.Conn) {
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
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		var m message
		if json.Unmarshal(sc.Bytes(), &m) != nil {
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
