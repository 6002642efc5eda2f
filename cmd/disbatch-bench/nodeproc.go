package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"reflect"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/internal/gctarget"
	"github.com/disbatch-go/disbatch/node"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// nodeCommand is the hidden subcommand that runs one node in a process of
// its own, so that its memory can be measured alone.
const nodeCommand = "node"

// envURI passes the URI to the node process (not on its command line,
// where ps would show a password).
const envURI = "DISBATCH_BENCH_MONGO_URI"

// nodeMessage is a line the node process writes to stdout.
type nodeMessage struct {
	Ready bool `json:"ready,omitempty"`
	// Steady: this process's projector leads and is steady
	// (projections.Stats.Steady); said once, with --report-steady.
	Steady   bool    `json:"steady,omitempty"`
	Finished int     `json:"finished"`
	Seconds  float64 `json:"seconds,omitempty"`
	// FirstClaim and LastFinish: Unix nanoseconds (0: none), so that the
	// drains of processes on one host can be put together.
	FirstClaim int64 `json:"first_claim,omitempty"`
	LastFinish int64 `json:"last_finish,omitempty"`
	// Claimer is the node's claim counters when it stopped.
	Claimer *claimer.Stats `json:"claimer,omitempty"`
	// Projector is its counter projector's lag when it was asked to stop
	// (events 0 when another process led; run and leader unset).
	Projector *LagRow `json:"projector,omitempty"`
	Error     string  `json:"error,omitempty"`
}

// runNodeProcess is `disbatch-bench node --db DB [--maxthreads N] [--name
// NAME]`: it runs a node with the no-op plugin on DB (URI in
// DISBATCH_BENCH_MONGO_URI), writes {"ready":true} once it claims, and stops
// when stdin closes or on SIGTERM/SIGINT, writing what it finished.
func runNodeProcess(args []string) int {
	fs := flag.NewFlagSet("disbatch-bench node", flag.ContinueOnError)
	dbName := fs.String("db", "", "database")
	maxThreads := fs.Int("maxthreads", 64, "node maxthreads")
	name := fs.String("name", "bench-rss", "node name")
	claimRunning := fs.Bool("claim-running", defaults.ClaimRunning, "claim straight into running")
	claimBatch := fs.Int("claim-batch", defaults.ClaimBatch, "the node's batched-claim size")
	claimLinger := fs.Duration("claim-linger", defaults.ClaimLinger, "how long the node's batched claims on a backlog may wait for free slots (0: never)")
	memProfile := fs.String("memprofile", "", "write a heap profile to `FILE` when asked to stop, before stopping")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile to `FILE`, from the node's start until its projector's figures are read once it is asked to stop")
	runsFile := fs.String("runs", "", "write the id of every task the plugin ran to `FILE`, one per line, once stopped")
	preImagesIdle := fs.Duration("pre-images-idle", 0, "node Config.PreImagesIdle")
	pollOnly := fs.Bool("poll-only", false, "no wake-up change streams: the tick and finishes alone find work")
	listeners := fs.Int("wakeup-listeners", 0, "node Config.WakeupListeners (0: every node)")
	lagWindow := fs.Int("lag-window", 0, "node Config.ProjectorLagWindow (0: its default)")
	reportSteady := fs.Bool("report-steady", false, `write {"steady":true} once this node's projector leads and is steady`)
	verbose := fs.Bool("verbose", false, "info logs")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	gctarget.Apply(os.Getenv) // as disbatchd
	uri := os.Getenv(envURI)
	if *dbName == "" || uri == "" {
		fmt.Fprintln(os.Stderr, "disbatch-bench node: --db and "+envURI+" are required")
		return 2
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("process", "node")
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		_ = out.Encode(nodeMessage{Error: err.Error()})
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stdinClosed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdinClosed)
	}()

	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		return fail(err)
	}
	defer disconnect(client)
	obs := newDrainObserver(math.MaxInt32)
	var runsMu sync.Mutex
	var runs []bson.ObjectID
	n, err := node.New(node.Config{
		Name: *name, Store: store.New(client.Database(*dbName), store.Options{}),
		Plugins: noopRegistry(func(id bson.ObjectID) {
			runsMu.Lock()
			runs = append(runs, id)
			runsMu.Unlock()
		}),
		MaxThreads: maxThreads, ClaimBatch: *claimBatch, ClaimLinger: nodeLinger(*claimLinger), Observer: obs, Logger: log, ClaimRunning: *claimRunning, PollOnly: *pollOnly, PreImagesIdle: *preImagesIdle,
		WakeupListeners: *listeners, ProjectorLagWindow: *lagWindow,
	})
	if err != nil {
		return fail(err)
	}
	stopCPU, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return fail(err)
	}
	defer stopCPU()
	if err := n.Start(ctx); err != nil {
		return fail(err)
	}
	_ = out.Encode(nodeMessage{Ready: true})
	steady := make(chan struct{})
	if *reportSteady {
		go func() {
			if untilSteady(ctx, stdinClosed, n) {
				_ = out.Encode(nodeMessage{Steady: true})
			}
			close(steady)
		}()
	} else {
		close(steady)
	}
	select {
	case <-ctx.Done():
	case <-stdinClosed:
	}
	<-steady // its line before the last
	// As an in-process drain's: read before the node stops, once the
	// batch whose counters the bench saw is in the stats.
	if !untilCommitted(5*time.Second, n) {
		log.Warn("the projector was still committing 5 s after the node was asked to stop; its lag figures leave that batch out")
	}
	proj := lagOf(n.ProjectorStats())
	stopCPU()
	if *memProfile != "" {
		if err := writeHeapProfile(*memProfile); err != nil {
			log.Warn("heap profile not written", "error", err)
		}
	}
	n.Stop()
	if *runsFile != "" {
		var b strings.Builder
		runsMu.Lock()
		for _, id := range runs {
			b.WriteString(id.Hex() + "\n")
		}
		runsMu.Unlock()
		if err := os.WriteFile(*runsFile, []byte(b.String()), 0o600); err != nil {
			return fail(err)
		}
	}
	finished, span := obs.result()
	first, last := obs.times()
	cs := n.ClaimerStats()
	_ = out.Encode(nodeMessage{Finished: finished, Seconds: span.Seconds(), FirstClaim: first, LastFinish: last, Claimer: &cs, Projector: &proj})
	return 0
}

// nodeRSS runs this program's node subcommand against db for
// --rss-duration after it is ready, sampling its resident memory.
func (e *env) nodeRSS(ctx context.Context, db string, backlog int) (RSSRow, error) {
	var extra []string
	if e.cfg.NodeMemProf != "" {
		extra = append(extra, "--memprofile", e.cfg.NodeMemProf)
	}
	p, err := e.startNodeProc(ctx, db, "bench-rss", e.cfg.MaxThreads, extra...)
	if err != nil {
		return RSSRow{}, err
	}
	defer p.stop()
	msgs := p.msgs
	pid := p.cmd.Process.Pid
	row := RSSRow{Backlog: backlog}
	sample := func() {
		if kb, err := procStatusKB(pid, "VmRSS"); err == nil {
			row.Samples++
			row.MaxMiB = max(row.MaxMiB, float64(kb)/1024)
		}
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var readyAt time.Time
	var deadline <-chan time.Time
sampling:
	for {
		select {
		case m, ok := <-msgs:
			switch {
			case !ok:
				return row, errors.New("the node process ended before it was asked to")
			case m.Error != "":
				return row, fmt.Errorf("node process: %s", m.Error)
			case m.Ready:
				readyAt = time.Now()
				if kb, err := procStatusKB(pid, "VmRSS"); err == nil {
					row.ReadyMiB = float64(kb) / 1024
				}
				deadline = time.After(e.cfg.RSSDuration)
			}
		case <-tick.C:
			sample()
		case <-ctx.Done():
			return row, ctx.Err()
		case <-deadline:
			break sampling
		}
	}
	sample()
	if kb, err := procStatusKB(pid, "VmHWM"); err == nil {
		row.MaxMiB = max(row.MaxMiB, float64(kb)/1024)
	} else if row.Samples == 0 {
		return row, fmt.Errorf("read the node process's memory: %w", err)
	}
	row.Seconds = time.Since(readyAt).Seconds()
	last, err := (&procGroup{procs: []*nodeProc{p}}).finish(ctx)
	if err != nil {
		return row, err
	}
	row.Finished = last[0].Finished
	return row, nil
}

// procStatusKB reads a "Name:   123 kB" field of /proc/PID/status.
func procStatusKB(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseStatusKB(string(b), field)
}

func parseStatusKB(status, field string) (int64, error) {
	for line := range strings.SplitSeq(status, "\n") {
		rest, ok := strings.CutPrefix(line, field+":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("%s: unexpected %q", field, line)
		}
		return strconv.ParseInt(f[0], 10, 64)
	}
	return 0, fmt.Errorf("no %s in /proc/PID/status", field)
}

// nodeProcDrain drains --tasks queued no-op tasks with k node processes
// (this program's node subcommand, each its own client and Go runtime, as
// k disbatchd processes on one host would be), the queue paused until all
// are ready; first claim to last finish by the processes' own clocks (one
// host's).
func (e *env) nodeProcDrain(ctx context.Context, k int) (DrainRow, LagRow, error) {
	db, q, drop, err := e.backlog(ctx, "pdrain", e.cfg.Tasks)
	defer drop()
	if err != nil {
		return DrainRow{}, LagRow{}, err
	}
	g, err := e.startProcs(ctx, db, q, k, "bench-proc", e.cfg.MaxThreads, func(i int) []string {
		flags := []string{"--report-steady", "--lag-window", strconv.Itoa(lagWindow(e.cfg.Tasks))}
		if e.cfg.NodeCPUProf != "" {
			flags = append(flags, "--cpuprofile", fmt.Sprintf("%s-bench-proc-%d", e.cfg.NodeCPUProf, i+1))
		}
		return flags
	})
	defer g.stop()
	if err != nil {
		return DrainRow{}, LagRow{}, err
	}
	if ok, err := g.steady(ctx, e.steadyWait()); err != nil {
		return DrainRow{}, LagRow{}, err
	} else if !ok {
		e.log.Warn("drain: no node process's projector was steady in time; draining anyway", "waited", e.steadyWait())
	}
	cpu := e.meterCPU(ctx, g.pids())
	age := sampleCommitAge(ctx, e.client)
	defer age.stop(0, 0) // after commitAgeOf's, a no-op
	if err := g.resume(); err != nil {
		return DrainRow{}, LagRow{}, err
	}
	complete := true
	err = waitDrained(ctx, db, q, time.Now().Add(e.cfg.DrainTimeout))
	cpu.stop(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return DrainRow{}, LagRow{}, err
		}
		complete = false
	}
	if n, err := countStatus(ctx, db, q, schema.StatusSucceeded); err != nil {
		return DrainRow{}, LagRow{}, err
	} else if n != int64(e.cfg.Tasks) {
		complete = false
	}
	if complete {
		e.waitProjected(ctx, db, q) // each process waits for its commit as it stops
	}
	last, err := g.finish(ctx)
	if err != nil {
		return DrainRow{}, LagRow{}, err
	}
	var finished int
	var first, end int64
	for _, m := range last {
		finished += m.Finished
		if m.FirstClaim != 0 && (first == 0 || m.FirstClaim < first) {
			first = m.FirstClaim
		}
		end = max(end, m.LastFinish)
	}
	conc := procsConcurrency(k)
	e.leftover(ctx, db, "drain, "+conc)
	span := time.Duration(end - first)
	row := DrainRow{What: whatNodeProcs, Concurrency: conc, Queued: e.cfg.Tasks, Finished: finished, Seconds: span.Seconds(), Rate: rate(finished, span), Complete: complete && finished == e.cfg.Tasks}
	cpu.fill(&row)
	lag := procsLag("drain, "+conc, last)
	lag.CommitAge = e.commitAgeOf(age, first, end)
	return row, lag, nil
}

// procsLag is the lag of the counter projector that applied the most
// events among the processes' (the one that led; another only if the
// lease moved).
func procsLag(run string, msgs []nodeMessage) LagRow {
	lag := LagRow{Run: run}
	for i, m := range msgs {
		if p := m.Projector; p != nil && (lag.Leader == "" || p.Events > lag.Events) {
			lag = *p
			lag.Run, lag.Leader = run, fmt.Sprintf("process %d of %d", i+1, len(msgs))
		}
	}
	return lag
}

// pids are the group's processes.
func (g *procGroup) pids() []int {
	var out []int
	for _, p := range g.procs {
		out = append(out, p.cmd.Process.Pid)
	}
	return out
}

// procsConcurrency names a drain by k node processes.
func procsConcurrency(k int) string { return fmt.Sprintf("%d processes", k) }

// procGroup is node processes on one queue.
type procGroup struct {
	procs  []*nodeProc
	resume func() error // unpause the queue
}

// startProcs pauses queue (threads 0), starts k node processes named
// prefix-1 .. prefix-k with maxThreads (and extra(i)'s flags), and returns
// once every one is ready. Call stop in any case.
func (e *env) startProcs(ctx context.Context, db *mongo.Database, queue bson.ObjectID, k int, prefix string, maxThreads int, extra func(i int) []string) (*procGroup, error) {
	resume, err := pauseQueue(ctx, db, queue, maxThreads)
	g := &procGroup{resume: resume}
	if err != nil {
		return g, err
	}
	for i := range k {
		var more []string
		if extra != nil {
			more = extra(i)
		}
		p, err := e.startNodeProc(ctx, db.Name(), fmt.Sprintf("%s-%d", prefix, i+1), maxThreads, more...)
		if err != nil {
			return g, err
		}
		g.procs = append(g.procs, p)
	}
	ready := time.After(2 * time.Minute)
	for _, p := range g.procs {
		select {
		case m, ok := <-p.msgs:
			switch {
			case !ok:
				return g, errors.New("a node process ended before it was ready")
			case m.Error != "":
				return g, fmt.Errorf("node process: %s", m.Error)
			}
		case <-ready:
			return g, errors.New("a node process was not ready within 2 minutes")
		case <-ctx.Done():
			return g, ctx.Err()
		}
	}
	return g, nil
}

// pauseQueue sets queue's threads to 0; resume sets them to maxThreads.
func pauseQueue(ctx context.Context, db *mongo.Database, queue bson.ObjectID, maxThreads int) (resume func() error, err error) {
	s := store.New(db, store.Options{})
	threads := func(n int) error {
		return s.QueueUpdate(ctx, store.QueueUpdateParams{ID: queue, SetMaxThreads: true, MaxThreads: &n})
	}
	return func() error { return threads(maxThreads) }, threads(0)
}

// steady waits until a process started with --report-steady says its
// projector is steady, for up to wait; false when none did by then.
func (g *procGroup) steady(ctx context.Context, wait time.Duration) (bool, error) {
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	cases := []reflect.SelectCase{
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timeout.C)},
	}
	for _, p := range g.procs {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(p.msgs)})
	}
	for {
		i, v, ok := reflect.Select(cases)
		switch {
		case i == 0:
			return false, ctx.Err()
		case i == 1:
			return false, nil
		case !ok:
			return false, fmt.Errorf("node process %s ended before the drain", g.procs[i-2].name)
		}
		m := v.Interface().(nodeMessage)
		switch {
		case m.Error != "":
			return false, fmt.Errorf("node process %s: %s", g.procs[i-2].name, m.Error)
		case m.Steady:
			return true, nil
		}
	}
}

// finish asks every process to stop and returns what each said last (in
// order), failing on a reported error or a process that does not stop
// within a minute.
func (g *procGroup) finish(ctx context.Context) ([]nodeMessage, error) {
	for _, p := range g.procs {
		_ = p.stdin.Close() // asks the node to stop; it says what it did
	}
	timeout := time.After(time.Minute)
	out := make([]nodeMessage, len(g.procs))
	for i, p := range g.procs {
	reading:
		for {
			select {
			case m, ok := <-p.msgs:
				switch {
				case !ok:
					break reading
				case m.Error != "":
					return nil, fmt.Errorf("node process %s: %s", p.name, m.Error)
				case !m.Ready && !m.Steady:
					out[i] = m
				}
			case <-timeout:
				return nil, fmt.Errorf("node process %s did not stop within a minute", p.name)
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return out, nil
}

// stop stops every process (those finish already stopped return at once).
func (g *procGroup) stop() {
	for _, p := range g.procs {
		p.stop()
	}
}

// startCPUProfile starts a CPU profile to path ("": none) and returns
// what stops it, once however often it is called.
func startCPUProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return sync.OnceFunc(func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}), nil
}

// writeHeapProfile writes the heap's live objects (after a collection)
// to path, for go tool pprof.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// nodeProc is one node subcommand process and its messages.
type nodeProc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	msgs   chan nodeMessage // closed when its stdout ends
	exited chan error
}

// startNodeProc starts this program's node subcommand on db, named name,
// with maxThreads and the run's claim mode and batch.
func (e *env) startNodeProc(ctx context.Context, db, name string, maxThreads int, extra ...string) (*nodeProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := append([]string{nodeCommand, "--db", db, "--name", name, "--maxthreads", strconv.Itoa(maxThreads),
		"--claim-running=" + strconv.FormatBool(e.cfg.ClaimRunning), "--claim-batch", strconv.Itoa(e.cfg.ClaimBatch),
		"--claim-linger", e.cfg.ClaimLinger.String(),
		"--pre-images-idle", e.cfg.PreImagesIdle.String()}, extra...)
	if e.cfg.Verbose {
		args = append(args, "--verbose")
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), envURI+"="+e.uri)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = childSysProcAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", exe, err)
	}
	p := &nodeProc{name: name, cmd: cmd, stdin: stdin, msgs: make(chan nodeMessage, 4), exited: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var m nodeMessage
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				p.msgs <- m
			}
		}
		close(p.msgs)
		p.exited <- cmd.Wait()
	}()
	return p, nil
}

// stop asks the process to stop (its stdin closes) and waits up to a
// minute before killing it.
func (p *nodeProc) stop() {
	_ = p.stdin.Close()
	go func() {
		for range p.msgs { // drained, so that its reader can reach Wait
		}
	}()
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
	}
}
